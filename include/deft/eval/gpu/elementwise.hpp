// GPU elementwise kernels ("how" on the device; eval/cpu/elementwise.hpp is
// the CPU's). Every GPU kernel is a Thrust algorithm whose functor is built
// from an expression's kernel view, so one fused tree is one kernel. They
// take a Thrust execution policy: the GPU executor passes a CUDA stream's
// policy, and deft's CPU-only tests pass thrust::cpp::par, which runs the
// same functors on the host (index arithmetic, broadcasting, the reduction
// order) on machines without a GPU.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "../../core/config.hpp"
#include "../../core/shape.hpp"
#include "../../expr/kernel_views.hpp"
#include "../../expr/ops.hpp"
#include "divider.hpp"

namespace deft::detail::gpu {

/// Element i (row-major) of an expression whose view was collapsed to `s`.
/// `view`'s leaves may be repointed (for_each_leaf) before use.
///
/// Rank is the collapsed rank when it is 1 or 2 (nearly every tree once
/// collapsed), 0 for any rank. The loops over dimensions run to max_rank
/// with a test of the rank inside, so that nvcc unrolls them and the view
/// and the coordinates stay in registers: a loop bounded by the rank put a
/// copy of the whole view on every thread's stack (864 bytes for a*b + c*2
/// - a, which then ran at 4% of an H100's bandwidth). The coordinates come
/// from Dividers (divider.hpp).
template <class View, int Rank = 0>
struct ElementAt {
  using value_type = typename View::value_type;
  View view;
  Divider row_strides[max_rank - 1];  // dimension d's stride in the output, d < rank - 1
  int rank = 0;

  ElementAt(const View& v, const Shape& s) : view(v), rank(s.rank()) {
    std::int64_t stride = 1;
    for (int d = rank - 1; d > 0; --d) {
      stride *= s[d];
      row_strides[d - 1] = Divider(stride, std::max<std::int64_t>(s.size() - 1, 0));
    }
    if constexpr (Rank == 1) view.set_row(nullptr, 0);  // one row: positioned once, here
  }
  DEFT_HD value_type operator()(std::int64_t i) const {
    if constexpr (Rank == 1) {
      return view.at(i);
    } else {
      const int outer = Rank == 2 ? 1 : rank - 1;
      std::int64_t idx[max_rank] = {};
      DEFT_UNROLL
      for (int d = 0; d < max_rank - 1; ++d)
        if (d < outer) i = row_strides[d].split(i, idx[d]);
      View w = view;
      w.set_row(idx, outer);
      return w.at(i);
    }
  }
};

template <class Expr>
using ViewOf = decltype(std::declval<const Expr&>().view(Shape{}));

/// The element functor of e for any rank (the tests repoint its leaves).
template <class Expr>
ElementAt<ViewOf<Expr>> element_at(const Expr& e) {
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());
  return {v, s};
}

/// f(element functor of e), with the functor specialised for e's collapsed rank.
template <class Expr, class F>
void with_element_at(const Expr& e, F&& f) {
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());
  if (s.rank() <= 1) f(ElementAt<ViewOf<Expr>, 1>(v, s));
  else if (s.rank() == 2) f(ElementAt<ViewOf<Expr>, 2>(v, s));
  else f(ElementAt<ViewOf<Expr>>(v, s));
}

/// A functor that crosses to the device carries everything by value: a
/// reference member would point into the recording thread's stack.
template <class F>
inline constexpr bool device_safe_functor = std::is_trivially_copyable_v<F> && std::is_copy_assignable_v<F>;

template <class Policy, class F, class Out>
void for_each_output(const Policy& policy, std::int64_t n, const F& f, Out* out) {
  static_assert(device_safe_functor<F>, "deft: a GPU functor must hold its views by value");
  if (n <= 0) return;
  thrust::transform(policy, thrust::counting_iterator<std::int64_t>(0), thrust::counting_iterator<std::int64_t>(n),
                    out, f);
}

/// f(i) for i in [0, n), for functors that write several outputs each.
template <class Policy, class F>
void for_each_index(const Policy& policy, std::int64_t n, const F& f) {
  static_assert(device_safe_functor<F>, "deft: a GPU functor must hold its views by value");
  if (n <= 0) return;
  thrust::for_each(policy, thrust::counting_iterator<std::int64_t>(0), thrust::counting_iterator<std::int64_t>(n), f);
}

/// out (contiguous, e's shape) = e: one kernel for the whole tree.
template <class Policy, class Expr, class T>
void evaluate(const Policy& policy, const Expr& e, T* out) {
  with_element_at(e, [&](const auto& el) { for_each_output(policy, e.shape().size(), el, out); });
}

}  // namespace deft::detail::gpu
