// What every group file shares: deft, the harness, the group entry points and
// the libtorch rows (implemented in peer_torch.cpp, the only file that
// includes libtorch's headers, which are slow to compile).
#pragma once
#include <deft/deft.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.hpp"

namespace bench {

void bench_elementwise();
void bench_broadcast();
void bench_reduce();
void bench_gemm();
void bench_overhead();
void bench_seeds();
void bench_parallel();
void bench_training();
/// deft_bench --peak-memory deft|torch: one library's MLP steps alone in this
/// process; prints "peak_mib X" (peak RSS above the RSS after set-up).
int training_peak_memory_child(const std::string& lib);

/// deft's engine with n workers, restored to the default count when dropped.
struct DeftThreads {
  int before;
  explicit DeftThreads(int n) : before(deft::engine::num_workers()) { deft::engine::set_num_workers(n); }
  ~DeftThreads() { deft::engine::set_num_workers(before); }
};

inline std::vector<float> values_of(const deft::Tensor<float>& t) { return t.to_vector(); }

/// The memory of t, a whole tensor, for peers to read: on a machine whose
/// last-level cache holds one operand of 64 MiB but not two (this one's
/// 260 MiB L3, shared with other VMs), deft over its tensor and a peer over a
/// copy, timed in alternation, read whichever of the two the cache kept
/// (Eigen's row sums took 4.4 ms over one and 3.0 ms over the other). Over
/// one buffer both find the same cache.
inline const float* storage_of(const deft::Tensor<float>& t) {
  t.wait_to_read();
  const auto b = deft::detail::whole_storage(t);
  if (!b) throw std::invalid_argument("storage_of: a part of a larger tensor");
  return b->as<const float>();
}

/// Largest |x - y| / max(1, |y|) over two arrays (checks that rows compute the same thing).
inline double max_rel_diff(const float* x, const float* y, std::size_t n) {
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::abs(double(x[i]) - double(y[i])) / std::max(1.0, std::abs(double(y[i])));
    worst = std::max(worst, d);
  }
  return worst;
}
void check_same(const char* group, const std::string& what, const float* x, const float* y, std::size_t n,
                double tol = 1e-4);

namespace torch_peer {
#if DEFT_BENCH_HAVE_TORCH
std::string version();
void set_threads(int n);
// Each returns seconds per call of the whole loop body described.
Summary fused(const float* a, const float* b, const float* c, const float* d, std::int64_t n, int inner,
              float* check_out);
Summary bias_add(const float* x, const float* b, std::int64_t rows, std::int64_t cols);
Summary col_scale(const float* x, const float* s, std::int64_t rows, std::int64_t cols);
Summary softmax(const float* x, std::int64_t rows, std::int64_t cols, float* check_out);
Summary sum_all(const float* x, std::int64_t n, double* result);
Summary sum_axis(const float* x, std::int64_t rows, std::int64_t cols, int axis);
Summary matmul(const float* a, const float* b, std::int64_t m, std::int64_t k, std::int64_t n, float* c);
Summary tiny_ops(int ops, bool in_place);
Summary seeds(const float* x, std::int64_t rows, std::int64_t cols, int steps);
/// The seeds' MLP step with ATen autograd from `weights` (w1, b1, w2, b2, w3, b3 as deft's
/// Dense stores them: (in, out) and (out)); *final_loss gets the mean loss of the last step.
Summary mlp_step(const float* x, std::int64_t batch, const std::vector<std::vector<float>>& weights, float lr,
                 float* final_loss);
/// `calls` forwards of the 512-256-128-2 net at batch 1 (no autograd); out gets the last output (2 values).
Summary small_forward(const float* x, const std::vector<std::vector<float>>& weights, int calls, float* out);
/// One epoch of the 784-256-10 MLP over `n` samples in order, softmax cross-entropy, SGD with momentum.
Summary mlp_epoch(const float* images, const std::int64_t* labels, std::int64_t n, std::int64_t features,
                  std::int64_t batch, const std::vector<std::vector<float>>& weights, float lr, float momentum,
                  float* last_loss);
#endif
}  // namespace torch_peer

}  // namespace bench
