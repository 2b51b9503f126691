// softmax and log_softmax along an axis, stable for any input range: with m
// the maximum along the axis (a constant for the gradient, which does not
// depend on it), exp(x - m) / sum(exp(x - m)) and (x - m) - log(sum(exp(x - m))).
// Three tasks: the maximum, the fused sum of exponentials, and the result.
#pragma once
#include <utility>

#include "elementwise.hpp"
#include "reduction.hpp"
#include "../tensor.hpp"

namespace deft {

/// exp(x) / sum(exp(x)) along `axis` (negative counts from the end); a
/// NaN along the axis makes that whole slice NaN.
template <Operand X>
auto softmax(X&& x, int axis = -1) {
  using T = detail::value_t<detail::expr_t<X>>;
  const Tensor<T> t(std::forward<X>(x));
  const Tensor<T> m = max(t.detach(), axis, true);
  const Tensor<T> s = sum(exp(t - m), axis, true);
  return Tensor<T>(exp(t - m) / s);
}

/// log(softmax(x)) along `axis`, without forming softmax (no log of 0 for
/// scores far below the maximum).
template <Operand X>
auto log_softmax(X&& x, int axis = -1) {
  using T = detail::value_t<detail::expr_t<X>>;
  const Tensor<T> t(std::forward<X>(x));
  const Tensor<T> m = max(t.detach(), axis, true);
  const Tensor<T> lse = log(sum(exp(t - m), axis, true));
  return Tensor<T>(t - m - lse);
}

}  // namespace deft
