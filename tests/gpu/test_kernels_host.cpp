// The GPU evaluators run on the host through Thrust's C++ backend
// (thrust::cpp::par): a CPU-only machine checks the functors a CUDA build
// launches. Memory is plain host vectors; `translate` is the identity.
#define BOOST_TEST_MODULE deft_gpu_kernels_host
#include <boost/test/unit_test.hpp>

#include <memory>
#include <vector>

#include <thrust/system/cpp/execution_policy.h>

#include "kernel_checks.hpp"

namespace {

struct HostMemory {
  static constexpr bool exact = true;  // the same host code as the CPU's: bit-identical results
  std::vector<std::shared_ptr<void>> blocks;

  static auto policy() { return thrust::cpp::par; }
  template <class T>
  void mirror(const deft::Tensor<T>& t) {
    t.wait_to_read();  // the evaluators read the storage directly
  }
  template <class T>
  static const T* translate(const T* p) { return p; }
  template <class T>
  T* make(std::int64_t n) {
    auto block = std::shared_ptr<T[]>(new T[std::size_t(n)]());
    blocks.push_back(block);
    return block.get();
  }
  template <class T>
  static std::vector<T> get(const T* p, std::int64_t n) { return std::vector<T>(p, p + n); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_kernels_host)

DEFT_GPU_KERNEL_CASES(HostMemory)

BOOST_AUTO_TEST_SUITE_END()
