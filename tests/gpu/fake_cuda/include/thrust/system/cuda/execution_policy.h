// thrust::cuda::par_nosync.on(stream) for the stand-in: Thrust's C++ system
// runs each algorithm, queued on the stream as a kernel would be (the real
// header needs nvcc). Only the two algorithms deft launches (eval/gpu/)
// are queued: for_each and transform. Any other would run at once on the
// calling thread, unordered with the stream's work.
#pragma once
#include <iterator>
#include <stdexcept>
#include <string>

#include <thrust/for_each.h>
#include <thrust/system_error.h>
#include <thrust/system/cpp/execution_policy.h>
#include <thrust/transform.h>

#include "../../../fake_cuda.hpp"

namespace fake_cuda {

struct StreamPolicy : thrust::cpp::execution_policy<StreamPolicy> {
  cudaStream_t stream = nullptr;
};

/// CUDA's error texts, as Thrust's CUDA system words them.
struct CudaCategory : thrust::error_category {
  const char* name() const noexcept override { return "cuda"; }
  std::string message(int status) const override { return cudaGetErrorString(cudaError_t(status)); }
};

/// A failed launch raises thrust::system_error, as Thrust's CUDA system does.
inline void raise_launch_error(cudaError_t status, const char* what) {
  static const CudaCategory category;
  if (status != cudaSuccess)
    throw thrust::system_error(int(status), category,
                               std::string("fake CUDA: launch of thrust::") + what + ": " + cudaGetErrorName(status));
}

template <class It, class F>
It for_each(StreamPolicy& policy, It first, It last, F f) {
  raise_launch_error(launch(policy.stream, [=] { thrust::for_each(thrust::cpp::par, first, last, f); }, "for_each"),
                     "for_each");
  return last;
}

template <class It, class Out, class F>
Out transform(StreamPolicy& policy, It first, It last, Out out, F f) {
  raise_launch_error(
      launch(policy.stream, [=] { thrust::transform(thrust::cpp::par, first, last, out, f); }, "transform"),
      "transform");
  return out + std::distance(first, last);
}

}  // namespace fake_cuda

namespace thrust::cuda {
struct FakeParNosync {
  fake_cuda::StreamPolicy on(cudaStream_t stream) const {
    fake_cuda::StreamPolicy p;
    p.stream = stream;
    return p;
  }
};
inline constexpr FakeParNosync par_nosync{};
}  // namespace thrust::cuda
