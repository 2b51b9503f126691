// One checkout's CPU GEMM behind a C entry point, built into a shared
// object of its own with hidden symbols (bench/gemm_ab.py), so that two
// checkouts' kernels live side by side in one process. Each object has its
// own engine and workers; they sleep as soon as they are idle, so that one
// object's polling workers do not take the cores from the other's call.
#include <deft/deft.hpp>

#include <chrono>
#include <cstdint>

extern "C" __attribute__((visibility("default"))) void deft_gemm_ab_run(std::int64_t m, std::int64_t n, std::int64_t k,
                                                                       const float* a, bool ta, const float* b, bool tb,
                                                                       float* c, int threads) {
  if (deft::engine::num_workers() != threads) {
    deft::engine::set_num_workers(threads);
    deft::engine::set_worker_poll(std::chrono::nanoseconds(0));
  }
  deft::detail::cpu::GemmKernel<float>::run(m, n, k, a, ta, b, tb, c);
}
