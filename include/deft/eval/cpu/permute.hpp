// CPU executor for moving elements between layouts: axis permutations
// (transpose), a gather along the output order whose 2-D case goes tile by
// tile so both sides stay in cache; and blocks of rows (slices, concat).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "../../core/shape.hpp"
#include "elementwise.hpp"

namespace deft::detail::cpu {

/// out (shape `out_shape`, contiguous) = in permuted: out[i0..] = in[i_axes[0]..].
template <class T>
inline void permute(const T* in, const Shape& in_shape, const std::array<int, max_rank>& axes, T* out) {
  const int r = in_shape.rank();
  const auto in_st = contiguous_strides(in_shape);
  Shape out_shape;
  std::array<std::int64_t, max_rank> src_st{};
  for (int d = 0; d < r; ++d) {
    out_shape.push_back(in_shape[axes[d]]);
    src_st[d] = in_st[axes[d]];
  }
  const std::int64_t total = out_shape.size();
  if (total == 0) return;  // an empty extent: nothing to move (and no index to divide by it)
  if (r == 2) {
    constexpr std::int64_t tile = 32;
    const std::int64_t rows = out_shape[0], cols = out_shape[1];
    const std::int64_t row_tiles = (rows + tile - 1) / tile;
    parallel_range(row_tiles, tile * cols, 1, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t i0 = t0 * tile; i0 < std::min(rows, t1 * tile); i0 += tile)
        for (std::int64_t j0 = 0; j0 < cols; j0 += tile)
          for (std::int64_t i = i0; i < std::min(rows, i0 + tile); ++i)
            for (std::int64_t j = j0; j < std::min(cols, j0 + tile); ++j) out[i * cols + j] = in[i * src_st[0] + j * src_st[1]];
    });
    return;
  }
  parallel_range(total, 2, 64, [&](std::int64_t lo, std::int64_t hi) {
    std::array<std::int64_t, max_rank> idx{};
    std::int64_t rem = lo;
    for (int d = r - 1; d >= 0; --d) {
      idx[d] = rem % out_shape[d];
      rem /= out_shape[d];
    }
    for (std::int64_t i = lo; i < hi; ++i) {
      std::int64_t src = 0;
      for (int d = 0; d < r; ++d) src += idx[d] * src_st[d];
      out[i] = in[src];
      for (int d = r - 1; d >= 0; --d) {
        if (++idx[d] < out_shape[d]) break;
        idx[d] = 0;
      }
    }
  });
}

/// dst[r * dst_pitch + c] = src[r * src_pitch + c] for r < rows, c < width:
/// a block of one row-major array into a block of another.
template <class T>
inline void copy_rows(std::int64_t rows, std::int64_t width, const T* src, std::int64_t src_pitch, T* dst,
                      std::int64_t dst_pitch) {
  if (rows <= 0 || width <= 0) return;
  parallel_range(rows, width, 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t r = lo; r < hi; ++r) std::copy_n(src + r * src_pitch, width, dst + r * dst_pitch);
  });
}

}  // namespace deft::detail::cpu
