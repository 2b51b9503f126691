// How Executor<gpu> queues work on a real GPU (nvcc only): the device made
// current, the work's memory uses declared (lanes.hpp), Thrust's policy on
// the calling thread's lane without a sync at the end
// of each algorithm, and products through cuBLAS (integers, which cuBLAS
// lacks, through a thread per element).
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

#include <thrust/system/cuda/execution_policy.h>

#include "../../device/cuda/backend.hpp"
#include "blas.hpp"
#include "gemm.hpp"

namespace deft::detail::gpu {

class Launch {
 public:
  /// Work with `uses` on the calling thread's lane of `device`.
  Launch(int device, MemoryUses uses)
      : ctx_(context(device)), guard_(device), access_(cuda_backend(), device, std::move(uses)),
        stream_(ctx_.stream(access_.lane())) {}

  auto policy() const { return thrust::cuda::par_nosync.on(stream_); }

  template <class T>
  void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool trans_a,
            bool trans_b) const {
    if constexpr (std::is_floating_point_v<T>)
      gpu::gemm(ctx_, access_.lane(), m, n, k, a, b, c, trans_a, trans_b);
    else
      naive_gemm(policy(), m, n, k, a, b, c, trans_a, trans_b);
  }

 private:
  DeviceContext& ctx_;
  DeviceGuard guard_;
  LaneAccess access_;  // after guard_: its uses are recorded while the device is current
  cudaStream_t stream_;
};

}  // namespace deft::detail::gpu
