// Integer elementwise operations (int32/int64) against exact references, and
// numpy broadcasting on random shapes, size-0 dimensions and build-time shape
// errors.
#include <tuple>

#include "common.hpp"

using namespace dt;
namespace engine = deft::engine;

namespace {

using IntTypes = std::tuple<std::int32_t, std::int64_t>;


}  // namespace

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(elementwise_int, EngineFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(arithmetic, T, IntTypes) {
  std::mt19937 g(201);
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto a = random_values<T>(g, n, -1000, 1000);
    auto b = random_values<T>(g, n, -50, 50);  // includes zeros
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x + y; }, [](double x, double y) { return x + y; }, 0, 0, "a+b");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x - y; }, [](double x, double y) { return x - y; }, 0, 0, "a-b");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x * y; }, [](double x, double y) { return x * y; }, 0, 0, "a*b");
    // Truncating division; division by zero gives 0.
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x / y; },
                 [](double x, double y) { return y == 0 ? 0.0 : std::trunc(x / y); }, 0, 0, "a/b");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return deft::maximum(x, y); }, [](double x, double y) { return std::max(x, y); }, 0, 0, "maximum");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return deft::minimum(x, y); }, [](double x, double y) { return std::min(x, y); }, 0, 0, "minimum");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::abs(x); }, [](double x) { return std::abs(x); }, 0, 0, "abs");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return -x; }, [](double x) { return -x; }, 0, 0, "-a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x + 3; }, [](double x) { return x + 3; }, 0, 0, "a+3");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 7 - x; }, [](double x) { return 7 - x; }, 0, 0, "7-a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x * -4; }, [](double x) { return x * -4; }, 0, 0, "a*-4");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x / 7; }, [](double x) { return std::trunc(x / 7); }, 0, 0, "a/7");
    check_unary(b, d, [](auto& x) -> Tensor<T> { return 100 / x; }, [](double x) { return x == 0 ? 0.0 : std::trunc(100 / x); }, 0, 0, "100/b");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x / 0; }, [](double) { return 0.0; }, 0, 0, "a/0");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::maximum(x, 10); }, [](double x) { return std::max(x, 10.0); }, 0, 0, "maximum(a,10)");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::minimum(-3, x); }, [](double x) { return std::min(-3.0, x); }, 0, 0, "minimum(-3,a)");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return deft::relu(x); }, [](double x) { return std::max(x, 0.0); }, 0, 0, "relu");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(comparisons_and_where, T, IntTypes) {
  std::mt19937 g(202);
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto a = random_values<T>(g, n, -20, 20);
    const auto b = random_values<T>(g, n, -20, 20);  // many ties
    auto m = [](bool c) { return c ? 1.0 : 0.0; };
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x < y; }, [&](double x, double y) { return m(x < y); }, 0, 0, "<");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x <= y; }, [&](double x, double y) { return m(x <= y); }, 0, 0, "<=");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x > y; }, [&](double x, double y) { return m(x > y); }, 0, 0, ">");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x >= y; }, [&](double x, double y) { return m(x >= y); }, 0, 0, ">=");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x == y; }, [&](double x, double y) { return m(x == y); }, 0, 0, "==");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return x != y; }, [&](double x, double y) { return m(x != y); }, 0, 0, "!=");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return 3 <= x; }, [&](double x) { return m(3 <= x); }, 0, 0, "3<=a");
    check_unary(a, d, [](auto& x) -> Tensor<T> { return x != 0; }, [&](double x) { return m(x != 0); }, 0, 0, "a!=0");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return deft::where(x > y, x * 2, y); },
                 [](double x, double y) { return x > y ? 2 * x : y; }, 0, 0, "where");
    check_binary(a, d, b, d, [](auto& x, auto& y) -> Tensor<T> { return deft::where(x, 5, y); },
                 [](double x, double y) { return x != 0 ? 5 : y; }, 0, 0, "where(a,5,b)");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(integer_pow, T, IntTypes) {
  std::mt19937 g(203);
  for (const auto& d : kElementwiseShapes) {
    const std::size_t n = product(d);
    const auto base = random_values<T>(g, n, -6, 6);
    const auto ex = random_values<T>(g, n, 0, 9);
    check_binary(base, d, ex, d, [](auto& x, auto& y) -> Tensor<T> { return deft::pow(x, y); },
                 [](double x, double y) { return std::pow(x, y); }, 0, 0, "pow(a,b)");
    check_unary(base, d, [](auto& x) -> Tensor<T> { return deft::pow(x, 3); }, [](double x) { return x * x * x; }, 0, 0, "pow(a,3)");
    check_unary(ex, d, [](auto& x) -> Tensor<T> { return deft::pow(2, x * 2); }, [](double x) { return std::pow(2.0, 2 * x); }, 0, 0, "pow(2,2a)");
  }
  // Negative exponents: 1 and -1 keep their powers, everything else truncates to 0.
  const Tensor<T> b = make<T>({1, -1, -1, 2, -3, 0, 5}, Shape{7});
  const Tensor<T> e = make<T>({-4, -3, -2, -1, -2, 0, 0}, Shape{7});
  check_tensor(Tensor<T>(deft::pow(b, e)), {7}, {1, -1, 1, 0, 0, 1, 1}, 0, 0, "negative exponents");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(wraparound, T, IntTypes) {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  const Tensor<T> a = make<T>({hi, lo, lo, lo, 6, -7}, Shape{6});
  const Tensor<T> b = make<T>({1, -1, -1, 1, -4, 2}, Shape{6});
  // hi+1 and lo-1 wrap; lo/-1 wraps to lo; truncation toward zero.
  const std::vector<T> sum = Tensor<T>(a + b).to_vector();
  BOOST_TEST(sum[0] == lo);
  BOOST_TEST(sum[1] == hi);
  const std::vector<T> q = Tensor<T>(a / b).to_vector();
  BOOST_TEST(q[1] == lo);
  BOOST_TEST(q[4] == T(-1));
  BOOST_TEST(q[5] == T(-3));
  BOOST_TEST(Tensor<T>(deft::abs(a)).to_vector()[1] == lo);  // |lo| wraps, as in numpy
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(broadcasting, EngineFixture)

namespace {

/// A random output shape of rank 0-4 (extents 1-5, with zero when allow_zero)
/// and two operand shapes that broadcast to (a part of) it.
struct ShapePair {
  std::vector<i64> a, b;
};
ShapePair random_pair(std::mt19937& g, bool allow_zero) {
  std::uniform_int_distribution<int> rank(0, 4), ext(1, 5);
  std::bernoulli_distribution unit(0.35), zero(0.08);
  std::vector<i64> out(rank(g));
  for (auto& x : out) x = (allow_zero && zero(g)) ? 0 : ext(g);
  auto operand = [&] {
    std::uniform_int_distribution<int> r(0, int(out.size()));
    const int k = r(g);
    std::vector<i64> s(out.end() - k, out.end());
    for (auto& x : s)
      if (unit(g)) x = 1;
    return s;
  };
  return {operand(), operand()};
}

template <class T>
void random_broadcast_trials(std::uint32_t seed, int trials, bool allow_zero) {
  std::mt19937 g(seed);
  for (int t = 0; t < trials; ++t) {
    const auto p = random_pair(g, allow_zero);
    const auto av = random_values<T>(g, product(p.a), -9, 9);
    const auto bv = random_values<T>(g, product(p.b), -9, 9);
    check_binary(av, p.a, bv, p.b, [](auto& x, auto& y) -> Tensor<T> { return (x - y) * x + y; },
                 [](double x, double y) { return (x - y) * x + y; }, arith_rtol<T> * 4, arith_rtol<T> * 4 * 200,
                 "(a-b)*a+b");  // atol: cancellation against terms up to ~200
    check_binary(av, p.a, bv, p.b, [](auto& x, auto& y) -> Tensor<T> { return deft::where(x > y, x, y * 2); },
                 [](double x, double y) { return x > y ? x : 2 * y; }, 0, 0, "where(a>b,a,2b)");
    check_binary(av, p.a, bv, p.b, [](auto& x, auto& y) -> Tensor<T> { return deft::maximum(x, y) - y; },
                 [](double x, double y) { return std::max(x, y) - y; }, arith_rtol<T> * 4, arith_rtol<T> * 40,
                 "maximum(a,b)-b");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(random_shapes_float) { random_broadcast_trials<float>(301, 150, false); }
BOOST_AUTO_TEST_CASE(random_shapes_double) { random_broadcast_trials<double>(302, 100, false); }
BOOST_AUTO_TEST_CASE(random_shapes_int32) { random_broadcast_trials<std::int32_t>(303, 100, false); }
BOOST_AUTO_TEST_CASE(random_shapes_int64) { random_broadcast_trials<std::int64_t>(304, 60, false); }
BOOST_AUTO_TEST_CASE(random_shapes_with_empty_dims) { random_broadcast_trials<float>(305, 150, true); }

// Three operands with three different broadcast patterns in one fused expression.
BOOST_AUTO_TEST_CASE(three_operands) {
  std::mt19937 g(306);
  for (int t = 0; t < 80; ++t) {
    const auto p = random_pair(g, false);
    const auto q = random_pair(g, false);
    const auto c_dims = q.a;
    const auto av = random_values<float>(g, product(p.a), -3, 3);
    const auto bv = random_values<float>(g, product(p.b), -3, 3);
    const auto cv = random_values<float>(g, product(c_dims), -3, 3);
    const auto ab = broadcast_dims(p.a, p.b);
    // Only shapes that broadcast together.
    bool ok = true;
    for (std::size_t i = 0; i < std::min(ab.size(), c_dims.size()); ++i) {
      const i64 x = ab[ab.size() - 1 - i], y = c_dims[c_dims.size() - 1 - i];
      if (x != y && x != 1 && y != 1) ok = false;
    }
    if (!ok) continue;
    const auto out = broadcast_dims(ab, c_dims);
    std::vector<double> ref(product(out));
    for (i64 i = 0; i < product(out); ++i) {
      const auto idx = unravel(i, out);
      const double x = av[broadcast_offset(idx, p.a)], y = bv[broadcast_offset(idx, p.b)], z = cv[broadcast_offset(idx, c_dims)];
      ref[i] = x * y + z;
    }
    const Tensor<float> a = make(av, shape_of(p.a)), b = make(bv, shape_of(p.b)), c = make(cv, shape_of(c_dims));
    check_tensor(Tensor<float>(a * b + c), out, ref, 1e-6, 1e-6,
                 "a*b+c " + str(a.shape()) + str(b.shape()) + str(c.shape()));
  }
}

// The named cases of the brief, on sizes large enough for SIMD and workers.
BOOST_AUTO_TEST_CASE(named_patterns) {
  std::mt19937 g(307);
  const i64 m = 300, n = 257;
  const auto mat = random_values<float>(g, m * n, -4, 4);
  const auto row = random_values<float>(g, n, -4, 4);
  const auto col = random_values<float>(g, m, -4, 4);
  const auto one = random_values<float>(g, 1, -4, 4);
  auto mul = [](double x, double y) { return x * y; };
  auto sub = [](double x, double y) { return x - y; };
  check_binary(mat, {m, n}, row, {n}, [](auto& x, auto& y) -> Tensor<float> { return x * y; }, mul, 1e-6, 0, "row vector over matrix");
  check_binary(row, {n}, mat, {m, n}, [](auto& x, auto& y) -> Tensor<float> { return x - y; }, sub, 1e-6, 1e-6, "row vector (left) over matrix");
  check_binary(mat, {m, n}, col, {m, 1}, [](auto& x, auto& y) -> Tensor<float> { return x - y; }, sub, 1e-6, 1e-6, "column over matrix");
  check_binary(col, {m, 1}, row, {1, n}, [](auto& x, auto& y) -> Tensor<float> { return x * y; }, mul, 1e-6, 0, "outer product (m,1)*(1,n)");
  check_binary(mat, {m, n}, one, {}, [](auto& x, auto& y) -> Tensor<float> { return x * y; }, mul, 1e-6, 0, "scalar tensor over matrix");
  check_binary(one, {}, mat, {m, n}, [](auto& x, auto& y) -> Tensor<float> { return x - y; }, sub, 1e-6, 1e-6, "scalar tensor (left)");
  check_binary(one, {}, one, {}, [](auto& x, auto& y) -> Tensor<float> { return x * y + 1; },
               [](double x, double y) { return double(float(x * y)) + 1; }, 1e-6, 0, "scalar tensors");
  check_binary(one, {1, 1, 1}, row, {n}, [](auto& x, auto& y) -> Tensor<float> { return x - y; }, sub, 1e-6, 1e-6, "(1,1,1) with (n)");
  const auto five = random_values<float>(g, 5, -4, 4);
  check_binary(mat, {m, 1, n}, five, {1, 5, 1}, [](auto& x, auto& y) -> Tensor<float> { return x * y; }, mul, 1e-6, 0, "(m,1,n) with (1,5,1)");
  // The result of a 0-d operation is 0-d.
  const Tensor<float> s = make(one, Shape{});
  const Tensor<float> r = s * 2 + s;
  BOOST_TEST(r.rank() == 0);
  BOOST_TEST(r.item() == one[0] * 3, boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(size_zero_dimensions) {
  std::mt19937 g(308);
  const auto row = random_values<float>(g, 3, -1, 1);
  const auto two = random_values<float>(g, 2, -1, 1);
  const auto one = random_values<float>(g, 1, -1, 1);
  const std::vector<float> none;
  auto add = [](auto& x, auto& y) -> Tensor<float> { return x + y; };
  auto addr = [](double x, double y) { return x + y; };
  check_binary(none, {0, 3}, row, {3}, add, addr, 0, 0, "(0,3)+(3)");
  check_binary(none, {2, 0}, two, {2, 1}, add, addr, 0, 0, "(2,0)+(2,1)");
  check_binary(none, {0}, one, {1}, add, addr, 0, 0, "(0)+(1)");
  check_binary(none, {0}, one, {}, add, addr, 0, 0, "(0)+()");
  check_binary(none, {4, 0, 2}, none, {0, 1}, add, addr, 0, 0, "(4,0,2)+(0,1)");
  const Tensor<float> e = make(none, Shape{0, 5});
  const Tensor<float> f = deft::exp(e) * 2 + deft::where(e > 0, e, 1);
  BOOST_TEST(f.size() == 0);
  BOOST_TEST((dims_of(f.shape()) == std::vector<i64>{0, 5}));
  BOOST_TEST(f.to_vector().empty());
  const Tensor<std::int32_t> fi = deft::cast<std::int32_t>(e);
  BOOST_TEST(fi.to_vector().empty());
  BOOST_CHECK_THROW(e + make(row, Shape{3}), std::invalid_argument);  // 5 vs 3
  BOOST_CHECK_THROW(make(none, Shape{0}) + make(row, Shape{3}), std::invalid_argument);  // 0 vs 3
}

BOOST_AUTO_TEST_CASE(mismatch_throws_at_build_time) {
  const Tensor<float> a = deft::ones({2, 3}), b = deft::ones({4});
  const Tensor<float> c = deft::ones({3, 2, 5}), d = deft::ones({4, 5});
  deft::wait_all();
  engine::reset_stats();
  expect_invalid([&] { (void)(a + b); }, {"(2, 3)", "(4,)"}, "a+b");
  expect_invalid([&] { (void)(b * a); }, {"(2, 3)", "(4,)"}, "b*a");
  expect_invalid([&] { (void)(a < b); }, {"(2, 3)", "(4,)"}, "a<b");
  expect_invalid([&] { (void)deft::maximum(a, b); }, {"(2, 3)", "(4,)"}, "maximum");
  expect_invalid([&] { (void)deft::pow(a, b); }, {"(2, 3)", "(4,)"}, "pow");
  expect_invalid([&] { (void)deft::where(a, a, b); }, {"(2, 3)", "(4,)"}, "where");
  expect_invalid([&] { (void)((a * 2 + 1) - deft::exp(b)); }, {"(2, 3)", "(4,)"}, "nested");
  expect_invalid([&] { (void)(c + d); }, {"(3, 2, 5)", "(4, 5)"}, "(3,2,5)+(4,5)");
  expect_invalid([&] { Tensor<float> x = a + b; (void)x; }, {"(2, 3)", "(4,)"}, "Tensor x = a+b");
  // In-place updates must keep the shape of the target.
  Tensor<float> small = deft::ones({3});
  BOOST_CHECK_THROW(small += a, std::invalid_argument);
  BOOST_CHECK_THROW(small.assign(a), std::invalid_argument);
  // Nothing was recorded or run by the failed statements, and no sync happened.
  const auto s = engine::stats();
  BOOST_TEST(s.tasks_recorded == 1u);  // ones({3}) only
  BOOST_TEST(s.tasks_run == (deferred_mode() ? 0u : 1u));
  if (deferred_mode()) BOOST_TEST(!small.is_ready());
  check_tensor(small, {3}, {1, 1, 1}, 0, 0, "target untouched");
}

BOOST_AUTO_TEST_CASE(in_place_update_broadcasts_operand) {
  std::mt19937 g(309);
  const auto mv = random_values<float>(g, 4 * 70, -3, 3);
  const auto rv = random_values<float>(g, 70, -3, 3);
  Tensor<float> m = make(mv, Shape{4, 70});
  m += make(rv, Shape{70});
  m *= make(std::vector<float>{2, 3, 4, 5}, Shape{4, 1});
  std::vector<double> ref(mv.size());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 70; ++j) ref[i * 70 + j] = (double(mv[i * 70 + j]) + rv[j]) * (i + 2);
  check_tensor(m, {4, 70}, ref, 1e-6, 1e-6, "m += row; m *= col");
}

BOOST_AUTO_TEST_SUITE_END()
