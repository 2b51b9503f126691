// CPU executor for reductions. Pieces of fixed size (thresholds::reduce_chunk)
// make results independent of the worker count. An expression operand is
// evaluated block by block into a small buffer, never into a full temporary.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../expr/nodes.hpp"
#include "../../expr/reducers.hpp"
#include "elementwise.hpp"
#include "simd.hpp"

namespace deft::detail::cpu {

/// Reduces n contiguous values with R (SIMD with four accumulators).
template <class R, class T>
inline T reduce_contiguous(const T* p, std::int64_t n) {
  std::int64_t i = 0;
  T acc = R::identity();
#if DEFT_CPU_SIMD
  if constexpr (std::is_floating_point_v<T>) {
    using B = simd_batch<T>;
    constexpr std::int64_t W = B::size;
    if (n >= 4 * W) {
      B a0(R::identity()), a1(R::identity()), a2(R::identity()), a3(R::identity());
      for (; i + 4 * W <= n; i += 4 * W) {
        a0 = R::step(a0, B::load_unaligned(p + i));
        a1 = R::step(a1, B::load_unaligned(p + i + W));
        a2 = R::step(a2, B::load_unaligned(p + i + 2 * W));
        a3 = R::step(a3, B::load_unaligned(p + i + 3 * W));
      }
      alignas(64) T lanes[4][W];
      a0.store_aligned(lanes[0]);
      a1.store_aligned(lanes[1]);
      a2.store_aligned(lanes[2]);
      a3.store_aligned(lanes[3]);
      for (std::int64_t l = 0; l < W; ++l)
        acc = R::merge(acc, R::merge(R::merge(lanes[0][l], lanes[1][l]), R::merge(lanes[2][l], lanes[3][l])));
    }
  }
#endif
  T tail = R::identity();
  for (; i < n; ++i) tail = R::step(tail, p[i]);
  return R::merge(acc, tail);
}

/// Calls f(values, count, linear_start) over elements [lo, hi) of a collapsed
/// view: straight from memory for a contiguous leaf, else evaluated in blocks.
template <class View, class F>
inline void visit_values(const View& v, const Shape& s, std::int64_t lo, std::int64_t hi, F&& f) {
  using T = typename View::value_type;
  if constexpr (std::is_same_v<View, LeafView<T>>) {
    if (s.rank() <= 1 && v.inner == 1) {
      f(v.data + lo, hi - lo, lo);
      return;
    }
  }
  alignas(64) T block[thresholds::reduce_block];
  for (std::int64_t b = lo; b < hi; b += thresholds::reduce_block) {
    const std::int64_t e = std::min(hi, b + thresholds::reduce_block);
    eval_range(v, s, b, e, block);
    f(static_cast<const T*>(block), e - b, b);
  }
}

/// R over elements [lo, hi), cut at multiples of reduce_chunk (from lo).
template <class R, class View>
inline auto reduce_range(const View& v, const Shape& s, std::int64_t lo, std::int64_t hi) {
  using T = typename View::value_type;
  T acc = R::identity();
  visit_values(v, s, lo, hi, [&](const T* p, std::int64_t n, std::int64_t) { acc = R::merge(acc, reduce_contiguous<R>(p, n)); });
  return acc;
}

/// out[0] = R over all elements of e.
template <class R, class Expr, class T>
inline void reduce_all(const Expr& e, T* out) {
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());
  const std::int64_t total = s.size();
  const std::int64_t chunks = std::max<std::int64_t>(1, (total + thresholds::reduce_chunk - 1) / thresholds::reduce_chunk);
  std::vector<T> partial(chunks, R::identity());
  parallel_range(chunks, thresholds::reduce_chunk * (Expr::cost + 1), 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c)
      partial[c] = reduce_range<R>(v, s, c * thresholds::reduce_chunk, std::min(total, (c + 1) * thresholds::reduce_chunk));
  });
  T acc = R::identity();
  for (const T& p : partial) acc = R::merge(acc, p);
  *out = R::finish(acc, total);
}

/// out[o * inner + i] = R over j of e[o, j, i].
template <class R, class Expr, class T>
inline void reduce_axis(const Expr& e, int axis, T* out) {
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());  // linear order is unchanged by collapsing
  const AxisSplit g(e.shape(), axis);
  if (g.inner == 1) {
    parallel_range(g.outer, g.len * (Expr::cost + 1), 1, [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t o = o0; o < o1; ++o) {
        T acc = R::identity();
        for (std::int64_t c = 0; c < g.len; c += thresholds::reduce_chunk)
          acc = R::merge(acc, reduce_range<R>(v, s, o * g.len + c, o * g.len + std::min(g.len, c + thresholds::reduce_chunk)));
        out[o] = R::finish(acc, g.len);
      }
    });
    return;
  }
  // Column-wise: accumulate rows of a tile of `inner` into a small array.
  constexpr std::int64_t tile = thresholds::reduce_block;
  const std::int64_t tiles_per_outer = (g.inner + tile - 1) / tile;
  parallel_range(g.outer * tiles_per_outer, g.len * std::min(g.inner, tile) * (Expr::cost + 1), 1,
                 [&](std::int64_t t0, std::int64_t t1) {
                   alignas(64) T acc[tile];
                   for (std::int64_t t = t0; t < t1; ++t) {
                     const std::int64_t o = t / tiles_per_outer, i0 = (t % tiles_per_outer) * tile;
                     const std::int64_t w = std::min(tile, g.inner - i0);
                     std::fill(acc, acc + w, R::identity());
                     for (std::int64_t j = 0; j < g.len; ++j) {
                       const std::int64_t base = (o * g.len + j) * g.inner + i0;
                       visit_values(v, s, base, base + w, [&](const T* p, std::int64_t n, std::int64_t start) {
                         T* a = acc + (start - base);
                         std::int64_t i = 0;
#if DEFT_CPU_SIMD
                         if constexpr (std::is_floating_point_v<T>) {
                           using B = simd_batch<T>;
                           for (; i + std::int64_t(B::size) <= n; i += std::int64_t(B::size))
                             R::step(B::load_unaligned(a + i), B::load_unaligned(p + i)).store_unaligned(a + i);
                         }
#endif
                         for (; i < n; ++i) a[i] = R::step(a[i], p[i]);
                       });
                     }
                     for (std::int64_t i = 0; i < w; ++i) out[o * g.inner + i0 + i] = R::finish(acc[i], g.len);
                   }
                 });
}

// --- argmax: ArgmaxReducer's rule (expr/reducers.hpp) ------------------------
template <class T>
inline void argmax_update(ArgBest<T>& best, const T* p, std::int64_t n, std::int64_t start) {
  for (std::int64_t i = 0; i < n; ++i) best = better(best, ArgBest<T>{p[i], start + i});
}

template <class Expr>
inline void argmax_all(const Expr& e, std::int64_t* out) {
  using T = value_t<Expr>;
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());
  const std::int64_t total = s.size();
  const std::int64_t chunks = std::max<std::int64_t>(1, (total + thresholds::reduce_chunk - 1) / thresholds::reduce_chunk);
  std::vector<ArgBest<T>> partial(chunks, ArgmaxReducer<T>::identity());
  parallel_range(chunks, thresholds::reduce_chunk * (Expr::cost + 1), 1, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c)
      visit_values(v, s, c * thresholds::reduce_chunk, std::min(total, (c + 1) * thresholds::reduce_chunk),
                   [&](const T* p, std::int64_t n, std::int64_t start) { argmax_update(partial[c], p, n, start); });
  });
  ArgBest<T> best = ArgmaxReducer<T>::identity();
  for (const auto& p : partial) best = better(best, p);
  *out = best.index;
}

template <class Expr>
inline void argmax_axis(const Expr& e, int axis, std::int64_t* out) {
  using T = value_t<Expr>;
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());
  const AxisSplit g(e.shape(), axis);
  if (g.inner == 1) {
    parallel_range(g.outer, g.len * (Expr::cost + 1), 1, [&](std::int64_t o0, std::int64_t o1) {
      for (std::int64_t o = o0; o < o1; ++o) {
        ArgBest<T> best = ArgmaxReducer<T>::identity();
        visit_values(v, s, o * g.len, (o + 1) * g.len, [&](const T* p, std::int64_t n, std::int64_t start) {
          argmax_update(best, p, n, start - o * g.len);
        });
        out[o] = best.index;
      }
    });
    return;
  }
  // Along a leading axis: a tile of `inner` candidates advanced row by row.
  constexpr std::int64_t tile = thresholds::reduce_block;
  const std::int64_t tiles_per_outer = (g.inner + tile - 1) / tile;
  parallel_range(g.outer * tiles_per_outer, g.len * std::min(g.inner, tile) * (Expr::cost + 1), 1,
                 [&](std::int64_t t0, std::int64_t t1) {
                   std::vector<ArgBest<T>> best(tile);
                   for (std::int64_t t = t0; t < t1; ++t) {
                     const std::int64_t o = t / tiles_per_outer, i0 = (t % tiles_per_outer) * tile;
                     const std::int64_t w = std::min(tile, g.inner - i0);
                     std::fill(best.begin(), best.begin() + w, ArgmaxReducer<T>::identity());
                     for (std::int64_t j = 0; j < g.len; ++j) {
                       const std::int64_t base = (o * g.len + j) * g.inner + i0;
                       visit_values(v, s, base, base + w, [&](const T* p, std::int64_t n, std::int64_t start) {
                         for (std::int64_t i = 0; i < n; ++i) {
                           best[start - base + i] = better(best[start - base + i], ArgBest<T>{p[i], j});
                         }
                       });
                     }
                     for (std::int64_t i = 0; i < w; ++i) out[o * g.inner + i0 + i] = best[i].index;
                   }
                 });
}

}  // namespace deft::detail::cpu
