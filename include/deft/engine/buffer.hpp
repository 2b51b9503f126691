// Buffer: one version of a tensor's storage. Its memory is allocated by the
// task that first writes it, so discarded work never allocates; a GPU's
// buffers come from that device's pool (see device_backend.hpp).
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../device/allocator.hpp"
#include "../device/backend.hpp"
#include "../core/spin_lock.hpp"
#include "stats.hpp"
#include "../core/thresholds.hpp"

namespace deft::detail {

class Task;
/// Releases a task reference without recursion (see task.hpp).
void bury(std::shared_ptr<Task>&& t) noexcept;

struct Buffer {
  Buffer(std::size_t nbytes, Device dev) : bytes(nbytes), device(dev) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  /// Allocates the storage if not yet done (called on the worker that writes it).
  void allocate();
  /// Whether the storage is page-locked host memory (see pinned_host); known
  /// once the buffer was allocated.
  bool page_locked() const { return locked_; }

  template <class T>
  T* as() const { return reinterpret_cast<T*>(data); }

  /// Whether the caller's reference `b` (a tensor's current version) is the
  /// only one, not counting that of a task writing it right now (WriterHold):
  /// a write recorded meanwhile waits for that task, so it may still write in
  /// place. Another reference is a reader that the write cannot order.
  static bool unshared(const std::shared_ptr<Buffer>& b) { return b.use_count() == 1 || unshared_but_held(b); }
  /// The references to `b`, not counting the engine's holds on a running
  /// writer's output (WriterHold): the readers and handles that keep it.
  static long references(const std::shared_ptr<Buffer>& b) {
    std::lock_guard lk(b->hold_lock_);
    return b.use_count() - b->writer_holds_;
  }

 private:
  DEFT_NOINLINE static bool unshared_but_held(const std::shared_ptr<Buffer>& b) {
    // Under the lock a counted hold is in use_count (taken before, released
    // after): no reader hides behind it. Readers cannot appear meanwhile
    // without the caller's reference or another reader to copy.
    std::lock_guard lk(b->hold_lock_);
    return b.use_count() == 1 + b->writer_holds_;
  }

 public:
  std::size_t bytes;
  Device device;
  std::byte* data = nullptr;
  // The last task that writes this buffer (null for buffers filled at creation).
  // Only changed while the writer has exclusive use of the buffer.
  std::shared_ptr<Task> producer;
  // Set when the producer failed or was skipped; a sync point rethrows it.
  std::exception_ptr error;
  // On the host: asks for page-locked memory from the GPU backend (a copy
  // from a GPU lands there by DMA, without the driver's staging); pageable
  // memory when there is none or it runs out. Set before the buffer is shared.
  bool pinned_host = false;
  // On a GPU: the backend's mark of the point on the device's queue after
  // which the latest writer's kernels are done (see DeviceBackend::mark).
  // Set by the engine after each writer ran; copies out and waits order
  // after it, not after everything queued.
  std::shared_ptr<void> ready_mark;
  // On a GPU: the lane (stream) its latest writer ran on, -1 before one ran;
  // and whether a reader already took that lane to go on with (the engine's
  // lane policy: a second reader starts another lane). Hints for speed only:
  // lanes.hpp orders the work.
  int lane = -1;
  std::atomic<bool> lane_taken{false};

 private:
  friend class WriterHold;
  std::shared_ptr<engine::HostAllocator> allocator;  // the one `data` came from
  SpinLock hold_lock_;   // guards writer_holds_ (see unshared)
  int writer_holds_ = 0;  // WriterHolds alive now
  bool locked_ = false;   // data is page-locked (from the backend's pinned memory)

  // The storage from `alloc` (none without one, or when it returns null).
  void take_from(std::shared_ptr<engine::HostAllocator> alloc) {
    if (!alloc) return;
    data = static_cast<std::byte*>(alloc->allocate(rounded_bytes(), alignment()));
    if (!data) return;
    allocator = std::move(alloc);
    counters().add_allocated(bytes);
  }

  // A cache line; on the host, a page for large buffers
  // (thresholds::page_align_min_bytes) and malloc's own alignment for small
  // ones (thresholds::small_host_buffer_bytes), which glibc then serves from
  // its per-thread cache instead of through memalign.
  std::size_t alignment() const {
    if (device.type == DeviceType::cpu && bytes >= thresholds::page_align_min_bytes) return thresholds::page_alignment;
    if (device.type == DeviceType::cpu && bytes <= thresholds::small_host_buffer_bytes) return alignof(std::max_align_t);
    return thresholds::alignment;
  }
  std::size_t rounded_bytes() const { return aligned_size(bytes, alignment()); }
  void release_memory() {
    if (!data) return;
    allocator->deallocate(data, rounded_bytes(), alignment());
    allocator.reset();
    counters().sub_allocated(bytes);
    data = nullptr;
  }
};

/// The engine's reference to the output of the task it runs, so that the
/// buffer outlives the kernel. Buffer::unshared() does not count it: a
/// `y += 1` recorded while the previous one runs still writes y in place
/// instead of copying it (docs/engine.md, section 5).
class WriterHold {
 public:
  /// Takes `output` unless the caller holds it already (`held`).
  WriterHold(const std::weak_ptr<Buffer>& output, Buffer* held) : held_(held) {
    if (held_) return;
    buffer_ = output.lock();
    if (buffer_) {
      std::lock_guard lk(buffer_->hold_lock_);
      ++buffer_->writer_holds_;
    }
  }
  WriterHold(const WriterHold&) = delete;
  WriterHold& operator=(const WriterHold&) = delete;
  ~WriterHold() {
    if (!buffer_) return;
    std::lock_guard lk(buffer_->hold_lock_);
    --buffer_->writer_holds_;
  }  // buffer_ lets go after the count: unshared() never sees the hold uncounted

  /// The output, or null when nobody holds it any more.
  Buffer* get() const { return held_ ? held_ : buffer_.get(); }

 private:
  Buffer* held_;
  std::shared_ptr<Buffer> buffer_;
};

#if DEFT_DEFINE_RUNTIME
DEFT_DECL Buffer::~Buffer() {
  release_memory();
  bury(std::move(producer));
}

DEFT_DECL void Buffer::allocate() {
  if (data || bytes == 0) return;
  // Rounding up must not wrap around for sizes near SIZE_MAX.
  if (bytes > std::numeric_limits<std::size_t>::max() - thresholds::page_alignment) throw std::bad_alloc();
  if (pinned_host) {  // pinned memory is scarce: pageable memory serves without it
    DeviceBackend* b = gpu_backend();
    try {
      take_from(b ? b->pinned_memory() : nullptr);
    } catch (...) {
    }
    locked_ = data != nullptr;
    if (data) return;
  }
  take_from(device.type == DeviceType::cpu ? AllocatorSlot::get().current() : backend_of(device).memory(device.index));
  if (!data) throw std::bad_alloc();
}
#endif

}  // namespace deft::detail
