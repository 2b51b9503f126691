// The GPU evaluators on a real GPU (label `gpu`): the checks of
// kernel_checks.hpp with device memory and a CUDA stream, against the same
// double-precision references. Without a GPU the runner exits with 77,
// which CTest reports as skipped.
#define BOOST_TEST_MODULE deft_gpu_kernels_device
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include <thrust/execution_policy.h>

#include <deft/eval/gpu/blas.hpp>
#include <deft/device/cuda/runtime.hpp>

#include "kernel_checks.hpp"
#include "tensor_checks.hpp"

// A real GPU's lanes are not checked: a race shows as a wrong value.
long gpu_tensors::lane_races() { return 0; }

namespace {

namespace gk = deft::detail::gpu;

/// Device copies of the operands, results in device memory, one stream.
struct DeviceMemory {
  static constexpr bool exact = false;  // the device's libm and FMAs may differ in the last bit
  gk::DeviceContext& ctx = gk::context(0);
  std::map<const void*, void*> mirrors;  // host storage -> its device copy
  std::vector<void*> blocks;

  ~DeviceMemory() {
    cudaStreamSynchronize(ctx.stream(0));
    for (void* p : blocks) cudaFree(p);
  }
  auto policy() const { return thrust::cuda::par_nosync.on(ctx.stream(0)); }

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
DEFT_GPU_TENSOR_CASES(false)

// A large request (over 1 MiB: an allocation of its own class) gets the
// block of its class freed last. (A small one may be cut from any free part
// of the small requests' allocations.)
BOOST_AUTO_TEST_CASE(caching_pool_reuses_device_blocks) {
  auto& pool = *gk::context(0).memory;
  void* a = pool.allocate(1 << 22, 256);
  pool.deallocate(a, 1 << 22, 256);
  const auto hits = pool.stats().hits;
  void* b = pool.allocate(1 << 22, 256);
  BOOST_TEST(b == a);
  BOOST_TEST(pool.stats().hits == hits + 1);
  pool.deallocate(b, 1 << 22, 256);
}

BOOST_AUTO_TEST_CASE(errors_carry_cuda_text_and_the_device_stays_usable) {
  BOOST_CHECK_EXCEPTION(gk::context(0).memory->allocate(std::size_t(1) << 50, 256), std::runtime_error,
                        [](const std::runtime_error& e) {
                          return std::string(e.what()).find("out of memory on gpu(0)") != std::string::npos;
                        });
  BOOST_CHECK_EXCEPTION(gk::context(gk::device_count()), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).find("no device gpu(") != std::string::npos;
  });
  DeviceMemory m;
  gpu_checks::fused_broadcast(m);  // still works after the failures
}

// cuBLAS products against a double loop, on random inputs, for every
// transposition and for shapes that are not multiples of any tile (and k = 0).
// Bound per element: tol * sum_p |a_ip * b_pj|, tol 1e-5 (float) or 1e-13 (double).
template <class T>
void check_blas_products(double tol) {
  DeviceMemory mem;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(-1, 1);
  const std::int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 33, 100}, {257, 129, 65}, {3, 4, 0}, {1, 300, 512}};
  for (const auto& shape : shapes) {
    const std::int64_t m = shape[0], n = shape[1], k = shape[2];
    for (int trans = 0; trans < 4; ++trans) {
      const bool ta = trans & 1, tb = trans & 2;
      std::vector<T> a(std::size_t(m * k)), b(std::size_t(k * n));
      for (auto& v : a) v = T(dist(rng));
      for (auto& v : b) v = T(dist(rng));
      T* da = mem.template make<T>(std::max<std::int64_t>(1, m * k));
      T* db = mem.template make<T>(std::max<std::int64_t>(1, k * n));
      T* dc = mem.template make<T>(m * n);
      gk::check(cudaMemcpy(da, a.data(), a.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy", 0);
      gk::check(cudaMemcpy(db, b.data(), b.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy", 0);
      gk::gemm(mem.ctx, 0, m, n, k, da, db, dc, ta, tb);
      const std::vector<T> c = mem.get(dc, m * n);
      double worst = 0;
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double ref = 0, scale = 0;
          for (std::int64_t p = 0; p < k; ++p) {
            const double x = ta ? a[std::size_t(p * m + i)] : a[std::size_t(i * k + p)];
            const double y = tb ? b[std::size_t(j * k + p)] : b[std::size_t(p * n + j)];
            ref += x * y;
            scale += std::abs(x * y);
          }
          const double err = std::abs(double(c[std::size_t(i * n + j)]) - ref);
          worst = std::max(worst, scale > 0 ? err / scale : err);
        }
      BOOST_TEST(worst <= tol, "gemm " << m << "x" << n << "x" << k << " trans_a " << ta << " trans_b " << tb
                                         << ": relative error " << worst);
    }
  }
}

BOOST_AUTO_TEST_CASE(cublas_products_match_a_double_reference) {
  check_blas_products<float>(1e-5);
  check_blas_products<double>(1e-13);
}

// Sums across GPUs through NCCL (loaded at run time). With several GPUs,
// allreduce over all of them against a double loop (|error| <= 1e-6 of the
// sum of magnitudes) and bit-equal everywhere; with one, the collective
// itself, over a clique of that GPU alone (its sum is its part).
BOOST_AUTO_TEST_CASE(nccl_sums_across_the_gpus) {
  auto& backend = gk::cuda_backend();
  BOOST_TEST_REQUIRE(backend.sums_across({0}), "libnccl could not be loaded (allreduce would sum through copies)");
  const int n = gk::device_count();
  if (n >= 2) {
    std::vector<deft::Tensor<float>> parts;
    std::vector<std::vector<float>> before;
    for (int d = 0; d < n; ++d) {
      before.push_back(gpu_tensors::random_values(100003, 900 + unsigned(d), -100, 100));
      parts.push_back(deft::Tensor<float>(before.back(), {100003}).to(deft::gpu(d)));
    }
    deft::allreduce(parts);
    const auto first = parts[0].to_vector();
    for (int d = 0; d < n; ++d) {
      BOOST_TEST(parts[std::size_t(d)].device() == deft::gpu(d));
      BOOST_TEST(parts[std::size_t(d)].to_vector() == first, boost::test_tools::per_element());
    }
    for (std::size_t i = 0; i < first.size(); ++i) {
      double want = 0, scale = 0;
      for (const auto& b : before) want += b[i], scale += std::abs(b[i]);
      BOOST_TEST(std::abs(first[i] - want) <= 1e-6 * scale);
    }
    return;
  }
  DeviceMemory mem;
  const auto values = gpu_tensors::random_values(4099, 910);
  float* from = mem.make<float>(4099);
  float* to = mem.make<float>(4099);
  gk::check(cudaMemcpy(from, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy", 0);
  backend.sum_across({{0, from, to}}, values.size(), deft::DType::float32);
  backend.synchronize(0);
  BOOST_TEST(mem.get(to, 4099) == values, boost::test_tools::per_element());
}

// Copies into pageable memory go through pinned blocks, 4 MiB at a time
// (StagingArea::download); page-locked memory takes the DMA directly.
BOOST_AUTO_TEST_CASE(copies_into_pageable_memory_arrive_whole) {
  std::vector<float> pageable(8);
  float on_stack = 0;
  void* pinned = gk::pinned_pool()->allocate(4096, 256);
  BOOST_TEST(!gk::page_locked(pageable.data()));
  BOOST_TEST(!gk::page_locked(&on_stack));
  BOOST_TEST(gk::page_locked(pinned));
  gk::pinned_pool()->deallocate(pinned, 4096, 256);
  BOOST_TEST(cudaPeekAtLastError() == cudaSuccess, "page_locked left an error behind");
  gk::check(cudaHostRegister(pageable.data(), pageable.size() * sizeof(float), cudaHostRegisterPortable), "cudaHostRegister", 0);
  BOOST_TEST(gk::page_locked(pageable.data()));
  gk::check(cudaHostUnregister(pageable.data()), "cudaHostUnregister", 0);

  const std::int64_t n = 3 * (std::int64_t(1) << 20) + 5;  // three 4 MiB chunks and 20 bytes
  const auto values = gpu_tensors::random_values(std::size_t(n), 920);
  const deft::Tensor<float> g = deft::Tensor<float>(values, {n}).to(deft::gpu(0));
  BOOST_TEST(g.to_vector() == values, boost::test_tools::per_element());
  BOOST_TEST(g.to(deft::cpu()).to_vector() == values, boost::test_tools::per_element());
  BOOST_TEST(deft::Tensor<float>(std::vector<float>{values[11]}, {1}).to(deft::gpu(0)).item() == values[11]);
}

// A kernel cannot throw: a label out of range makes that sample's loss NaN
// on a GPU (the CPU raises, tests/nn), and leaves the others as they are.
// (Not on the stand-in, fake_cuda: its kernels are host code, which raises.)
#if !defined(DEFT_FAKE_CUDA)
BOOST_AUTO_TEST_CASE(a_bad_label_makes_that_samples_loss_nan) {
  const auto scores = gpu_tensors::random_values(12, 930);
  const deft::Tensor<float> pred = deft::Tensor<float>(scores, {4, 3}).to(deft::gpu(0));
  const std::vector<std::int64_t> labels{0, 2, 3, -1};
  const auto loss = deft::nn::SoftmaxCrossEntropyLoss()(pred, deft::Tensor<std::int64_t>(labels, {4}).to(deft::gpu(0))).to_vector();
  for (std::size_t i = 0; i < 2; ++i) {
    double m = -1e300, total = 0;
    for (std::size_t c = 0; c < 3; ++c) m = std::max(m, double(scores[i * 3 + c]));
    for (std::size_t c = 0; c < 3; ++c) total += std::exp(double(scores[i * 3 + c]) - m);
    const double want = std::log(total) + m - double(scores[i * 3 + std::size_t(labels[i])]);
    BOOST_TEST(std::abs(loss[i] - want) <= 1e-5 * std::max(1.0, std::abs(want)), "sample " << i);
  }
  BOOST_TEST(std::isnan(loss[2]));
  BOOST_TEST(std::isnan(loss[3]));
}
#endif

BOOST_AUTO_TEST_SUITE_END()

int main(int argc, char* argv[]) {
  if (gk::device_count() == 0) {
    std::printf("no CUDA GPU on this machine: the gpu tests are skipped\n");
    return 77;
  }
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}
