// Reducers: how the values of a reduction combine (identity, step, merge,
// finish), written once for scalars and SIMD batches, for every device.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "../core/config.hpp"
#include "ops.hpp"

namespace deft::detail {

template <class T>
struct SumReducer {
  DEFT_HD static T identity() { return T(0); }
  template <class V>
  DEFT_HD static V step(const V& acc, const V& x) { return Add{}(acc, x); }
  DEFT_HD static T merge(T a, T b) { return Add{}(a, b); }
  DEFT_HD static T finish(T acc, std::int64_t) { return acc; }
};
template <class T>
struct MeanReducer : SumReducer<T> {
  DEFT_HD static T finish(T acc, std::int64_t n) { return n ? acc / T(n) : std::numeric_limits<T>::quiet_NaN(); }
};
template <class T>
struct NormReducer : SumReducer<T> {  // sum of squares, then the square root
  template <class V>
  DEFT_HD static V step(const V& acc, const V& x) { return acc + x * x; }
  DEFT_HD static T finish(T acc, std::int64_t) { return std::sqrt(acc); }
};
template <class T>
struct MaxReducer {
  // -inf for floating point: lowest() would be the max of an all -inf input.
  DEFT_HD static T identity() {
    if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
  template <class V>
  DEFT_HD static V step(const V& acc, const V& x) { return Maximum{}(x, acc); }  // x first: a NaN in x sticks
  DEFT_HD static T merge(T a, T b) { return Maximum{}(a, b); }
  DEFT_HD static T finish(T acc, std::int64_t) { return acc; }
};
template <class T>
struct MinReducer {
  DEFT_HD static T identity() {
    if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
  template <class V>
  DEFT_HD static V step(const V& acc, const V& x) { return Minimum{}(x, acc); }
  DEFT_HD static T merge(T a, T b) { return Minimum{}(a, b); }
  DEFT_HD static T finish(T acc, std::int64_t) { return acc; }
};

// --- argmax: the index of the first largest value (the first NaN wins, as
// numpy), one rule for both devices' kernels ------------------------------

template <class T>
struct ArgBest {
  T value;
  std::int64_t index;  // -1: nothing seen yet
};

/// Commutative and associative, so partials may merge in any grouping:
/// NaN beats numbers, a larger value beats a smaller, and ties go to the
/// lower index.
template <class T>
DEFT_HD ArgBest<T> better(const ArgBest<T>& a, const ArgBest<T>& b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  const bool na = is_nan(a.value), nb = is_nan(b.value);
  if (na != nb) return na ? a : b;
  if (!na && a.value != b.value) return a.value > b.value ? a : b;
  return a.index < b.index ? a : b;
}

/// argmax as a reducer: the accumulator is the best (value, index) so far,
/// and the result its index.
template <class T>
struct ArgmaxReducer {
  DEFT_HD static ArgBest<T> identity() { return {T(0), -1}; }
  DEFT_HD static ArgBest<T> step(const ArgBest<T>& acc, T x, std::int64_t j) { return better(acc, ArgBest<T>{x, j}); }
  DEFT_HD static ArgBest<T> merge(const ArgBest<T>& a, const ArgBest<T>& b) { return better(a, b); }
  DEFT_HD static std::int64_t finish(const ArgBest<T>& a, std::int64_t) { return a.index; }
};

}  // namespace deft::detail
