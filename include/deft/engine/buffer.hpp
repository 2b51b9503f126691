// Buffer: one version of a tensor's storage. Its memory is allocated by the
// task that first writes it, so discarded work never allocates; a GPU's
// buffers come from that device's pool (see device_backend.hpp).
#pragma once
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <new>

#include "../core/device.hpp"
#include "allocator.hpp"
#include "device_backend.hpp"
#include "stats.hpp"
#include "thresholds.hpp"

namespace deft::detail {

class Task;
/// Releases a task reference without recursion (see task.hpp).
void bury(std::shared_ptr<Task>&& t) noexcept;

struct Buffer {
  Buffer(std::size_t nbytes, Device dev) : bytes(nbytes), device(dev) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    release_memory();
    bury(std::move(producer));
  }

  /// Allocates the storage if not yet done (called on the worker that writes it).
  void allocate() {
    if (data || bytes == 0) return;
    // Rounding up must not wrap around for sizes near SIZE_MAX.
    if (bytes > std::numeric_limits<std::size_t>::max() - thresholds::page_alignment) throw std::bad_alloc();
    auto alloc = device.type == DeviceType::cpu ? AllocatorSlot::get().current() : backend_of(device).memory(device.index);
    data = static_cast<std::byte*>(alloc->allocate(rounded_bytes(), alignment()));
    if (!data) throw std::bad_alloc();
    allocator = std::move(alloc);
    counters().add_allocated(bytes);
  }

  template <class T>
  T* as() const { return reinterpret_cast<T*>(data); }

  std::size_t bytes;
  Device device;
  std::byte* data = nullptr;
  // The last task that writes this buffer (null for buffers filled at creation).
  // Only changed while the writer has exclusive use of the buffer.
  std::shared_ptr<Task> producer;
  // Set when the producer failed or was skipped; a sync point rethrows it.
  std::exception_ptr error;
  // On a GPU: the backend's mark of the point on the device's queue after
  // which the latest writer's kernels are done (see DeviceBackend::mark).
  // Set by the engine after each writer ran; copies out and waits order
  // after it, not after everything queued.
  std::shared_ptr<void> ready_mark;

 private:
  std::shared_ptr<engine::HostAllocator> allocator;  // the one `data` came from

  // A cache line, or a page for large host buffers (thresholds::page_align_min_bytes).
  std::size_t alignment() const {
    return device.type == DeviceType::cpu && bytes >= thresholds::page_align_min_bytes ? thresholds::page_alignment
                                                                                       : thresholds::alignment;
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

}  // namespace deft::detail
