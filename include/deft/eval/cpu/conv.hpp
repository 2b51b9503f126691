// The CPU's convolution and pooling kernels (ops/conv.hpp records them):
// conv2d runs im2col on blocks of whole images and one GEMM per block, blocks
// in parallel; its input gradient is a GEMM then col2im, its weight gradient
// a product per block (dot products of rows, gemm_nt, or the packed GEMM for
// many channels), summed per group of blocks in a fixed order (the same bits
// for any worker count). Pooling is a direct loop over the N*C planes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "../conv_geometry.hpp"
#include "gemm.hpp"
#include "elementwise.hpp"

namespace deft::detail::cpu {

/// Output positions [lo, hi) along one axis whose input index o*s + off lies in [0, in).
inline void valid_range(std::int64_t off, std::int64_t s, std::int64_t in, std::int64_t out, std::int64_t& lo,
                        std::int64_t& hi) {
  lo = off >= 0 ? 0 : -off / s + (-off % s != 0);  // the ceiling of -off / s, without overflow for huge strides
  const std::int64_t top = in - 1 - off;  // o*s <= top
  hi = top < 0 ? 0 : std::min(out, top / s + 1);
  lo = std::min(lo, hi);
}

/// The output rows [r0, r1) and columns [c0, c1) whose input pixel under the
/// kernel tap (i, j) lies inside the image; the others read padding.
struct TapRange {
  std::int64_t r0, r1, c0, c1;
};
inline TapRange tap_range(const ConvGeom& g, std::int64_t i, std::int64_t j) {
  TapRange t;
  valid_range(i - g.ph, g.sh, g.h, g.oh, t.r0, t.r1);
  valid_range(j - g.pw, g.sw, g.w, g.ow, t.c0, t.c1);
  return t;
}

template <class T>
using Scratch = AlignedScratch<T>;

inline std::size_t at_least_one(std::int64_t n) { return std::size_t(std::max<std::int64_t>(n, 1)); }

/// cols (K x images*P, row-major) from `images` images starting at x:
/// cols[(c,i,j), (b,oh,ow)] = x[b, c, oh*sh - ph + i, ow*sw - pw + j], zero outside.
template <class T>
void im2col(const ConvGeom& g, const T* x, std::int64_t images, T* out) {
  const std::int64_t P = g.p(), ld = images * P, plane = g.h * g.w;
  for (std::int64_t c = 0; c < g.c; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const auto [r0, r1, c0, c1] = tap_range(g, i, j);
        T* dst = out + ((c * g.kh + i) * g.kw + j) * ld;
        // Unit stride along rows as wide as the input's ("same" width): the
        // tap's valid pixels, read row after row, are one contiguous range of
        // x, so one copy moves them, and the columns that read padding are
        // zeroed after it (the copy put the neighbouring row's pixels there).
        const bool one_range = g.sh == 1 && g.sw == 1 && g.ow == g.w && r1 > r0 && c1 > c0;
        for (std::int64_t b = 0; b < images; ++b) {
          const T* xc = x + (b * g.c + c) * plane;
          T* d = dst + b * P;
          if (one_range) {
            const std::int64_t first = r0 * g.ow + c0, last = (r1 - 1) * g.ow + c1;  // [first, last) of d
            std::fill(d, d + first, T(0));
            std::memcpy(d + first, xc + (r0 - g.ph + i) * g.w + (c0 + j - g.pw), std::size_t(last - first) * sizeof(T));
            for (std::int64_t oh = r0; oh + 1 < r1; ++oh) {  // between two rows' valid columns
              T* drow = d + oh * g.ow;
              std::fill(drow + c1, drow + g.ow + c0, T(0));
            }
            std::fill(d + last, d + P, T(0));
            continue;
          }
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

/// C (m x n) (+)= A (m x k) · Bᵀ, B being (n x k): every C element is the
/// dot product of a row of A and a row of B, both contiguous. The weight
/// gradient's shape (few rows and columns, a long k) suits this better than
/// the packed GEMM: an MI x NJ tile of dot products shares its row loads;
/// edge tiles repeat the last row and drop the copies. Each element's sum
/// is in a fixed order (SIMD lanes, then the k tail), whatever the threads.
template <class T>
void gemm_nt(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool accumulate) {
  using V = simd_batch<T>;
  constexpr std::int64_t W = V::size;
  constexpr std::int64_t MI = simd_registers >= 32 ? 4 : 3, NJ = 4;
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
      for (std::int64_t i = 0; i < g.kh; ++i)
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const auto [r0, r1, c0, c1] = tap_range(g, i, j);
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

/// dyb (O x images*P) = the block's output gradient, image-major rows gathered.
template <class T>
void gather_block(const ConvGeom& g, const T* dy, std::int64_t images, T* dyb) {
  const std::int64_t P = g.p(), ld = images * P;
  for (std::int64_t b = 0; b < images; ++b)
    for (std::int64_t o = 0; o < g.o; ++o)
      std::memcpy(dyb + o * ld + b * P, dy + (b * g.o + o) * P, std::size_t(P) * sizeof(T));
}

/// y (N, O, OH, OW) = conv(x, w) + bias (bias may be null).
template <class T>
void conv2d_forward(const ConvGeom& g, const T* x, const T* w, const T* bias, T* y) {
  const std::int64_t K = g.k(), P = g.p(), B = g.block(), nb = g.blocks(), chw = g.c * g.h * g.w;
  if (g.n == 0 || g.o == 0) return;  // an empty output: no image's scratch to allocate
  parallel_range(nb, std::max<std::int64_t>(1, B * (g.o + 2) * K * P), 1, [&](std::int64_t lo, std::int64_t hi) {
    Scratch<T> cols(at_least_one(K * B * P));
    Scratch<T> yb(at_least_one(B > 1 ? g.o * B * P : 0));
    for (std::int64_t blk = lo; blk < hi; ++blk) {
      const std::int64_t n0 = blk * B, m = std::min(B, g.n - n0);
      im2col(g, x + n0 * chw, m, cols.p);
      T* out = y + n0 * g.o * P;
      if (m == 1) {
        gemm(g.o, P, K, w, cols.p, out);
        if (bias)
          for (std::int64_t o = 0; o < g.o; ++o)
            for (std::int64_t q = 0; q < P; ++q) out[o * P + q] += bias[o];
        continue;
      }
      gemm(g.o, m * P, K, w, cols.p, yb.p);
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

/// dx (N, C, H, W) = the input gradient. With unit strides (and padding
/// under the kernel's extent) it is the forward convolution of dY with the
/// kernel turned half a turn and its two channel axes swapped, padded by
/// KH-1-PH and KW-1-PW: im2col of dY and one GEMM per block write dx once,
/// where col2im adds each tap's share into it, a read-modify-write of dx per
/// tap (11 % of a narrow ResNet-18 step). Other strides: col2im(Wᵀ · dY),
/// block by block.
template <class T>
void conv2d_backward_input(const ConvGeom& g, const T* dy, const T* w, T* dx) {
  const std::int64_t K = g.k(), P = g.p(), B = g.block(), nb = g.blocks(), chw = g.c * g.h * g.w;
  if (g.n == 0 || g.o == 0) {  // no output channel reads x: its gradient is zero, without scratch
    std::fill(dx, dx + g.n * chw, T(0));
    return;
  }
  if (g.sh == 1 && g.sw == 1 && g.ph < g.kh && g.pw < g.kw) {
    ConvGeom t = g;
    t.c = g.o, t.h = g.oh, t.w = g.ow;
    t.o = g.c, t.oh = g.h, t.ow = g.w;
    t.ph = g.kh - 1 - g.ph, t.pw = g.kw - 1 - g.pw;
    Scratch<T> turned(at_least_one(g.o * K));  // (C, O, KH, KW)
    for (std::int64_t o = 0; o < g.o; ++o)
      for (std::int64_t c = 0; c < g.c; ++c)
        for (std::int64_t i = 0; i < g.kh; ++i)
          for (std::int64_t j = 0; j < g.kw; ++j)
            turned.p[((c * g.o + o) * g.kh + (g.kh - 1 - i)) * g.kw + (g.kw - 1 - j)] = w[((o * g.c + c) * g.kh + i) * g.kw + j];
    conv2d_forward(t, dy, turned.p, static_cast<const T*>(nullptr), dx);
    return;
  }
  parallel_range(nb, std::max<std::int64_t>(1, B * (g.o + 2) * K * P), 1, [&](std::int64_t lo, std::int64_t hi) {
    Scratch<T> dcols(at_least_one(K * B * P));
    Scratch<T> dyb(at_least_one(B > 1 ? g.o * B * P : 0));
    for (std::int64_t blk = lo; blk < hi; ++blk) {
      const std::int64_t n0 = blk * B, m = std::min(B, g.n - n0);
      const T* src = dy + n0 * g.o * P;
      if (m > 1) {
        gather_block(g, src, m, dyb.p);
        src = dyb.p;
      }
      gemm(K, m * P, g.o, w, src, dcols.p, /*trans_a=*/true);  // W is O x K
      col2im(g, dcols.p, m, dx + n0 * chw);
    }
  });
}

/// dYb · colsbᵀ added to (or, with `accumulate` false, written into) acc
/// (O x K): dot products of contiguous rows (gemm_nt) for few output
/// channels or taps, the packed GEMM from thresholds::conv_weight_packed_min
/// of both, where it ran 2-3x faster (a 3x3 convolution of 32 or 64
/// channels). The choice depends on the shapes alone, so the bits do not
/// depend on the worker count.
template <class T>
void weight_block_product(std::int64_t o, std::int64_t k, std::int64_t len, const T* dyb, const T* cols, T* acc,
                          bool accumulate) {
  if constexpr (std::is_floating_point_v<T>) {
    if (o >= thresholds::conv_weight_packed_min && k >= thresholds::conv_weight_packed_min) {
      GemmKernel<T>::run(o, k, len, dyb, false, cols, true, acc, accumulate);
      return;
    }
  }
  gemm_nt(o, k, len, dyb, cols, acc, accumulate);
}

/// dw (O, C, KH, KW) = Σ over blocks of dYb · colsbᵀ (weight_block_product).
/// Blocks are summed into one partial per group of consecutive blocks, and
/// the partials are added in order: the same bits for any worker count.
template <class T>
void conv2d_backward_weight(const ConvGeom& g, const T* dy, const T* x, T* dw) {
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
  parallel_range(slots, std::max<std::int64_t>(1, per_slot * B * (g.o + 1) * K * P), 1,
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
                          weight_block_product(g.o, K, m * P, src, cols.p, acc, blk > b0);
                        }
                      }
                    });
  if (slots > 1)
    parallel_range(OK, slots, 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t s = 1; s < slots; ++s) {
        const T* p = partials.p + (s - 1) * OK;
        for (std::int64_t e = lo; e < hi; ++e) dw[e] += p[e];
      }
    });
}

/// db (O) = Σ over N, OH, OW of dY (accumulated in double).
template <class T>
void conv2d_backward_bias(const ConvGeom& g, const T* dy, T* db) {
  const std::int64_t P = g.p();
  parallel_range(g.o, std::max<std::int64_t>(1, g.n * P), 1, [&](std::int64_t lo, std::int64_t hi) {
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

template <PoolKind Kind, class T>
void pool2d_forward(const PoolGeom& g, const T* x, T* y) {
  const std::int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const T area = T(g.kh * g.kw);
  parallel_range(g.n * g.c, std::max<std::int64_t>(1, out_plane * g.kh * g.kw), 1,
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
template <PoolKind Kind, class T>
void pool2d_backward(const PoolGeom& g, const T* dy, const T* x, T* dx) {
  const std::int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const T area = T(g.kh * g.kw);
  parallel_range(g.n * g.c, std::max<std::int64_t>(1, out_plane * g.kh * g.kw + in_plane), 1,
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

}  // namespace deft::detail::cpu
