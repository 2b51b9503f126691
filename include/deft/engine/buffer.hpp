// Buffer: one version of a tensor's storage. Its memory is allocated by the
// task that first writes it, so discarded work never allocates.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>

#include "../core/device.hpp"
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
    const std::size_t rounded = (bytes + thresholds::alignment - 1) / thresholds::alignment * thresholds::alignment;
    data = static_cast<std::byte*>(std::aligned_alloc(thresholds::alignment, rounded));
    if (!data) throw std::bad_alloc();
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

 private:
  void release_memory() {
    if (!data) return;
    std::free(data);
    counters().sub_allocated(bytes);
    data = nullptr;
  }
};

}  // namespace deft::detail
