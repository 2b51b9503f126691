// How Executor<gpu> queues work on a real GPU (nvcc only): the device made
// current, Thrust's policy on the device's stream without a sync at the end
// of each algorithm, and products through cuBLAS (integers, which cuBLAS
// lacks, through a thread per element).
#pragma once
#include <cstdint>
#include <type_traits>

#include <thrust/system/cuda/execution_policy.h>

#include "backend.hpp"
#include "blas.hpp"
#include "kernels.hpp"

namespace deft::detail::gpu {

class Launch {
 public:
  explicit Launch(int device) : ctx_(context(device)), guard_(device) {}

  auto policy() const { return thrust::cuda::par_nosync.on(ctx_.stream); }

  template <class T>
  void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool trans_a,
            bool trans_b) const {
    if constexpr (std::is_floating_point_v<T>)
      gpu::gemm(ctx_, m, n, k, a, b, c, trans_a, trans_b);
    else
      naive_gemm(policy(), m, n, k, a, b, c, trans_a, trans_b);
  }

 private:
  DeviceContext& ctx_;
  DeviceGuard guard_;
};

}  // namespace deft::detail::gpu
