// GPU transposes and blocks of rows (eval/cpu/permute.hpp is the CPU's):
// one thread per output element.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "../../core/config.hpp"
#include "../../core/shape.hpp"
#include "divider.hpp"
#include "elementwise.hpp"

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

namespace deft::detail::gpu {

/// out[i] = in at the permuted position (out's dimension d is in's axes[d]),
/// the loop unrolled to max_rank and the index split by Dividers (see
/// ElementAt).
template <class T>
struct PermuteAt {
  const T* in;
  int rank;
  Divider out_ext[max_rank];
  std::int64_t src_stride[max_rank];
  DEFT_HD T operator()(std::int64_t i) const {
    std::int64_t src = 0;
    DEFT_UNROLL
    for (int k = 0; k < max_rank; ++k)  // dimension rank - 1 - k
      if (k < rank) {
        std::int64_t q = 0;
        src += out_ext[max_rank - 1 - k].split(i, q) * src_stride[max_rank - 1 - k];
        i = q;
      }
    return in[src];
  }
};

template <class Policy, class T>
void permute(const Policy& policy, const T* in, const Shape& in_shape, const std::array<int, max_rank>& axes, T* out) {
  PermuteAt<T> f{in, in_shape.rank(), {}, {}};
  const auto st = contiguous_strides(in_shape);
  const std::int64_t total = in_shape.size();
  for (int d = 0; d < f.rank; ++d) {  // right-aligned: the loop's indices are constants
    f.out_ext[max_rank - f.rank + d] = Divider(in_shape[axes[d]], std::max<std::int64_t>(total - 1, 0));
    f.src_stride[max_rank - f.rank + d] = st[axes[d]];
  }
  for_each_output(policy, total, f, out);
}

/// Element i of a block of rows: dst[r * dst_pitch + c] = src[r * src_pitch + c].
template <class T>
struct CopyRowsAt {
  const T* src;
  T* dst;
  Divider width;
  std::int64_t src_pitch, dst_pitch;
  DEFT_HD void operator()(std::int64_t i) const {
    std::int64_t r = 0;
    const std::int64_t c = width.split(i, r);
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
  }
};

template <class Policy, class T>
void copy_rows(const Policy& policy, std::int64_t rows, std::int64_t width, const T* src, std::int64_t src_pitch,
               T* dst, std::int64_t dst_pitch) {
  if (rows <= 0 || width <= 0) return;
  thrust::for_each(policy, thrust::counting_iterator<std::int64_t>(0),
                   thrust::counting_iterator<std::int64_t>(rows * width),
                   CopyRowsAt<T>{src, dst, Divider(width, rows * width - 1), src_pitch, dst_pitch});
}

}  // namespace deft::detail::gpu
