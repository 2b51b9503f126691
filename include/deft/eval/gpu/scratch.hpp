// Device memory for a kernel's intermediate values (Executor<gpu>, the GPU's
// reductions and convolutions), from the device's caching pool.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "../../core/device.hpp"
#include "../../engine/device_backend.hpp"
#include "../../engine/thresholds.hpp"

namespace deft::detail::gpu {

/// n elements of device memory from the device's pool, returned when this
/// goes: later work on the same stream may reuse them, as it runs after the
/// kernels queued now.
template <class T>
class Scratch {
 public:
  Scratch(int device, std::int64_t n)
      : pool_(backend_of(deft::gpu(device)).memory(device)),
        bytes_(aligned_size(std::size_t(n > 0 ? n : 1) * sizeof(T), thresholds::alignment)),
        data_(static_cast<T*>(pool_->allocate(bytes_, thresholds::alignment))) {
    if (!data_) throw std::bad_alloc();
  }
  ~Scratch() { pool_->deallocate(data_, bytes_, thresholds::alignment); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return data_; }

 private:
  std::shared_ptr<engine::HostAllocator> pool_;
  std::size_t bytes_;
  T* data_;
};

}  // namespace deft::detail::gpu
