// reduce: the sum of 2^24 float32 values, and sums along each axis of a
// 4096 x 4096 matrix (axis 0: one sum per column; axis 1: one per row), all
// threads. Eigen Tensor runs on its ThreadPoolDevice; Eigen's Array, xtensor
// and the hand loop on one thread (the hand loop with OpenMP as well).
// deft on one thread is timed in alternation with Eigen's Array, and the
// sum of 2^24 on all threads with Eigen Tensor: these rows run at the
// memory's rate, which drifts on a shared machine. Every peer reads deft's
// own memory (storage_of).
#include "common.hpp"

#include <cmath>

#include "peers.hpp"

namespace bench {

namespace {

void check_sum(const char* g, const std::string& who, double got, double want) {
  if (std::abs(got - want) > 1e-3 * std::max(1.0, std::abs(want)))
    std::printf("%-12s WARNING: %s sum %.8g, deft %.8g\n", g, who.c_str(), got, want);
}

void sum_all_rows() {
  using namespace deft;
  const char* g = "reduce";
  const std::int64_t n = std::int64_t(1) << 24;
  const std::string size = std::to_string(n), name = "sum all";
  const int all = hardware_threads();
  random::seed(11);
  auto tx = random::uniform<float>(0, 1, {n});
  const float* px = storage_of(tx);  // the peers read deft's own memory
  float result = 0;
#if DEFT_BENCH_HAVE_EIGEN
  Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>> et(px, n);
  Eigen::Tensor<float, 0, Eigen::RowMajor> eigen_out;
  Eigen::ThreadPool pool(all);
  Eigen::ThreadPoolDevice dev(&pool, all);
#endif
  for (int t : {1, all}) {
    if (t == 1 && all == 1) continue;
    DeftThreads threads(t);
    auto deft_sum = [&] { result = sum(tx).item(); };
#if DEFT_BENCH_HAVE_EIGEN
    // deft and its Eigen peer in alternation (Eigen's Array on one thread,
    // Eigen Tensor's pool on all): both read the 64 MiB at the memory's
    // rate, so timed apart the VM's drift between the two measurements
    // would decide the ratio.
    Eigen::Map<const Eigen::ArrayXf> ea(px, n);
    float r = 0;
    const auto s = measure_interleaved({deft_sum, [&] {
                                          if (t == all) {
                                            eigen_out.device(dev) = et.sum();
                                            r = eigen_out();
                                          } else {
                                            r = ea.sum();
                                          }
                                          clobber(&r);
                                        }});
    add_time(g, name, "deft", t, size, "ms", s[0]);
    add_time(g, name, t == all ? "eigen-tensor" : "eigen-array", t, size, "ms", s[1]);
    check_sum(g, t == all ? "Eigen Tensor" : "Eigen ArrayXf", r, result);
#else
    add_time(g, name, "deft", t, size, "ms", measure(deft_sum));
#endif
  }
  const double want = result;
  {
    float r = 0;
    add_time(g, name, "hand", 1, size, "ms", measure([&] {
               float acc = 0;
               for (std::int64_t i = 0; i < n; ++i) acc += px[i];  // no -ffast-math: a scalar chain
               r = acc;
               clobber(&r);
             }));
    check_sum(g, "hand", r, want);
#if DEFT_BENCH_HAVE_OPENMP
    set_omp_threads(all);
    add_time(g, name, "hand-omp", all, size, "ms", measure([&] {
               float acc = 0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
               for (std::int64_t i = 0; i < n; ++i) acc += px[i];
               r = acc;
               clobber(&r);
             }));
    check_sum(g, "hand-omp", r, want);
#endif
  }
#if !DEFT_BENCH_HAVE_EIGEN
  skip(g, "eigen", "Eigen3 not found");
#endif
#if DEFT_BENCH_HAVE_XTENSOR
  {
    auto xx = xt::adapt(px, std::size_t(n), xt::no_ownership(), std::vector<std::size_t>{std::size_t(n)});
    float r = 0;
    add_time(g, name, "xtensor", 1, size, "ms", measure([&] {
               r = xt::sum(xx)();
               clobber(&r);
             }));
    check_sum(g, "xtensor", r, want);
  }
#else
  skip(g, "xtensor", "xtensor not found");
#endif
#if DEFT_BENCH_HAVE_TORCH
  {
    torch_peer::set_threads(all);
    double r = 0;
    add_time(g, name, "torch", all, size, "ms", torch_peer::sum_all(px, n, &r));
    check_sum(g, "libtorch", r, want);
  }
#else
  skip(g, "torch", "libtorch not found");
#endif
}

void sum_axis_rows() {
  using namespace deft;
  const char* g = "reduce";
  constexpr std::int64_t N = 4096;
  const std::string size = "4096x4096";
  const int all = hardware_threads();
  random::seed(12);
  auto tx = random::uniform<float>(0, 1, {N, N});
  const float* px = storage_of(tx);  // the peers read deft's own memory
  FloatBuf out(N), ref(N);
  for (int axis : {0, 1}) {
    const std::string name = "sum axis " + std::to_string(axis);
    Tensor<float> ts;
    float* po = out.data();
#if DEFT_BENCH_HAVE_EIGEN
    using RowArr = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const RowArr> ea(px, N, N);
    const auto eigen_array = [&] {
      if (axis == 0) Eigen::Map<Eigen::Array<float, 1, Eigen::Dynamic>>(po, N) = ea.colwise().sum();
      else Eigen::Map<Eigen::Array<float, Eigen::Dynamic, 1>>(po, N) = ea.rowwise().sum();
      clobber(po);
    };
#endif
    for (int t : {1, all}) {
      if (t == 1 && all == 1) continue;
      DeftThreads threads(t);
      const auto deft_sum = [&] {
        ts = sum(tx, axis);
        ts.wait_to_read();
      };
#if DEFT_BENCH_HAVE_EIGEN
      if (t == 1) {  // with Eigen's Array in alternation: both run at the memory's rate (see sum all)
        const auto s = measure_interleaved({deft_sum, eigen_array});
        add_time(g, name, "deft", t, size, "ms", s[0]);
        add_time(g, name, "eigen-array", 1, size, "ms", s[1]);
        continue;
      }
#endif
      deft_sum();
      add_time(g, name, "deft", t, size, "ms", measure(deft_sum));
    }
    const auto v = ts.to_vector();
    std::copy(v.begin(), v.end(), ref.data());
#if DEFT_BENCH_HAVE_EIGEN
    eigen_array();
    check_same(g, "Eigen Array " + name, po, ref.data(), N, 1e-4);
#endif
#if DEFT_BENCH_HAVE_OPENMP
    set_omp_threads(all);
    add_time(g, name, "hand-omp", all, size, "ms", measure([&] {
               if (axis == 1) {
#pragma omp parallel for schedule(static)
                 for (std::int64_t i = 0; i < N; ++i) {
                   float acc = 0;
#pragma omp simd reduction(+ : acc)
                   for (std::int64_t j = 0; j < N; ++j) acc += px[i * N + j];
                   po[i] = acc;
                 }
               } else {
#pragma omp parallel for schedule(static)
                 for (std::int64_t j0 = 0; j0 < N; j0 += 256) {
                   for (std::int64_t j = j0; j < j0 + 256; ++j) po[j] = 0;
                   for (std::int64_t i = 0; i < N; ++i)
#pragma omp simd
                     for (std::int64_t j = j0; j < j0 + 256; ++j) po[j] += px[i * N + j];
                 }
               }
               clobber(po);
             }));
    check_same(g, "hand-omp " + name, po, ref.data(), N, 1e-4);
#endif
#if DEFT_BENCH_HAVE_EIGEN
    {
      Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor>> et(px, N, N);
      Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>> eo(po, N);
      Eigen::ThreadPool pool(all);
      Eigen::ThreadPoolDevice dev(&pool, all);
      const Eigen::array<Eigen::Index, 1> ax{axis};
      add_time(g, name, "eigen-tensor", all, size, "ms", measure([&] {
                 eo.device(dev) = et.sum(ax);
                 clobber(po);
               }));
      check_same(g, "Eigen Tensor " + name, po, ref.data(), N, 1e-4);
    }
#endif
#if DEFT_BENCH_HAVE_XTENSOR
    {
      auto xx = xt::adapt(px, std::size_t(N * N), xt::no_ownership(), std::vector<std::size_t>{std::size_t(N), std::size_t(N)});
      auto xo = xt::adapt(po, std::size_t(N), xt::no_ownership(), std::vector<std::size_t>{std::size_t(N)});
      add_time(g, name, "xtensor", 1, size, "ms", measure([&] {
                 xo = xt::sum(xx, {std::size_t(axis)});
                 clobber(po);
               }));
      check_same(g, "xtensor " + name, po, ref.data(), N, 1e-4);
    }
#endif
#if DEFT_BENCH_HAVE_TORCH
    torch_peer::set_threads(all);
    add_time(g, name, "torch", all, size, "ms", torch_peer::sum_axis(px, N, N, axis));
#endif
  }
}

}  // namespace

void bench_reduce() {
  sum_all_rows();
  sum_axis_rows();
}

}  // namespace bench
