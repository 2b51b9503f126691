// broadcast: a bias row added to every row (x + b, b of shape (2048)), every
// row scaled by its own factor (x * s, s of shape (1024, 1)), on 1024 x 2048
// float32, and a row-wise softmax. All threads; Eigen's Array and xtensor run
// on one thread (they have no thread pool for these), Eigen Tensor uses its
// ThreadPoolDevice.
#include "common.hpp"

#include "peers.hpp"

namespace bench {

void bench_broadcast() {
  using namespace deft;
  const char* g = "broadcast";
  constexpr std::int64_t R = 1024, C = 2048;
  const std::string size = "1024x2048";
  const int all = hardware_threads();
  random::seed(7);
  auto tx = random::uniform<float>(-4, 4, {R, C});
  auto tb = random::uniform<float>(-1, 1, {C});
  auto ts = random::uniform<float>(-1, 1, {R, 1});
  FloatBuf y(R * C), ref(R * C);
  // The peers read deft's own tensors (storage_of): copies would add 8 MiB
  // to what the rows' alternation keeps in this machine's 32 MiB L3.
  const float *px = storage_of(tx), *pb = storage_of(tb), *ps = storage_of(ts);
  float* py = y.data();

  const std::string bias = "bias add x+b (row vector)", scale = "scale x*s (column)", soft = "softmax rows";

  // The bias add on all threads, by deft and by OpenMP: blocks of calls in
  // alternation (measure_interleaved), each pool's threads awake as in a
  // loop of such statements, and OpenMP's put to sleep before each block
  // (else they spin beside deft's for milliseconds: the parallel group
  // measures that). Timed apart, as the other rows are, the VM's phases and
  // OpenMP's threads spinning after other peers moved this row's ratio from
  // 1.05 to 3.8 between runs.
  Tensor<float> ty = tx + tb;
  const auto deft_bias = [&] {
    ty = tx + tb;
    ty.wait_to_read();
  };
#if DEFT_BENCH_HAVE_OPENMP
  constexpr bool with_omp = true;
  if (all > 1) {
    DeftThreads threads(all);
    set_omp_threads(all);
    const auto s = measure_interleaved({deft_bias, [&] {
#pragma omp parallel for schedule(static)
                                          for (std::int64_t i = 0; i < R; ++i)
                                            for (std::int64_t j = 0; j < C; ++j) py[i * C + j] = px[i * C + j] + pb[j];
                                          clobber(py);
                                        }},
                                       20, pause_omp_threads);
    add_time(g, bias, "deft", all, size, "ms", s[0]);
    add_time(g, bias, "hand-omp", all, size, "ms", s[1]);
  }
#else
  constexpr bool with_omp = false;
#endif
  // --- deft: one worker, then all workers (the default engine) ---
  for (int t : {1, all}) {
    if (t == 1 && all == 1) continue;
    DeftThreads threads(t);
    ty.wait_to_read();
    if (t == 1 || !with_omp) add_time(g, bias, "deft", t, size, "ms", measure(deft_bias));
    ty = tx * ts;
    ty.wait_to_read();
    add_time(g, scale, "deft", t, size, "ms", measure([&] {
               ty = tx * ts;
               ty.wait_to_read();
             }));
    Tensor<float> sm;
    // deft's op, as libtorch's row is at::softmax (the peers without one
    // compose max, exp and sum).
    auto softmax = [&] {
      sm = deft::softmax(tx, 1);
      sm.wait_to_read();
    };
    add_time(g, soft, "deft", t, size, "ms", measure(softmax));
    const auto v = sm.to_vector();
    std::copy(v.begin(), v.end(), ref.data());
  }
  // hand: bias add, one thread and OpenMP
  {
    auto loop = [&] {
      for (std::int64_t i = 0; i < R; ++i)
        for (std::int64_t j = 0; j < C; ++j) py[i * C + j] = px[i * C + j] + pb[j];
      clobber(py);
    };
    add_time(g, bias, "hand", 1, size, "ms", measure(loop));
  }
#if DEFT_BENCH_HAVE_EIGEN
  {
    using RowArr = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const RowArr> ex(px, R, C);
    Eigen::Map<const Eigen::Array<float, 1, Eigen::Dynamic>> eb(pb, C);
    Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, 1>> es(ps, R);
    Eigen::Map<RowArr> ey(py, R, C);
    add_time(g, bias, "eigen-array", 1, size, "ms", measure([&] {
               ey = ex.rowwise() + eb;
               clobber(py);
             }));
    add_time(g, scale, "eigen-array", 1, size, "ms", measure([&] {
               ey = ex.colwise() * es;
               clobber(py);
             }));
    RowArr e(R, C);
    add_time(g, soft, "eigen-array", 1, size, "ms", measure([&] {
               const Eigen::Array<float, Eigen::Dynamic, 1> m = ex.rowwise().maxCoeff();
               e = (ex.colwise() - m).exp();
               const Eigen::Array<float, Eigen::Dynamic, 1> z = e.rowwise().sum();
               ey = e.colwise() / z;
               clobber(py);
             }));
    check_same(g, "Eigen softmax", py, ref.data(), R * C, 1e-5);

    using TM = Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor>>;
    TM tx2(px, R, C), tb2(pb, 1, C), ts2(ps, R, 1);
    Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor>> ty2(py, R, C);
    Eigen::ThreadPool pool(all);
    Eigen::ThreadPoolDevice dev(&pool, all);
    const Eigen::array<Eigen::Index, 2> by_rows{R, 1}, by_cols{1, C};
    add_time(g, bias, "eigen-tensor", all, size, "ms", measure([&] {
               ty2.device(dev) = tx2 + tb2.broadcast(by_rows);
               clobber(py);
             }));
    add_time(g, scale, "eigen-tensor", all, size, "ms", measure([&] {
               ty2.device(dev) = tx2 * ts2.broadcast(by_cols);
               clobber(py);
             }));
    Eigen::Tensor<float, 2, Eigen::RowMajor> te(R, C), tm(R, 1), tz(R, 1);
    const Eigen::array<Eigen::Index, 1> axis1{1};
    const Eigen::array<Eigen::Index, 2> keep{R, 1};
    add_time(g, soft, "eigen-tensor", all, size, "ms", measure([&] {
               tm.device(dev) = tx2.maximum(axis1).reshape(keep);
               te.device(dev) = (tx2 - tm.broadcast(by_cols)).exp();
               tz.device(dev) = te.sum(axis1).reshape(keep);
               ty2.device(dev) = te / tz.broadcast(by_cols);
               clobber(py);
             }));
    check_same(g, "Eigen Tensor softmax", py, ref.data(), R * C, 1e-5);
  }
#else
  skip(g, "eigen", "Eigen3 not found");
#endif
#if DEFT_BENCH_HAVE_XTENSOR
  {
    const std::vector<std::size_t> s2{std::size_t(R), std::size_t(C)}, s1{std::size_t(C)}, sc{std::size_t(R), 1};
    auto xx = xt::adapt(px, std::size_t(R * C), xt::no_ownership(), s2);
    auto xb = xt::adapt(pb, std::size_t(C), xt::no_ownership(), s1);
    auto xs = xt::adapt(ps, std::size_t(R), xt::no_ownership(), sc);
    auto xy = xt::adapt(py, std::size_t(R * C), xt::no_ownership(), s2);
    add_time(g, bias, "xtensor", 1, size, "ms", measure([&] {
               xy = xx + xb;
               clobber(py);
             }));
    add_time(g, scale, "xtensor", 1, size, "ms", measure([&] {
               xy = xx * xs;
               clobber(py);
             }));
    xt::xtensor<float, 2> e({std::size_t(R), std::size_t(C)});
    add_time(g, soft, "xtensor", 1, size, "ms", measure([&] {
               const xt::xtensor<float, 2> m = xt::amax(xx, {1}, xt::keep_dims);
               e = xt::exp(xx - m);
               const xt::xtensor<float, 2> z = xt::sum(e, {1}, xt::keep_dims);
               xy = e / z;
               clobber(py);
             }));
    check_same(g, "xtensor softmax", py, ref.data(), R * C, 1e-5);
  }
#else
  skip(g, "xtensor", "xtensor not found");
#endif
#if DEFT_BENCH_HAVE_TORCH
  torch_peer::set_threads(all);
  add_time(g, bias, "torch", all, size, "ms", torch_peer::bias_add(px, pb, R, C));
  add_time(g, scale, "torch", all, size, "ms", torch_peer::col_scale(px, ps, R, C));
  add_time(g, soft, "torch", all, size, "ms", torch_peer::softmax(px, R, C, py));
  check_same(g, "libtorch softmax", py, ref.data(), R * C, 1e-5);
#else
  skip(g, "torch", "libtorch not found");
#endif
}

}  // namespace bench
