// The GPU's convolution and pooling kernels, behind Executor<gpu>. Each pass
// is one Thrust call of a functor that gathers one output element (im2col:
// one channel's taps at one output position), so no pass needs atomics and
// the sums run in a fixed order:
//   conv2d: im2col of a block of images, one GEMM (cuBLAS), then the rows
//   moved back to (N, O, OH, OW) with the bias added;
//   dx: dY's rows gathered, Wᵀ·dY (GEMM), then col2im as a gather over the
//   input (each element sums the kernel taps that read it);
//   dW and db: per block a GEMM (dY·colsᵀ, dY·1) into dw/db or a partial
//   that is added in block order;
//   pooling: each output (forward) or input (backward) element visits its
//   windows.
// Blocks bound the im2col matrix at thresholds::gpu_conv_block_elements.
#pragma once
#include <algorithm>
#include <cstdint>

#include "../../core/thresholds.hpp"
#include "../conv_geometry.hpp"
#include "divider.hpp"
#include "elementwise.hpp"
#include "../../device/cuda/scratch.hpp"

namespace deft::detail::gpu {

using i64 = std::int64_t;

/// cols[(c,i,j), (b,oh,ow)] = x[b, c, oh*sh - ph + i, ow*sw - pw + j] (zero
/// outside), ld = images * P: one thread per channel and column writes the
/// column's kh * kw taps of that channel, so each thread splits its index
/// once (a thread per element split it five times: the pass's cost), and
/// neighbouring threads write neighbouring columns of each row.
template <class T>
struct Im2colTaps {
  ConvGeom g;
  const T* x;
  T* cols;
  Divider ld, p, ow;
  Im2colTaps(const ConvGeom& geom, const T* x_, T* cols_, i64 ld_)
      : g(geom), x(x_), cols(cols_), ld(ld_, geom.c * ld_), p(geom.p(), ld_), ow(geom.ow, geom.p()) {}
  DEFT_HD void operator()(i64 t) const {
    i64 c = 0, b = 0, oh = 0;
    const i64 col = ld.split(t, c), q = p.split(col, b), w_out = ow.split(q, oh);
    const T* plane = x + (b * g.c + c) * g.h * g.w;
    T* out = cols + c * g.kh * g.kw * ld.divisor() + col;
    const i64 y0 = oh * g.sh - g.ph, x0 = w_out * g.sw - g.pw;
    for (i64 i = 0; i < g.kh; ++i) {
      const i64 y = y0 + i;
      const bool inside = y >= 0 && y < g.h;
      for (i64 j = 0; j < g.kw; ++j, out += ld.divisor()) {
        const i64 xx = x0 + j;
        *out = inside && xx >= 0 && xx < g.w ? plane[y * g.w + xx] : T(0);
      }
    }
  }
};

/// out[(b, o, q)] = rows[o * ld + b * P + q] (+ bias[o]): a block's GEMM rows back in image order.
template <class T>
struct ImagesFromRows {
  const T* rows;
  const T* bias;  // may be null
  i64 ld;
  Divider p, o;
  ImagesFromRows(const T* rows_, const T* bias_, i64 channels, i64 positions, i64 ld_)
      : rows(rows_), bias(bias_), ld(ld_), p(positions, channels * ld_), o(channels, channels * ld_) {}
  DEFT_HD T operator()(i64 e) const {
    i64 image = 0, b = 0;
    const i64 q = p.split(e, image), oc = o.split(image, b);
    return rows[oc * ld + b * p.divisor() + q] + (bias ? bias[oc] : T(0));
  }
};

/// rows[o * ld + b * P + q] = dy[(b, o, q)]: the inverse of ImagesFromRows.
template <class T>
struct RowsFromImages {
  const T* dy;
  i64 o;
  Divider ld, p;
  RowsFromImages(const T* dy_, i64 channels, i64 positions, i64 ld_)
      : dy(dy_), o(channels), ld(ld_, channels * ld_), p(positions, ld_) {}
  DEFT_HD T operator()(i64 e) const {
    i64 oc = 0, b = 0;
    const i64 col = ld.split(e, oc), q = p.split(col, b);
    return dy[(b * o + oc) * p.divisor() + q];
  }
};

/// dx[b, c, y, x] = Σ over the taps (i, j) that read it of dcols[(c,i,j), (b,oh,ow)].
template <class T>
struct Col2imAt {
  ConvGeom g;
  const T* dcols;
  i64 ld;
  Divider w, h, c, sh, sw;
  Col2imAt(const ConvGeom& geom, const T* dcols_, i64 ld_, i64 images)
      : g(geom), dcols(dcols_), ld(ld_), w(geom.w, images * geom.c * geom.h * geom.w),
        h(geom.h, images * geom.c * geom.h), c(geom.c, images * geom.c), sh(geom.sh, geom.h + geom.ph),
        sw(geom.sw, geom.w + geom.pw) {}
  DEFT_HD T operator()(i64 e) const {
    i64 rows = 0, planes = 0, b = 0, oh = 0, ow = 0;
    const i64 xx = w.split(e, rows), y = h.split(rows, planes), ch = c.split(planes, b);
    const i64 base = b * g.oh * g.ow;
    T acc = T(0);
    for (i64 i = 0; i < g.kh; ++i) {
      const i64 ty = y + g.ph - i;  // oh * sh
      if (ty < 0 || sh.split(ty, oh) != 0 || oh >= g.oh) continue;
      for (i64 j = 0; j < g.kw; ++j) {
        const i64 tx = xx + g.pw - j;  // ow * sw
        if (tx < 0 || sw.split(tx, ow) != 0 || ow >= g.ow) continue;
        acc += dcols[((ch * g.kh + i) * g.kw + j) * ld + base + oh * g.ow + ow];
      }
    }
    return acc;
  }
};

template <class T>
struct SumOf {
  const T* a;
  const T* b;
  DEFT_HD T operator()(i64 e) const { return a[e] + b[e]; }
};

template <class T>
struct Filled {
  T value;
  DEFT_HD T operator()(i64) const { return value; }
};

/// Images per block: the im2col matrix (K x images*P) within the budget.
inline i64 conv_block(const ConvGeom& g) {
  const i64 per_image = std::max<i64>(1, g.k() * g.p());
  return std::clamp<i64>(thresholds::gpu_conv_block_elements / per_image, 1, std::max<i64>(1, g.n));
}

/// y (N, O, OH, OW) = conv(x, w) + bias (bias may be null).
template <class Launch, class T>
void conv2d_forward(const Launch& on, int device, const ConvGeom& g, const T* x, const T* w, const T* bias, T* y) {
  const i64 K = g.k(), P = g.p(), B = conv_block(g), chw = g.c * g.h * g.w;
  if (g.n == 0 || g.o == 0) return;  // an empty output: no image's scratch to allocate
  Scratch<T> cols(device, K * B * P), rows(device, g.o * B * P);
  for (i64 n0 = 0; n0 < g.n; n0 += B) {
    const i64 ld = std::min(B, g.n - n0) * P;
    for_each_index(on.policy(), g.c * ld, Im2colTaps<T>(g, x + n0 * chw, cols.get(), ld));
    on.gemm(g.o, ld, K, w, cols.get(), rows.get(), false, false);
    for_each_output(on.policy(), g.o * ld, ImagesFromRows<T>(rows.get(), bias, g.o, P, ld), y + n0 * g.o * P);
  }
}

/// dx (N, C, H, W) = col2im(Wᵀ · dY), block by block.
template <class Launch, class T>
void conv2d_backward_input(const Launch& on, int device, const ConvGeom& g, const T* dy, const T* w, T* dx) {
  const i64 K = g.k(), P = g.p(), B = conv_block(g), chw = g.c * g.h * g.w;
  if (g.n == 0 || g.o == 0) {  // no output channel reads x: its gradient is zero, without scratch
    if (g.n * chw > 0) for_each_output(on.policy(), g.n * chw, Filled<T>{T(0)}, dx);
    return;
  }
  Scratch<T> dcols(device, K * B * P), rows(device, g.o * B * P);
  for (i64 n0 = 0; n0 < g.n; n0 += B) {
    const i64 m = std::min(B, g.n - n0), ld = m * P;
    for_each_output(on.policy(), g.o * ld, RowsFromImages<T>(dy + n0 * g.o * P, g.o, P, ld), rows.get());
    on.gemm(K, ld, g.o, w, rows.get(), dcols.get(), /*trans_a=*/true, false);  // W is O x K
    for_each_output(on.policy(), m * chw, Col2imAt<T>(g, dcols.get(), ld, m), dx + n0 * chw);
  }
}

/// out (m x n) = Σ over blocks of product(block, partial): the first block
/// writes `out`, each later one a partial added to it (in block order).
template <class Launch, class T, class Product>
void sum_over_blocks(const Launch& on, int device, const ConvGeom& g, i64 out_elements, T* out, Product product) {
  const i64 B = conv_block(g);
  if (g.n == 0) {
    for_each_output(on.policy(), out_elements, Filled<T>{T(0)}, out);
    return;
  }
  Scratch<T> partial(device, g.n > B ? out_elements : 0);
  for (i64 n0 = 0; n0 < g.n; n0 += B) {
    product(n0, std::min(B, g.n - n0), n0 == 0 ? out : partial.get());
    if (n0 > 0) for_each_output(on.policy(), out_elements, SumOf<T>{out, partial.get()}, out);
  }
}

/// dw (O, C, KH, KW) = Σ over blocks of dYb · colsbᵀ.
template <class Launch, class T>
void conv2d_backward_weight(const Launch& on, int device, const ConvGeom& g, const T* dy, const T* x, T* dw) {
  const i64 K = g.k(), P = g.p(), B = conv_block(g), chw = g.c * g.h * g.w;
  Scratch<T> cols(device, K * B * P), rows(device, g.o * B * P);
  sum_over_blocks(on, device, g, g.o * K, dw, [&](i64 n0, i64 m, T* to) {
    const i64 ld = m * P;
    for_each_output(on.policy(), g.o * ld, RowsFromImages<T>(dy + n0 * g.o * P, g.o, P, ld), rows.get());
    for_each_index(on.policy(), g.c * ld, Im2colTaps<T>(g, x + n0 * chw, cols.get(), ld));
    on.gemm(g.o, K, ld, rows.get(), cols.get(), to, false, /*trans_b=*/true);
  });
}

/// db (O) = Σ over N, OH, OW of dY: per block the gathered rows times a column of ones.
template <class Launch, class T>
void conv2d_backward_bias(const Launch& on, int device, const ConvGeom& g, const T* dy, T* db) {
  const i64 P = g.p(), B = conv_block(g);
  Scratch<T> rows(device, g.o * B * P), ones(device, B * P);
  for_each_output(on.policy(), B * P, Filled<T>{T(1)}, ones.get());
  sum_over_blocks(on, device, g, g.o, db, [&](i64 n0, i64 m, T* to) {
    const i64 ld = m * P;
    for_each_output(on.policy(), g.o * ld, RowsFromImages<T>(dy + n0 * g.o * P, g.o, P, ld), rows.get());
    on.gemm(g.o, 1, ld, rows.get(), ones.get(), to, false, false);
  });
}

/// One pooled element: the maximum (ties: the first; NaN propagates) or the mean of its window.
template <PoolKind Kind, class T>
struct PoolAt {
  PoolGeom g;
  const T* x;
  DEFT_HD T operator()(i64 e) const {
    const i64 ow = e % g.ow, oh = (e / g.ow) % g.oh, plane = e / (g.ow * g.oh);
    const T* xp = x + plane * g.h * g.w + oh * g.sh * g.w + ow * g.sw;
    T acc = xp[0];
    for (i64 i = 0; i < g.kh; ++i)
      for (i64 j = 0; j < g.kw; ++j) {
        if (i == 0 && j == 0) continue;
        const T v = xp[i * g.w + j];
        if constexpr (Kind == PoolKind::max) acc = takes_max(v, acc) ? v : acc;
        else acc += v;
      }
    if constexpr (Kind == PoolKind::avg) acc /= T(g.kh * g.kw);
    return acc;
  }
};

/// One input element's gradient: the sum over the windows that contain it
/// of their output gradient, where it is the window's first maximum (max)
/// or divided by the window's area (avg).
template <PoolKind Kind, class T>
struct PoolGradAt {
  PoolGeom g;
  const T* dy;
  const T* x;  // null for avg
  DEFT_HD T operator()(i64 e) const {
    const i64 xx = e % g.w, y = (e / g.w) % g.h, plane = e / (g.w * g.h);
    // Windows oh with oh*sh <= y < oh*sh + kh (likewise along the width).
    const i64 oh0 = y < g.kh ? 0 : (y - g.kh) / g.sh + 1, oh1 = y / g.sh < g.oh ? y / g.sh : g.oh - 1;
    const i64 ow0 = xx < g.kw ? 0 : (xx - g.kw) / g.sw + 1, ow1 = xx / g.sw < g.ow ? xx / g.sw : g.ow - 1;
    const T* dyp = dy + plane * g.oh * g.ow;
    T acc = T(0);
    for (i64 oh = oh0; oh <= oh1; ++oh)
      for (i64 ow = ow0; ow <= ow1; ++ow) {
        if constexpr (Kind == PoolKind::max) {
          if (argmax_of(plane, oh, ow) == (y - oh * g.sh) * g.kw + (xx - ow * g.sw)) acc += dyp[oh * g.ow + ow];
        } else {
          acc += dyp[oh * g.ow + ow] / T(g.kh * g.kw);
        }
      }
    return acc;
  }
  // The tap i*kw + j of window (oh, ow) holding its first maximum.
  DEFT_HD i64 argmax_of(i64 plane, i64 oh, i64 ow) const {
    const T* xp = x + plane * g.h * g.w + oh * g.sh * g.w + ow * g.sw;
    T best = xp[0];
    i64 at = 0;
    for (i64 i = 0; i < g.kh; ++i)
      for (i64 j = 0; j < g.kw; ++j) {
        const T v = xp[i * g.w + j];
        if ((i != 0 || j != 0) && takes_max(v, best)) {
          best = v;
          at = i * g.kw + j;
        }
      }
    return at;
  }
};

template <PoolKind Kind, class Launch, class T>
void pool2d_forward(const Launch& on, const PoolGeom& g, const T* x, T* y) {
  for_each_output(on.policy(), g.n * g.c * g.oh * g.ow, PoolAt<Kind, T>{g, x}, y);
}

template <PoolKind Kind, class Launch, class T>
void pool2d_backward(const Launch& on, const PoolGeom& g, const T* dy, const T* x, T* dx) {
  for_each_output(on.policy(), g.n * g.c * g.h * g.w, PoolGradAt<Kind, T>{g, dy, x}, dx);
}

}  // namespace deft::detail::gpu
