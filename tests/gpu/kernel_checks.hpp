// The checks of deft's GPU evaluators (eval/gpu/), written once
// for any memory: `Mem` supplies the Thrust policy, copies of the operands
// and room for results. The CPU-only runner (test_kernels_host.cpp) passes
// thrust::cpp::par and host vectors, so CI checks the functors' index
// arithmetic and reduction order without a GPU; the gpu-labelled runner
// (test_kernels_device.cu) passes a CUDA stream and device memory. Every
// result is compared with a naive double-precision loop on random inputs.
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <deft/deft.hpp>
#include <deft/eval/gpu/elementwise.hpp>
#include <deft/eval/gpu/gemm.hpp>
#include <deft/eval/gpu/permute.hpp>
#include <deft/eval/gpu/random.hpp>
#include <deft/eval/gpu/reduce.hpp>

namespace gpu_checks {

using deft::Shape;
using deft::Tensor;
using i64 = std::int64_t;
namespace gk = deft::detail::gpu;

template <class T>
std::vector<T> values(const Tensor<T>& t) {
  return t.to_vector();
}

/// The element functor of expression e with every leaf repointed into `mem`
/// (each leaf must be one of the tensors mirrored with mem.mirror()).
template <class Mem, class Expr>
auto elements_in(Mem& mem, const Expr& e) {
  auto el = gk::element_at(e);
  el.view.for_each_leaf([&](auto& leaf) {
    leaf.data = mem.translate(leaf.data);
    leaf.row = leaf.data;
  });
  return el;
}

/// Result of evaluating e through the GPU evaluator, back on the host.
template <class Mem, class Expr, class T = deft::detail::value_t<Expr>>
std::vector<T> evaluated(Mem& mem, const Expr& e) {
  const i64 n = e.shape().size();
  T* out = mem.template make<T>(n);
  gk::for_each_output(mem.policy(), n, elements_in(mem, e), out);
  return mem.get(out, n);
}

inline double rel_err(double got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1;
  return std::abs(got - want) / std::max(1.0, std::abs(want));
}

template <class T>
void expect_close(const std::vector<T>& got, const std::vector<double>& want, double tol) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (rel_err(double(got[i]), want[i]) > tol)
      BOOST_FAIL("element " << i << ": got " << got[i] << ", want " << want[i] << " (tolerance " << tol << ")");
}

/// Fused tree with broadcasting (a row vector and a column) on a 3-D shape.
template <class Mem>
void fused_broadcast(Mem& mem) {
  deft::random::seed(7);
  auto a = deft::random::uniform<float>(-2, 2, {3, 5, 7}), b = deft::random::uniform<float>(-2, 2, {7});
  auto c = deft::random::uniform<float>(-2, 2, {3, 5, 1});
  mem.mirror(a), mem.mirror(b), mem.mirror(c);
  const auto got = evaluated(mem, a * b + c * 2.0f - deft::maximum(a, 0.0f));
  const auto va = values(a), vb = values(b), vc = values(c);
  std::vector<double> want(va.size());
  for (i64 i = 0; i < 3; ++i)
    for (i64 j = 0; j < 5; ++j)
      for (i64 k = 0; k < 7; ++k) {
        const i64 e = (i * 5 + j) * 7 + k;
        want[e] = double(va[e]) * vb[k] + double(vc[i * 5 + j]) * 2 - std::max(double(va[e]), 0.0);
      }
  expect_close(got, want, 1e-6);
}

/// Broadcasts that no dimension merges away: ranks 4 and 5 after
/// collapsing (the per-channel operands of a batch norm are rank 3), each
/// element and a sum along an inner axis against a double loop.
template <class Mem>
void high_rank_broadcast(Mem& mem) {
  deft::random::seed(11);
  for (const Shape& shape : {Shape{3, 4, 5, 6}, Shape{2, 3, 4, 5, 7}}) {
    const int r = shape.rank();
    Shape every_other = shape, the_rest = shape;  // broadcast along dimensions 1, 3, ... and 0, 2, ...
    for (int d = 0; d < r; ++d) (d % 2 ? every_other : the_rest)[d] = 1;
    auto a = deft::random::uniform<float>(-2, 2, shape), b = deft::random::uniform<float>(-2, 2, every_other);
    auto c = deft::random::uniform<float>(-2, 2, the_rest);
    mem.mirror(a), mem.mirror(b), mem.mirror(c);
    const auto e = a * b - c;
    auto v = e.view(e.shape());
    BOOST_TEST(deft::detail::collapse(v, e.shape()).rank() == r);
    const auto va = values(a), vb = values(b), vc = values(c);
    const i64 n = shape.size();
    std::vector<double> want(n);
    for (i64 i = 0; i < n; ++i) {
      i64 rest = i, ib = 0, ic = 0, sb = 1, sc = 1;
      for (int d = r - 1; d >= 0; --d) {
        const i64 x = rest % shape[d];
        rest /= shape[d];
        if (every_other[d] > 1) ib += x * sb, sb *= shape[d];
        if (the_rest[d] > 1) ic += x * sc, sc *= shape[d];
      }
      want[i] = double(va[i]) * vb[ib] - vc[ic];
    }
    BOOST_TEST_CONTEXT("shape " << shape.to_string()) {
      expect_close(evaluated(mem, e), want, 1e-6);
      const deft::detail::AxisSplit g(shape, r - 2);
      std::vector<double> sum(g.outer * g.inner, 0);
      for (i64 o = 0; o < g.outer; ++o)
        for (i64 j = 0; j < g.len; ++j)
          for (i64 k = 0; k < g.inner; ++k) sum[o * g.inner + k] += double(float(want[(o * g.len + j) * g.inner + k]));
      float* out = mem.template make<float>(g.outer * g.inner);
      float* scratch = mem.template make<float>(std::max<i64>(gk::AxisPlan(g).scratch(), 1));
      gk::reduce_axis_elements<deft::detail::SumReducer<float>>(mem.policy(), elements_in(mem, e), g, out, scratch);
      expect_close(mem.get(out, g.outer * g.inner), sum, 1e-5);
    }
  }
}

/// float64, a transcendental function and a column broadcast along rows.
template <class Mem>
void double_column_broadcast(Mem& mem) {
  deft::random::seed(8);
  auto a = deft::random::uniform<double>(-1, 1, {6, 9}), b = deft::random::uniform<double>(-1, 1, {6, 1});
  mem.mirror(a), mem.mirror(b);
  const auto got = evaluated(mem, deft::exp(a) * b);
  const auto va = values(a), vb = values(b);
  std::vector<double> want(va.size());
  for (i64 i = 0; i < 6; ++i)
    for (i64 j = 0; j < 9; ++j) want[i * 9 + j] = std::exp(va[i * 9 + j]) * vb[i];
  expect_close(got, want, 1e-12);
}

/// Sum, mean, max, min and norm of every element: sizes that take one
/// pass (no scratch), two, and partials merged in more than one pass.
template <class Mem>
void reduce_all(Mem& mem) {
  std::vector<int> passes;
  for (const i64 n : {i64(1), i64(1000), i64(65536 + 77), i64(300001)}) {
    int k = 1;
    for (gk::AxisPlan p(gk::whole(n)); p.chunks > 1; p = gk::AxisPlan(p.merge_split())) ++k;
    passes.push_back(k);
    deft::random::seed(9 + n);
    auto x = deft::random::uniform<float>(-1, 1, {n});
    mem.mirror(x);
    const auto vx = values(x);
    double s = 0, sq = 0, mx = -INFINITY, mn = INFINITY;
    for (float v : vx) s += v, sq += double(v) * v, mx = std::max(mx, double(v)), mn = std::min(mn, double(v));
    const auto el = elements_in(mem, x * 1.0f);
    float* out = mem.template make<float>(5);
    float* scratch = mem.template make<float>(std::max<i64>(gk::reduce_scratch(n), 1));
    gk::reduce_elements<deft::detail::SumReducer<float>>(mem.policy(), el, n, out + 0, scratch);
    gk::reduce_elements<deft::detail::MeanReducer<float>>(mem.policy(), el, n, out + 1, scratch);
    gk::reduce_elements<deft::detail::MaxReducer<float>>(mem.policy(), el, n, out + 2, scratch);
    gk::reduce_elements<deft::detail::MinReducer<float>>(mem.policy(), el, n, out + 3, scratch);
    gk::reduce_elements<deft::detail::NormReducer<float>>(mem.policy(), el, n, out + 4, scratch);
    BOOST_TEST_CONTEXT("n = " << n) {
      // float sums of n terms of magnitude <= 1: error grows like sqrt(n) eps
      expect_close(mem.get(out, 5), {s, s / double(n), mx, mn, std::sqrt(sq)}, 1e-4);
    }
  }
  BOOST_TEST(passes == (std::vector<int>{1, 2, 3, 4}), boost::test_tools::per_element());
}

/// Reductions along each axis of 3-D expressions: short axes (one pass),
/// and long axes with few outputs, which AxisPlan cuts into parts merged by
/// later passes (the parts' lengths do not divide the axis; along the last
/// axis the parts interleave; where the partials are many, their merge is
/// split again).
template <class Mem>
void reduce_axes(Mem& mem) {
  deft::random::seed(10);
  int split = 0, deep = 0;
  for (const Shape& shape : {Shape{4, 33, 20}, Shape{3, 2000, 5}, Shape{5001, 3, 1}, Shape{2, 1, 4099},
                            Shape{1, 200003, 1}}) {
    auto x = deft::random::uniform<float>(-1, 1, shape);
    mem.mirror(x);
    const auto vx = values(x);
    for (int axis = 0; axis < 3; ++axis) {
      const deft::detail::AxisSplit g(shape, axis);
      const gk::AxisPlan plan(g);
      split += plan.chunks > 1;
      deep += plan.chunks > 1 && gk::AxisPlan(plan.merge_split()).chunks > 1;
      BOOST_TEST((plan.chunks - 1) * plan.step() < g.len);  // no empty part
      const i64 outputs = g.outer * g.inner;
      std::vector<double> sum(outputs, 0), mean(outputs), norm(outputs, 0), mx(outputs, -INFINITY);
      for (i64 o = 0; o < g.outer; ++o)
        for (i64 j = 0; j < g.len; ++j)
          for (i64 i = 0; i < g.inner; ++i) {
            const double v = double(vx[(o * g.len + j) * g.inner + i] * 3.0f);  // the float product, as evaluated
            sum[o * g.inner + i] += v;
            norm[o * g.inner + i] += v * v;
            mx[o * g.inner + i] = std::max(mx[o * g.inner + i], v);
          }
      for (i64 s = 0; s < outputs; ++s) mean[s] = sum[s] / double(g.len), norm[s] = std::sqrt(norm[s]);
      const auto el = elements_in(mem, x * 3.0f);
      float* out_sum = mem.template make<float>(outputs);
      float* out_mean = mem.template make<float>(outputs);
      float* out_norm = mem.template make<float>(outputs);
      float* out_max = mem.template make<float>(outputs);
      float* scratch = mem.template make<float>(std::max<i64>(plan.scratch(), 1));
      gk::reduce_axis_elements<deft::detail::SumReducer<float>>(mem.policy(), el, g, out_sum, scratch);
      gk::reduce_axis_elements<deft::detail::MeanReducer<float>>(mem.policy(), el, g, out_mean, scratch);
      gk::reduce_axis_elements<deft::detail::NormReducer<float>>(mem.policy(), el, g, out_norm, scratch);
      gk::reduce_axis_elements<deft::detail::MaxReducer<float>>(mem.policy(), el, g, out_max, scratch);
      BOOST_TEST_CONTEXT("shape " << shape.to_string() << ", axis " << axis << ", " << plan.chunks << " runs") {
        expect_close(mem.get(out_sum, outputs), sum, 1e-5);
        expect_close(mem.get(out_mean, outputs), mean, 1e-5);
        expect_close(mem.get(out_norm, outputs), norm, 1e-5);
        expect_close(mem.get(out_max, outputs), mx, 0);
      }
    }
  }
  BOOST_TEST(split == 4);  // the axes 2000, 5001, 4099 and 200003 long
  BOOST_TEST(deep == 2);   // 5001 (3 outputs) and 200003 (one output): partials merged in more than one pass
}

/// Marks the room past a kernel's scratch, to see that nothing lands there.
struct Sentinel {
  DEFT_HD deft::detail::ArgBest<float> operator()(i64) const { return {-1.0f, -7}; }
};

/// Index of the first largest of n values at v[base + j * stride] (the
/// first NaN wins), as numpy's argmax.
inline i64 first_largest(const std::vector<float>& v, i64 base, i64 n, i64 stride) {
  i64 best = 0;
  for (i64 j = 1; j < n; ++j) {
    const float b = v[base + best * stride], x = v[base + j * stride];
    if (!std::isnan(b) && (std::isnan(x) || x > b)) best = j;
  }
  return best;
}

/// argmax: ties go to the first index, the first NaN wins, over all
/// elements (across partials, within reduce_scratch) and along each axis,
/// with long axes split by AxisPlan.
template <class Mem>
void argmax(Mem& mem) {
  const i64 n = 200003;
  std::vector<float> v(n);
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> pick(0, 50);
  for (auto& x : v) x = float(pick(gen));  // many ties
  const Tensor<float> t(v, {n});
  mem.mirror(t);
  auto* out = mem.template make<i64>(1);
  const i64 room = gk::reduce_scratch(n), guard = 4;
  auto* scratch = mem.template make<deft::detail::ArgBest<float>>(room + guard);
  gk::for_each_output(mem.policy(), guard, Sentinel{}, scratch + room);
  gk::argmax_elements(mem.policy(), elements_in(mem, t * 1.0f), n, out, scratch);
  BOOST_TEST(mem.get(out, 1)[0] == first_largest(v, 0, n, 1));

  v[123456] = std::numeric_limits<float>::quiet_NaN();
  v[190000] = std::numeric_limits<float>::quiet_NaN();
  const Tensor<float> with_nan(v, {n});
  mem.mirror(with_nan);
  gk::argmax_elements(mem.policy(), elements_in(mem, with_nan * 1.0f), n, out, scratch);
  BOOST_TEST(mem.get(out, 1)[0] == 123456);
  for (const auto& past : mem.get(scratch + room, guard)) BOOST_TEST(past.index == -7);

  int split = 0, deep = 0;
  for (const Shape& shape : {Shape{5, 40, 3}, Shape{3, 5001, 1}, Shape{2, 3000, 3}, Shape{4099, 2, 1}}) {
    std::vector<float> vx(shape.size());
    for (auto& x : vx) x = float(pick(gen));
    vx[vx.size() / 3] = vx[vx.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    const Tensor<float> x(vx, shape);
    mem.mirror(x);
    for (int axis = 0; axis < 3; ++axis) {
      const deft::detail::AxisSplit g(shape, axis);
      const gk::AxisPlan plan(g);
      split += plan.chunks > 1;
      deep += plan.chunks > 1 && gk::AxisPlan(plan.merge_split()).chunks > 1;
      auto* idx = mem.template make<i64>(g.outer * g.inner);
      auto* parts = mem.template make<deft::detail::ArgBest<float>>(std::max<i64>(plan.scratch(), 1));
      gk::argmax_axis_elements(mem.policy(), elements_in(mem, x * 1.0f), g, idx, parts);
      const auto got = mem.get(idx, g.outer * g.inner);
      BOOST_TEST_CONTEXT("shape " << shape.to_string() << ", axis " << axis << ", " << plan.chunks << " runs") {
        for (i64 o = 0; o < g.outer; ++o)
          for (i64 i = 0; i < g.inner; ++i)
            BOOST_TEST(got[o * g.inner + i] == first_largest(vx, o * g.len * g.inner + i, g.len, g.inner));
      }
    }
  }
  BOOST_TEST(split == 3);  // the axes 5001, 3000 and 4099 long
  BOOST_TEST(deep == 1);   // 5001 along the last axis: partials merged in more than one pass
}

/// Axis permutation of a 3-D tensor.
template <class Mem>
void permute(Mem& mem) {
  deft::random::seed(13);
  const Shape shape{3, 4, 5};
  auto x = deft::random::uniform<float>(-1, 1, shape);
  mem.mirror(x);
  const auto vx = values(x);
  const std::array<int, deft::max_rank> axes{2, 0, 1};
  float* out = mem.template make<float>(60);
  const float* in = mem.translate(gk::element_at(deft::as_expr(x)).view.data);
  gk::permute(mem.policy(), in, shape, axes, out);
  const auto got = mem.get(out, 60);
  for (i64 k = 0; k < 5; ++k)
    for (i64 i = 0; i < 3; ++i)
      for (i64 j = 0; j < 4; ++j) BOOST_TEST(got[(k * 3 + i) * 4 + j] == vx[(i * 4 + j) * 5 + k]);
}

/// Integer products in all four transpositions.
template <class Mem>
void integer_products(Mem& mem) {
  const i64 m = 7, n = 9, k = 11;
  std::mt19937 gen(14);
  std::uniform_int_distribution<int> pick(-20, 20);
  std::vector<std::int32_t> a(m * k), b(k * n);
  for (auto& x : a) x = pick(gen);
  for (auto& x : b) x = pick(gen);
  const Tensor<std::int32_t> ta(a, {i64(a.size())}), tb(b, {i64(b.size())});
  mem.mirror(ta), mem.mirror(tb);
  const auto* da = mem.translate(gk::element_at(deft::as_expr(ta)).view.data);
  const auto* db = mem.translate(gk::element_at(deft::as_expr(tb)).view.data);
  auto* c = mem.template make<std::int32_t>(m * n);
  for (const bool trans_a : {false, true})
    for (const bool trans_b : {false, true}) {
      // Stored layouts: A is m x k (k x m when transposed), B is k x n (n x k).
      gk::naive_gemm(mem.policy(), m, n, k, da, db, c, trans_a, trans_b);
      const auto got = mem.get(c, m * n);
      for (i64 i = 0; i < m; ++i)
        for (i64 j = 0; j < n; ++j) {
          std::int64_t want = 0;
          for (i64 p = 0; p < k; ++p)
            want += std::int64_t(trans_a ? a[p * m + i] : a[i * k + p]) * (trans_b ? b[j * k + p] : b[p * n + j]);
          BOOST_TEST_CONTEXT("trans_a " << trans_a << ", trans_b " << trans_b) { BOOST_TEST(got[i * n + j] == want); }
        }
    }
}

/// The evaluator's random numbers against the CPU's for the same seed and
/// call: uniform float32 and int32, normal float32 and float64, an odd count
/// (the last pair is half written). `exact` (Thrust's C++ backend runs the
/// same host code): bit for bit. On a GPU, whose log, sin and cos and fused
/// multiply-adds may round differently in the last bit: within 4 units in the
/// last place of float32, 1e-14 relative for float64, 1 for int32.
template <class Mem>
void random_numbers(Mem& mem, bool exact) {
  using deft::detail::Distribution;
  constexpr i64 n = 1001;
  const std::uint64_t seed = 4242;
  auto check = [&](auto cpu, auto* out, double tol) {
    const auto want = values(cpu);
    const auto got = mem.get(out, n);
    BOOST_REQUIRE_EQUAL(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double g = double(got[i]), w = double(want[i]);
      if (exact ? g != w : std::abs(g - w) > tol * std::max(1.0, std::abs(w)))
        BOOST_FAIL("random element " << i << ": device " << g << ", CPU " << w);
    }
  };
  deft::random::seed(seed);  // each call below is the first after seeding: stream 0
  auto uf = deft::random::uniform<float>(-3, 5, {n});
  float* f = mem.template make<float>(n);
  gk::fill_random<float, Distribution::uniform>(mem.policy(), f, n, seed, 0, -3, 5);
  check(uf, f, 4 * std::numeric_limits<float>::epsilon());

  deft::random::seed(seed);
  auto ui = deft::random::uniform<std::int32_t>(-100, 100, {n});
  auto* i32 = mem.template make<std::int32_t>(n);
  gk::fill_random<std::int32_t, Distribution::uniform>(mem.policy(), i32, n, seed, 0, -100, 100);
  check(ui, i32, 1.0);

  deft::random::seed(seed);
  auto nf = deft::random::normal<float>(1, 2, {n});
  float* g = mem.template make<float>(n);
  gk::fill_random<float, Distribution::normal>(mem.policy(), g, n, seed, 0, 1, 2);
  check(nf, g, 4 * std::numeric_limits<float>::epsilon());

  deft::random::seed(seed);
  auto nd = deft::random::normal<double>(0, 1, {n});
  double* d = mem.template make<double>(n);
  gk::fill_random<double, Distribution::normal>(mem.policy(), d, n, seed, 0, 0, 1);
  check(nd, d, 1e-14);
}

}  // namespace gpu_checks

/// Registers every check above as a test case run with memory `Mem`.
#define DEFT_GPU_KERNEL_CASES(Mem)                                                                 \
  BOOST_AUTO_TEST_CASE(fused_tree_with_broadcasting) { Mem m; gpu_checks::fused_broadcast(m); }  \
  BOOST_AUTO_TEST_CASE(float64_column_broadcast) { Mem m; gpu_checks::double_column_broadcast(m); } \
  BOOST_AUTO_TEST_CASE(high_rank_broadcasts) { Mem m; gpu_checks::high_rank_broadcast(m); }        \
  BOOST_AUTO_TEST_CASE(full_reductions) { Mem m; gpu_checks::reduce_all(m); }                   \
  BOOST_AUTO_TEST_CASE(reductions_along_each_axis) { Mem m; gpu_checks::reduce_axes(m); }        \
  BOOST_AUTO_TEST_CASE(argmax_ties_and_nan) { Mem m; gpu_checks::argmax(m); }                    \
  BOOST_AUTO_TEST_CASE(axis_permutation) { Mem m; gpu_checks::permute(m); }                      \
  BOOST_AUTO_TEST_CASE(integer_products_all_transpositions) { Mem m; gpu_checks::integer_products(m); } \
  BOOST_AUTO_TEST_CASE(random_numbers_equal_the_cpus) { Mem m; gpu_checks::random_numbers(m, Mem::exact); }
