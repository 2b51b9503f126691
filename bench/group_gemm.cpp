// gemm: float32 matrix products C = A * B (row-major) at 512, 2000 (the
// seeds' size) and 4096, and the two products of an MLP layer pair
// (1024x512 * 512x2048 and 1024x2048 * 2048x512); all threads, and one
// thread at 2000. deft's own header-only kernel against OpenBLAS
// cblas_sgemm (openblas_set_num_threads), Eigen's product (OpenMP threads,
// Eigen::setNbThreads) and libtorch's at::mm (set_num_threads). The relative
// error of deft's (and OpenBLAS's) result against a double-precision
// reference on sampled rows is printed as a row of its own.
#include "common.hpp"

#include <cmath>

#if DEFT_BENCH_HAVE_EIGEN
#include <Eigen/Core>
#endif
#if DEFT_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace bench {

namespace {

/// ||C - R||_F / ||R||_F over `samples` evenly spaced rows, R in double.
double rel_error(const float* a, const float* b, const float* c, std::int64_t m, std::int64_t k, std::int64_t n,
                 int samples = 16) {
  double num = 0, den = 0;
  std::vector<double> row(n);
  for (int s = 0; s < samples; ++s) {
    const std::int64_t i = (m - 1) * s / std::max(1, samples - 1);
    std::fill(row.begin(), row.end(), 0.0);
    for (std::int64_t p = 0; p < k; ++p) {
      const double aip = a[i * k + p];
      const float* brow = b + p * n;
      for (std::int64_t j = 0; j < n; ++j) row[j] += aip * brow[j];
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const double d = c[i * n + j] - row[j];
      num += d * d;
      den += row[j] * row[j];
    }
  }
  return std::sqrt(num / den);
}

void gemm_case(std::int64_t m, std::int64_t k, std::int64_t n, const std::vector<int>& thread_counts) {
  using namespace deft;
  const char* g = "gemm";
  const std::string name = m == k && k == n ? "matmul square" : "matmul mlp";
  const std::string size = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
  random::seed(uint64_t(m * 31 + k * 7 + n));
  auto ta = random::uniform<float>(-1, 1, {m, k});
  auto tb = random::uniform<float>(-1, 1, {k, n});
  const FloatBuf a(values_of(ta)), b(values_of(tb));
  FloatBuf c(m * n);
  const float *pa = a.data(), *pb = b.data();
  float* pc = c.data();
  const double flop = 2.0 * m * k * n;
  for (int t : thread_counts) {
    {
      DeftThreads threads(t);
      Tensor<float> tc = dot(ta, tb);
      tc.wait_to_read();
      const Summary s = measure([&] {
        tc = dot(ta, tb);
        tc.wait_to_read();
      });
      add_time(g, name, "deft", t, size, "ms", s);
      add(g, name + " GFLOP/s", "deft", t, size, "GFLOP/s", flop / s.median / 1e9, flop / s.min / 1e9);
      const auto v = tc.to_vector();
      add(g, "rel. error vs double", "deft", t, size, "relerr", rel_error(pa, pb, v.data(), m, k, n),
          rel_error(pa, pb, v.data(), m, k, n));
    }
#if DEFT_BENCH_HAVE_OPENBLAS
    {
      set_blas_threads(t);
      const Summary s = measure([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0f, pa, int(k), pb, int(n),
                    0.0f, pc, int(n));
      });
      add_time(g, name, "openblas", t, size, "ms", s);
      add(g, name + " GFLOP/s", "openblas", t, size, "GFLOP/s", flop / s.median / 1e9, flop / s.min / 1e9);
      if (t == thread_counts.front())
        add(g, "rel. error vs double", "openblas", t, size, "relerr", rel_error(pa, pb, pc, m, k, n),
            rel_error(pa, pb, pc, m, k, n));
    }
#else
    skip(g, "openblas", "OpenBLAS not found");
#endif
#if DEFT_BENCH_HAVE_EIGEN
    {
      using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::Map<const RowMat> ea(pa, m, k), eb(pb, k, n);
      Eigen::Map<RowMat> ec(pc, m, n);
      set_eigen_threads(t);
      set_omp_threads(t);
      const Summary s = measure([&] { ec.noalias() = ea * eb; });
      add_time(g, name, "eigen", t, size, "ms", s);
      add(g, name + " GFLOP/s", "eigen", t, size, "GFLOP/s", flop / s.median / 1e9, flop / s.min / 1e9);
    }
#else
    skip(g, "eigen", "Eigen3 not found");
#endif
#if DEFT_BENCH_HAVE_TORCH
    {
      torch_peer::set_threads(t);
      set_blas_threads(t);
      const Summary s = torch_peer::matmul(pa, pb, m, k, n, pc);
      add_time(g, name, "torch", t, size, "ms", s);
      add(g, name + " GFLOP/s", "torch", t, size, "GFLOP/s", flop / s.median / 1e9, flop / s.min / 1e9);
    }
#else
    skip(g, "torch", "libtorch not found");
#endif
  }
  const int all = hardware_threads();
  set_blas_threads(all);
  set_eigen_threads(all);
  set_omp_threads(all);
}

}  // namespace

void bench_gemm() {
  const int all = hardware_threads();
  std::vector<int> many{all}, both{1, all};
  if (all == 1) both = many;
  gemm_case(512, 512, 512, many);
  gemm_case(2000, 2000, 2000, both);
  gemm_case(4096, 4096, 4096, many);
  gemm_case(1024, 512, 2048, many);
  gemm_case(1024, 2048, 512, many);
}

}  // namespace bench
