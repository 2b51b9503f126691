// Where host tensor storage comes from. The default takes aligned memory from
// the C heap; a user may install another allocator (an arena, pinned memory,
// a tracking or fault-injecting one) for the buffers allocated afterwards.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

namespace deft::engine {

/// Allocates the storage of host tensors. Called from the worker that first
/// writes a buffer, so it must be thread-safe. allocate() reports failure by
/// throwing (std::bad_alloc preferably) or returning nullptr; the task that
/// needed the memory then fails and its sync points rethrow the error.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  /// `bytes` is a positive multiple of `alignment`, a power of two.
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  /// Frees `p`, which allocate(bytes, alignment) returned.
  virtual void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
};

/// std::aligned_alloc / std::free.
class DefaultHostAllocator final : public HostAllocator {
 public:
  /// std::aligned_alloc(alignment, bytes).
  void* allocate(std::size_t bytes, std::size_t alignment) override { return std::aligned_alloc(alignment, bytes); }
  /// std::free(p).
  void deallocate(void* p, std::size_t, std::size_t) noexcept override { std::free(p); }
};

}  // namespace deft::engine

namespace deft::detail {

/// The installed allocator. Every buffer keeps the allocator that gave it its
/// memory, so replacing the allocator never frees memory with the wrong one.
class AllocatorSlot {
 public:
  static AllocatorSlot& get() {
    static auto* slot = new AllocatorSlot();  // leaked: buffers may be freed during static destruction
    return *slot;
  }
  std::shared_ptr<engine::HostAllocator> current() {
    std::lock_guard lk(m_);
    return current_;
  }
  std::shared_ptr<engine::HostAllocator> exchange(std::shared_ptr<engine::HostAllocator> a) {
    if (!a) a = std::make_shared<engine::DefaultHostAllocator>();
    std::lock_guard lk(m_);
    return std::exchange(current_, std::move(a));
  }

 private:
  AllocatorSlot() : current_(std::make_shared<engine::DefaultHostAllocator>()) {}
  std::mutex m_;
  std::shared_ptr<engine::HostAllocator> current_;
};

}  // namespace deft::detail

namespace deft::engine {

/// Installs `a` for host buffers allocated from now on (nullptr: the default)
/// and returns the allocator it replaces. Buffers already allocated are freed
/// by the allocator that allocated them.
inline std::shared_ptr<HostAllocator> set_host_allocator(std::shared_ptr<HostAllocator> a) {
  return detail::AllocatorSlot::get().exchange(std::move(a));
}
/// The allocator new buffers take their memory from.
inline std::shared_ptr<HostAllocator> host_allocator() { return detail::AllocatorSlot::get().current(); }

}  // namespace deft::engine
