// CPU executor for elementwise expressions: one fused pass over memory,
// xsimd batches along the innermost dimension, split across workers when the
// cost model says it pays.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../../engine/engine.hpp"
#include "../../core/thresholds.hpp"
#include "../../expr/kernel_views.hpp"
#include "simd.hpp"

namespace deft::detail::cpu {

/// Stores batch x at p; with `stream` (p then aligned to the batch size)
/// bypassing the caches, a non-temporal store, where the ISA has one for
/// this type. `stream` is a run-time flag so that each expression compiles
/// one loop, not one per kind of store: the branch is the same for a whole
/// row and predicted.
template <class B, class T>
DEFT_ALWAYS_INLINE inline void store_batch(const B& x, T* p, [[maybe_unused]] bool stream) {
#if defined(__AVX512F__)
  if constexpr (sizeof(B) == 64) {
    if (stream) {
      if constexpr (std::is_same_v<T, float>) _mm512_stream_ps(p, x);
      else if constexpr (std::is_same_v<T, double>) _mm512_stream_pd(p, x);
      else _mm512_stream_si512(reinterpret_cast<__m512i*>(p), x);
      return;
    }
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(B) == 32) {
    if (stream) {
      if constexpr (std::is_same_v<T, float>) _mm256_stream_ps(p, x);
      else if constexpr (std::is_same_v<T, double>) _mm256_stream_pd(p, x);
      else _mm256_stream_si256(reinterpret_cast<__m256i*>(p), x);
      return;
    }
  }
#endif
  x.store_unaligned(p);
}

/// out[j - c0] = d(j) for j in [c0, c1), d a row whose leaves are all
/// contiguous (DenseLeafView). With `stream` the aligned middle is written
/// with non-temporal stores: for an output far larger than the caches this
/// saves reading every destination line before writing it (a sixth of the
/// traffic of a 4-input expression). Returns where it stopped (the tail of
/// fewer than two batches is left to the caller).
template <class B, class Dense, class T>
DEFT_ALWAYS_INLINE inline std::int64_t eval_dense(const Dense& d, std::int64_t c0, std::int64_t c1, T* out, bool stream) {
  constexpr std::int64_t W = B::size;
  std::int64_t j = c0;
  if (stream)
    for (; j < c1 && reinterpret_cast<std::uintptr_t>(out + (j - c0)) % sizeof(B) != 0; ++j) out[j - c0] = d.at(j);
  for (; j + 2 * W <= c1; j += 2 * W) {
    const B x0 = d.template batch_dense<B>(j);
    const B x1 = d.template batch_dense<B>(j + W);
    store_batch(x0, out + (j - c0), stream);
    store_batch(x1, out + (j - c0) + W, stream);
  }
  return j;
}

/// out[j - c0] = v(j) for j in [c0, c1) of the current row.
/// Each loop below holds a copy of the whole expression tree (its batch
/// reads are always inlined), so there are as few loops as the paths need.
template <class View, class T>
inline void eval_row(const View& v, std::int64_t c0, std::int64_t c1, T* out, bool stream) {
  std::int64_t j = c0;
#if DEFT_CPU_SIMD
  if constexpr (View::simd && std::is_same_v<typename View::value_type, T>) {
    using B = simd_batch<T>;
    constexpr std::int64_t W = B::size;
    if (v.dense()) j = eval_dense<B>(v.dense_row(), c0, c1, out, stream);  // plain loads, no stride tests
    for (; j + 2 * W <= c1; j += 2 * W) {
      const B x0 = v.template batch<B>(j);
      const B x1 = v.template batch<B>(j + W);
      x0.store_unaligned(out + (j - c0));
      x1.store_unaligned(out + (j - c0) + W);
    }
    for (; j + W <= c1; j += W) v.template batch<B>(j).store_unaligned(out + (j - c0));
  }
#endif
  for (; j < c1; ++j) out[j - c0] = v.at(j);
}

/// Calls f(row_view, c0, c1, linear_start) for each row piece of the linear
/// range [lo, hi) of a collapsed shape, with the view positioned on the row.
template <class View, class F>
inline void for_each_row(View& v, const Shape& s, std::int64_t lo, std::int64_t hi, F&& f) {
  const int m = s.rank();
  const int outer = m > 0 ? m - 1 : 0;
  const std::int64_t n = m > 0 ? s[m - 1] : 1;
  if (n == 0 || lo >= hi) return;
  std::array<std::int64_t, max_rank> idx{};
  std::int64_t row = lo / n, col = lo % n;
  for (int d = outer - 1; d >= 0; --d) {
    idx[d] = row % s[d];
    row /= s[d];
  }
  while (lo < hi) {
    v.set_row(idx.data(), outer);
    const std::int64_t c1 = std::min(n, col + (hi - lo));
    f(v, col, c1, lo);
    lo += c1 - col;
    col = 0;
    for (int d = outer - 1; d >= 0; --d) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
}

/// Writes elements [lo, hi) of the collapsed view into out[0, hi - lo).
template <class View, class T>
inline void eval_range(View v, const Shape& s, std::int64_t lo, std::int64_t hi, T* out, bool stream = false) {
  for_each_row(v, s, lo, hi, [&](const View& row, std::int64_t c0, std::int64_t c1, std::int64_t start) {
    eval_row(row, c0, c1, out + (start - lo), stream);
  });
#if defined(__SSE2__)
  if (stream) _mm_sfence();  // non-temporal stores are visible before the task reports completion
#endif
}

/// Splits [0, total) into pieces of about a multiple of `align` elements as
/// the cost model allows and runs body(lo, hi) on each, in parallel. Each
/// inner split point t moves to split(t), a monotone map into [0, total]
/// (the elementwise kernels' SplitPoints).
template <class Split, class Body>
inline void parallel_range_split(std::int64_t total, std::int64_t cost_per_element, std::int64_t align, Split&& split,
                                 Body&& body) {
  Engine& eng = Engine::get();
  const std::int64_t chunks = thresholds::parallel_chunks(total * std::max<std::int64_t>(cost_per_element, 1),
                                                          eng.parallelism());
  if (chunks <= 1) {
    body(std::int64_t{0}, total);
    return;
  }
  std::int64_t len = (total + chunks - 1) / chunks;
  len = (len + align - 1) / align * align;
  const std::int64_t pieces = (total + len - 1) / len;
  const auto at = [&](std::int64_t i) { return i == 0 ? std::int64_t{0} : i >= pieces ? total : std::min(total, split(i * len)); };
  eng.parallel_for(pieces, [&](std::int64_t i) { body(at(i), at(i + 1)); });
}
/// The same, split at multiples of `align`.
template <class Body>
inline void parallel_range(std::int64_t total, std::int64_t cost_per_element, std::int64_t align, Body&& body) {
  parallel_range_split(total, cost_per_element, align, [](std::int64_t t) { return t; }, std::forward<Body>(body));
}

/// Where an elementwise kernel may split its output between workers so
/// that every element takes the path it takes in one piece: a SIMD batch or
/// a row's scalar tail, whose functions may differ in the last bits (pow,
/// tanh), so results do not depend on the number of workers. Batches start
/// at each row's column 0, or, with streaming stores into dense rows, at
/// addresses aligned to the batch (after a scalar prologue); a split falls
/// on a batch boundary of the one-piece run.
template <class T, bool Simd>
struct SplitPoints {
  std::int64_t row = 1;    // the innermost extent (the whole range for a flat evaluation)
  std::int64_t width = 1;  // the SIMD batch's elements, or 1
  std::int64_t phase = 0;  // by address: the first element at an aligned address
  bool by_address = false;
  SplitPoints(const T* out, std::int64_t row_length, bool stream_dense) : row(std::max<std::int64_t>(row_length, 1)) {
#if DEFT_CPU_SIMD
    if constexpr (Simd) {
      using B = simd_batch<T>;
      width = B::size;
      by_address = stream_dense;
      const auto misaligned = reinterpret_cast<std::uintptr_t>(out) % sizeof(B);
      phase = misaligned == 0 || misaligned % sizeof(T) ? 0 : std::int64_t((sizeof(B) - misaligned) / sizeof(T));
    }
#else
    (void)out, (void)stream_dense;
#endif
  }
  std::int64_t operator()(std::int64_t t) const {
    if (by_address) return t + ((phase - t) % width + width) % width;
    return t - t % row % width;
  }
};

/// An expression whose every node has a flat_view() (no cast, no map).
template <class E>
concept HasFlatView = requires(const E& e) { e.flat_view(); };

/// Whether every leaf of `e` reads exactly `out` (no broadcast) from
/// contiguous storage, so that flat_view() describes the whole evaluation.
template <class Expr>
inline bool reads_flat(const Expr& e, const Shape& out) {
  bool flat = true;
  e.for_each_leaf([&](const auto& leaf) { flat = flat && leaf.extent == out; });
  return flat;
}

/// Writes the flat view `d` of an expression (see reads_flat) into out[0, total).
template <class Dense, class T>
inline void evaluate_flat(const Dense& dref, std::int64_t total, std::int64_t cost, T* out, bool stream) {
  const SplitPoints<T, Dense::simd && std::is_same_v<typename Dense::value_type, T>> split(out, total, stream);
  parallel_range_split(total, cost, 64, split, [&](std::int64_t lo, std::int64_t hi) {
    // A local copy: through the reference, the stores to `out` might alias
    // the view, and the constants' broadcasts were reloaded every batch.
    const Dense d = dref;
    std::int64_t j = lo;
#if DEFT_CPU_SIMD
    if constexpr (Dense::simd && std::is_same_v<typename Dense::value_type, T>) {
      using B = simd_batch<T>;
      constexpr std::int64_t W = B::size;
      j = eval_dense<B>(d, lo, hi, out + lo, stream);
      for (; j + W <= hi; j += W) d.template batch_dense<B>(j).store_unaligned(out + j);
    }
#endif
    for (; j < hi; ++j) out[j] = d.at(j);
#if defined(__SSE2__)
    if (stream) _mm_sfence();  // non-temporal stores are visible before the task reports completion
#endif
  });
}

/// Evaluates expression `e` into the contiguous destination `out`
/// (which has e's shape).
template <class Expr, class T>
inline void evaluate(const Expr& e, T* out) {
  const Shape& shape = e.shape();
  const std::int64_t cost = Expr::cost + 1, total = shape.size();
  const bool stream = total * std::int64_t(sizeof(T)) >= thresholds::stream_store_min_bytes;
  if constexpr (HasFlatView<Expr>) {
    if (reads_flat(e, shape)) {  // the usual statement: one flat row, no strides to set up
      evaluate_flat(e.flat_view(), total, cost, out, stream);
      return;
    }
  }
  auto v = e.view(shape);
  static_assert(std::is_trivially_copy_constructible_v<decltype(v)> && std::is_trivially_destructible_v<decltype(v)>, "kernel views must be trivially copyable (device-ready)");
  const Shape s = collapse(v, shape);  // as many elements as `shape`, in fewer dimensions
  constexpr bool simd = decltype(v)::simd && std::is_same_v<typename decltype(v)::value_type, T>;
  const SplitPoints<T, simd> split(out, s.rank() > 0 ? s[s.rank() - 1] : 1, stream && v.dense());
  parallel_range_split(total, cost, 64, split,
                       [&](std::int64_t lo, std::int64_t hi) { eval_range(v, s, lo, hi, out + lo, stream); });
}

}  // namespace deft::detail::cpu
