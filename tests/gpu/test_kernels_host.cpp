// The GPU evaluators run on the host through Thrust's C++ backend
// (thrust::cpp::par): a CPU-only machine checks the functors a CUDA build
// launches. Memory is plain host vectors; `translate` is the identity.
// Built with DEFT_GPU_EMULATION, it also runs tensors on emulated GPUs.
#define BOOST_TEST_MODULE deft_gpu_kernels_host
#include <boost/test/unit_test.hpp>

#include <memory>
#include <vector>

#include <thrust/system/cpp/execution_policy.h>

#include "kernel_checks.hpp"
#include "tensor_checks.hpp"

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

// Tensors on the emulated gpu(0) and gpu(1) (DEFT_GPU_EMULATION): the
// engine, executor and backend paths of a CUDA build, run on the host.
BOOST_AUTO_TEST_SUITE(gpu_tensors_emulated)

DEFT_GPU_TENSOR_CASES(true)

BOOST_AUTO_TEST_CASE(num_gpus_counts_the_backends_devices) { BOOST_TEST(deft::num_gpus() == 2); }

// Copies to the host and waits go after the mark of the buffer's writer (on
// CUDA: its event, so later kernels keep running); the emulated marks name
// their device, so a wrong buffer's mark would throw.
BOOST_AUTO_TEST_CASE(copies_and_waits_follow_the_buffers_mark) {
  auto& backend = deft::detail::gpu::emulated_backend();
  const long copies = backend.marked_copies, waits = backend.marked_waits;
  const auto v = gpu_tensors::random_values(64, 21);
  deft::Tensor<float> x = deft::Tensor<float>(v, {64}).to(deft::gpu(1)) * 2.0f;
  x.wait_to_read();
  BOOST_TEST(backend.marked_waits == waits + 1);
  std::vector<double> want(v.begin(), v.end());
  for (auto& e : want) e *= 2;
  gpu_tensors::expect_near(x.to_vector(), want, 0, "to_vector");
  gpu_tensors::expect_near(x.to(deft::cpu()).to_vector(), want, 0, "to(cpu())");
  BOOST_TEST(backend.marked_copies == copies + 2);
}

BOOST_AUTO_TEST_CASE(device_pool_is_reused_in_a_steady_loop) {
  auto& pool = deft::detail::gpu::emulated_backend().pool(0);
  deft::Tensor<float> x = deft::ones<float>({256, 256}, deft::gpu(0));
  for (int i = 0; i < 3; ++i) x = x * 2.0f + 1.0f;
  x.wait_to_read();
  const auto misses = pool.stats().misses;
  for (int i = 0; i < 20; ++i) {
    x = x * 0.5f + 1.0f;
    x.wait_to_read();
  }
  BOOST_TEST(pool.stats().misses == misses);  // every buffer came from the cache
  BOOST_TEST(pool.stats().hits > 0u);
}

BOOST_AUTO_TEST_SUITE_END()
