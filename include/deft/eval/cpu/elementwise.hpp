// CPU executor for elementwise expressions: one fused pass over memory,
// xsimd batches along the innermost dimension, split across workers when the
// cost model says it pays.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
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

/// out[j - c0] = d(j) for j in [c0, c1), d a dense view: every leaf
/// contiguous (flat_view() of a whole statement, or dense_row() of one row).
/// With `stream` the aligned middle is written with non-temporal stores: for
/// an output far larger than the caches this saves reading every
/// destination line before writing it (a sixth of the traffic of a 4-input
/// expression).
/// Each loop holds a copy of the whole expression tree (its reads are always
/// inlined), and each copy costs compile time in every program: so this is
/// one function per expression, not inlined, that the flat evaluation and
/// the dense rows of a broadcast share, with one scalar loop for the head and
/// the tail.
template <class Dense, class T>
DEFT_NOINLINE void eval_dense(const Dense& view, std::int64_t c0, std::int64_t c1, T* out, [[maybe_unused]] bool stream) {
  // By reference, then copied here: through the reference each store to
  // `out` might change the view; passed by value, the caller's copy was
  // built with stores of mixed widths and read back whole, which stalled.
  const Dense d = view;
  std::int64_t body = c0, end = c0;  // [body, end): whole SIMD batches
#if DEFT_CPU_SIMD
  if constexpr (Dense::simd && std::is_same_v<typename Dense::value_type, T>) {
    using B = simd_batch<T>;
    constexpr std::int64_t W = B::size;
    if (stream)
      while (body < c1 && reinterpret_cast<std::uintptr_t>(out + (body - c0)) % sizeof(B) != 0) ++body;
    end = body + (c1 - body) / W * W;
    std::int64_t j = body;
    for (const std::int64_t pairs = body + (end - body) / (2 * W) * (2 * W); j != pairs; j += 2 * W) {
      const B x0 = d.template batch_dense<B>(j);
      const B x1 = d.template batch_dense<B>(j + W);
      store_batch(x0, out + (j - c0), stream);
      store_batch(x1, out + (j - c0) + W, stream);
    }
    if (j < end) store_batch(d.template batch_dense<B>(j), out + (j - c0), stream);
  }
#endif
  for (std::int64_t j = c0; j < c1; ++j) {
    if (j == body) j = end;
    if (j < c1) out[j - c0] = d.at(j);
  }
}

/// out[j - c0] = v(j) for j in [c0, c1) of the current row.
template <class View, class T>
inline void eval_row(const View& v, std::int64_t c0, std::int64_t c1, T* out, bool stream) {
  std::int64_t j = c0;
#if DEFT_CPU_SIMD
  if constexpr (View::simd && std::is_same_v<typename View::value_type, T>) {
    using B = simd_batch<T>;
    constexpr std::int64_t W = B::size;
    // Plain loads, no stride tests; a row of a few batches stays here, where
    // a call would cost more than the tests (the split points agree: without
    // streaming both loops start their batches at c0).
    if (v.dense() && (stream || c1 - c0 >= 4 * W)) return eval_dense(v.dense_row(), c0, c1, out, stream);
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

/// Where an elementwise kernel may split its output between workers so
/// that every element takes the path it takes in one piece: a SIMD batch or
/// a row's scalar tail, whose functions may differ in the last bits (pow,
/// tanh), so results do not depend on the number of workers. Batches start
/// at each row's column 0, or, with streaming stores into dense rows, at
/// addresses aligned to the batch (after a scalar prologue); a split falls
/// on a batch boundary of the one-piece run.
struct SplitPoints {
  std::int64_t row = 1;    // the innermost extent (the whole range for a flat evaluation)
  std::int64_t width = 1;  // the SIMD batch's elements, or 1
  std::int64_t phase = 0;  // by address: the first element at an aligned address
  bool by_address = false;

  /// For an output `out` of T, written in batches when Simd.
  template <bool Simd, class T>
  static SplitPoints of([[maybe_unused]] const T* out, std::int64_t row_length, [[maybe_unused]] bool stream_dense) {
    SplitPoints p;
    p.row = std::max<std::int64_t>(row_length, 1);
#if DEFT_CPU_SIMD
    if constexpr (Simd) {
      using B = simd_batch<T>;
      p.width = B::size;
      p.by_address = stream_dense;
      const auto misaligned = reinterpret_cast<std::uintptr_t>(out) % sizeof(B);
      p.phase = misaligned == 0 || misaligned % sizeof(T) ? 0 : std::int64_t((sizeof(B) - misaligned) / sizeof(T));
    }
#endif
    return p;
  }
  std::int64_t operator()(std::int64_t t) const {
    if (by_address) return t + ((phase - t) % width + width) % width;
    return t - t % row % width;
  }
};

/// Splits [0, total) into pieces of about a multiple of `align` elements as
/// the cost model allows and runs body(context, lo, hi) on each, in
/// parallel. With `split`, each inner split point t moves to (*split)(t).
/// One function for every kernel: a body is reached through a pointer, so
/// it is compiled once, not once more for the serial case.
DEFT_NOINLINE inline void parallel_pieces(std::int64_t total, std::int64_t cost_per_element, std::int64_t align,
                                          const SplitPoints* split,
                                          void (*body)(void*, std::int64_t, std::int64_t), void* context) {
  Engine& eng = Engine::get();
  const std::int64_t chunks = thresholds::parallel_chunks(total * std::max<std::int64_t>(cost_per_element, 1),
                                                          eng.parallelism());
  if (chunks <= 1) {
    body(context, 0, total);
    return;
  }
  std::int64_t len = (total + chunks - 1) / chunks;
  len = (len + align - 1) / align * align;
  const std::int64_t pieces = (total + len - 1) / len;
  const auto at = [&](std::int64_t i) {
    if (i == 0) return std::int64_t{0};
    if (i >= pieces) return total;
    return std::min(total, split ? (*split)(i * len) : i * len);
  };
  eng.parallel_for(pieces, [&](std::int64_t i) { body(context, at(i), at(i + 1)); });
}

/// parallel_pieces with body(lo, hi), a callable.
template <class Body>
inline void parallel_range_split(std::int64_t total, std::int64_t cost_per_element, std::int64_t align,
                                 const SplitPoints* split, Body&& body) {
  using Callable = std::remove_reference_t<Body>;
  parallel_pieces(total, cost_per_element, align, split,
                  [](void* c, std::int64_t lo, std::int64_t hi) { (*static_cast<Callable*>(c))(lo, hi); },
                  const_cast<void*>(static_cast<const void*>(std::addressof(body))));
}
/// The same, split at multiples of `align`.
template <class Body>
inline void parallel_range(std::int64_t total, std::int64_t cost_per_element, std::int64_t align, Body&& body) {
  parallel_range_split(total, cost_per_element, align, nullptr, std::forward<Body>(body));
}

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
  if (thresholds::serial_work(total * cost) && !stream) {  // one piece: skip the split's plumbing
    eval_dense(dref, 0, total, out, false);
    return;
  }
  const auto split = SplitPoints::of<Dense::simd && std::is_same_v<typename Dense::value_type, T>>(out, total, stream);
  parallel_range_split(total, cost, 64, &split, [&](std::int64_t lo, std::int64_t hi) {
    eval_dense(dref, lo, hi, out + lo, stream);
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
  const auto split = SplitPoints::of<simd>(out, s.rank() > 0 ? s[s.rank() - 1] : 1, stream && v.dense());
  parallel_range_split(total, cost, 64, &split,
                       [&](std::int64_t lo, std::int64_t hi) { eval_range(v, s, lo, hi, out + lo, stream); });
}

}  // namespace deft::detail::cpu
