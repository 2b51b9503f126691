// deft's host/device vocabulary in device code: an Element-constrained
// template (a C++20 concept, which nvcc only accepts at --std=c++20) and
// Shape::size(), marked DEFT_HD.
#include <deft/core/config.hpp>
#include <deft/core/dtype.hpp>
#include <deft/core/shape.hpp>

#include <cstdio>

#include <cuda_runtime.h>

template <deft::Element T>
__global__ void fill(T* out, deft::Shape shape, T value) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < shape.size()) out[i] = value;
}

int main() {
  const deft::Shape shape{4, 8};
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda consumer: built with deft::cuda (%lld elements); no GPU here, kernel not launched\n",
                static_cast<long long>(shape.size()));
    return 0;
  }
  float* d = nullptr;
  cudaMalloc(&d, sizeof(float) * shape.size());
  fill<<<1, 64>>>(d, shape, 2.5f);
  float h[32];
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  cudaFree(d);
  for (float v : h)
    if (v != 2.5f) {
      std::printf("cuda consumer: wrong value %g\n", v);
      return 1;
    }
  std::printf("cuda consumer: kernel filled %lld elements on the GPU\n", static_cast<long long>(shape.size()));
  return 0;
}
