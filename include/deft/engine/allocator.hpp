// Where host tensor storage comes from. The default takes aligned memory from
// the C heap and keeps large freed blocks for reuse (CachingHostAllocator);
// a user may install another allocator (an arena, pinned memory, a tracking
// or fault-injecting one) for the buffers allocated afterwards.
#pragma once
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "thresholds.hpp"

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

/// Keeps freed blocks of `min_bytes` (host_cache_min_bytes) and more, by size
/// class, and hands them out again instead of asking `upstream`; smaller
/// blocks pass straight through. The cache holds at most limit() free bytes;
/// when the upstream fails, the cache is emptied and the request tried again.
/// The upstream may be any allocator: a GPU's caches device memory.
class CachingHostAllocator final : public HostAllocator {
 public:
  /// What the cache did so far.
  struct Stats {
    std::uint64_t hits = 0;        ///< cacheable requests served from the cache
    std::uint64_t misses = 0;      ///< cacheable requests passed to the upstream allocator
    std::size_t cached_bytes = 0;  ///< free bytes held now
  };

  /// Caches what `upstream` allocates from `min_bytes` up, holding at most `limit` free bytes.
  explicit CachingHostAllocator(std::shared_ptr<HostAllocator> upstream = std::make_shared<DefaultHostAllocator>(),
                                std::size_t limit = thresholds::host_cache_max_bytes,
                                std::size_t min_bytes = thresholds::host_cache_min_bytes)
      : upstream_(std::move(upstream)), limit_(limit), min_bytes_(min_bytes) {}
  ~CachingHostAllocator() override { release(); }

  /// The size a request of `bytes` is rounded up to (a multiple of `alignment`).
  std::size_t size_class(std::size_t bytes, std::size_t alignment) const {
    static_assert(std::has_single_bit(unsigned(thresholds::host_cache_classes_per_octave)));
    constexpr int class_bits = std::countr_zero(unsigned(thresholds::host_cache_classes_per_octave));
    if (bytes < min_bytes_) return bytes;
    const int octave = int(std::bit_width(bytes)) - 1;
    const std::size_t step = std::max(alignment, std::size_t(1) << std::max(0, octave - class_bits));
    return (bytes + step - 1) / step * step;
  }

  void* allocate(std::size_t bytes, std::size_t alignment) override {
    const std::size_t size = size_class(bytes, alignment);
    if (bytes >= min_bytes_) {
      std::lock_guard lk(m_);
      auto& list = free_[{size, alignment}];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        stats_.cached_bytes -= size;
        ++stats_.hits;
        return p;
      }
      ++stats_.misses;
    }
    // A failure with blocks cached: free them all and ask once more (free
    // blocks of other sizes are no use to this request).
    void* p = nullptr;
    try {
      p = upstream_->allocate(size, alignment);
    } catch (...) {
      if (stats().cached_bytes == 0) throw;
    }
    if (p || stats().cached_bytes == 0) return p;
    release();
    return upstream_->allocate(size, alignment);
  }

  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    const std::size_t size = size_class(bytes, alignment);
    if (bytes >= min_bytes_) {
      std::lock_guard lk(m_);
      if (stats_.cached_bytes + size <= limit_) {
        try {
          free_[{size, alignment}].push_back(p);
          stats_.cached_bytes += size;
          return;
        } catch (...) {  // no memory for the list entry: free the block instead
        }
      }
    }
    upstream_->deallocate(p, size, alignment);
  }

  /// Frees every cached block.
  void release() noexcept {
    std::lock_guard lk(m_);
    for (auto& [key, list] : free_)
      for (void* p : list) upstream_->deallocate(p, key.first, key.second);
    free_.clear();
    stats_.cached_bytes = 0;
  }
  /// Caps the free bytes held (0: cache nothing), freeing blocks past the new cap.
  void set_limit(std::size_t bytes) noexcept {
    {
      std::lock_guard lk(m_);
      limit_ = bytes;
      if (stats_.cached_bytes <= limit_) return;
    }
    release();
  }
  /// The cap on the free bytes held.
  std::size_t limit() const noexcept {
    std::lock_guard lk(m_);
    return limit_;
  }
  /// Hits, misses and the free bytes held now.
  Stats stats() const noexcept {
    std::lock_guard lk(m_);
    return stats_;
  }

 private:
  std::shared_ptr<HostAllocator> upstream_;
  mutable std::mutex m_;
  std::size_t limit_;
  std::size_t min_bytes_;
  Stats stats_;
  std::map<std::pair<std::size_t, std::size_t>, std::vector<void*>> free_;  // (size, alignment) -> free blocks
};

}  // namespace deft::engine

namespace deft::detail {

/// `bytes` rounded up to a multiple of `alignment` (a power of two): the sizes
/// HostAllocator::allocate takes, as std::aligned_alloc requires. Every
/// caller of an allocator rounds with this one function.
constexpr std::size_t aligned_size(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) & ~(alignment - 1);
}

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
    if (!a) a = std::make_shared<engine::CachingHostAllocator>();
    std::lock_guard lk(m_);
    return std::exchange(current_, std::move(a));
  }

 private:
  AllocatorSlot() : current_(std::make_shared<engine::CachingHostAllocator>()) {}
  std::mutex m_;
  std::shared_ptr<engine::HostAllocator> current_;
};

}  // namespace deft::detail

namespace deft::engine {

/// Installs `a` for host buffers allocated from now on (nullptr: a new
/// CachingHostAllocator over the C heap, the default)
/// and returns the allocator it replaces. Buffers already allocated are freed
/// by the allocator that allocated them.
inline std::shared_ptr<HostAllocator> set_host_allocator(std::shared_ptr<HostAllocator> a) {
  return detail::AllocatorSlot::get().exchange(std::move(a));
}
/// The allocator new buffers take their memory from.
inline std::shared_ptr<HostAllocator> host_allocator() { return detail::AllocatorSlot::get().current(); }

/// Frees the blocks the installed allocator keeps for reuse, if it is a
/// CachingHostAllocator (memory held by live tensors stays).
inline void release_cached_host_memory() {
  if (auto c = std::dynamic_pointer_cast<CachingHostAllocator>(host_allocator())) c->release();
}

}  // namespace deft::engine
