// softmax and log_softmax along an axis, stable for any input range: with m
// the maximum along the axis, exp(x - m) / Σ exp(x - m) and
// (x - m) - log Σ exp(x - m). Along the innermost axis on the CPU this is
// one task (the executor's softmax_rows: each row's passes run in cache).
// Elsewhere it is four: softmax keeps exp(x - m) for its sum and its
// quotient, so that each element's exp is computed once; log_softmax takes
// each log once per slice, not once per element. The gradient is one fused
// formula of the result (autograd/softmax.hpp), not the chain of these
// steps' derivatives.
#pragma once
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "elementwise.hpp"
#include "reduction.hpp"
#include "../tensor.hpp"

namespace deft {
namespace detail {

/// softmax (log_softmax with Log) along `axis` as separate reductions and
/// elementwise passes, named `name` in errors.
template <bool Log, class T>
Tensor<T> softmax_composed(const Tensor<T>& t, int axis, const char* name) {
  // An empty axis leaves nothing to normalise: an empty result, as numpy's.
  const Tensor<T> m = reduce<MaxReducer, false>(name, t, axis, true, false);
  Tensor<T> y;
  if constexpr (Log) {
    y = eval_untracked(t - m - Tensor<T>(eval_untracked(log(sum_untracked(exp(t - m), axis, true)))));
  } else {
    const Tensor<T> e = eval_untracked(exp(t - m));
    y = eval_untracked(e / sum_untracked(e, axis, true));
  }
  return y;
}

/// softmax (log_softmax with Log) of t along `axis`: one task of the
/// executor's row kernel where it has one, else softmax_composed.
template <bool Log, class T>
Tensor<T> softmax_along(const Tensor<T>& t, int axis) {
  static_assert(std::is_floating_point_v<T>, "deft: softmax and log_softmax need a float or double tensor");
  const char* name = Log ? "log_softmax" : "softmax";
  const Shape& shape = t.shape();
  const int rank = shape.rank();
  Tensor<T> y;
  if (has_row_softmax(t.device()) && rank > 0 && (axis == rank - 1 || axis == -1) && shape.size() > 0) {
    const Leaf<T> x = t.leaf();
    const std::int64_t cols = shape[rank - 1], rows = shape.size() / cols;
    y = record_new<T>(
        name, shape, x.device(),
        [x, rows, cols](Buffer& b) {
          on_device(b.device, [&](auto ex) {
            if constexpr (requires { ex.template softmax_rows<Log>(rows, cols, b.as<const T>(), b.as<T>()); })
              ex.template softmax_rows<Log>(rows, cols, x.source->template as<const T>() + x.offset, b.as<T>());
            else
              raise<std::logic_error>("softmax: no row kernel on ", b.device, " (has_row_softmax disagrees with its executor)");
          });
        },
        [&](Task& task) { task.add_input(x.buffer); });
  } else {
    y = softmax_composed<Log>(t, axis, name);
  }
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
