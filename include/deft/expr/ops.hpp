// Element functors: what each elementwise operation computes, written once for
// scalars (host and device) and, on the host, for xsimd batches.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../core/config.hpp"

#include <xsimd/xsimd.hpp>

namespace deft::detail {

// --- helpers that differ between a scalar and a batch ----------------------
template <class V>
DEFT_HD V from_bool(bool c) { return c ? V(1) : V(0); }
template <class V>
DEFT_HD V choose(bool c, const V& a, const V& b) { return c ? a : b; }
template <class V>
DEFT_HD bool is_nan(const V& a) { return a != a; }

template <class V, class T, class A>
V from_bool(const xsimd::batch_bool<T, A>& c) { return xsimd::select(c, V(T(1)), V(T(0))); }
template <class T, class A>
xsimd::batch<T, A> choose(const xsimd::batch_bool<T, A>& c, const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  return xsimd::select(c, a, b);
}
// Not `a != a`: xsimd 8's batch != is an ordered compare (false for NaN).
template <class T, class A>
xsimd::batch_bool<T, A> is_nan(const xsimd::batch<T, A>& a) { return xsimd::isnan(a); }

// a > b ? a : b and a < b ? a : b, lane by lane. On x86, maxps and minps
// compute exactly these (NaN and signed zeros included) in one instruction,
// where the compare and blend take two.
template <class V>
DEFT_HD V greater_of(const V& a, const V& b) { return a > b ? a : b; }
template <class V>
DEFT_HD V lesser_of(const V& a, const V& b) { return a < b ? a : b; }
template <class T, class A>
xsimd::batch<T, A> greater_of(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
#if defined(__SSE2__) || defined(_M_X64)
  if constexpr (std::is_floating_point_v<T>) return xsimd::max(a, b);
#endif
  return xsimd::select(a > b, a, b);
}
template <class T, class A>
xsimd::batch<T, A> lesser_of(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
#if defined(__SSE2__) || defined(_M_X64)
  if constexpr (std::is_floating_point_v<T>) return xsimd::min(a, b);
#endif
  return xsimd::select(a < b, a, b);
}

// Recomputes the lanes of r selected by `fix` with the scalar f: for the IEEE
// special cases that xsimd 8's kernels get wrong (rare lanes, so cheap).
template <class T, class A, class F>
xsimd::batch<T, A> fix_lanes(const xsimd::batch_bool<T, A>& fix, const xsimd::batch<T, A>& r, F f,
                             const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) {
  if (!xsimd::any(fix)) return r;
  constexpr std::size_t W = xsimd::batch<T, A>::size;
  alignas(64) T ra[W], aa[W], ba[W];
  r.store_aligned(ra);
  a.store_aligned(aa);
  b.store_aligned(ba);
  for (std::size_t i = 0; i < W; ++i)
    if (fix.get(i)) ra[i] = f(aa[i], ba[i]);
  return xsimd::batch<T, A>::load_aligned(ra);
}

// Signed integer arithmetic wraps (as numpy does) instead of being undefined.
template <class V>
inline constexpr bool is_int = std::is_integral_v<V>;
template <class V, class F>
DEFT_HD V wrap(V a, V b, F f) {
  using U = std::make_unsigned_t<V>;
  return static_cast<V>(f(static_cast<U>(a), static_cast<U>(b)));
}

// --- unary -------------------------------------------------------------------
// `floating_only` ops refuse integer tensors at compile time (no silent truncation).
struct Neg {
  static constexpr int cost = 1;
  static constexpr bool floating_only = false;
  static constexpr const char* name = "neg";
  template <class V>
  DEFT_HD V operator()(const V& a) const {
    if constexpr (is_int<V>) return wrap(V(0), a, [](auto x, auto y) { return x - y; });
    else if constexpr (std::is_floating_point_v<V>) return -a;
    else return a * V(typename V::value_type(-1));  // xsimd 8's batch -x gives +0 for +0
  }
};
struct Abs {
  static constexpr int cost = 1;
  static constexpr bool floating_only = false;
  static constexpr const char* name = "abs";
  template <class V>
  DEFT_HD V operator()(const V& a) const {
    if constexpr (is_int<V>) return a < 0 ? Neg{}(a) : a;
    else { using std::abs; return abs(a); }
  }
};
#define DEFT_FLOAT_UNARY(Name, label, cost_, expr)                     \
  struct Name {                                                      \
    static constexpr int cost = cost_;                               \
    static constexpr bool floating_only = true;                      \
    static constexpr const char* name = label;                       \
    template <class V>                                               \
    DEFT_HD V operator()(const V& a) const {                         \
      using std::exp; using std::log; using std::sqrt; using std::tanh; using std::sin; using std::cos; \
      return expr;                                                   \
    }                                                                \
  };
// exp: xsimd 8 overflows to inf below log(max()) (from 88.38 for float) and
// flushes results below the normal range to 0; lanes near either edge use
// std::exp, so an element's value never depends on its place in a row.
struct Exp {
  static constexpr int cost = 8;
  static constexpr bool floating_only = true;
  static constexpr const char* name = "exp";
  template <class V>
  DEFT_HD V operator()(const V& a) const {
    using std::exp;
    if constexpr (std::is_floating_point_v<V>) {
      return exp(a);
    } else {
      using T = typename V::value_type;
      constexpr T hi = std::is_same_v<T, float> ? T(88) : T(709);    // log(max()) is 88.72 / 709.78
      constexpr T lo = std::is_same_v<T, float> ? T(-87) : T(-708);  // log(min()) is -87.34 / -708.40
      const auto edge = (a > V(hi)) | (a < V(lo));
      return fix_lanes(edge, V(exp(a)), [](T x, T) { return std::exp(x); }, a, a);
    }
  }
};
// log: xsimd 8 is wrong for denormal inputs; those lanes use std::log.
struct Log {
  static constexpr int cost = 8;
  static constexpr bool floating_only = true;
  static constexpr const char* name = "log";
  template <class V>
  DEFT_HD V operator()(const V& a) const {
    using std::log;
    if constexpr (std::is_floating_point_v<V>) {
      return log(a);
    } else {
      using T = typename V::value_type;
      const auto denormal = (a > V(T(0))) & (a < V(std::numeric_limits<T>::min()));
      return fix_lanes(denormal, V(log(a)), [](T x, T) { return std::log(x); }, a, a);
    }
  }
};
DEFT_FLOAT_UNARY(Sqrt, "sqrt", 4, sqrt(a))
DEFT_FLOAT_UNARY(Tanh, "tanh", 12, tanh(a))
DEFT_FLOAT_UNARY(Sin, "sin", 12, sin(a))
DEFT_FLOAT_UNARY(Cos, "cos", 12, cos(a))
DEFT_FLOAT_UNARY(Sigmoid, "sigmoid", 10, V(1) / (V(1) + Exp{}(-a)))  // Exp: the scalar tail's exp in every lane
#undef DEFT_FLOAT_UNARY

// --- binary ------------------------------------------------------------------
struct Add {
  static constexpr int cost = 1;
  static constexpr const char* name = "+";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const {
    if constexpr (is_int<V>) return wrap(a, b, [](auto x, auto y) { return x + y; });
    else return a + b;
  }
};
struct Sub {
  static constexpr int cost = 1;
  static constexpr const char* name = "-";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const {
    if constexpr (is_int<V>) return wrap(a, b, [](auto x, auto y) { return x - y; });
    else return a - b;
  }
};
struct Mul {
  static constexpr int cost = 1;
  static constexpr const char* name = "*";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const {
    if constexpr (is_int<V>) return wrap(a, b, [](auto x, auto y) { return x * y; });
    else return a * b;
  }
};
// Integer division by zero gives 0 (no SIGFPE); INT_MIN / -1 wraps.
struct Div {
  static constexpr int cost = 4;
  static constexpr const char* name = "/";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const {
    if constexpr (is_int<V>) {
      if (b == 0) return V(0);
      if (b == -1) return Neg{}(a);
      return a / b;
    } else {
      return a / b;
    }
  }
};
// maximum/minimum propagate NaN from either side, as numpy does.
struct Maximum {
  static constexpr int cost = 1;
  static constexpr const char* name = "maximum";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const { return choose(is_nan(a), a, greater_of(a, b)); }
};
struct Minimum {
  static constexpr int cost = 1;
  static constexpr const char* name = "minimum";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const { return choose(is_nan(a), a, lesser_of(a, b)); }
};
// relu(x) = maximum(x, 0), NaN included; a unary op of its own so that its
// derivative at 0 is 0 (as in PyTorch and MXNet), not maximum's tie rule.
struct Relu {
  static constexpr int cost = 1;
  static constexpr bool floating_only = false;
  static constexpr const char* name = "relu";
  template <class V>
  DEFT_HD V operator()(const V& a) const { return Maximum{}(a, V(0)); }
};
struct Pow {
  static constexpr int cost = 16;
  static constexpr const char* name = "pow";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const {
    if constexpr (is_int<V>) {  // exponentiation by squaring; negative exponents as numpy's 1/a^n truncated
      if (b < 0) return a == 1 ? V(1) : a == -1 ? ((b & 1) ? V(-1) : V(1)) : V(0);
      V result = 1, base = a;
      for (V e = b; e > 0; e >>= 1) {
        if (e & 1) result = Mul{}(result, base);
        base = Mul{}(base, base);
      }
      return result;
    } else if constexpr (std::is_floating_point_v<V>) {
      using std::pow;
      return pow(a, b);
    } else {
      // xsimd 8's pow misses IEEE special cases (pow(inf, 0) = 1, pow(-8, 1/3.) = NaN, ...):
      // lanes outside positive, normal, finite a != 1 and finite b != 0 use std::pow.
      using T = typename V::value_type;
      // So do results that over- or underflowed (pow(DBL_MAX, 1) = inf there).
      // Squares and first powers exactly, as std::pow gives them (xsimd's
      // float pow is up to 5 ulp off there, and pow(x, 1) != x).
      const V r = xsimd::select(b == V(T(1)), a, xsimd::select(b == V(T(2)), a * a, xsimd::pow(a, b)));
      const auto special = (!(xsimd::isfinite(a) & xsimd::isfinite(b))) | (a < V(std::numeric_limits<T>::min())) |
                           (b == V(T(0))) | (a == V(T(1))) | (!xsimd::isfinite(r)) |
                           (xsimd::abs(r) < V(std::numeric_limits<T>::min()));
      return fix_lanes(special, r, [](T x, T y) { return std::pow(x, y); }, a, b);
    }
  }
};

// Comparisons give masks of the operands' type: 1 where true, 0 elsewhere.
#define DEFT_COMPARISON(Name, label, op)                                         \
  struct Name {                                                                \
    static constexpr int cost = 1;                                             \
    static constexpr const char* name = label;                                 \
    template <class V>                                                         \
    DEFT_HD V operator()(const V& a, const V& b) const { return from_bool<V>(a op b); } \
  };
DEFT_COMPARISON(Less, "<", <)
DEFT_COMPARISON(LessEqual, "<=", <=)
DEFT_COMPARISON(Greater, ">", >)
DEFT_COMPARISON(GreaterEqual, ">=", >=)
DEFT_COMPARISON(Equal, "==", ==)
#undef DEFT_COMPARISON
// a != b as !(a == b): true when either is NaN, also for xsimd 8 batches
// (whose != is an ordered compare).
struct NotEqual {
  static constexpr int cost = 1;
  static constexpr const char* name = "!=";
  template <class V>
  DEFT_HD V operator()(const V& a, const V& b) const { return from_bool<V>(!(a == b)); }
};

/// where(c, a, b): a where c is nonzero, b elsewhere.
struct Where {
  static constexpr int cost = 1;
  template <class V>
  DEFT_HD V operator()(const V& c, const V& a, const V& b) const { return choose(!(c == V(0)), a, b); }  // NaN selects a
};

/// Float to integer conversion that never invokes undefined behaviour:
/// NaN becomes 0 and out-of-range values saturate.
template <class To, class From>
DEFT_HD To convert(From v) {
  if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    if (v != v) return To(0);
    if (v <= From(std::numeric_limits<To>::lowest())) return std::numeric_limits<To>::lowest();
    if (v >= From(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
  }
  return static_cast<To>(v);
}

}  // namespace deft::detail
