// The GPU evaluators on a real GPU (label `gpu`): the checks of
// kernel_checks.hpp with device memory and a CUDA stream, against the same
// double-precision references. Without a GPU the runner exits with 77,
// which CTest reports as skipped.
#define BOOST_TEST_MODULE deft_gpu_kernels_device
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <map>
#include <vector>

#include <thrust/execution_policy.h>

#include <deft/eval/gpu/runtime.hpp>

#include "kernel_checks.hpp"

namespace {

namespace gk = deft::detail::gpu;

/// Device copies of the operands, results in device memory, one stream.
struct DeviceMemory {
  gk::DeviceContext& ctx = gk::context(0);
  std::map<const void*, void*> mirrors;  // host storage -> its device copy
  std::vector<void*> blocks;

  ~DeviceMemory() {
    cudaStreamSynchronize(ctx.stream);
    for (void* p : blocks) cudaFree(p);
  }
  auto policy() const { return thrust::cuda::par_nosync.on(ctx.stream); }

  template <class T>
  T* make(std::int64_t n) {
    void* p = nullptr;
    gk::check(cudaMalloc(&p, std::size_t(n) * sizeof(T)), "cudaMalloc", 0);
    blocks.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T>
  void mirror(const deft::Tensor<T>& t) {
    const auto host = t.to_vector();
    T* dev = make<T>(std::int64_t(host.size()));
    gk::check(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy", 0);
    mirrors[gk::element_at(deft::as_expr(t)).view.data] = dev;
  }
  template <class T>
  const T* translate(const T* host) const {
    const auto it = mirrors.find(host);
    BOOST_REQUIRE_MESSAGE(it != mirrors.end(), "an operand was not mirrored to the device");
    return static_cast<const T*>(it->second);
  }
  template <class T>
  std::vector<T> get(const T* dev, std::int64_t n) {
    ctx.synchronize();  // kernel failures surface here, with CUDA's text
    std::vector<T> out(static_cast<std::size_t>(n));
    gk::check(cudaMemcpy(out.data(), dev, out.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy", 0);
    return out;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_kernels)

DEFT_GPU_KERNEL_CASES(DeviceMemory)

BOOST_AUTO_TEST_CASE(caching_pool_reuses_device_blocks) {
  auto& pool = gk::context(0).memory;
  void* a = pool.allocate(1 << 20, 256);
  pool.deallocate(a, 1 << 20, 256);
  const auto hits = pool.stats().hits;
  void* b = pool.allocate(1 << 20, 256);
  BOOST_TEST(b == a);
  BOOST_TEST(pool.stats().hits == hits + 1);
  pool.deallocate(b, 1 << 20, 256);
}

BOOST_AUTO_TEST_CASE(errors_carry_cuda_text_and_the_device_stays_usable) {
  BOOST_CHECK_EXCEPTION(gk::context(0).memory.allocate(std::size_t(1) << 50, 256), std::runtime_error,
                        [](const std::runtime_error& e) {
                          return std::string(e.what()).find("out of memory on gpu(0)") != std::string::npos;
                        });
  BOOST_CHECK_EXCEPTION(gk::context(gk::device_count()), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("no device gpu(") != std::string::npos;
  });
  DeviceMemory m;
  gpu_checks::fused_broadcast(m);  // still works after the failures
}

BOOST_AUTO_TEST_SUITE_END()

int main(int argc, char* argv[]) {
  if (gk::device_count() == 0) {
    std::printf("no CUDA GPU on this machine: the gpu tests are skipped\n");
    return 77;
  }
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}
