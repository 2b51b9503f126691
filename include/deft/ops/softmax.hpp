// softmax and log_softmax along an axis, stable for any input range: with m
// the maximum along the axis, exp(x - m) / Σ exp(x - m) and
// (x - m) - log Σ exp(x - m). Four tasks each: softmax keeps exp(x - m)
// for its sum and its quotient, so that each element's exp is computed
// once (in cache, the exp bounds these passes, not memory); log_softmax takes each
// log once per slice, not once per element. The gradient is one fused
// formula of the result (autograd/softmax.hpp), not the chain of these
// steps' derivatives.
#pragma once
#include <type_traits>
#include <utility>

#include "elementwise.hpp"
#include "reduction.hpp"
#include "../tensor.hpp"

namespace deft {
namespace detail {

template <bool Log, class T>
Tensor<T> softmax_along(const Tensor<T>& t, int axis) {
  // An empty axis leaves nothing to normalise: an empty result, as numpy's.
  const Tensor<T> m = reduce<MaxReducer, false>(Log ? "log_softmax" : "softmax", t, axis, true, false);
  Tensor<T> y;
  if constexpr (Log) {
    y = eval_untracked(t - m - Tensor<T>(eval_untracked(log(sum_untracked(exp(t - m), axis, true)))));
  } else {
    const Tensor<T> e = eval_untracked(exp(t - m));
    y = eval_untracked(e / sum_untracked(e, axis, true));
  }
  if constexpr (std::is_floating_point_v<T>)
    if (autograd::is_recording() && t.grad_meta()) autograd::detail::track_softmax(y, t.grad_meta(), axis, Log);
  return y;
}

}  // namespace detail

/// exp(x) / sum(exp(x)) along `axis` (negative counts from the end); a
/// NaN along the axis makes that whole slice NaN.
template <Operand X>
auto softmax(X&& x, int axis = -1) {
  using T = detail::value_t<detail::expr_t<X>>;
  return detail::softmax_along<false>(Tensor<T>(std::forward<X>(x)), axis);
}

/// log(softmax(x)) along `axis`, without forming softmax (no log of 0 for
/// scores far below the maximum).
template <Operand X>
auto log_softmax(X&& x, int axis = -1) {
  using T = detail::value_t<detail::expr_t<X>>;
  return detail::softmax_along<true>(Tensor<T>(std::forward<X>(x)), axis);
}

}  // namespace deft
