// elementwise: the fused expression y = a*b + c*2 - max(d, 0) in float32 on
// n = 2^24 (memory bound: 4 reads and 1 write per element) and n = 4096
// (in cache: what a statement costs end to end), 1 thread and all threads,
// against a hand-written loop, the same with OpenMP, Eigen (ArrayXf; Tensor
// with its ThreadPoolDevice), xtensor and libtorch eager; and the STREAM
// triad a = b + s*c, the memory-bandwidth limit. At n = 4096 a second deft
// row runs the statement from an expression built once (deft-prebuilt).
#include "common.hpp"

#include "peers.hpp"

namespace bench {

void check_same(const char* group, const std::string& what, const float* x, const float* y, std::size_t n,
                double tol) {
  const double d = max_rel_diff(x, y, n);
  if (d > tol) std::printf("%-12s WARNING: %s differs from deft by %.3g\n", group, what.c_str(), d);
}

namespace {

void fused_rows(std::int64_t n) {
  using namespace deft;
  const char* g = "elementwise";
  const std::string name = "fused a*b+c*2-max(d,0)";
  const std::string size = std::to_string(n);
  const bool small = n <= 65536;
  // Small sizes: one timed call evaluates the expression `inner` times.
  const int inner = small ? 2000 : 1;
  const std::string unit = small ? "us" : "ms";
  const int all = hardware_threads();

  random::seed(42);
  auto ta = random::uniform<float>(-1, 1, {n}), tb = random::uniform<float>(-1, 1, {n});
  auto tc = random::uniform<float>(-1, 1, {n}), td = random::uniform<float>(-1, 1, {n});
  const FloatBuf a(values_of(ta)), b(values_of(tb)), c(values_of(tc)), d(values_of(td));
  FloatBuf y(n), ref(n);
  const float *pa = a.data(), *pb = b.data(), *pc = c.data(), *pd = d.data();
  float* py = y.data();

  for (int t : {1, all}) {
    if (t == 1 && all == 1) continue;
    DeftThreads threads(t);
    // deft's statement and the single-threaded peers, each a call of `inner`
    // evaluations. At the small size they are timed in alternation: that is
    // the row whose ratio is a target, and its calls are short.
    struct Run {
      std::string library;
      std::function<void()> f;
      std::string check;  // what check_same calls it ("": deft itself)
      bool writes_ty = false;  // its result is in ty, not in y
    };
    Tensor<float> ty = ta * tb + tc * 2 - maximum(td, 0);
    ty.wait_to_read();
    std::vector<Run> runs;
    // Each statement is recorded and then run by the sync point that follows
    // (on the waiting thread, split across the workers when the cost model says so).
    runs.push_back({"deft", [&] {
                      for (int i = 0; i < inner; ++i) {
                        ty = ta * tb + tc * 2 - maximum(td, 0);
                        ty.wait_to_read();
                      }
                    }, ""});
    // The same statement with its expression built once, outside the loop:
    // the difference to deft's row is what building the tree costs (each
    // leaf a snapshot of its tensor, each node moved into its parent).
    if (small && t == 1)
      runs.push_back({"deft-prebuilt", [&, prebuilt = ta * tb + tc * 2 - maximum(td, 0)] {
                        for (int i = 0; i < inner; ++i) {
                          ty = prebuilt;
                          ty.wait_to_read();
                        }
                      }, "deft, expression built once", true});
    if (t == 1) {
      runs.push_back({"hand", [&] {
                        for (int i = 0; i < inner; ++i) {
                          for (std::int64_t j = 0; j < n; ++j) py[j] = pa[j] * pb[j] + pc[j] * 2 - std::max(pd[j], 0.0f);
                          clobber(py);
                        }
                      }, "hand loop"});
#if DEFT_BENCH_HAVE_EIGEN
      runs.push_back({"eigen-array", [&] {  // Eigen's Array expressions run on the calling thread only
                        Eigen::Map<const Eigen::ArrayXf> ea(pa, n), eb(pb, n), ec(pc, n), ed(pd, n);
                        Eigen::Map<Eigen::ArrayXf> ey(py, n);
                        for (int i = 0; i < inner; ++i) {
                          ey = ea * eb + ec * 2.0f - ed.max(0.0f);
                          clobber(py);
                        }
                      }, "Eigen ArrayXf"});
      runs.push_back({"eigen-tensor", [&] {
                        using TM = Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>>;
                        TM xa(pa, n), xb(pb, n), xc(pc, n), xd(pd, n);
                        Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>> xy(py, n);
                        for (int i = 0; i < inner; ++i) {
                          xy = xa * xb + xc * 2.0f - xd.cwiseMax(0.0f);
                          clobber(py);
                        }
                      }, "Eigen Tensor"});
#endif
#if DEFT_BENCH_HAVE_XTENSOR
      // xtensor evaluates on the calling thread (no TBB/OpenMP backend here).
      runs.push_back({"xtensor", [&] {
                        std::vector<std::size_t> shape{std::size_t(n)};
                        auto xa = xt::adapt(pa, std::size_t(n), xt::no_ownership(), shape);
                        auto xb = xt::adapt(pb, std::size_t(n), xt::no_ownership(), shape);
                        auto xc = xt::adapt(pc, std::size_t(n), xt::no_ownership(), shape);
                        auto xd = xt::adapt(pd, std::size_t(n), xt::no_ownership(), shape);
                        auto xy = xt::adapt(py, std::size_t(n), xt::no_ownership(), shape);
                        for (int i = 0; i < inner; ++i) {
                          xy = xa * xb + xc * 2.0f - xt::maximum(xd, 0.0f);
                          clobber(py);
                        }
                      }, "xtensor"});
#endif
    }
    std::vector<Summary> times;
    if (small) {
      std::vector<std::function<void()>> fs;
      for (const auto& r : runs) fs.push_back(r.f);
      times = measure_interleaved(fs);
    } else {
      for (const auto& r : runs) times.push_back(measure(r.f));
    }
    for (std::size_t k = 0; k < runs.size(); ++k) {
      add_time(g, name, runs[k].library, t, size, unit, times[k], inner);
      if (runs[k].check.empty()) {  // deft: the reference of the others
        const auto v = ty.to_vector();
        std::copy(v.begin(), v.end(), ref.data());
        if (!small)
          add(g, name + " GB/s", "deft", t, size, "GB/s", 5.0 * 4 * n / times[k].median / 1e9,
              5.0 * 4 * n / times[k].min / 1e9);
      } else {
        runs[k].f();  // its own result, for the check
        check_same(g, runs[k].check, runs[k].writes_ty ? values_of(ty).data() : py, ref.data(), n);
      }
    }
#if DEFT_BENCH_HAVE_OPENMP
    {
      set_omp_threads(t);
      const Summary s = measure([&] {
        for (int i = 0; i < inner; ++i) {
#pragma omp parallel for schedule(static)
          for (std::int64_t j = 0; j < n; ++j) py[j] = pa[j] * pb[j] + pc[j] * 2 - std::max(pd[j], 0.0f);
          clobber(py);
        }
      });
      add_time(g, name, "hand-omp", t, size, unit, s, inner);
      check_same(g, "hand OpenMP loop", py, ref.data(), n);
      if (!small) add(g, name + " GB/s", "hand-omp", t, size, "GB/s", 5.0 * 4 * n / s.median / 1e9, 5.0 * 4 * n / s.min / 1e9);
    }
#else
    skip(g, "hand-omp", "built without OpenMP");
#endif
#if DEFT_BENCH_HAVE_EIGEN
    if (t > 1) {  // Eigen Tensor with its thread pool
      using TM = Eigen::TensorMap<Eigen::Tensor<const float, 1, Eigen::RowMajor>>;
      TM xa(pa, n), xb(pb, n), xc(pc, n), xd(pd, n);
      Eigen::TensorMap<Eigen::Tensor<float, 1, Eigen::RowMajor>> xy(py, n);
      Eigen::ThreadPool pool(t);
      Eigen::ThreadPoolDevice dev(&pool, t);
      const Summary s = measure([&] {
        for (int i = 0; i < inner; ++i) {
          xy.device(dev) = xa * xb + xc * 2.0f - xd.cwiseMax(0.0f);
          clobber(py);
        }
      });
      add_time(g, name, "eigen-tensor", t, size, unit, s, inner);
      check_same(g, "Eigen Tensor", py, ref.data(), n);
    }
#else
    skip(g, "eigen", "Eigen3 not found");
#endif
#if !DEFT_BENCH_HAVE_XTENSOR
    skip(g, "xtensor", "xtensor not found");
#endif
#if DEFT_BENCH_HAVE_TORCH
    {
      torch_peer::set_threads(t);
      const Summary s = torch_peer::fused(pa, pb, pc, pd, n, inner, py);
      add_time(g, name, "torch", t, size, unit, s, inner);
      check_same(g, "libtorch", py, ref.data(), n);
    }
#else
    skip(g, "torch", "libtorch not found");
#endif
#if DEFT_BENCH_HAVE_OPENMP
    if (!small) {
      // STREAM triad a = b + s*c (2 reads, 1 write): what the memory system gives.
      FloatBuf out(n);
      float* po = out.data();
      set_omp_threads(t);
      volatile float sv = 3.0f;
      const float scalar = sv;
      const Summary s = measure([&] {
#pragma omp parallel for schedule(static)
        for (std::int64_t j = 0; j < n; ++j) po[j] = pb[j] + scalar * pc[j];
        clobber(po);
      });
      add_time(g, "stream triad a=b+s*c", "hand-omp", t, size, "ms", s);
      add(g, "stream triad GB/s", "hand-omp", t, size, "GB/s", 3.0 * 4 * n / s.median / 1e9, 3.0 * 4 * n / s.min / 1e9);
    }
#endif
  }
  set_omp_threads(all);
}

}  // namespace

void bench_elementwise() {
  fused_rows(std::int64_t(1) << 24);
  fused_rows(4096);
}

}  // namespace bench
