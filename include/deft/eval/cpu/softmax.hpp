// CPU kernel of softmax and log_softmax along the innermost axis. Each row
// takes three passes while it stays in L1/L2 (a row of 2048 floats is
// 8 KiB): its maximum m, exp(x - m) summed (and stored, for softmax), then
// the scale by 1 / Σ (softmax) or x - m - log Σ (log_softmax). From memory
// that is one read of x and one write of the result; the same steps as
// separate ops cost four tasks and as many passes over memory.
#pragma once
#include <cmath>
#include <cstdint>

#include "../../expr/ops.hpp"
#include "../../expr/reducers.hpp"
#include "elementwise.hpp"
#include "reduce.hpp"
#include "simd.hpp"

namespace deft::detail::cpu {

/// Σ exp(x[j] - m) over the row, storing each term into out when Store.
/// The exps are deft's elementwise Exp, batch and tail alike, so softmax's
/// terms have the bits that exp(x - m) has as an expression.
template <bool Store, class T>
inline T sum_exp_shifted(const T* x, std::int64_t n, T m, T* out) {
  const Exp exp_of;
  std::int64_t j = 0;
  T total = 0;
#if DEFT_CPU_SIMD
  using B = simd_batch<T>;
  constexpr std::int64_t W = B::size;
  if (n >= 4 * W) {
    // Four accumulators, as reduce_contiguous: four exps in flight, and
    // each lane sums a quarter as many terms.
    const B mb(m);
    B s0(T(0)), s1(T(0)), s2(T(0)), s3(T(0));
    for (; j + 4 * W <= n; j += 4 * W) {
      const B e0 = exp_of(B::load_unaligned(x + j) - mb), e1 = exp_of(B::load_unaligned(x + j + W) - mb),
              e2 = exp_of(B::load_unaligned(x + j + 2 * W) - mb), e3 = exp_of(B::load_unaligned(x + j + 3 * W) - mb);
      if constexpr (Store) {
        e0.store_unaligned(out + j);
        e1.store_unaligned(out + j + W);
        e2.store_unaligned(out + j + 2 * W);
        e3.store_unaligned(out + j + 3 * W);
      }
      s0 += e0;
      s1 += e1;
      s2 += e2;
      s3 += e3;
    }
    alignas(64) T lanes[W];
    ((s0 + s1) + (s2 + s3)).store_aligned(lanes);
    for (std::int64_t l = 0; l < W; ++l) total += lanes[l];
  }
#endif
  for (; j < n; ++j) {
    const T e = exp_of(x[j] - m);
    if constexpr (Store) out[j] = e;
    total += e;
  }
  return total;
}

/// Over the row: out[j] *= k (softmax, k = 1 / Σ), or out[j] = (x[j] - m) - k
/// (log_softmax, k = log Σ).
template <bool Log, class T>
inline void finish_softmax_row(const T* x, std::int64_t n, T m, T k, T* out) {
  std::int64_t j = 0;
#if DEFT_CPU_SIMD
  using B = simd_batch<T>;
  constexpr std::int64_t W = B::size;
  const B mb(m), kb(k);
  for (; j + W <= n; j += W) {
    if constexpr (Log) ((B::load_unaligned(x + j) - mb) - kb).store_unaligned(out + j);
    else (B::load_unaligned(out + j) * kb).store_unaligned(out + j);
  }
#endif
  for (; j < n; ++j) out[j] = Log ? (x[j] - m) - k : out[j] * k;
}

/// softmax (or log_softmax, with Log) of each of `rows` contiguous rows of
/// `cols` elements of x into out; rows are split between the workers. A
/// NaN in a row makes that whole row NaN (it reaches the sum).
template <bool Log, class T>
inline void softmax_rows(std::int64_t rows, std::int64_t cols, const T* x, T* out) {
  parallel_range(rows, cols * (Exp::cost + 3), 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * cols;
      T* yr = out + r * cols;
      const T m = reduce_contiguous<MaxReducer<T>>(xr, cols);
      const T total = sum_exp_shifted<!Log>(xr, cols, m, yr);
      // Softmax multiplies by the reciprocal (PyTorch's CPU kernel does
      // too): within an ulp of the quotient, at a fraction of a division's cost.
      finish_softmax_row<Log>(xr, cols, m, Log ? T(std::log(total)) : T(1) / total, yr);
    }
  });
}

}  // namespace deft::detail::cpu
