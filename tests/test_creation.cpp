// The creation, random_numbers and printing suites.
#include <tuple>

#include "common.hpp"

using namespace dt;
namespace engine = deft::engine;

namespace {
using AllTypes = std::tuple<float, double, std::int32_t, std::int64_t>;
}

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(creation, DeferredFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(full_ones_zeros, T, AllTypes) {
  for (const auto& d : std::vector<std::vector<i64>>{{}, {0}, {3, 4}, {2, 0, 5}, {1000, 257}}) {
    const Shape s = shape_of(d);
    const std::size_t n = product(d);
    engine::reset_stats();
    const Tensor<T> o = deft::ones<T>(s), z = deft::zeros<T>(s), f = deft::full<T>(s, T(-7));
    BOOST_TEST(engine::stats().tasks_recorded == 3u);  // deferred like everything else
    BOOST_TEST(engine::stats().tasks_run == 0u);
    check_tensor(o, d, std::vector<double>(n, 1.0), 0, 0, std::string("ones ") + type_name<T>());
    check_tensor(z, d, std::vector<double>(n, 0.0), 0, 0, std::string("zeros ") + type_name<T>());
    check_tensor(f, d, std::vector<double>(n, -7.0), 0, 0, std::string("full ") + type_name<T>());
  }
  if constexpr (std::is_floating_point_v<T>) {
    check_tensor(deft::full<T>({3}, T(0.1)), {3}, std::vector<double>(3, double(T(0.1))), 0, 0, "full 0.1");
  }
}

BOOST_AUTO_TEST_CASE(metadata) {
  const Tensor<> t = deft::ones({2, 3, 4});
  static_assert(std::is_same_v<decltype(t), const Tensor<float>>);  // float by default
  BOOST_TEST(t.rank() == 3);
  BOOST_TEST(t.size() == 24);
  BOOST_TEST((dims_of(t.shape()) == std::vector<i64>{2, 3, 4}));
  BOOST_TEST((t.dtype() == deft::DType::float32));
  BOOST_TEST((Tensor<double>::dtype() == deft::DType::float64));
  BOOST_TEST((Tensor<std::int32_t>::dtype() == deft::DType::int32));
  BOOST_TEST((Tensor<std::int64_t>::dtype() == deft::DType::int64));
  BOOST_TEST((t.device() == deft::cpu(0)));
  BOOST_TEST(bool(t));
  BOOST_TEST(deft::ones({}).rank() == 0);
  BOOST_TEST(deft::ones({}).size() == 1);
  BOOST_TEST((deft::Shape{2, 3}.to_string() == "(2, 3)"));
  BOOST_TEST((deft::Shape{4}.to_string() == "(4,)"));
  BOOST_TEST((deft::Shape{}.to_string() == "()"));
  BOOST_CHECK_THROW(deft::Shape({2, -1}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(arange_values) {
  check_tensor(deft::arange<float>(0.f, 1.f, 0.25f), {4}, {0, 0.25, 0.5, 0.75}, 0, 0, "arange(0,1,0.25)");
  check_tensor(deft::arange<std::int32_t>(10, 0, -3), {4}, {10, 7, 4, 1}, 0, 0, "arange(10,0,-3)");
  check_tensor(deft::arange<std::int64_t>(-1, -10, -2), {5}, {-1, -3, -5, -7, -9}, 0, 0, "arange(-1,-10,-2)");
  check_tensor(deft::arange<float>(2.f, -1.f, -0.5f), {6}, {2, 1.5, 1, 0.5, 0, -0.5}, 0, 0, "arange(2,-1,-0.5)");
  check_tensor(deft::arange<std::int64_t>(5), {5}, {0, 1, 2, 3, 4}, 0, 0, "arange(5)");
  check_tensor(deft::arange<float>(3.f), {3}, {0, 1, 2}, 0, 0, "arange(3.f)");
  check_tensor(deft::arange<std::int32_t>(0, 10, 4), {3}, {0, 4, 8}, 0, 0, "arange(0,10,4)");
  check_tensor(deft::arange<std::int32_t>(0, 5, -1), {0}, {}, 0, 0, "arange with the wrong sign");
  check_tensor(deft::arange<float>(3.f, 3.f), {0}, {}, 0, 0, "arange(3,3)");
  // Non-representable steps: as many elements as numpy, start + i * step.
  const auto d = deft::arange<double>(0.0, 1.0, 0.1).to_vector();
  BOOST_TEST(d.size() == 10u);
  for (std::size_t i = 0; i < d.size(); ++i) BOOST_TEST(d[i] == 0.1 * double(i), boost::test_tools::tolerance(1e-12));
  // Long enough to be split across workers.
  const auto big = deft::arange<std::int32_t>(-50000, 150000, 2).to_vector();
  BOOST_REQUIRE(big.size() == 100000u);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < big.size(); ++i) bad += big[i] != -50000 + 2 * std::int32_t(i);
  BOOST_TEST(bad == 0u);
  const auto bigf = deft::arange<float>(0.f, 200000.f).to_vector();
  BOOST_REQUIRE(bigf.size() == 200000u);
  bad = 0;
  for (std::size_t i = 0; i < bigf.size(); ++i) bad += bigf[i] != float(i);
  BOOST_TEST(bad == 0u);
  BOOST_CHECK_THROW(deft::arange<float>(0.f, 1.f, 0.f), std::invalid_argument);
  BOOST_CHECK_THROW(deft::arange<std::int32_t>(0, 1, 0), std::invalid_argument);
  // Integers beyond 2^53, where a double cannot count them: exact lengths
  // and values (a nanosecond timestamp; 2^62; the whole int32 range).
  const std::int64_t t0 = 1700000000000000000;
  const auto ns = deft::arange<std::int64_t>(t0, t0 + 1000).to_vector();
  BOOST_REQUIRE(ns.size() == 1000u);
  BOOST_TEST(ns.front() == t0);
  BOOST_TEST(ns.back() == t0 + 999);
  const std::int64_t p62 = std::int64_t(1) << 62;
  check_tensor(deft::arange<std::int64_t>(p62, p62 + 3), {3}, {double(p62), double(p62 + 1), double(p62 + 2)}, 0, 0,
               "arange(2^62, 2^62 + 3)");
  BOOST_TEST(deft::arange<std::int64_t>(p62, p62 + 3).to_vector()[2] == p62 + 2);
  BOOST_TEST(deft::arange<std::int64_t>(0, p62 + 1, p62 >> 1).size() == 3);
  const auto wide = deft::arange<std::int32_t>(INT32_MIN, INT32_MAX, 1 << 30).to_vector();
  BOOST_TEST(wide == (std::vector<std::int32_t>{INT32_MIN, -(1 << 30), 0, 1 << 30}), boost::test_tools::per_element());
  const auto down = deft::arange<std::int64_t>(INT64_MAX, INT64_MIN, -(std::int64_t(1) << 62)).to_vector();
  BOOST_TEST(down.size() == 4u);
  BOOST_TEST(down.back() == -(std::int64_t(1) << 62) - 1);  // INT64_MAX - 3 * 2^62
}

BOOST_AUTO_TEST_CASE_TEMPLATE(from_values, T, AllTypes) {
  std::mt19937 g(1201);
  const auto v = random_values<T>(g, 60, -100, 100);
  engine::reset_stats();
  const Tensor<T> t(v, Shape{3, 4, 5});
  BOOST_TEST(t.is_ready());  // ready at once, no task
  BOOST_TEST(engine::stats().tasks_recorded == 0u);
  BOOST_TEST(t.to_vector() == v);
  BOOST_TEST((dims_of(t.shape()) == std::vector<i64>{3, 4, 5}));
  const Tensor<T> s(std::vector<T>{T(42)}, Shape{});
  BOOST_TEST(s.item() == T(42));
  // The wrong number of values throws, naming the shape.
  BOOST_CHECK_THROW(Tensor<T>(std::vector<T>(59), Shape{3, 4, 5}), std::invalid_argument);
  BOOST_CHECK_THROW(Tensor<T>(std::vector<T>(61), Shape{3, 4, 5}), std::invalid_argument);
  BOOST_CHECK_THROW(Tensor<T>(std::vector<T>{}, Shape{}), std::invalid_argument);
  BOOST_CHECK_THROW(Tensor<T>(std::vector<T>(2), Shape{}), std::invalid_argument);
  try {
    (void)Tensor<T>(std::vector<T>(7), Shape{2, 3});
    BOOST_ERROR("no exception");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("(2, 3)") != std::string::npos, e.what());
  }
  // item() needs exactly one element.
  BOOST_CHECK_THROW((void)t.item(), std::invalid_argument);
  // Later writes to the source vector do not affect the tensor.
  std::vector<T> src{T(1), T(2)};
  const Tensor<T> c(src, Shape{2});
  src[0] = T(9);
  BOOST_TEST(c.to_vector()[0] == T(1));
}

BOOST_AUTO_TEST_CASE(eval_and_clone) {
  const Tensor<float> x = make<float>({1, 2, 3}, Shape{3});
  const auto e = deft::eval(x * x);
  static_assert(std::is_same_v<std::remove_cv_t<decltype(e)>, Tensor<float>>);
  check_tensor(e, {3}, {1, 4, 9}, 0, 0, "eval");
  const auto i = deft::eval(deft::cast<std::int64_t>(x) * 3);
  static_assert(std::is_same_v<std::remove_cv_t<decltype(i)>, Tensor<std::int64_t>>);
  check_tensor(i, {3}, {3, 6, 9}, 0, 0, "eval of a cast");
  const Tensor<float> v = make<float>({1, 2, 3, 4, 5, 6}, Shape{3, 2}).rows(1, 3).clone();
  check_tensor(v, {2, 2}, {3, 4, 5, 6}, 0, 0, "clone of a view");
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
// (Not named "random": a suite is a namespace, and ::random() exists in <stdlib.h>.)
BOOST_FIXTURE_TEST_SUITE(random_numbers, DeferredFixture)

BOOST_AUTO_TEST_CASE(seeding_is_reproducible) {
  deft::random::seed(42);
  const auto u1 = deft::random::uniform<float>(0, 1, {1000}).to_vector();
  const auto n1 = deft::random::normal<double>(0, 1, {1001}).to_vector();
  const auto i1 = deft::random::uniform<std::int32_t>(-5, 5, {999}).to_vector();
  deft::random::seed(42);
  const auto u2 = deft::random::uniform<float>(0, 1, {1000}).to_vector();
  const auto n2 = deft::random::normal<double>(0, 1, {1001}).to_vector();
  const auto i2 = deft::random::uniform<std::int32_t>(-5, 5, {999}).to_vector();
  BOOST_TEST(same_bits(u1, u2));
  BOOST_TEST(same_bits(n1, n2));
  BOOST_TEST(i1 == i2);
  // Another seed, or the next call, gives other numbers.
  deft::random::seed(43);
  const auto u3 = deft::random::uniform<float>(0, 1, {1000}).to_vector();
  const auto u4 = deft::random::uniform<float>(0, 1, {1000}).to_vector();
  std::size_t same3 = 0, same4 = 0;
  for (std::size_t i = 0; i < u1.size(); ++i) {
    same3 += u1[i] == u3[i];
    same4 += u3[i] == u4[i];
  }
  BOOST_TEST(same3 < 5u);
  BOOST_TEST(same4 < 5u);
}

BOOST_AUTO_TEST_CASE(same_numbers_for_any_worker_count) {
  auto draw = [] {
    deft::random::seed(7);
    std::vector<std::vector<double>> r;
    r.push_back(to_double(deft::random::uniform<float>(-3, 3, {1000003}).to_vector()));
    r.push_back(deft::random::normal<double>(1, 2, {500001}).to_vector());
    r.push_back(to_double(deft::random::normal<float>(0, 1, {300000}).to_vector()));
    r.push_back(to_double(deft::random::uniform<std::int64_t>(0, 1000, {200000}).to_vector()));
    return r;
  };
  const auto one = with_workers(1, draw), two = with_workers(2, draw), four = with_workers(4, draw);
  for (std::size_t i = 0; i < one.size(); ++i) {
    BOOST_TEST(same_bits(one[i], two[i]), "draw " << i << ": 1 vs 2 workers");
    BOOST_TEST(same_bits(one[i], four[i]), "draw " << i << ": 1 vs 4 workers");
  }
}

BOOST_AUTO_TEST_CASE(numbers_are_fixed_when_recorded_not_when_run) {
  // Each call takes its place in the sequence when it is recorded, so the
  // order in which deferred calls happen to run does not matter.
  deft::random::seed(99);
  const Tensor<float> a = deft::random::uniform<float>(0, 1, {5000});
  const Tensor<float> b = deft::random::uniform<float>(0, 1, {5000});
  const auto bv = b.to_vector();  // b runs first
  const auto av = a.to_vector();
  deft::random::seed(99);
  const auto a2 = deft::random::uniform<float>(0, 1, {5000}).to_vector();
  const auto b2 = deft::random::uniform<float>(0, 1, {5000}).to_vector();
  BOOST_TEST(same_bits(av, a2));
  BOOST_TEST(same_bits(bv, b2));
}

BOOST_AUTO_TEST_CASE(uniform_distribution) {
  const std::size_t n = 1000000;
  deft::random::seed(1234);
  auto check = [&](const std::vector<double>& v, double lo, double hi, const char* what) {
    double sum = 0, sq = 0, mn = 1e300, mx = -1e300;
    for (double x : v) {
      sum += x;
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    const double mean = sum / double(n);
    for (double x : v) sq += (x - mean) * (x - mean);
    const double var = sq / double(n - 1), w = hi - lo;
    BOOST_TEST(mn >= lo, what << ": min " << mn);
    BOOST_TEST(mx < hi, what << ": max " << mx);
    BOOST_TEST(std::abs(mean - (lo + hi) / 2) <= 5 * w / std::sqrt(12.0 * double(n)), what << ": mean " << mean);
    BOOST_TEST(std::abs(var / (w * w / 12) - 1) <= 0.01, what << ": variance " << var);
    // Both ends of the range are reached (not a narrower interval).
    BOOST_TEST(mn - lo < w * 1e-4, what << ": min " << mn);
    BOOST_TEST(hi - mx < w * 1e-4, what << ": max " << mx);
  };
  const Tensor<float> f = deft::random::uniform<float>(-2, 3, {1000, 1000});
  BOOST_TEST((dims_of(f.shape()) == std::vector<i64>{1000, 1000}));
  check(to_double(f.to_vector()), -2, 3, "uniform<float>(-2,3)");
  check(deft::random::uniform<double>(10, 10.5, {i64(n)}).to_vector(), 10, 10.5, "uniform<double>(10,10.5)");
  // Integers: lo..hi-1, each about equally often.
  const auto iv = deft::random::uniform<std::int32_t>(0, 10, {i64(n)}).to_vector();
  std::vector<std::size_t> count(10, 0);
  std::size_t outside = 0;
  for (auto x : iv) {
    if (x < 0 || x > 9) ++outside;
    else ++count[x];
  }
  BOOST_TEST(outside == 0u);
  for (int k = 0; k < 10; ++k) BOOST_TEST(std::abs(double(count[k]) - 1e5) < 1500, "bucket " << k << ": " << count[k]);
  const auto neg = deft::random::uniform<std::int64_t>(-5, 5, {100000}).to_vector();
  BOOST_TEST(*std::min_element(neg.begin(), neg.end()) == -5);
  BOOST_TEST(*std::max_element(neg.begin(), neg.end()) == 4);
  // Where hi's last place is coarse, lo + (hi - lo) * u rounds up to hi for
  // u near 1 (here for every u > 1/2): such a draw must stay below hi.
  const std::int64_t big = std::int64_t(1) << 52;
  const auto coarse = deft::random::uniform<std::int64_t>(double(big), double(big + 2), {1000}).to_vector();
  std::size_t firsts = 0, seconds = 0;
  for (auto x : coarse) {
    firsts += x == big;
    seconds += x == big + 1;
  }
  BOOST_TEST(firsts + seconds == coarse.size(), "draws outside [2^52, 2^52 + 2): " << coarse.size() - firsts - seconds);
  BOOST_TEST(firsts > 0u);
  BOOST_TEST(seconds > 0u);
}

BOOST_AUTO_TEST_CASE(normal_distribution) {
  const std::size_t n = 1000000;
  deft::random::seed(4321);
  auto check = [&](const std::vector<double>& v, double mu, double sigma, const char* what) {
    double sum = 0, sq = 0;
    std::size_t within1 = 0, nonfinite = 0;
    for (double x : v) {
      sum += x;
      if (!std::isfinite(x)) ++nonfinite;
    }
    const double mean = sum / double(v.size());
    for (double x : v) {
      sq += (x - mean) * (x - mean);
      within1 += std::abs(x - mu) <= sigma;
    }
    const double sd = std::sqrt(sq / double(v.size() - 1));
    BOOST_TEST(nonfinite == 0u, what);
    BOOST_TEST(std::abs(mean - mu) <= 5 * sigma / std::sqrt(double(v.size())), what << ": mean " << mean);
    BOOST_TEST(std::abs(sd / sigma - 1) <= 0.01, what << ": std " << sd);
    BOOST_TEST(std::abs(double(within1) / double(v.size()) - 0.682689) <= 0.003, what << ": within one sigma");
  };
  check(to_double(deft::random::normal<float>(1.5, 2.0, {i64(n)}).to_vector()), 1.5, 2.0, "normal<float>(1.5,2)");
  check(deft::random::normal<double>(-3, 0.25, {i64(n) + 1}).to_vector(), -3, 0.25, "normal<double>(-3,0.25), odd n");
  const auto z = deft::random::normal<float>(5, 0, {10}).to_vector();
  BOOST_TEST(z == std::vector<float>(10, 5.f));
}

// Regression (fixed in 1270f84): rounding a double draw to float could give hi.
BOOST_AUTO_TEST_CASE(uniform_float_stays_below_hi) {
  deft::random::seed(3);
  const Tensor<float> u = deft::random::uniform<float>(0, 1, {4701581});  // element 4701580 rounded to 1.0f
  BOOST_TEST(deft::max(u).item() < 1.0f);
  BOOST_TEST(deft::min(u).item() >= 0.0f);
  // A range narrower than the float spacing above lo.
  const auto v = deft::random::uniform<float>(1.0, 1.0 + 1e-7, {1000}).to_vector();
  std::size_t outside = 0;
  for (float f : v) outside += double(f) >= 1.0 + 1e-7 || double(f) < 1.0;
  BOOST_TEST(outside == 0u);
}

BOOST_AUTO_TEST_CASE(random_calls_are_deferred_and_validated) {
  engine::reset_stats();
  const Tensor<float> u = deft::random::uniform<float>(0, 1, {100});
  BOOST_TEST(engine::stats().tasks_recorded == 1u);
  BOOST_TEST(engine::stats().tasks_run == 0u);
  BOOST_TEST(!u.is_ready());
  BOOST_CHECK_THROW(deft::random::uniform<float>(1, 1, {3}), std::invalid_argument);
  BOOST_CHECK_THROW(deft::random::uniform<float>(2, 1, {3}), std::invalid_argument);
  // Integers are lo .. hi - 1: a fractional bound is refused (floor gave values below lo).
  BOOST_CHECK_EXCEPTION(deft::random::uniform<std::int32_t>(0.5, 3, {3}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return std::string(e.what()).find("whole-number") != std::string::npos; });
  BOOST_CHECK_THROW(deft::random::uniform<std::int64_t>(0, 2.5, {3}), std::invalid_argument);
  BOOST_TEST(deft::random::uniform<std::int32_t>(-2, 3, {3}).to_vector().size() == 3u);
  BOOST_CHECK_THROW(deft::random::normal<float>(0, -1, {3}), std::invalid_argument);
  BOOST_CHECK_THROW(deft::random::normal<float>(0, NAN, {3}), std::invalid_argument);
  BOOST_TEST(deft::random::uniform<float>(0, 1, {0}).to_vector().empty());
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(printing, DeferredFixture)

namespace {
template <class X>
std::string print(const X& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
std::string footer(const std::string& s) { return s.substr(s.rfind('\n') + 1); }
}  // namespace

BOOST_AUTO_TEST_CASE(small_tensor) {
  const auto a = deft::ones({1, 2});
  const auto b = deft::ones({1, 2});
  const Tensor<float> c = a * b + 2;
  const std::string s = print(c);
  BOOST_TEST(first_line(s) == "[[3, 3]]");
  const std::string f = footer(s);
  BOOST_TEST(f.find("float32") != std::string::npos, f);
  BOOST_TEST(f.find("(1, 2)") != std::string::npos, f);
  BOOST_TEST(f.find("cpu(0)") != std::string::npos, f);
  // An expression prints its value.
  BOOST_TEST(first_line(print(a * b + 2)) == "[[3, 3]]");
}

BOOST_AUTO_TEST_CASE(element_types_and_ranks) {
  const std::string i = print(make<std::int32_t>({1, -2, 3}, Shape{3}));
  BOOST_TEST(first_line(i) == "[1, -2, 3]");
  BOOST_TEST(footer(i).find("int32") != std::string::npos, i);
  BOOST_TEST(footer(i).find("(3,)") != std::string::npos, i);
  const std::string l = print(make<std::int64_t>({5000000000LL}, Shape{1, 1}));
  BOOST_TEST(first_line(l) == "[[5000000000]]");
  BOOST_TEST(footer(l).find("int64") != std::string::npos, l);
  const std::string d = print(make<double>({0.5, -1.25}, Shape{2}));
  BOOST_TEST(first_line(d) == "[0.5, -1.25]");
  BOOST_TEST(footer(d).find("float64") != std::string::npos, d);
  const std::string s = print(make<float>({7}, Shape{}));
  BOOST_TEST(first_line(s) == "7");
  BOOST_TEST(footer(s).find("()") != std::string::npos, s);
  const std::string m = print(make<float>({1, 2, 3, 4, 5, 6}, Shape{2, 3}));
  BOOST_TEST(m.substr(0, m.rfind('\n')) == "[[1, 2, 3],\n [4, 5, 6]]");
  const std::string e = print(make<float>({}, Shape{2, 0}));
  BOOST_TEST(first_line(e) == "[[],");
  // NaN prints without the sign bit a computed one carries on x86 (glibc: "-nan").
  const Tensor<float> computed_nan = deft::sqrt(make<float>({-1.0f, 4.0f}, Shape{2}));
  BOOST_TEST(first_line(print(computed_nan)) == "[nan, 2]");
  BOOST_TEST(first_line(print(make<double>({std::nan(""), -INFINITY}, Shape{2}))) == "[nan, -inf]");
}

BOOST_AUTO_TEST_CASE(large_tensors_are_summarised) {
  const std::string s = print(deft::arange<float>(2000.f));
  BOOST_TEST(s.find("...") != std::string::npos, s);
  BOOST_TEST(s.size() < 200u, s);
  // Regression (fixed in 1270f84): the separators around "..." were wrong,
  // "[0, 1, 2..., , 1997, 1998, 1999]".
  BOOST_TEST(first_line(s) == "[0, 1, 2, ..., 1997, 1998, 1999]");
  BOOST_TEST(s.find("1000") == std::string::npos, s);  // the middle is left out
  const std::string m = print(deft::arange<float>(10000.f).reshape({100, 100}));
  const std::string row0 = "[[0, 1, 2, ..., 97, 98, 99],\n";
  const std::string rows = row0 + " [100, 101, 102, ..., 197, 198, 199],\n [200, 201, 202, ..., 297, 298, 299],\n ...,\n" +
                           " [9700, 9701, 9702, ..., 9797, 9798, 9799],\n [9800, 9801, 9802, ..., 9897, 9898, 9899],\n" +
                           " [9900, 9901, 9902, ..., 9997, 9998, 9999]]";
  BOOST_TEST(m.substr(0, m.rfind('\n')) == rows);
  // At the threshold nothing is left out.
  const std::string t = print(deft::arange<std::int32_t>(1000));
  BOOST_TEST(t.find("...") == std::string::npos);
  BOOST_TEST(t.find("500, 501") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(printing_is_a_sync_point) {
  const Tensor<float> x = make<float>({1, 2}, Shape{2});
  engine::reset_stats();
  const Tensor<float> y = x * 10;
  BOOST_TEST(engine::stats().tasks_run == 0u);
  BOOST_TEST(first_line(print(y)) == "[10, 20]");
  BOOST_TEST(engine::stats().tasks_run == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
