// 2-D convolution and pooling over NCHW tensors (issue 5, LeNet), with
// gradients. Each operation records one task, like dot: conv2d runs im2col on
// blocks of whole images and one GEMM per block (the executor's gemm), blocks
// in parallel; pooling is a direct loop, parallel over the N*C planes. Inside
// autograd::record the result gets a node whose backward() records its own
// untracked tasks: dx (gemm Wᵀ·dY, then col2im), dW (dY·colsᵀ, with gemm_nt
// below: few long dot products suit it better than the packed GEMM), db, and
// the pooling scatters. See docs/conv.md.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "../autograd/graph.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../engine/engine.hpp"
#include "../eval/executor.hpp"
#include "../tensor.hpp"
#include "linalg.hpp"

namespace deft {

/// A (height, width) pair: strides, paddings and pooling windows.
/// `2` means {2, 2}; `{2, 1}` is 2 along the height, 1 along the width.
struct Size2d {
  std::int64_t h = 0;  ///< along the height
  std::int64_t w = 0;  ///< along the width
  /// The same value along both axes.
  constexpr Size2d(std::int64_t both) : h(both), w(both) {}  // NOLINT: implicit on purpose, `max_pool2d(x, 2)`
  /// Height and width values.
  constexpr Size2d(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  /// "(h, w)", for error messages.
  std::string to_string() const {
    std::string s = "(";  // appended piece by piece: GCC 12 warns (-Wrestrict) on "(" + std::to_string(...)
    s += std::to_string(h);
    s += ", ";
    s += std::to_string(w);
    s += ')';
    return s;
  }
};

namespace detail {

// Tuning of the convolution kernels (shape-derived only, never the worker
// count, so that results are the same bits for any number of workers).

/// Everything a convolution kernel needs to know about its shapes.
struct ConvGeom {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input (N, C, H, W)
  std::int64_t o = 0, kh = 0, kw = 0;       // weight (O, C, KH, KW)
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0;
  std::int64_t oh = 0, ow = 0;  // output (N, O, OH, OW)

  std::int64_t k() const { return c * kh * kw; }  // rows of the im2col matrix
  std::int64_t p() const { return oh * ow; }      // output positions per image
  Shape input() const { return Shape{n, c, h, w}; }
  Shape weight() const { return Shape{o, c, kh, kw}; }
  Shape output() const { return Shape{n, o, oh, ow}; }
  // Images per block and blocks (see thresholds.hpp).
  std::int64_t block() const {
    const std::int64_t per_image = std::max<std::int64_t>(1, k() * p());
    std::int64_t b = std::max<std::int64_t>(1, thresholds::conv_block_elements / per_image);
    b = std::min(b, std::max<std::int64_t>(1, (n + thresholds::conv_min_blocks - 1) / thresholds::conv_min_blocks));
    return b;
  }
  std::int64_t blocks() const { return (n + block() - 1) / block(); }
};

/// A pooling window's shapes.
struct PoolGeom {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t kh = 1, kw = 1, sh = 1, sw = 1;
  std::int64_t oh = 0, ow = 0;
  Shape input() const { return Shape{n, c, h, w}; }
  Shape output() const { return Shape{n, c, oh, ow}; }
};

/// Output positions [lo, hi) along one axis whose input index o*s + off lies in [0, in).
inline void valid_range(std::int64_t off, std::int64_t s, std::int64_t in, std::int64_t out, std::int64_t& lo,
                        std::int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + s - 1) / s;
  const std::int64_t top = in - 1 - off;  // o*s <= top
  hi = top < 0 ? 0 : std::min(out, top / s + 1);
  lo = std::min(lo, hi);
}

inline std::int64_t checked_padded(std::int64_t in, std::int64_t pad, const char* op, const Shape& x, Size2d padding) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(pad, std::int64_t(2), &r) || __builtin_add_overflow(in, r, &r))
    raise(op, ": padding ", padding.to_string(), " is too large for input shape ", x.to_string());
  return r;
}

/// Checks a convolution's shapes (before anything is recorded) and plans it.
inline ConvGeom plan_conv2d(const Shape& x, const Shape& w, const Shape* b, Size2d stride, Size2d padding) {
  if (x.rank() != 4) raise("conv2d: the input must have rank 4 (N, C, H, W), got shape ", x.to_string());
  if (w.rank() != 4) raise("conv2d: the weight must have rank 4 (O, C, KH, KW), got shape ", w.to_string());
  if (stride.h <= 0 || stride.w <= 0)
    raise("conv2d: the stride must be positive, got ", stride.to_string(), " (input shape ", x.to_string(),
          ", weight shape ", w.to_string(), ")");
  if (padding.h < 0 || padding.w < 0)
    raise("conv2d: the padding must be >= 0, got ", padding.to_string(), " (input shape ", x.to_string(),
          ", weight shape ", w.to_string(), ")");
  if (x[1] != w[1])
    raise("conv2d: the input has ", x[1], " channels (shape ", x.to_string(), ") but the weight expects ", w[1],
          " (shape ", w.to_string(), ")");
  if (w[2] == 0 || w[3] == 0) raise("conv2d: the kernel extents must be positive, got weight shape ", w.to_string());
  if (b && !(b->rank() == 1 && (*b)[0] == w[0]))
    raise("conv2d: the bias must have shape (", w[0], ",) for weight shape ", w.to_string(), ", got shape ",
          b->to_string());
  const std::int64_t hp = checked_padded(x[2], padding.h, "conv2d", x, padding);
  const std::int64_t wp = checked_padded(x[3], padding.w, "conv2d", x, padding);
  if (w[2] > hp || w[3] > wp)
    raise("conv2d: the kernel ", w[2], "x", w[3], " (weight shape ", w.to_string(), ") is larger than the padded input ",
          hp, "x", wp, " (input shape ", x.to_string(), ", padding ", padding.to_string(), ")");
  ConvGeom g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.kh = w[2], g.kw = w[3];
  g.sh = stride.h, g.sw = stride.w, g.ph = padding.h, g.pw = padding.w;
  g.oh = (hp - g.kh) / g.sh + 1;
  g.ow = (wp - g.kw) / g.sw + 1;
  (void)g.output().size();  // Shape checks that the element count fits
  return g;
}

inline PoolGeom plan_pool2d(const char* op, const Shape& x, Size2d kernel, Size2d stride) {
  if (x.rank() != 4) raise(op, ": the input must have rank 4 (N, C, H, W), got shape ", x.to_string());
  if (kernel.h <= 0 || kernel.w <= 0)
    raise(op, ": the kernel must be positive, got ", kernel.to_string(), " (input shape ", x.to_string(), ")");
  if (stride.h <= 0 || stride.w <= 0)
    raise(op, ": the stride must be positive, got ", stride.to_string(), " (input shape ", x.to_string(), ")");
  if (kernel.h > x[2] || kernel.w > x[3])
    raise(op, ": the kernel ", kernel.h, "x", kernel.w, " is larger than the input ", x[2], "x", x[3], " (input shape ",
          x.to_string(), ")");
  PoolGeom g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.kh = kernel.h, g.kw = kernel.w, g.sh = stride.h, g.sw = stride.w;
  g.oh = (g.h - g.kh) / g.sh + 1;
  g.ow = (g.w - g.kw) / g.sw + 1;
  return g;
}

template <class T>
const T* data_of(const Leaf<T>& l) { return l.source->template as<const T>() + l.offset; }

/// A leaf without its autograd record (what a kernel closure keeps).
template <class T>
Leaf<T> plain_leaf(const Leaf<T>& l) { return Leaf<T>(l.buffer, l.offset, l.extent); }

namespace cpu_conv {

template <class T>
using Scratch = cpu::AlignedScratch<T>;

inline std::size_t at_least_one(std::int64_t n) { return std::size_t(std::max<std::int64_t>(n, 1)); }

/// cols (K x images*P, row-major) from `images` images starting at x:
/// cols[(c,i,j), (b,oh,ow)] = x[b, c, oh*sh - ph + i, ow*sw - pw + j], zero outside.
template <class T>
void im2col(const ConvGeom& g, const T* x, std::int64_t images, T* out) {
  const std::int64_t P = g.p(), ld = images * P, plane = g.h * g.w;
  for (std::int64_t c = 0; c < g.c; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i) {
      std::int64_t r0, r1;
      valid_range(i - g.ph, g.sh, g.h, g.oh, r0, r1);
      for (std::int64_t j = 0; j < g.kw; ++j) {
        std::int64_t c0, c1;
        valid_range(j - g.pw, g.sw, g.w, g.ow, c0, c1);
        T* dst = out + ((c * g.kh + i) * g.kw + j) * ld;
        for (std::int64_t b = 0; b < images; ++b) {
          const T* xc = x + (b * g.c + c) * plane;
          T* d = dst + b * P;
          std::fill(d, d + r0 * g.ow, T(0));
          for (std::int64_t oh = r0; oh < r1; ++oh) {
            const T* xrow = xc + (oh * g.sh - g.ph + i) * g.w;  // input column ow*sw + j - pw
            T* drow = d + oh * g.ow;
            std::fill(drow, drow + c0, T(0));
            if (g.sw == 1) {
              if (c1 > c0) std::memcpy(drow + c0, xrow + (c0 + j - g.pw), std::size_t(c1 - c0) * sizeof(T));
            } else {
              for (std::int64_t ow = c0; ow < c1; ++ow) drow[ow] = xrow[ow * g.sw + j - g.pw];
            }
            std::fill(drow + c1, drow + g.ow, T(0));
          }
          std::fill(d + r1 * g.ow, d + P, T(0));
        }
      }
    }
}

/// C (m x n) (+)= A (m x k) · Bᵀ, B being (n x k): every C element is the
/// dot product of a row of A and a row of B, both contiguous. The weight
/// gradient's shape (few rows and columns, a long k) suits this better than
/// the packed GEMM: an MI x NJ tile of dot products shares its row loads;
/// edge tiles repeat the last row and drop the copies. Each element's sum
/// is in a fixed order (SIMD lanes, then the k tail), whatever the threads.
template <class T>
void gemm_nt(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  using V = cpu::simd_batch<T>;
  constexpr std::int64_t W = V::size;
  constexpr std::int64_t MI = cpu::simd_registers >= 32 ? 4 : 3, NJ = 4;
  const std::int64_t kv = k / W * W;
  for (std::int64_t i0 = 0; i0 < m; i0 += MI)
    for (std::int64_t j0 = 0; j0 < n; j0 += NJ) {
      const T* ar[MI];
      const T* br[NJ];
      for (std::int64_t r = 0; r < MI; ++r) ar[r] = a + std::min(i0 + r, m - 1) * k;
      for (std::int64_t s = 0; s < NJ; ++s) br[s] = b + std::min(j0 + s, n - 1) * k;
      V acc[MI][NJ];
      for (std::int64_t r = 0; r < MI; ++r)
        for (std::int64_t s = 0; s < NJ; ++s) acc[r][s] = V(T(0));
      for (std::int64_t p = 0; p < kv; p += W) {
        V bv[NJ];
        for (std::int64_t s = 0; s < NJ; ++s) bv[s] = V::load_unaligned(br[s] + p);
        for (std::int64_t r = 0; r < MI; ++r) {
          const V av = V::load_unaligned(ar[r] + p);
          for (std::int64_t s = 0; s < NJ; ++s) acc[r][s] = xsimd::fma(av, bv[s], acc[r][s]);
        }
      }
      for (std::int64_t r = 0; r < MI && i0 + r < m; ++r)
        for (std::int64_t s = 0; s < NJ && j0 + s < n; ++s) {
          T sum = xsimd::hadd(acc[r][s]);
          for (std::int64_t p = kv; p < k; ++p) sum += ar[r][p] * br[s][p];
          T& out = c[(i0 + r) * n + j0 + s];
          out = accumulate ? out + sum : sum;
        }
    }
}

/// dx (images, zeroed first) += col2im(dcols), dcols being K x images*P.
template <class T>
void col2im(const ConvGeom& g, const T* dcols, std::int64_t images, T* dx) {
  const std::int64_t P = g.p(), ld = images * P, plane = g.h * g.w;
  std::fill(dx, dx + images * g.c * plane, T(0));
  for (std::int64_t b = 0; b < images; ++b)
    for (std::int64_t c = 0; c < g.c; ++c) {
      T* xc = dx + (b * g.c + c) * plane;
      for (std::int64_t i = 0; i < g.kh; ++i) {
        std::int64_t r0, r1;
        valid_range(i - g.ph, g.sh, g.h, g.oh, r0, r1);
        for (std::int64_t j = 0; j < g.kw; ++j) {
          std::int64_t c0, c1;
          valid_range(j - g.pw, g.sw, g.w, g.ow, c0, c1);
          const T* src = dcols + ((c * g.kh + i) * g.kw + j) * ld + b * P;
          for (std::int64_t oh = r0; oh < r1; ++oh) {
            T* xrow = xc + (oh * g.sh - g.ph + i) * g.w;  // input column ow*sw + j - pw
            const T* srow = src + oh * g.ow;
            if (g.sw == 1) {
              for (std::int64_t ow = c0; ow < c1; ++ow) xrow[ow + j - g.pw] += srow[ow];
            } else {
              for (std::int64_t ow = c0; ow < c1; ++ow) xrow[ow * g.sw + j - g.pw] += srow[ow];
            }
          }
        }
      }
    }
}

/// dyb (O x images*P) = the block's output gradient, image-major rows gathered.
template <class T>
void gather_block(const ConvGeom& g, const T* dy, std::int64_t images, T* dyb) {
  const std::int64_t P = g.p(), ld = images * P;
  for (std::int64_t b = 0; b < images; ++b)
    for (std::int64_t o = 0; o < g.o; ++o)
      std::memcpy(dyb + o * ld + b * P, dy + (b * g.o + o) * P, std::size_t(P) * sizeof(T));
}

/// y (N, O, OH, OW) = conv(x, w) + bias (bias may be null).
template <class Ex, class T>
void conv2d_forward(Ex ex, const ConvGeom& g, const T* x, const T* w, const T* bias, T* y) {
  const std::int64_t K = g.k(), P = g.p(), B = g.block(), nb = g.blocks(), chw = g.c * g.h * g.w;
  ex.parallel_range(nb, std::max<std::int64_t>(1, B * (g.o + 2) * K * P), 1, [&](std::int64_t lo, std::int64_t hi) {
    Scratch<T> cols(at_least_one(K * B * P));
    Scratch<T> yb(at_least_one(B > 1 ? g.o * B * P : 0));
    for (std::int64_t blk = lo; blk < hi; ++blk) {
      const std::int64_t n0 = blk * B, m = std::min(B, g.n - n0);
      im2col(g, x + n0 * chw, m, cols.p);
      T* out = y + n0 * g.o * P;
      if (m == 1) {
        ex.gemm(g.o, P, K, w, cols.p, out);
        if (bias)
          for (std::int64_t o = 0; o < g.o; ++o)
            for (std::int64_t q = 0; q < P; ++q) out[o * P + q] += bias[o];
        continue;
      }
      ex.gemm(g.o, m * P, K, w, cols.p, yb.p);
      for (std::int64_t b = 0; b < m; ++b)
        for (std::int64_t o = 0; o < g.o; ++o) {
          const T* src = yb.p + o * m * P + b * P;
          T* dst = out + (b * g.o + o) * P;
          const T bo = bias ? bias[o] : T(0);
          for (std::int64_t q = 0; q < P; ++q) dst[q] = src[q] + bo;
        }
    }
  });
}

/// dx (N, C, H, W) = col2im(Wᵀ · dY), block by block.
template <class Ex, class T>
void conv2d_backward_input(Ex ex, const ConvGeom& g, const T* dy, const T* w, T* dx) {
  const std::int64_t K = g.k(), P = g.p(), B = g.block(), nb = g.blocks(), chw = g.c * g.h * g.w;
  ex.parallel_range(nb, std::max<std::int64_t>(1, B * (g.o + 2) * K * P), 1, [&](std::int64_t lo, std::int64_t hi) {
    Scratch<T> dcols(at_least_one(K * B * P));
    Scratch<T> dyb(at_least_one(B > 1 ? g.o * B * P : 0));
    for (std::int64_t blk = lo; blk < hi; ++blk) {
      const std::int64_t n0 = blk * B, m = std::min(B, g.n - n0);
      const T* src = dy + n0 * g.o * P;
      if (m > 1) {
        gather_block(g, src, m, dyb.p);
        src = dyb.p;
      }
      ex.gemm(K, m * P, g.o, w, src, dcols.p, /*trans_a=*/true);  // W is O x K
      col2im(g, dcols.p, m, dx + n0 * chw);
    }
  });
}

/// dw (O, C, KH, KW) = Σ over blocks of dYb · colsbᵀ (gemm_nt). Blocks are
/// summed into one partial per group of consecutive blocks, and the partials
/// are added in order: the same bits for any worker count.
template <class Ex, class T>
void conv2d_backward_weight(Ex ex, const ConvGeom& g, const T* dy, const T* x, T* dw) {
  const std::int64_t K = g.k(), P = g.p(), B = g.block(), nb = g.blocks(), chw = g.c * g.h * g.w;
  const std::int64_t OK = g.o * K;
  if (OK == 0) return;
  if (nb == 0 || P == 0) {
    std::fill(dw, dw + OK, T(0));
    return;
  }
  const std::int64_t max_slots = std::max<std::int64_t>(1, std::min(nb, thresholds::conv_partial_elements / OK));
  const std::int64_t per_slot = (nb + max_slots - 1) / max_slots, slots = (nb + per_slot - 1) / per_slot;
  // Slot 0 sums into dw itself, the others into partials added afterwards.
  Scratch<T> partials(at_least_one((slots - 1) * OK));
  ex.parallel_range(slots, std::max<std::int64_t>(1, per_slot * B * (g.o + 1) * K * P), 1,
                    [&](std::int64_t lo, std::int64_t hi) {
                      Scratch<T> cols(at_least_one(K * B * P));
                      Scratch<T> dyb(at_least_one(B > 1 ? g.o * B * P : 0));
                      for (std::int64_t s = lo; s < hi; ++s) {
                        T* acc = s == 0 ? dw : partials.p + (s - 1) * OK;
                        const std::int64_t b0 = s * per_slot, b1 = std::min(nb, b0 + per_slot);
                        for (std::int64_t blk = b0; blk < b1; ++blk) {
                          const std::int64_t n0 = blk * B, m = std::min(B, g.n - n0);
                          const T* src = dy + n0 * g.o * P;
                          if (m > 1) {
                            gather_block(g, src, m, dyb.p);
                            src = dyb.p;
                          }
                          im2col(g, x + n0 * chw, m, cols.p);
                          gemm_nt(g.o, K, m * P, src, cols.p, acc, blk > b0);
                        }
                      }
                    });
  if (slots > 1)
    ex.parallel_range(OK, slots, 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t s = 1; s < slots; ++s) {
        const T* p = partials.p + (s - 1) * OK;
        for (std::int64_t e = lo; e < hi; ++e) dw[e] += p[e];
      }
    });
}

/// db (O) = Σ over N, OH, OW of dY (accumulated in double).
template <class Ex, class T>
void conv2d_backward_bias(Ex ex, const ConvGeom& g, const T* dy, T* db) {
  const std::int64_t P = g.p();
  ex.parallel_range(g.o, std::max<std::int64_t>(1, g.n * P), 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t o = lo; o < hi; ++o) {
      double s = 0;
      for (std::int64_t n = 0; n < g.n; ++n) {
        const T* row = dy + (n * g.o + o) * P;
        for (std::int64_t q = 0; q < P; ++q) s += double(row[q]);
      }
      db[o] = T(s);
    }
  });
}

enum class PoolKind { max, avg };

/// Whether v replaces best as a window's maximum: strictly larger (ties keep
/// the first), or the first NaN (NaN propagates, as numpy's max).
template <class T>
inline bool takes_max(T v, T best) { return (v > best) | ((v != v) & (best == best)); }

/// One plane's pooled rows. Windows are visited element by element in
/// row-major order, each pass updating a whole output row (no branches on
/// the data). With `at`, the plane index of each window's maximum too.
template <PoolKind Kind, class T>
void pool_row(const PoolGeom& g, const T* xp, std::int64_t oh, T* out, std::int64_t* at) {
  const std::int64_t OW = g.ow, sw = g.sw;
  for (std::int64_t i = 0; i < g.kh; ++i) {
    const std::int64_t base = (oh * g.sh + i) * g.w;
    const T* r = xp + base;
    for (std::int64_t j = 0; j < g.kw; ++j) {
      if (i == 0 && j == 0) {
        for (std::int64_t ow = 0; ow < OW; ++ow) out[ow] = r[ow * sw];
        if (at)
          for (std::int64_t ow = 0; ow < OW; ++ow) at[ow] = base + ow * sw;
      } else if constexpr (Kind == PoolKind::max) {
        if (at) {
          for (std::int64_t ow = 0; ow < OW; ++ow) {
            const T v = r[ow * sw + j];
            const bool take = takes_max(v, out[ow]);
            out[ow] = take ? v : out[ow];
            at[ow] = take ? base + ow * sw + j : at[ow];
          }
        } else {
          for (std::int64_t ow = 0; ow < OW; ++ow) {
            const T v = r[ow * sw + j];
            out[ow] = takes_max(v, out[ow]) ? v : out[ow];
          }
        }
      } else {
        for (std::int64_t ow = 0; ow < OW; ++ow) out[ow] += r[ow * sw + j];
      }
    }
  }
}

template <PoolKind Kind, class Ex, class T>
void pool2d_forward(Ex ex, const PoolGeom& g, const T* x, T* y) {
  const std::int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const T area = T(g.kh * g.kw);
  ex.parallel_range(g.n * g.c, std::max<std::int64_t>(1, out_plane * g.kh * g.kw), 1,
                    [&](std::int64_t lo, std::int64_t hi) {
                      for (std::int64_t pl = lo; pl < hi; ++pl)
                        for (std::int64_t oh = 0; oh < g.oh; ++oh) {
                          T* yrow = y + pl * out_plane + oh * g.ow;
                          pool_row<Kind>(g, x + pl * in_plane, oh, yrow, nullptr);
                          if constexpr (Kind == PoolKind::avg)
                            for (std::int64_t ow = 0; ow < g.ow; ++ow) yrow[ow] /= area;
                        }
                    });
}

/// dx: every window's gradient to its first maximum (max) or spread evenly (avg).
template <PoolKind Kind, class Ex, class T>
void pool2d_backward(Ex ex, const PoolGeom& g, const T* dy, const T* x, T* dx) {
  const std::int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const T area = T(g.kh * g.kw);
  ex.parallel_range(g.n * g.c, std::max<std::int64_t>(1, out_plane * g.kh * g.kw + in_plane), 1,
                    [&](std::int64_t lo, std::int64_t hi) {
                      std::unique_ptr<T[]> best(Kind == PoolKind::max ? new T[std::size_t(g.ow)] : nullptr);
                      std::unique_ptr<std::int64_t[]> at(Kind == PoolKind::max ? new std::int64_t[std::size_t(g.ow)]
                                                                                 : nullptr);
                      for (std::int64_t pl = lo; pl < hi; ++pl) {
                        T* dxp = dx + pl * in_plane;
                        std::fill(dxp, dxp + in_plane, T(0));
                        for (std::int64_t oh = 0; oh < g.oh; ++oh) {
                          const T* dyrow = dy + pl * out_plane + oh * g.ow;
                          if constexpr (Kind == PoolKind::max) {
                            pool_row<Kind>(g, x + pl * in_plane, oh, best.get(), at.get());
                            for (std::int64_t ow = 0; ow < g.ow; ++ow) dxp[at[ow]] += dyrow[ow];
                          } else {
                            for (std::int64_t i = 0; i < g.kh; ++i) {
                              T* r = dxp + (oh * g.sh + i) * g.w;
                              for (std::int64_t j = 0; j < g.kw; ++j)
                                for (std::int64_t ow = 0; ow < g.ow; ++ow) r[ow * g.sw + j] += dyrow[ow] / area;
                            }
                          }
                        }
                      }
                    });
}

}  // namespace cpu_conv

// --- recorded tasks (the forward ones and the untracked gradients) -------------

template <class T>
Tensor<T> record_conv2d(const Leaf<T>& x, const Leaf<T>& w, const Leaf<T>* b, const ConvGeom& g) {
  const bool has_bias = b != nullptr;
  require_cpu(x.device(), "conv2d");
  return record_new<T>(
      "conv2d", g.output(), x.device(),
      [x = plain_leaf(x), w = plain_leaf(w), b = has_bias ? plain_leaf(*b) : Leaf<T>(), has_bias, g](Buffer& out) {
        on_cpu(out.device, "convolution and pooling", [&](auto ex) {
          cpu_conv::conv2d_forward(ex, g, data_of(x), data_of(w), has_bias ? data_of(b) : nullptr, out.as<T>());
        });
      },
      [&](Task& t) {
        t.add_input(x.buffer);
        t.add_input(w.buffer);
        if (b) t.add_input(b->buffer);
      });
}

/// A gradient task reading two leaves: kernel(ex, a's data, b's data, out).
template <class T, class Kernel>
Tensor<T> record_grad(const char* name, const Shape& shape, const Leaf<T>& a, const Leaf<T>& b, Kernel kernel) {
  require_cpu(a.device(), name);
  return record_new<T>(
      name, shape, a.device(),
      [a = plain_leaf(a), b = plain_leaf(b), kernel](Buffer& out) {
        on_cpu(out.device, "convolution and pooling", [&](auto ex) { kernel(ex, data_of(a), data_of(b), out.as<T>()); });
      },
      [&](Task& t) {
        t.add_input(a.buffer);
        t.add_input(b.buffer);
      });
}

template <class T>
Tensor<T> conv2d_grad_input(const Leaf<T>& dy, const Leaf<T>& w, const ConvGeom& g) {
  return record_grad<T>("conv2d_grad_input", g.input(), dy, w, [g](auto ex, const T* pdy, const T* pw, T* out) {
    cpu_conv::conv2d_backward_input(ex, g, pdy, pw, out);
  });
}

template <class T>
Tensor<T> conv2d_grad_weight(const Leaf<T>& dy, const Leaf<T>& x, const ConvGeom& g) {
  return record_grad<T>("conv2d_grad_weight", g.weight(), dy, x, [g](auto ex, const T* pdy, const T* px, T* out) {
    cpu_conv::conv2d_backward_weight(ex, g, pdy, px, out);
  });
}

template <class T>
Tensor<T> conv2d_grad_bias(const Leaf<T>& dy, const ConvGeom& g) {
  require_cpu(dy.device(), "conv2d_grad_bias");
  return record_new<T>(
      "conv2d_grad_bias", Shape{g.o}, dy.device(),
      [dy = plain_leaf(dy), g](Buffer& out) {
        on_cpu(out.device, "convolution and pooling", [&](auto ex) { cpu_conv::conv2d_backward_bias(ex, g, data_of(dy), out.as<T>()); });
      },
      [&](Task& t) { t.add_input(dy.buffer); });
}

template <cpu_conv::PoolKind Kind, class T>
Tensor<T> record_pool2d(const char* name, const Leaf<T>& x, const PoolGeom& g) {
  require_cpu(x.device(), name);
  return record_new<T>(
      name, g.output(), x.device(),
      [x = plain_leaf(x), g](Buffer& out) {
        on_cpu(out.device, "convolution and pooling", [&](auto ex) { cpu_conv::pool2d_forward<Kind>(ex, g, data_of(x), out.as<T>()); });
      },
      [&](Task& t) { t.add_input(x.buffer); });
}

template <cpu_conv::PoolKind Kind, class T>
Tensor<T> pool2d_grad(const Leaf<T>& dy, const Leaf<T>& x, const PoolGeom& g) {
  constexpr bool reads_x = Kind == cpu_conv::PoolKind::max;  // avg needs only the window geometry
  require_cpu(dy.device(), "pool2d_grad");
  return record_new<T>(
      Kind == cpu_conv::PoolKind::max ? "max_pool2d_grad" : "avg_pool2d_grad", g.input(), dy.device(),
      [dy = plain_leaf(dy), x = reads_x ? plain_leaf(x) : Leaf<T>(), g](Buffer& out) {
        on_cpu(out.device, "convolution and pooling", [&](auto ex) {
          cpu_conv::pool2d_backward<Kind>(ex, g, data_of(dy), reads_x ? data_of(x) : nullptr, out.as<T>());
        });
      },
      [&](Task& t) {
        t.add_input(dy.buffer);
        if (reads_x) t.add_input(x.buffer);
      });
}

}  // namespace detail
}  // namespace deft

namespace deft::autograd::detail {

/// conv2d's derivative: dx = col2im(Wᵀ·dY), dW = dY·colsᵀ, db = Σ dY.
template <class T>
struct Conv2dNode final : Node {
  deft::detail::Leaf<T> x, w, b;
  bool has_bias;
  deft::detail::ConvGeom geom;

  Conv2dNode(deft::detail::Leaf<T> in, deft::detail::Leaf<T> weight, const deft::detail::Leaf<T>* bias,
             const deft::detail::ConvGeom& g)
      : Node("conv2d"), x(std::move(in)), w(std::move(weight)), has_bias(bias != nullptr), geom(g) {
    if (bias) b = *bias;
    if (x.grad) inputs.push_back(x.grad);
    if (w.grad) inputs.push_back(w.grad);
    if (has_bias && b.grad) inputs.push_back(b.grad);
  }
  void backward(MetaBase& out) override {
    const auto dy = gathered<T>(out).leaf();  // recording is paused: a plain leaf
    if (x.grad) accumulate<T>(*x.grad, deft::detail::conv2d_grad_input(dy, w, geom));
    if (w.grad) accumulate<T>(*w.grad, deft::detail::conv2d_grad_weight(dy, x, geom));
    if (has_bias && b.grad) accumulate<T>(*b.grad, deft::detail::conv2d_grad_bias(dy, geom));
  }
};

/// Pooling's derivative: to each window's first maximum, or spread evenly.
template <deft::detail::cpu_conv::PoolKind Kind, class T>
struct Pool2dNode final : Node {
  deft::detail::Leaf<T> x;
  deft::detail::PoolGeom geom;
  Pool2dNode(deft::detail::Leaf<T> in, const deft::detail::PoolGeom& g)
      : Node(Kind == deft::detail::cpu_conv::PoolKind::max ? "max_pool2d" : "avg_pool2d"), x(std::move(in)), geom(g) {
    inputs.push_back(x.grad);
  }
  void backward(MetaBase& out) override {
    const auto dy = gathered<T>(out).leaf();
    accumulate<T>(*x.grad, deft::detail::pool2d_grad<Kind>(dy, x, geom));
  }
};

}  // namespace deft::autograd::detail

namespace deft {
namespace detail {

template <class T>
void require_conv_type() {
  static_assert(std::is_floating_point_v<T>, "deft: conv2d and pooling need float or double tensors");
}

/// B = std::nullptr_t: no bias.
template <class X, class W, class B>
auto conv2d_impl(X&& x, W&& w, B&& b, Size2d stride, Size2d padding) {
  constexpr bool has_bias = !std::is_same_v<std::remove_cvref_t<B>, std::nullptr_t>;
  auto plan = [&](const Shape& xs, const Shape& ws) {
    if constexpr (has_bias) {
      const Shape bs = as_expr(b).shape();
      return plan_conv2d(xs, ws, &bs, stride, padding);
    } else {
      return plan_conv2d(xs, ws, nullptr, stride, padding);
    }
  };
  {  // shapes and devices first: a bad convolution records nothing (not even its operands' evaluation)
    const auto ex = as_expr(x);
    const auto ew = as_expr(w);
    (void)plan(ex.shape(), ew.shape());
    (void)common_device(ex, ew, "conv2d");
    if constexpr (has_bias) (void)common_device(ex, as_expr(b), "conv2d");
  }
  auto lx = materialized_leaf(std::forward<X>(x));
  auto lw = materialized_leaf(std::forward<W>(w));
  using T = value_t<decltype(lx)>;
  require_conv_type<T>();
  static_assert(std::is_same_v<T, value_t<decltype(lw)>>,
                "deft: conv2d needs operands of one element type; use deft::cast<U>(x)");
  const ConvGeom g = plan(lx.shape(), lw.shape());
  using autograd::detail::Conv2dNode;
  if constexpr (has_bias) {
    auto lb = materialized_leaf(std::forward<B>(b));
    static_assert(std::is_same_v<T, value_t<decltype(lb)>>,
                  "deft: conv2d needs operands of one element type; use deft::cast<U>(x)");
    auto out = record_conv2d<T>(lx, lw, &lb, g);
    if (autograd::is_recording() && (lx.grad || lw.grad || lb.grad))
      out.set_grad_meta(autograd::detail::new_meta<T>(out.shape(), std::make_shared<Conv2dNode<T>>(lx, lw, &lb, g)));
    return out;
  } else {
    auto out = record_conv2d<T>(lx, lw, nullptr, g);
    if (autograd::is_recording() && (lx.grad || lw.grad))
      out.set_grad_meta(autograd::detail::new_meta<T>(out.shape(), std::make_shared<Conv2dNode<T>>(lx, lw, nullptr, g)));
    return out;
  }
}

template <cpu_conv::PoolKind Kind, class X>
auto pool2d_impl(const char* name, X&& x, Size2d kernel, Size2d stride) {
  (void)plan_pool2d(name, as_expr(x).shape(), kernel, stride);  // before an expression operand is evaluated
  auto lx = materialized_leaf(std::forward<X>(x));
  using T = value_t<decltype(lx)>;
  require_conv_type<T>();
  const PoolGeom g = plan_pool2d(name, lx.shape(), kernel, stride);
  auto out = record_pool2d<Kind, T>(name, lx, g);
  if (autograd::is_recording() && lx.grad)
    out.set_grad_meta(
        autograd::detail::new_meta<T>(out.shape(), std::make_shared<autograd::detail::Pool2dNode<Kind, T>>(lx, g)));
  return out;
}

}  // namespace detail

/// 2-D convolution (cross-correlation, as in every DL framework) of x (N, C, H, W)
/// with w (O, C, KH, KW) plus b (O): a new (N, O, OH, OW) tensor with
/// OH = (H + 2*padding.h - KH) / stride.h + 1 (likewise OW). Zero padding.
template <Operand X, Operand W, Operand B>
auto conv2d(X&& x, W&& w, B&& b, Size2d stride = {1, 1}, Size2d padding = {0, 0}) {
  return detail::conv2d_impl(std::forward<X>(x), std::forward<W>(w), std::forward<B>(b), stride, padding);
}
/// The same without a bias.
template <Operand X, Operand W>
auto conv2d(X&& x, W&& w, Size2d stride = {1, 1}, Size2d padding = {0, 0}) {
  return detail::conv2d_impl(std::forward<X>(x), std::forward<W>(w), nullptr, stride, padding);
}

/// Maximum over kernel.h x kernel.w windows of x (N, C, H, W), moved by
/// `stride` (default: the kernel, windows side by side); no padding.
template <Operand X>
auto max_pool2d(X&& x, Size2d kernel, Size2d stride) {
  return detail::pool2d_impl<detail::cpu_conv::PoolKind::max>("max_pool2d", std::forward<X>(x), kernel, stride);
}
/// max_pool2d with the stride equal to the window.
template <Operand X>
auto max_pool2d(X&& x, Size2d kernel) { return max_pool2d(std::forward<X>(x), kernel, kernel); }

/// Mean over kernel.h x kernel.w windows (every window lies inside x).
template <Operand X>
auto avg_pool2d(X&& x, Size2d kernel, Size2d stride) {
  return detail::pool2d_impl<detail::cpu_conv::PoolKind::avg>("avg_pool2d", std::forward<X>(x), kernel, stride);
}
/// avg_pool2d with the stride equal to the window.
template <Operand X>
auto avg_pool2d(X&& x, Size2d kernel) { return avg_pool2d(std::forward<X>(x), kernel, kernel); }

}  // namespace deft
