// Reducers: how the values of a reduction combine (identity, step, merge,
// finish), written once for scalars and SIMD batches, for every device.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

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

}  // namespace deft::detail
