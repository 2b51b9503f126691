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

namespace deft::detail::gpu {

/// Element i (row-major) of an expression whose view was collapsed to `s`.
/// `view`'s leaves may be repointed (for_each_leaf) before use.
///
/// Rank is the collapsed rank when it is 1 or 2 (nearly every tree once
/// collapsed), 0 for any rank. The fixed ranks index with compile-time
/// loops, so the view stays in registers; the run-time loop puts a copy of
/// the whole view on every thread's stack (864 bytes for a*b + c*2 - a,
/// which then ran at 4% of an H100's bandwidth).
template <class View, int Rank = 0>
struct ElementAt {
  using value_type = typename View::value_type;
  View view;
  std::int64_t ext[max_rank] = {};
  int rank = 0;

  ElementAt(const View& v, const Shape& s) : view(v), rank(s.rank()) {
    for (int d = 0; d < rank; ++d) ext[d] = s[d];
    if constexpr (Rank == 1) view.set_row(nullptr, 0);  // one row: positioned once, here
  }
  DEFT_HD value_type operator()(std::int64_t i) const {
    if constexpr (Rank == 1) {
      return view.at(i);
    } else if constexpr (Rank == 2) {
      View w = view;
      const std::int64_t r = i / ext[1];
      w.set_row(&r, 1);
      return w.at(i - r * ext[1]);
    } else {
      View w = view;
      if (rank <= 1) {
        w.set_row(nullptr, 0);
        return w.at(i);
      }
      std::int64_t idx[max_rank] = {};
      std::int64_t r = i / ext[rank - 1];
      const std::int64_t j = i % ext[rank - 1];
      for (int d = rank - 2; d >= 0; --d) {
        idx[d] = r % ext[d];
        r /= ext[d];
      }
      w.set_row(idx, rank - 1);
      return w.at(j);
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

/// out (contiguous, e's shape) = e: one kernel for the whole tree.
template <class Policy, class Expr, class T>
void evaluate(const Policy& policy, const Expr& e, T* out) {
  with_element_at(e, [&](const auto& el) { for_each_output(policy, e.shape().size(), el, out); });
}

}  // namespace deft::detail::gpu
