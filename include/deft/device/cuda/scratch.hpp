// Device memory for a kernel's intermediate values (Executor<gpu>, the GPU's
// reductions and convolutions), from the device's caching pool.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>

#include "../../core/device.hpp"
#include "../backend.hpp"
#include "../../core/thresholds.hpp"

namespace deft::detail::gpu {

/// n elements of device memory from the device's pool (none, and get() is
/// null, when n is 0: a kernel that needs no scratch), written by the work
/// queued on the calling thread's lane while this lives (a LaneAccess: work
/// on another lane that used the block before, or uses it next, is ordered).
/// While a program records, the block is the program's (its address is
/// part of the program) and outlives this.
template <class T>
class Scratch {
 public:
  Scratch(int device, std::int64_t n) {
    if (n <= 0) return;
    pool_ = backend_of(deft::gpu(device)).memory(device);
    bytes_ = aligned_size(std::size_t(n) * sizeof(T), thresholds::alignment);
    ProgramCapture* program = ProgramCapture::active();
    data_ = static_cast<T*>(program ? program->scratch(pool_, bytes_, thresholds::alignment)
                                    : pool_->allocate(bytes_, thresholds::alignment));
    if (!data_) throw std::bad_alloc();
    owned_ = !program;
    try {
      access_.emplace(backend_of(deft::gpu(device)), device, MemoryUses{{}, {data_}});
    } catch (...) {
      if (owned_) pool_->deallocate(data_, bytes_, thresholds::alignment);
      throw;
    }
  }
  ~Scratch() {
    access_.reset();  // the uses are recorded before another lane can take the block
    if (data_ && owned_) pool_->deallocate(data_, bytes_, thresholds::alignment);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return data_; }

 private:
  std::shared_ptr<engine::HostAllocator> pool_;
  std::size_t bytes_ = 0;
  T* data_ = nullptr;
  bool owned_ = true;  // false: a program's
  std::optional<LaneAccess> access_;
};

}  // namespace deft::detail::gpu
