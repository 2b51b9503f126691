// GPU transposes and blocks of rows (eval/cpu/permute.hpp is the CPU's):
// one thread per output element.
#pragma once
#include <array>
#include <cstdint>

#include "../../core/config.hpp"
#include "../../core/shape.hpp"
#include "elementwise.hpp"

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

namespace deft::detail::gpu {

/// out[i] = in at the permuted position (out's dimension d is in's axes[d]).
template <class T>
struct PermuteAt {
  const T* in;
  int rank;
  std::int64_t out_ext[max_rank];
  std::int64_t src_stride[max_rank];
  DEFT_HD T operator()(std::int64_t i) const {
    std::int64_t src = 0;
    for (int d = rank - 1; d >= 0; --d) {
      src += (i % out_ext[d]) * src_stride[d];
      i /= out_ext[d];
    }
    return in[src];
  }
};

template <class Policy, class T>
void permute(const Policy& policy, const T* in, const Shape& in_shape, const std::array<int, max_rank>& axes, T* out) {
  PermuteAt<T> f{in, in_shape.rank(), {}, {}};
  const auto st = contiguous_strides(in_shape);
  std::int64_t total = 1;
  for (int d = 0; d < f.rank; ++d) {
    f.out_ext[d] = in_shape[axes[d]];
    f.src_stride[d] = st[axes[d]];
    total *= f.out_ext[d];
  }
  for_each_output(policy, total, f, out);
}

/// Element i of a block of rows: dst[r * dst_pitch + c] = src[r * src_pitch + c].
template <class T>
struct CopyRowsAt {
  const T* src;
  T* dst;
  std::int64_t width, src_pitch, dst_pitch;
  DEFT_HD void operator()(std::int64_t i) const {
    const std::int64_t r = i / width, c = i - r * width;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
  }
};

template <class Policy, class T>
void copy_rows(const Policy& policy, std::int64_t rows, std::int64_t width, const T* src, std::int64_t src_pitch,
               T* dst, std::int64_t dst_pitch) {
  if (rows <= 0 || width <= 0) return;
  thrust::for_each(policy, thrust::counting_iterator<std::int64_t>(0),
                   thrust::counting_iterator<std::int64_t>(rows * width),
                   CopyRowsAt<T>{src, dst, width, src_pitch, dst_pitch});
}

}  // namespace deft::detail::gpu
