// NaN, ±Inf, ±0, the extremes and denormals through every elementwise op,
// cast and reduction, against IEEE results computed in double (numpy's rules
// where IEEE has none: maximum/minimum/max/min propagate NaN, argmax returns
// the first NaN); and integer semantics: wrap-around, division by zero gives 0.
// Every path is taken: SIMD batches (long rows), scalar tails (broadcast rows
// and one-element tensors), reductions over all elements, along the last axis
// and along a leading axis, in several chunks.
#include <cmath>
#include <limits>

#include "bad_input.hpp"

using namespace bad;

namespace {

using Floats = std::tuple<float, double>;
using Ints = std::tuple<std::int32_t, std::int64_t>;

template <class T>
std::vector<T> specials() {
  using L = std::numeric_limits<T>;
  return {L::quiet_NaN(), L::infinity(), -L::infinity(), T(0), -T(0), T(1), T(-1), T(0.5), T(2), T(-3),
          L::max(),       L::lowest(),   L::denorm_min(),  L::min()};
}

/// got vs ref (already rounded to T): NaN matches NaN, infinities and (when
/// `sign`) the sign of zero exactly, other values within rtol.
template <class T>
void check_ieee(const std::vector<T>& got, const std::vector<double>& ref, double rtol, bool sign, const std::string& what,
                const std::vector<std::string>& inputs) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.size());
  std::size_t bad_count = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), r = double(T(ref[i]));
    bool ok;
    if (std::isnan(r)) ok = std::isnan(g);
    else if (std::isinf(r) || r == 0) ok = g == r && (!sign || std::signbit(g) == std::signbit(r));
    else ok = std::abs(g - r) <= rtol * std::abs(r);
    if (!ok && bad_count++ < 6)
      BOOST_ERROR(what << " " << type_name<T>() << " " << inputs[i] << ": got " << g << ", expected " << r);
  }
  BOOST_TEST(bad_count == 0u, what << " " << type_name<T>() << ": " << bad_count << " wrong");
}

std::string show(double a) {
  std::ostringstream os;
  os.precision(9);
  os << a;
  return os.str();
}

template <class T>
struct BinaryOp {
  std::string name;
  std::function<Tensor<T>(const Tensor<T>&, const Tensor<T>&)> deft;
  std::function<double(double, double)> ref;
  double rtol;
  bool sign;
};

template <class T>
std::vector<BinaryOp<T>> binary_ops() {
  const double p = std::is_same_v<T, float> ? 1e-6 : 1e-15;
  auto mask = [](bool c) { return c ? 1.0 : 0.0; };
  auto nanmax = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); };
  auto nanmin = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); };
  return {
      {"+", [](auto& a, auto& b) { return Tensor<T>(a + b); }, [](double a, double b) { return a + b; }, 0, true},
      {"-", [](auto& a, auto& b) { return Tensor<T>(a - b); }, [](double a, double b) { return a - b; }, 0, true},
      {"*", [](auto& a, auto& b) { return Tensor<T>(a * b); }, [](double a, double b) { return a * b; }, 0, true},
      {"/", [](auto& a, auto& b) { return Tensor<T>(a / b); }, [](double a, double b) { return a / b; }, 0, true},
      {"maximum", [](auto& a, auto& b) { return Tensor<T>(deft::maximum(a, b)); }, nanmax, 0, false},
      {"minimum", [](auto& a, auto& b) { return Tensor<T>(deft::minimum(a, b)); }, nanmin, 0, false},
      {"pow", [](auto& a, auto& b) { return Tensor<T>(deft::pow(a, b)); },
       [](double a, double b) { return std::pow(a, b); }, 64 * p, true},  // xsimd's pow: a few ulps at the extremes
      {"<", [](auto& a, auto& b) { return Tensor<T>(a < b); }, [=](double a, double b) { return mask(a < b); }, 0, false},
      {"<=", [](auto& a, auto& b) { return Tensor<T>(a <= b); }, [=](double a, double b) { return mask(a <= b); }, 0, false},
      {">", [](auto& a, auto& b) { return Tensor<T>(a > b); }, [=](double a, double b) { return mask(a > b); }, 0, false},
      {">=", [](auto& a, auto& b) { return Tensor<T>(a >= b); }, [=](double a, double b) { return mask(a >= b); }, 0, false},
      {"==", [](auto& a, auto& b) { return Tensor<T>(a == b); }, [=](double a, double b) { return mask(a == b); }, 0, false},
      {"!=", [](auto& a, auto& b) { return Tensor<T>(a != b); }, [=](double a, double b) { return mask(a != b); }, 0, false},
      {"where", [](auto& a, auto& b) { return Tensor<T>(deft::where(a, b, T(7))); },
       [](double a, double b) { return a != 0 ? b : 7.0; }, 0, true},
  };
}

template <class T>
struct UnaryOp {
  std::string name;
  std::function<Tensor<T>(const Tensor<T>&)> deft;
  std::function<double(double)> ref;
  double rtol;
  bool sign;
};

template <class T>
std::vector<UnaryOp<T>> unary_ops() {
  const double t = std::is_same_v<T, float> ? 4e-6 : 1e-13;
  return {
      {"neg", [](auto& a) { return Tensor<T>(-a); }, [](double a) { return -a; }, 0, true},
      {"abs", [](auto& a) { return Tensor<T>(deft::abs(a)); }, [](double a) { return std::fabs(a); }, 0, true},
      {"exp", [](auto& a) { return Tensor<T>(deft::exp(a)); }, [](double a) { return std::exp(a); }, t, true},
      {"log", [](auto& a) { return Tensor<T>(deft::log(a)); }, [](double a) { return std::log(a); }, t, true},
      {"sqrt", [](auto& a) { return Tensor<T>(deft::sqrt(a)); }, [](double a) { return std::sqrt(a); }, t, true},
      {"tanh", [](auto& a) { return Tensor<T>(deft::tanh(a)); }, [](double a) { return std::tanh(a); }, t, true},
      {"sigmoid", [](auto& a) { return Tensor<T>(deft::sigmoid(a)); }, [](double a) { return 1 / (1 + std::exp(-a)); }, t, false},
      {"relu", [](auto& a) { return Tensor<T>(deft::relu(a)); },
       [](double a) { return std::isnan(a) ? a : a > 0 ? a : 0.0; }, 0, false},
  };
}

}  // namespace

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(ieee_elementwise, EngineFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(binary_ops_on_special_values, T, Floats) {
  const auto v = specials<T>();
  const std::size_t n = v.size();
  std::vector<T> av, bv;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      av.push_back(v[i]);
      bv.push_back(v[j]);
      names.push_back("(" + show(v[i]) + ", " + show(v[j]) + ")");
    }
  const Tensor<T> a = make(av, Shape{i64(n * n)}), b = make(bv, Shape{i64(n * n)});
  const Tensor<T> col = make(v, Shape{i64(n), 1}), row = make(v, Shape{1, i64(n)});
  for (const auto& op : binary_ops<T>()) {
    std::vector<double> ref;
    for (std::size_t k = 0; k < av.size(); ++k) ref.push_back(op.ref(double(av[k]), double(bv[k])));
    check_ieee(op.deft(a, b).to_vector(), ref, op.rtol, op.sign, op.name + " (long rows)", names);
    check_ieee(op.deft(col, row).to_vector(), ref, op.rtol, op.sign, op.name + " (broadcast rows)", names);
    std::vector<T> single;
    for (std::size_t k = 0; k < av.size(); ++k)
      single.push_back(op.deft(make(std::vector<T>{av[k]}, Shape{1}), make(std::vector<T>{bv[k]}, Shape{1})).item());
    check_ieee(single, ref, op.rtol, op.sign, op.name + " (one element)", names);
  }
  // A number on either side (a Constant operand).
  std::vector<double> r1, r2;
  std::vector<std::string> n1;
  for (T x : v) {
    r1.push_back(double(x) * 0.0);
    r2.push_back(std::numeric_limits<double>::infinity() - double(x));
    n1.push_back(show(x));
  }
  const Tensor<T> vt = make(v, Shape{i64(n)});
  check_ieee(Tensor<T>(vt * T(0)).to_vector(), r1, 0, true, "x * 0", n1);
  check_ieee(Tensor<T>(std::numeric_limits<T>::infinity() - vt).to_vector(), r2, 0, true, "inf - x", n1);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(unary_ops_on_special_values, T, Floats) {
  const auto v = specials<T>();
  std::vector<T> av;
  std::vector<std::string> names;
  for (int rep = 0; rep < 5; ++rep)
    for (T x : v) {
      av.push_back(x);
      names.push_back(show(x));
    }
  const Tensor<T> a = make(av, Shape{i64(av.size())});
  for (const auto& op : unary_ops<T>()) {
    std::vector<double> ref;
    for (T x : av) ref.push_back(op.ref(double(x)));
    check_ieee(op.deft(a).to_vector(), ref, op.rtol, op.sign, op.name, names);
    std::vector<T> single;
    for (T x : v) single.push_back(op.deft(make(std::vector<T>{x}, Shape{})).item());
    check_ieee(single, std::vector<double>(ref.begin(), ref.begin() + v.size()), op.rtol, op.sign, op.name + " (scalar)",
               names);
  }
}

BOOST_AUTO_TEST_CASE(casts_of_special_values) {
  // Float to integer: NaN gives 0, out-of-range values saturate, the rest truncate.
  const auto f = specials<float>();
  const Tensor<float> ft = make(f, Shape{i64(f.size())});
  const auto i32 = Tensor<std::int32_t>(deft::cast<std::int32_t>(ft)).to_vector();
  const std::int32_t I = std::numeric_limits<std::int32_t>::max(), J = std::numeric_limits<std::int32_t>::min();
  check_equal(i32, std::vector<std::int32_t>{0, I, J, 0, 0, 1, -1, 0, 2, -3, I, J, 0, 0}, "cast<int32>(float)");
  const auto d = specials<double>();
  const auto i64v = Tensor<std::int64_t>(deft::cast<std::int64_t>(make(d, Shape{i64(d.size())}))).to_vector();
  const i64 K = std::numeric_limits<i64>::max(), M = std::numeric_limits<i64>::min();
  check_equal(i64v, std::vector<i64>{0, K, M, 0, 0, 1, -1, 0, 2, -3, K, M, 0, 0}, "cast<int64>(double)");
  check_equal(Tensor<std::int64_t>(deft::cast<std::int64_t>(make<double>({9.3e18, -9.3e18, 2.9e9, -2.5}, Shape{4}))).to_vector(),
              std::vector<i64>{K, M, 2900000000LL, -2}, "cast<int64> near the limits");
  // Double to float: NaN and infinities carry over, beyond FLT_MAX rounds to infinity, below denormals to ±0.
  const auto fd = Tensor<float>(deft::cast<float>(make<double>({NAN, INFINITY, -INFINITY, 1e300, -1e300, 1e-300, -1e-300, -0.0},
                                                                Shape{8}))).to_vector();
  check_ieee(fd, {NAN, INFINITY, -INFINITY, INFINITY, -INFINITY, 0.0, -0.0, -0.0}, 0, true, "cast<float>(double)",
             std::vector<std::string>(8, "value"));
  // Integer to float.
  check_equal(Tensor<float>(deft::cast<float>(make<std::int64_t>({K, M}, Shape{2}))).to_vector(),
              std::vector<float>{float(K), float(M)}, "cast<float>(int64)");
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
namespace {

struct Pattern {
  std::string name;
  std::vector<double> values;
  double background;  // the other elements of the long layouts
  bool overflow;      // finite values whose sum overflows T: mean is left out
};

const std::vector<Pattern>& patterns() {
  static const std::vector<Pattern> p = {
      {"{1, NaN, 3}", {1, NAN, 3}, 1, false},
      {"{1, inf, 3}", {1, INFINITY, 3}, 1, false},
      {"{inf, -inf}", {INFINITY, -INFINITY}, 1, false},
      {"{-inf, -inf} (all)", {-INFINITY, -INFINITY}, -INFINITY, false},
      {"{inf, inf} (all)", {INFINITY, INFINITY}, INFINITY, false},
      {"{NaN, inf, NaN}", {NAN, INFINITY, NAN}, -1, false},
      {"{-inf, NaN}", {-INFINITY, NAN}, -INFINITY, false},
      {"{2, -inf, 5}", {2, -INFINITY, 5}, -2, false},
      {"{NaN} (all)", {NAN}, NAN, false},
  };
  return p;
}

// numpy's semantics, in double.
double ref_max(const std::vector<double>& x) {
  double m = -INFINITY;
  for (double v : x) {
    if (std::isnan(v)) return NAN;
    m = std::max(m, v);
  }
  return m;
}
double ref_min(const std::vector<double>& x) {
  double m = INFINITY;
  for (double v : x) {
    if (std::isnan(v)) return NAN;
    m = std::min(m, v);
  }
  return m;
}
double ref_argmax(const std::vector<double>& x) {
  std::size_t best = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) return double(i);
    if (x[i] > x[best] || (std::isnan(x[best]))) best = i;
  }
  return double(best);
}
double ref_sum(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}
double ref_norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

/// The reductions of a (rows x cols) tensor against the references, over
/// all elements and along both axes.
template <class T>
void check_reductions(const std::vector<double>& data, i64 rows, i64 cols, const std::string& what) {
  std::vector<T> tv(data.begin(), data.end());
  std::vector<double> dv(tv.begin(), tv.end());  // the values as T holds them
  const Tensor<T> x = make(tv, Shape{rows, cols});
  const Tensor<T> flat = x.reshape({-1});
  using Ref = double (*)(const std::vector<double>&);
  const std::vector<std::tuple<std::string, Ref, std::function<Tensor<T>(const Tensor<T>&)>,
                               std::function<Tensor<T>(const Tensor<T>&, int)>>>
      reds = {
          {"sum", ref_sum, [](auto& t) { return deft::sum(t); }, [](auto& t, int a) { return deft::sum(t, a); }},
          {"mean", [](const std::vector<double>& v) { return ref_sum(v) / double(v.size()); },
           [](auto& t) { return deft::mean(t); }, [](auto& t, int a) { return deft::mean(t, a); }},
          {"max", ref_max, [](auto& t) { return deft::max(t); }, [](auto& t, int a) { return deft::max(t, a); }},
          {"min", ref_min, [](auto& t) { return deft::min(t); }, [](auto& t, int a) { return deft::min(t, a); }},
          {"norm", ref_norm, [](auto& t) { return deft::norm(t); }, [](auto& t, int a) { return deft::norm(t, a); }},
          {"argmax", ref_argmax,
           [](auto& t) { return Tensor<T>(deft::cast<T>(deft::argmax(t))); },
           [](auto& t, int a) { return Tensor<T>(deft::cast<T>(deft::argmax(t, a))); }},
      };
  const double rtol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  for (const auto& [name, ref, all, axis] : reds) {
    const std::string w = name + " " + what;
    check_ieee(all(flat).to_vector(), {ref(dv)}, rtol, false, w + " (all)", {"all"});
    check_ieee(all(x * T(1)).to_vector(), {ref(dv)}, rtol, false, w + " (all, of an expression)", {"all"});
    std::vector<double> r1, r0;
    for (i64 r = 0; r < rows; ++r) r1.push_back(ref(std::vector<double>(dv.begin() + r * cols, dv.begin() + (r + 1) * cols)));
    for (i64 c = 0; c < cols; ++c) {
      std::vector<double> col;
      for (i64 r = 0; r < rows; ++r) col.push_back(dv[r * cols + c]);
      r0.push_back(ref(col));
    }
    check_ieee(axis(x, 1).to_vector(), r1, rtol, false, w + " (axis 1)", std::vector<std::string>(r1.size(), "row"));
    check_ieee(axis(x, 0).to_vector(), r0, rtol, false, w + " (axis 0)", std::vector<std::string>(r0.size(), "column"));
  }
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(ieee_reductions, EngineFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(special_values_in_every_layout, T, Floats) {
  for (const auto& p : patterns()) {
    // Short: the pattern alone, as one row and as one column.
    check_reductions<T>(p.values, 1, i64(p.values.size()), p.name + " short row");
    check_reductions<T>(p.values, i64(p.values.size()), 1, p.name + " short column");
    // Long: 3+ reduction chunks, the pattern's values spread out (one lands
    // in the last SIMD tail), the rest `background`.
    const i64 rows = 37, cols = 1423, n = rows * cols;
    std::vector<double> big(n, p.background);
    for (std::size_t k = 0; k < p.values.size(); ++k) big[(k + 1) * (n / (p.values.size() + 1)) + 3] = p.values[k];
    big[n - 1] = p.values.back();
    check_reductions<T>(big, rows, cols, p.name + " long");
  }
}

BOOST_AUTO_TEST_CASE(overflow_and_signed_zero) {
  const float fmax = std::numeric_limits<float>::max();
  // Finite values whose sum exceeds the type: +inf, as IEEE (numpy float32 too).
  BOOST_TEST(std::isinf(deft::sum(make<float>({fmax, fmax}, Shape{2})).item()));
  BOOST_TEST(std::isinf(deft::mean(make<float>({fmax, fmax}, Shape{2})).item()));
  // norm squares without scaling: |x| > sqrt(FLT_MAX) overflows to inf (as numpy's float32 norm).
  BOOST_TEST(std::isinf(deft::norm(make<float>({1e20f}, Shape{1})).item()));
  BOOST_TEST(deft::norm(make<double>({1e20}, Shape{1})).item() == 1e20);
  // The sum of negative zeros is +0 (the reduction starts from +0; numpy gives -0).
  const float z = deft::sum(make<float>({-0.f, -0.f}, Shape{2})).item();
  BOOST_TEST((z == 0.f && !std::signbit(z)));
  // max/min of equal zeros: a zero (either sign).
  BOOST_TEST(deft::max(make<float>({-0.f, 0.f}, Shape{2})).item() == 0.f);
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
namespace {

template <class T>
T wrap_ref(double) = delete;

template <class T>
using U = std::make_unsigned_t<T>;

template <class T>
T ref_pow(T a, T b) {
  if (b < 0) return a == 1 ? T(1) : a == -1 ? ((b % 2) ? T(-1) : T(1)) : T(0);
  U<T> r = 1;
  for (T e = 0; e < b; ++e) r = U<T>(r * U<T>(a));
  return T(r);
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(integer_semantics, EngineFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(wrap_around_and_division_by_zero, T, Ints) {
  using L = std::numeric_limits<T>;
  const std::vector<T> v = {L::max(), L::min(), T(-1), T(0), T(1), T(2), T(7), T(-7), T(3)};
  const std::vector<T> exps = {T(-2), T(-1), T(0), T(1), T(2), T(3), T(31), T(63)};
  std::vector<T> av, bv, pa, pb;
  for (T x : v)
    for (T y : v) {
      av.push_back(x);
      bv.push_back(y);
    }
  for (T x : v)
    for (T e : exps) {
      pa.push_back(x);
      pb.push_back(e);
    }
  const Tensor<T> a = make(av, Shape{i64(av.size())}), b = make(bv, Shape{i64(bv.size())});
  std::vector<T> add, sub, mul, div, pw;
  for (std::size_t k = 0; k < av.size(); ++k) {
    const U<T> x = U<T>(av[k]), y = U<T>(bv[k]);
    add.push_back(T(U<T>(x + y)));
    sub.push_back(T(U<T>(x - y)));
    mul.push_back(T(U<T>(x * y)));
    div.push_back(bv[k] == 0 ? T(0) : bv[k] == -1 ? T(U<T>(U<T>(0) - x)) : T(av[k] / bv[k]));
  }
  for (std::size_t k = 0; k < pa.size(); ++k) pw.push_back(ref_pow(pa[k], pb[k]));
  check_equal(Tensor<T>(a + b).to_vector(), add, "+ wraps");
  check_equal(Tensor<T>(a - b).to_vector(), sub, "- wraps");
  check_equal(Tensor<T>(a * b).to_vector(), mul, "* wraps");
  check_equal(Tensor<T>(a / b).to_vector(), div, "/ truncates, x / 0 = 0, MIN / -1 wraps");
  check_equal(Tensor<T>(deft::pow(make(pa, Shape{i64(pa.size())}), make(pb, Shape{i64(pb.size())}))).to_vector(), pw,
              "pow wraps, negative exponents as numpy");
  std::vector<T> neg, ab;
  for (T x : v) {
    neg.push_back(T(U<T>(U<T>(0) - U<T>(x))));
    ab.push_back(x < 0 ? T(U<T>(U<T>(0) - U<T>(x))) : x);
  }
  const Tensor<T> vt = make(v, Shape{i64(v.size())});
  check_equal(Tensor<T>(-vt).to_vector(), neg, "-MIN = MIN");
  check_equal(Tensor<T>(deft::abs(vt)).to_vector(), ab, "abs(MIN) = MIN");
  // Compound updates and scalars: t /= 0 gives zeros, t += MAX wraps.
  Tensor<T> t = vt.clone();
  t /= T(0);
  check_equal(t.to_vector(), std::vector<T>(v.size(), T(0)), "t /= 0");
  Tensor<T> u = make(std::vector<T>{L::max(), T(1)}, Shape{2});
  u += L::max();
  check_equal(u.to_vector(), std::vector<T>{T(-2), L::min()}, "t += MAX");
  // Reductions wrap too (sum), max/min/argmax are exact.
  const i64 n = 70001;
  const Tensor<T> big = deft::full<T>({n}, L::max());
  check_equal(std::vector<T>{deft::sum(big).item()}, std::vector<T>{T(U<T>(U<T>(L::max()) * U<T>(n)))}, "sum wraps");
  check_equal(std::vector<T>{deft::sum(make(std::vector<T>{L::max(), T(1)}, Shape{2})).item()}, std::vector<T>{L::min()},
              "MAX + 1 = MIN");
  BOOST_TEST(deft::max(vt).item() == L::max());
  BOOST_TEST(deft::min(vt).item() == L::min());
  BOOST_TEST(deft::argmax(vt).item() == 0);
  BOOST_TEST(deft::max(deft::full<T>({3}, L::min())).item() == L::min());
  // Narrowing casts between integers are modular.
  if constexpr (std::is_same_v<T, std::int64_t>)
    check_equal(Tensor<std::int32_t>(deft::cast<std::int32_t>(make<T>({T(1) << 32 | 5, -1, T(1) << 31}, Shape{3}))).to_vector(),
                std::vector<std::int32_t>{5, -1, std::numeric_limits<std::int32_t>::min()}, "cast<int32>(int64)");
}

BOOST_AUTO_TEST_SUITE_END()
