// An installed deft::cuda in a CUDA translation unit: nvcc compiles deft's
// C++20 headers, kernels included, and DEFT_CUDA_BACKEND (set by the target)
// registers the CUDA backend. With a GPU, a fused expression and a product
// run on gpu(0) and are checked on the host; without one, asking for gpu(0)
// must be refused by the backend ("no device gpu(0): this machine has 0"),
// which shows the target carried the definition.
#include <deft/deft.hpp>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <cuda_runtime.h>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    try {
      (void)deft::ones<float>({4, 8}, deft::gpu(0));
    } catch (const std::invalid_argument& e) {
      if (std::string(e.what()).find("no device gpu(0)") == std::string::npos) {
        std::printf("cuda consumer: unexpected error: %s\n", e.what());
        return 1;
      }
      std::printf("cuda consumer: built with deft::cuda; no GPU here, so gpu(0) is refused as it should be\n");
      return 0;
    }
    std::printf("cuda consumer: gpu(0) was accepted on a machine without a GPU\n");
    return 1;
  }
  const auto dev = deft::gpu(0);
  deft::Tensor<float> a = deft::full<float>({4, 8}, 1.5f, dev);
  deft::Tensor<float> b = deft::arange<float>(0, 8, 1, dev).reshape({8, 1});
  const auto c = deft::Tensor<float>(deft::dot(a * 2.0f, b)).to_vector();  // each row: 3 * (0 + 1 + ... + 7)
  for (float v : c)
    if (std::abs(v - 84.0f) > 1e-4f) {
      std::printf("cuda consumer: wrong value %g (want 84)\n", v);
      return 1;
    }
  std::printf("cuda consumer: a product of GPU tensors gave the expected %zu values\n", c.size());
  return 0;
}
