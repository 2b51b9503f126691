// Elementwise operations on float32/float64 against a naive double-precision
// reference: every operator and function, with tensors and scalars on both
// sides, NaN/infinity handling and cast<U>.
#include <tuple>

#include "common.hpp"

using namespace dt;
namespace engine = deft::engine;

namespace {

using FloatTypes = std::tuple<float, double>;


}  // namespace

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(elementwise, EngineFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(arithmetic_tensor_tensor, T, FloatTypes) {
  std::mt19937 g(101);
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto a = random_values<T>(g, n, -10, 10);
    const auto b = away_from_zero<T>(g, n, 0.5, 5);
    const double rt = arith_rtol<T>;
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x + y; }, [](double x, double y) { return x + y; }, rt, 0, "a+b");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x - y; }, [](double x, double y) { return x - y; }, rt, 0, "a-b");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x * y; }, [](double x, double y) { return x * y; }, rt, 0, "a*b");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x / y; }, [](double x, double y) { return x / y; }, rt, 0, "a/b");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return deft::maximum(x, y); }, [](double x, double y) { return std::max(x, y); }, 0, 0, "maximum");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return deft::minimum(x, y); }, [](double x, double y) { return std::min(x, y); }, 0, 0, "minimum");
    // A fused expression using both leaves twice.
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return (x - y) * x + y / (y * y + 1); },
                 [](double x, double y) { return (x - y) * x + y / (y * y + 1); }, 4 * rt, 4 * rt * 200, "fused");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(arithmetic_with_scalars, T, FloatTypes) {
  std::mt19937 g(102);
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto a = away_from_zero<T>(g, n, 0.5, 8);
    const double rt = arith_rtol<T>;
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x + 2.5; }, [](double x) { return x + 2.5; }, rt, 0, "a+2.5");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 2.5 + x; }, [](double x) { return 2.5 + x; }, rt, 0, "2.5+a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x - 0.75; }, [](double x) { return x - 0.75; }, rt, 0, "a-0.75");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 0.75 - x; }, [](double x) { return 0.75 - x; }, rt, 0, "0.75-a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x * -1.5; }, [](double x) { return x * -1.5; }, rt, 0, "a*-1.5");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 3 * x; }, [](double x) { return 3 * x; }, rt, 0, "3*a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x / 4; }, [](double x) { return x / 4; }, rt, 0, "a/4");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 3 / x; }, [](double x) { return 3 / x; }, rt, 0, "3/a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return -x; }, [](double x) { return -x; }, 0, 0, "-a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return -(x * 2) + 1; }, [](double x) { return -(x * 2) + 1; }, rt, 0, "-(2a)+1");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::maximum(x, 0.25); }, [](double x) { return std::max(x, 0.25); }, 0, 0, "maximum(a,0.25)");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::maximum(-1, x); }, [](double x) { return std::max(-1.0, x); }, 0, 0, "maximum(-1,a)");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::minimum(x, 0.25); }, [](double x) { return std::min(x, 0.25); }, 0, 0, "minimum(a,0.25)");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::minimum(2, x); }, [](double x) { return std::min(2.0, x); }, 0, 0, "minimum(2,a)");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(unary_functions, T, FloatTypes) {
  std::mt19937 g(103);
  const double rt = transc_rtol<T>, at = transc_atol<T>;
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto any = random_values<T>(g, n, -10, 10);
    const auto pos = random_values<T>(g, n, 0.01, 100);
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::exp(x); }, [](double x) { return std::exp(x); }, rt, 0, "exp");
    check_unary(pos, d, [](auto& x) -> Tensor<T> { return deft::log(x); }, [](double x) { return std::log(x); }, rt, at, "log");
    check_unary(pos, d, [](auto& x) -> Tensor<T> { return deft::sqrt(x); }, [](double x) { return std::sqrt(x); }, arith_rtol<T>, 0, "sqrt");
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::abs(x); }, [](double x) { return std::abs(x); }, 0, 0, "abs");
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::tanh(x * 0.5); }, [](double x) { return std::tanh(double(T(x * 0.5))); }, rt, at, "tanh");
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }, rt, at, "sigmoid");
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::sin(x); }, [](double x) { return std::sin(x); }, rt, at, "sin");
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::cos(x); }, [](double x) { return std::cos(x); }, rt, at, "cos");
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::relu(x); }, [](double x) { return x > 0 ? x : 0.0; }, 0, 0, "relu");
    // Compositions, fused into one pass.
    check_unary(pos, d, [](auto& x) -> Tensor<T> { return deft::exp(deft::log(x) * 0.5) - deft::sqrt(x); },
                [](double) { return 0.0; }, 0, 100 * rt, "exp(log(x)/2)-sqrt(x)");
    check_unary(any, d, [](auto& x) -> Tensor<T> { return deft::sigmoid(deft::abs(x) - 3) * deft::tanh(x); },
                [](double x) { return 1 / (1 + std::exp(-(std::abs(x) - 3))) * std::tanh(x); }, 10 * rt, at, "sigmoid*tanh");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(pow_float, T, FloatTypes) {
  std::mt19937 g(104);
  const double rt = transc_rtol<T>, at = transc_atol<T>;
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto base = random_values<T>(g, n, 0.1, 4);
    const auto ex = random_values<T>(g, n, -3, 3);
    check_binary(base, d, ex, d, [](auto& x, auto& y) -> Tensor<T> { return deft::pow(x, y); },
                 [](double x, double y) { return std::pow(x, y); }, rt, at, "pow(a,b)");
    check_unary(base, d, [](auto& x) -> Tensor<T> { return deft::pow(x, 2); }, [](double x) { return x * x; }, rt, at, "pow(a,2)");
    check_unary(ex, d, [](auto& x) -> Tensor<T> { return deft::pow(2, x); }, [](double x) { return std::pow(2.0, x); }, rt, at, "pow(2,a)");
    // First powers and squares are exact in every lane (SIMD and tail).
    const Tensor<T> b = make(base, shape_of(d));
    const auto first = Tensor<T>(deft::pow(b * T(20), 1)).to_vector(), square = Tensor<T>(deft::pow(b, 2)).to_vector();
    std::size_t inexact = 0;
    for (std::size_t i = 0; i < n; ++i) inexact += first[i] != base[i] * T(20) || square[i] != base[i] * base[i];
    BOOST_TEST(inexact == 0u, inexact << " of " << n << " first powers or squares are not exact");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(comparisons_give_masks, T, FloatTypes) {
  std::mt19937 g(105);
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto a = random_values<T>(g, n, -5, 5);
    const auto b = with_ties(g, a, random_values<T>(g, n, -5, 5));
    auto m = [](bool c) { return c ? 1.0 : 0.0; };
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x < y; }, [&](double x, double y) { return m(x < y); }, 0, 0, "<");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x <= y; }, [&](double x, double y) { return m(x <= y); }, 0, 0, "<=");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x > y; }, [&](double x, double y) { return m(x > y); }, 0, 0, ">");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x >= y; }, [&](double x, double y) { return m(x >= y); }, 0, 0, ">=");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x == y; }, [&](double x, double y) { return m(x == y); }, 0, 0, "==");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x != y; }, [&](double x, double y) { return m(x != y); }, 0, 0, "!=");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x < 0.5; }, [&](double x) { return m(x < 0.5); }, 0, 0, "a<0.5");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 0.5 < x; }, [&](double x) { return m(0.5 < x); }, 0, 0, "0.5<a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 1 >= x; }, [&](double x) { return m(1 >= x); }, 0, 0, "1>=a");
    // Masks are numbers: they combine arithmetically.
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return (x > y) * x + (x <= y) * y; },
                 [](double x, double y) { return std::max(x, y); }, 0, 0, "mask arithmetic");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(where_selects, T, FloatTypes) {
  std::mt19937 g(106);
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto a = random_values<T>(g, n, -5, 5);
    const auto b = random_values<T>(g, n, -5, 5);
    // A condition of zeros and arbitrary nonzero values (not only 1).
    auto c = random_values<T>(g, n, -2, 2);
    std::bernoulli_distribution zero(0.5);
    for (auto& x : c)
      if (zero(g)) x = 0;
    const Tensor<T> ta = make(a, shape_of(d)), tb = make(b, shape_of(d)), tc = make(c, shape_of(d));
    std::vector<double> r1(n), r2(n), r3(n), r4(n);
    for (std::size_t i = 0; i < n; ++i) {
      r1[i] = c[i] != 0 ? a[i] : b[i];
      r2[i] = a[i] > b[i] ? a[i] - b[i] : 2.5;
      r3[i] = c[i] != 0 ? -1.0 : b[i];
      r4[i] = c[i] != 0 ? 1.0 : 0.0;
    }
    check_tensor(Tensor<T>(deft::where(tc, ta, tb)), d, r1, 0, 0, "where(c,a,b)");
    check_tensor(Tensor<T>(deft::where(ta > tb, ta - tb, 2.5)), d, r2, arith_rtol<T>, 0, "where(a>b,a-b,2.5)");
    check_tensor(Tensor<T>(deft::where(tc, -1, tb)), d, r3, 0, 0, "where(c,-1,b)");
    check_tensor(Tensor<T>(deft::where(tc, 1, 0)), d, r4, 0, 0, "where(c,1,0)");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(nan_and_infinity, T, FloatTypes) {
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  const Tensor<T> a = make<T>({nan, 1, 2, -inf}, Shape{4});
  const Tensor<T> b = make<T>({0, nan, 3, 0}, Shape{4});
  check_tensor(Tensor<T>(deft::maximum(a, b)), {4}, {NAN, NAN, 3, 0}, 0, 0, "maximum propagates NaN");
  check_tensor(Tensor<T>(deft::minimum(a, b)), {4}, {NAN, NAN, 2, -INFINITY}, 0, 0, "minimum propagates NaN");
  check_tensor(Tensor<T>(deft::relu(a)), {4}, {NAN, 1, 2, 0}, 0, 0, "relu");
  check_tensor(Tensor<T>(a == a), {4}, {0, 1, 1, 1}, 0, 0, "NaN != NaN");
  check_tensor(Tensor<T>(b / 0), {4}, {NAN, NAN, INFINITY, NAN}, 0, 0, "x/0");
  check_tensor(Tensor<T>(deft::exp(a)), {4}, {NAN, std::exp(1.0), std::exp(2.0), 0}, transc_rtol<T>, 0, "exp");
}

// maximum and minimum on SIMD batches, not only the scalar tail: every pair
// of special values (NaN, infinities, signed zeros) in every lane position,
// tensor-tensor and with a constant on either side. NaN from either side
// wins; otherwise a tie (+0 against -0 included) gives the second operand.
BOOST_AUTO_TEST_CASE_TEMPLATE(maximum_and_minimum_of_special_values_in_every_lane, T, FloatTypes) {
  const T nan = std::numeric_limits<T>::quiet_NaN(), inf = std::numeric_limits<T>::infinity();
  const std::vector<T> specials = {nan, -inf, T(-1.5), T(-0.0), T(0.0), T(2), inf};
  std::vector<T> av, bv;
  for (int rep = 0; rep < 3; ++rep)  // 49 pairs (coprime with every batch width) three times, then a tail
    for (T x : specials)
      for (T y : specials) av.push_back(x), bv.push_back(y);
  av.push_back(-0.0), bv.push_back(0.0);
  const i64 n = i64(av.size());
  const Tensor<T> a = make(av, Shape{n}), b = make(bv, Shape{n});
  auto max_ref = [](T x, T y) { return (x > y || std::isnan(x)) ? x : y; };
  auto min_ref = [](T x, T y) { return (x < y || std::isnan(x)) ? x : y; };
  // got[i] against ref(x(i), y(i)), bit for bit but for NaN's payload.
  auto expect = [&](const Tensor<T>& got, auto x, auto y, auto ref, const char* what) {
    const auto g = got.to_vector();
    int wrong = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const T r = ref(x(i), y(i));
      const bool same = std::isnan(r) ? std::isnan(g[i]) : (g[i] == r && std::signbit(g[i]) == std::signbit(r));
      if (!same && ++wrong <= 3)
        BOOST_ERROR(what << " at " << i << " of (" << x(i) << ", " << y(i) << "): got " << g[i] << ", want " << r);
    }
    BOOST_TEST(wrong == 0, what << ": " << wrong << " of " << n << " elements differ");
  };
  auto a_at = [&](std::size_t i) { return av[i]; };
  auto b_at = [&](std::size_t i) { return bv[i]; };
  expect(deft::maximum(a, b), a_at, b_at, max_ref, "maximum(a, b)");
  expect(deft::minimum(a, b), a_at, b_at, min_ref, "minimum(a, b)");
  for (T c : specials) {
    auto c_at = [c](std::size_t) { return c; };
    expect(deft::maximum(a, c), a_at, c_at, max_ref, "maximum(a, constant)");
    expect(deft::maximum(c, a), c_at, a_at, max_ref, "maximum(constant, a)");
    expect(deft::minimum(a, c), a_at, c_at, min_ref, "minimum(a, constant)");
    expect(deft::minimum(c, a), c_at, a_at, min_ref, "minimum(constant, a)");
  }
  expect(deft::relu(a), a_at, [](std::size_t) { return T(0); }, max_ref, "relu");
}

// cast<U> between every pair of element types used here.
BOOST_AUTO_TEST_CASE(cast_between_types) {
  std::mt19937 g(107);
  const std::vector<i64> d{5, 71};
  const auto f = random_values<float>(g, 355, -1000, 1000);
  const Tensor<float> tf = make(f, shape_of(d));
  std::vector<double> trunc(f.size()), asf(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    trunc[i] = double(std::int64_t(f[i]));  // toward zero
    asf[i] = double(f[i]);
  }
  check_tensor(Tensor<double>(deft::cast<double>(tf)), d, asf, 0, 0, "float->double");
  check_tensor(Tensor<std::int32_t>(deft::cast<std::int32_t>(tf)), d, trunc, 0, 0, "float->int32");
  check_tensor(Tensor<std::int64_t>(deft::cast<std::int64_t>(tf * 2)), d,
               [&] { std::vector<double> r; for (float x : f) r.push_back(double(std::int64_t(x * 2))); return r; }(), 0, 0,
               "float expr->int64");
  const auto iv = random_values<std::int32_t>(g, 355, -100000, 100000);
  const Tensor<std::int32_t> ti = make(iv, shape_of(d));
  check_tensor(Tensor<float>(deft::cast<float>(ti) / 2), d,
               [&] { std::vector<double> r; for (auto x : iv) r.push_back(double(float(x) / 2)); return r; }(), 0, 0,
               "int32->float");
  check_tensor(Tensor<std::int64_t>(deft::cast<std::int64_t>(ti) * 100000), d,
               [&] { std::vector<double> r; for (auto x : iv) r.push_back(double(std::int64_t(x) * 100000)); return r; }(), 0,
               0, "int32->int64 (no overflow)");
  const Tensor<double> td = make<double>({1.0 + 1e-12, -2.75, 1e30}, Shape{3});
  check_tensor(Tensor<float>(deft::cast<float>(td)), {3}, {1.0, -2.75, double(float(1e30))}, 0, 0, "double->float");
  // Float to integer saturates and maps NaN to 0.
  const Tensor<float> special = make<float>({1e20f, -1e20f, NAN, -0.9f, 2.9f}, Shape{5});
  check_tensor(Tensor<std::int32_t>(deft::cast<std::int32_t>(special)), {5},
               {2147483647.0, -2147483648.0, 0, 0, 2}, 0, 0, "saturating cast");
}

// Results of thresholds::stream_store_min_bytes and more are written with
// non-temporal stores; a write into a view starts at an unaligned address and
// peels elements until the stores are aligned.
BOOST_AUTO_TEST_CASE(results_too_large_for_the_caches) {
  std::mt19937 g(140);
  const i64 n = deft::thresholds::stream_store_min_bytes / i64(sizeof(float)) + 37;
  const auto a = random_values<float>(g, std::size_t(n), -2, 2);
  const auto b = random_values<float>(g, std::size_t(n), -2, 2);
  check_binary(a, {n}, b, {n}, [](auto& x, auto& y) -> Tensor<float> { return x * y + x * 2 - deft::maximum(y, 0); },
               [](double x, double y) { return x * y + x * 2 - std::max(y, 0.0); }, 1e-6, 1e-6, "fused, streamed");
  // rows [1, r) of a (r, c) tensor with c odd: the written range starts 4*c bytes into the buffer.
  const i64 c = 1001, r = deft::thresholds::stream_store_min_bytes / i64(sizeof(float)) / c + 3;
  const auto v = random_values<float>(g, std::size_t((r - 1) * c), -2, 2);
  Tensor<float> x = deft::zeros<float>({r, c});
  const Tensor<float> ta = make(v, Shape{r - 1, c});
  x.rows(1, r).assign(ta * 3.f + 1.f);
  const auto got = x.to_vector();
  std::size_t bad = 0;
  for (i64 i = 0; i < r * c; ++i) {
    const double want = i < c ? 0.0 : double(v[std::size_t(i - c)]) * 3 + 1;
    bad += std::abs(double(got[std::size_t(i)]) - want) > 1e-6 * (1 + std::abs(want));
  }
  BOOST_TEST(bad == 0u, bad << " wrong elements in a streamed write into rows(1, " << r << ")");
}

// A statement whose every operand reads exactly the output's shape takes the
// flat path (eval/cpu/elementwise.hpp: reads_flat, flat_view). Operands here
// are views at odd offsets into larger storage, lengths straddle the SIMD
// widths, and one operand that broadcasts sends the same tree down the
// strided path: both must match the double reference.
BOOST_AUTO_TEST_CASE_TEMPLATE(flat_statements_on_views_and_odd_lengths, T, FloatTypes) {
  std::mt19937 g(177);
  for (const i64 n : {i64(1), i64(3), i64(7), i64(8), i64(15), i64(16), i64(17), i64(33), i64(1000), i64(4099)}) {
    const i64 rows = 5;
    const auto av = random_values<T>(g, std::size_t(rows * n), -2, 2);
    const auto bv = random_values<T>(g, std::size_t(rows * n), -2, 2);
    const auto sv = random_values<T>(g, std::size_t(n), -2, 2);
    const Tensor<T> a = make(av, Shape{rows, n}), b = make(bv, Shape{rows, n}), s = make(sv, Shape{n});
    // rows(1, 4) of a and rows(2, 5) of b: leaves at offsets n and 2n.
    const Tensor<T> x = a.rows(1, 4), y = b.rows(2, 5);
    const Tensor<T> flat = x * y + x * T(2) - deft::maximum(y, T(0));
    const Tensor<T> strided = x * y + s * T(2) - deft::maximum(y, T(0));  // s broadcasts along rows
    Tensor<T> chain = x * T(1);
    for (int k = 0; k < 3; ++k) chain = chain * T(0.5) + y;  // in place, reads itself
    std::vector<double> want_flat, want_strided, want_chain;
    for (i64 r = 0; r < 3; ++r)
      for (i64 j = 0; j < n; ++j) {
        const double xv = double(av[std::size_t((r + 1) * n + j)]), yv = double(bv[std::size_t((r + 2) * n + j)]);
        want_flat.push_back(xv * yv + xv * 2 - std::max(yv, 0.0));
        want_strided.push_back(xv * yv + double(sv[std::size_t(j)]) * 2 - std::max(yv, 0.0));
        double c = xv;
        for (int k = 0; k < 3; ++k) c = c * 0.5 + yv;
        want_chain.push_back(c);
      }
    const double rtol = std::is_same_v<T, float> ? 1e-6 : 1e-14, atol = 4 * rtol;
    check_tensor(flat, {3, n}, want_flat, rtol, atol, "flat, n = " + std::to_string(n));
    check_tensor(strided, {3, n}, want_strided, rtol, atol, "broadcast operand, n = " + std::to_string(n));
    check_tensor(chain, {3, n}, want_chain, rtol, atol, "in-place chain, n = " + std::to_string(n));
  }
}

// sigmoid(x) for float x just above -88.7 is a subnormal: exp(-x) is near
// FLT_MAX, past where xsimd's exp overflows (88.38). Every lane must give
// it, not only the scalar tail.
BOOST_AUTO_TEST_CASE(sigmoid_near_exps_overflow_in_every_lane) {
  for (const float x : {-88.4f, -88.5f, -88.6f}) {
    const std::vector<float> v(67, x);
    const auto got = Tensor<float>(deft::sigmoid(make(v, Shape{67}))).to_vector();
    const double want = 1 / (1 + std::exp(-double(x)));
    for (std::size_t i = 0; i < got.size(); ++i)
      BOOST_TEST(std::abs(double(got[i]) - want) <= 1e-44, "x = " << x << ", element " << i << ": " << got[i]);
  }
}

// A row's last partial batch is computed by the scalar function, the rest by
// xsimd's, which may differ in the last bits (pow, tanh): the kernels split
// their work between workers only where one piece would switch paths too,
// so every element gets the same bits with any worker count. Rows of 1001
// straddle the split points; the streamed write (stream_store_min_bytes or
// more) starts 8 bytes past an aligned address, so its pieces' prologues
// would differ too. The float results stay below that threshold: 600 rows, or
// fewer where a build lowers it.
BOOST_AUTO_TEST_CASE(same_bits_for_any_worker_count) {
  std::mt19937 g(181);
  const i64 c = 1001;
  const i64 r = std::min<i64>(600, deft::thresholds::stream_store_min_bytes / i64(sizeof(float)) / c * 3 / 4);
  const i64 big = deft::thresholds::stream_store_min_bytes / i64(sizeof(double)) / c + 3;  // rows(1, big): streamed
  BOOST_REQUIRE_MESSAGE(r * c * i64(sizeof(float)) < deft::thresholds::stream_store_min_bytes,
                        "the float results must stay below the streaming threshold");
  const auto av = random_values<float>(g, std::size_t(r * c), 0.5, 2);
  const auto bv = random_values<float>(g, std::size_t(c), -1, 1);
  const auto colv = random_values<float>(g, std::size_t(r), 0, 1);
  const auto dv = random_values<double>(g, std::size_t((big - 1) * c), -2, 2);
  const auto dbv = random_values<double>(g, std::size_t(c), -1, 1);
  auto compute = [&] {
    const Tensor<float> a = make(av, Shape{r, c}), b = make(bv, Shape{c}), col = make(colv, Shape{r, 1});
    const Tensor<double> d = make(dv, Shape{big - 1, c}), db = make(dbv, Shape{c});
    std::vector<std::vector<double>> out;
    out.push_back(to_double(Tensor<float>(deft::tanh(a + b) * deft::exp(b)).to_vector()));  // dense rows
    out.push_back(to_double(Tensor<float>(deft::pow(a + col, 3.3f)).to_vector()));         // a broadcast column
    out.push_back(to_double(Tensor<float>(deft::pow(a, 2.7f) + deft::sigmoid(a)).to_vector()));  // flat
    Tensor<double> x = deft::zeros<double>({big, c});
    x.rows(1, big).assign(deft::tanh(d) * 3.0);  // flat, streamed
    out.push_back(x.to_vector());
    x.rows(1, big).assign(deft::tanh(d + db));  // dense rows, streamed
    out.push_back(x.to_vector());
    return out;
  };
  std::vector<std::vector<std::vector<double>>> runs;
  for (const int workers : {1, 2, 3, 5}) {
    WorkersGuard w(workers);
    runs.push_back(compute());
  }
  for (std::size_t k = 1; k < runs.size(); ++k)
    for (std::size_t i = 0; i < runs[0].size(); ++i)
      BOOST_TEST(same_bits(runs[0][i], runs[k][i]), "result " << i << " differs between 1 worker and run " << k);
}

BOOST_AUTO_TEST_SUITE_END()

