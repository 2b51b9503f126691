// Shared helpers for deft's tests: an engine fixture that isolates every test
// case, seeded random inputs, a naive double-precision broadcasting reference
// and tolerance checks that report the first mismatches.
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <deft/deft.hpp>

namespace dt {

using deft::Shape;
using deft::Tensor;
using i64 = std::int64_t;

// --- engine state --------------------------------------------------------------

/// Drains the engine and swallows a failure left by an earlier test.
inline void settle() {
  try {
    deft::wait_all();
  } catch (...) {
  }
}

/// The engine mode the process started in (DEFT_ENGINE=synchronous selects
/// synchronous mode; CTest runs the numeric suites that way too).
inline deft::engine::Mode initial_mode() {
  static const deft::engine::Mode m = deft::engine::mode();
  return m;
}

/// Puts the engine in a known state (the process's initial mode, default
/// limits, no pending failure) around every test case and restores the worker
/// count, so that one test's failure or settings never leak into the next.
struct EngineFixture {
  deft::engine::Mode mode;
  int workers;
  explicit EngineFixture(deft::engine::Mode m = initial_mode()) : mode(m) {
    deft::engine::set_mode(mode);
    deft::engine::set_limits(deft::engine::Limits{});
    settle();
    workers = deft::engine::num_workers();
    deft::engine::reset_stats();
  }
  ~EngineFixture() {
    try {
      deft::engine::set_mode(mode);
      settle();
      deft::engine::set_limits(deft::engine::Limits{});
      if (deft::engine::num_workers() != workers) deft::engine::set_num_workers(workers);
      settle();
    } catch (...) {
    }
  }
};

/// For suites about deferral itself: always deferred mode.
struct DeferredFixture : EngineFixture {
  DeferredFixture() : EngineFixture(deft::engine::Mode::deferred) {}
};

/// True when statements are deferred (checks of laziness only apply then).
inline bool deferred_mode() { return deft::engine::mode() == deft::engine::Mode::deferred; }

/// Sets an engine setting for a scope and restores the previous value, even
/// when a check throws (with Settle, the engine is drained first so that no
/// work recorded under the setting straddles the restore).
template <class Value, Value (*get)(), void (*set)(Value), bool Settle = false>
struct ScopedSetting {
  Value saved;
  explicit ScopedSetting(Value v) : saved(get()) { set(v); }
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;
  ~ScopedSetting() {
    try {
      if constexpr (Settle) settle();
      set(saved);
    } catch (...) {
    }
  }
};
inline void set_limits_by_value(deft::engine::Limits l) { deft::engine::set_limits(l); }
using WorkersGuard = ScopedSetting<int, &deft::engine::num_workers, &deft::engine::set_num_workers>;
using ModeGuard = ScopedSetting<deft::engine::Mode, &deft::engine::mode, &deft::engine::set_mode>;
using LimitsGuard = ScopedSetting<deft::engine::Limits, &deft::engine::limits, &set_limits_by_value, true>;

/// f() with the engine's worker count set to `workers` (restored after).
template <class F>
auto with_workers(int workers, F&& f) {
  WorkersGuard guard(workers);
  return f();
}

/// Shapes for same-shape elementwise checks: a small one with SIMD tails and a
/// large one that the engine splits across workers.
inline const std::vector<std::vector<i64>> kElementwiseShapes = {{3, 37}, {300, 257}};

// --- inputs ----------------------------------------------------------------------

/// n values uniform in [lo, hi] (integers: lo..hi inclusive).
template <class T>
std::vector<T> random_values(std::mt19937& g, std::size_t n, double lo, double hi) {
  std::vector<T> v(n);
  if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (auto& x : v) x = static_cast<T>(d(g));
  } else {
    std::uniform_int_distribution<long long> d(static_cast<long long>(lo), static_cast<long long>(hi));
    for (auto& x : v) x = static_cast<T>(d(g));
  }
  return v;
}

/// Values with magnitude in [lo, hi] and a random sign (never near zero).
template <class T>
std::vector<T> away_from_zero(std::mt19937& g, std::size_t n, double lo, double hi) {
  auto v = random_values<T>(g, n, lo, hi);
  std::bernoulli_distribution s(0.5);
  for (auto& x : v)
    if (s(g)) x = static_cast<T>(-x);
  return v;
}

inline std::vector<i64> dims_of(const Shape& s) { return std::vector<i64>(s.begin(), s.end()); }

inline std::string str(const Shape& s) { return s.to_string(); }

template <class T>
Tensor<T> make(const std::vector<T>& v, const Shape& s) {
  return Tensor<T>(v, s);
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// --- naive reference -----------------------------------------------------------

/// The numpy broadcast of two shapes, computed independently of deft.
inline std::vector<i64> broadcast_dims(const std::vector<i64>& a, const std::vector<i64>& b) {
  const std::size_t r = std::max(a.size(), b.size());
  std::vector<i64> out(r);
  for (std::size_t i = 0; i < r; ++i) {
    const long ia = long(i) - long(r - a.size()), ib = long(i) - long(r - b.size());
    const i64 da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    BOOST_REQUIRE_MESSAGE(da == db || da == 1 || db == 1, "test bug: incompatible shapes");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

inline i64 product(const std::vector<i64>& d) {
  i64 n = 1;
  for (auto x : d) n *= x;
  return n;
}

/// Offset into an operand of dims `in` (row-major) of the output multi-index
/// `idx` (of rank >= in.size()): right-aligned, size-1 dims read index 0.
inline i64 broadcast_offset(const std::vector<i64>& idx, const std::vector<i64>& in) {
  const std::size_t lead = idx.size() - in.size();
  i64 off = 0;
  for (std::size_t d = 0; d < in.size(); ++d) off = off * in[d] + (in[d] == 1 ? 0 : idx[lead + d]);
  return off;
}

/// Multi-index of linear position `lin` in `dims`.
inline std::vector<i64> unravel(i64 lin, const std::vector<i64>& dims) {
  std::vector<i64> idx(dims.size());
  for (long d = long(dims.size()) - 1; d >= 0; --d) {
    idx[d] = dims[d] ? lin % dims[d] : 0;
    lin = dims[d] ? lin / dims[d] : 0;
  }
  return idx;
}

/// out[i] = f(a[bcast], b[bcast]) over the broadcast shape, in double.
template <class A, class B, class F>
std::vector<double> ref_binary(const std::vector<A>& a, const std::vector<i64>& da, const std::vector<B>& b,
                               const std::vector<i64>& db, F f) {
  const auto out = broadcast_dims(da, db);
  const i64 n = product(out);
  std::vector<double> r(n);
  for (i64 i = 0; i < n; ++i) {
    const auto idx = unravel(i, out);
    r[i] = f(double(a[broadcast_offset(idx, da)]), double(b[broadcast_offset(idx, db)]));
  }
  return r;
}

// --- comparison -----------------------------------------------------------------

/// Checks got[i] against ref[i]: |got - ref| <= rtol * |ref| + atol (NaN only
/// matches NaN). Reports the count and the first few mismatches.
template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& ref, double rtol, double atol,
                 const std::string& what) {
  BOOST_REQUIRE_MESSAGE(got.size() == ref.size(),
                        what << ": " << got.size() << " values, expected " << ref.size());
  std::size_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), r = ref[i];
    bool ok;
    if (std::isnan(r)) ok = std::isnan(g);
    else if (std::isinf(r)) ok = g == r;
    else ok = std::abs(g - r) <= rtol * std::abs(r) + atol;
    if (!ok && bad++ < 4) first << "\n  [" << i << "] got " << g << ", expected " << r;
  }
  BOOST_TEST(bad == 0u, what << ": " << bad << " of " << got.size() << " values outside tolerance (rtol " << rtol
                             << ", atol " << atol << ")" << first.str());
}

/// Exact comparison (integers, masks, copies).
template <class T, class U>
void check_equal(const std::vector<T>& got, const std::vector<U>& ref, const std::string& what) {
  BOOST_REQUIRE_MESSAGE(got.size() == ref.size(),
                        what << ": " << got.size() << " values, expected " << ref.size());
  std::size_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(double(got[i]) == double(ref[i])) && !(std::isnan(double(got[i])) && std::isnan(double(ref[i])))) {
      if (bad++ < 4) first << "\n  [" << i << "] got " << +got[i] << ", expected " << +ref[i];
    }
  }
  BOOST_TEST(bad == 0u, what << ": " << bad << " of " << got.size() << " values differ" << first.str());
}

/// Checks shape and values of a tensor against a reference.
template <class T>
void check_tensor(const Tensor<T>& t, const std::vector<i64>& dims, const std::vector<double>& ref, double rtol,
                  double atol, const std::string& what) {
  BOOST_TEST(dims_of(t.shape()) == dims, what << ": shape " << t.shape().to_string());
  if (std::is_integral_v<T>) check_equal(t.to_vector(), ref, what);
  else check_close(t.to_vector(), ref, rtol, atol, what);
}

/// Bitwise equality of two float vectors.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Default tolerances: float arithmetic / double arithmetic.
template <class T>
constexpr double arith_rtol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
template <class T>
constexpr double transc_rtol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
template <class T>
constexpr double transc_atol = std::is_same_v<T, float> ? 1e-6 : 1e-14;

template <class T>
const char* type_name() {
  return deft::dtype_name_of<T>;
}

/// A deft::Shape from a vector of extents.
inline Shape shape_of(const std::vector<i64>& d) { return Shape(d); }

// --- elementwise checks ----------------------------------------------------------

/// c = mk(a, b) for a, b of dims da, db, checked against rf on every element.
template <class T, class Mk, class Rf>
void check_binary(const std::vector<T>& av, const std::vector<i64>& da, const std::vector<T>& bv,
                  const std::vector<i64>& db, Mk mk, Rf rf, double rtol, double atol, const std::string& what) {
  const Tensor<T> a = make(av, shape_of(da)), b = make(bv, shape_of(db));
  const Tensor<T> c = mk(a, b);
  check_tensor(c, broadcast_dims(da, db), ref_binary(av, da, bv, db, rf), rtol, atol,
               what + " " + type_name<T>() + " " + str(shape_of(da)) + " " + str(shape_of(db)));
}

/// c = mk(a) checked against rf.
template <class T, class Mk, class Rf>
void check_unary(const std::vector<T>& av, const std::vector<i64>& da, Mk mk, Rf rf, double rtol, double atol,
                 const std::string& what) {
  const Tensor<T> a = make(av, shape_of(da));
  const Tensor<T> c = mk(a);
  std::vector<double> ref(av.size());
  for (std::size_t i = 0; i < av.size(); ++i) ref[i] = rf(double(av[i]));
  check_tensor(c, da, ref, rtol, atol, what + " " + type_name<T>() + " " + str(shape_of(da)));
}

/// b equal to a at about a third of the positions (ties for comparisons).
template <class T>
std::vector<T> with_ties(std::mt19937& g, const std::vector<T>& a, std::vector<T> b) {
  std::bernoulli_distribution tie(0.33);
  for (std::size_t i = 0; i < b.size(); ++i)
    if (tie(g)) b[i] = a[i];
  return b;
}

/// Runs f and checks that it throws std::invalid_argument whose message holds every part.
template <class F>
void expect_invalid(F f, std::vector<std::string> parts, const std::string& what) {
  bool thrown = false;
  try {
    f();
  } catch (const std::invalid_argument& e) {
    thrown = true;
    const std::string msg = e.what();
    for (const auto& p : parts) BOOST_TEST(msg.find(p) != std::string::npos, what << ": message '" << msg << "' lacks '" << p << "'");
  }
  BOOST_TEST(thrown, what << ": no std::invalid_argument");
}

}  // namespace dt
