// The shapes of a 2-D convolution or pooling (NCHW), as every device's
// kernels see them: ops/conv.hpp plans them, eval/cpu/conv.hpp and
// eval/gpu/conv.hpp compute with them. Plain values, copied into GPU functors.
#pragma once
#include <algorithm>
#include <cstdint>

#include "../core/config.hpp"
#include "../core/shape.hpp"
#include "../core/thresholds.hpp"

namespace deft::detail {

// Tuning of the convolution kernels (shape-derived only, never the worker
// count, so that results are the same bits for any number of workers).

/// Everything a convolution kernel needs to know about its shapes.
struct ConvGeom {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input (N, C, H, W)
  std::int64_t o = 0, kh = 0, kw = 0;       // weight (O, C, KH, KW)
  std::int64_t sh = 1, sw = 1, ph = 0, pw = 0;
  std::int64_t oh = 0, ow = 0;  // output (N, O, OH, OW)

  DEFT_HD std::int64_t k() const { return c * kh * kw; }  // rows of the im2col matrix
  DEFT_HD std::int64_t p() const { return oh * ow; }      // output positions per image
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

enum class PoolKind { max, avg };

/// Whether v replaces best as a window's maximum: strictly larger (ties keep
/// the first), or the first NaN (NaN propagates, as numpy's max).
template <class T>
DEFT_HD inline bool takes_max(T v, T best) { return (v > best) | ((v != v) & (best == best)); }

}  // namespace deft::detail
