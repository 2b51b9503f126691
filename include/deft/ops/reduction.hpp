// Reductions over all elements or along one axis: sum mean max min norm argmax.
// Each records one task; an expression operand is consumed block by block.
#pragma once
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "../eval/executor.hpp"
#include "../expr/reducers.hpp"
#include "elementwise.hpp"
#include "../tensor.hpp"

namespace deft {
namespace detail {

/// The result shape of reducing `in` over `axis` (all axes when empty).
inline Shape reduced_shape(const Shape& in, std::optional<int> axis, bool keepdims) {
  if (axis) return in.without(*axis, keepdims);
  Shape s;
  if (keepdims)
    for (int d = 0; d < in.rank(); ++d) s.push_back(1);
  return s;
}

/// Track = false for autograd's own backward work (see record_expression).
template <template <class> class R, bool Track = true, class X>
auto reduce(const char* name, X&& x, std::optional<int> axis, bool keepdims, bool needs_elements) {
  auto e = as_expr(std::forward<X>(x));
  using T = value_t<decltype(e)>;
  const Shape in = e.shape();
  if (axis) axis = normalize_axis(*axis, in.rank(), name);
  if (needs_elements && (axis ? in[*axis] == 0 : in.size() == 0))
    raise(name, ": cannot reduce an empty extent (shape ", in.to_string(), axis ? ", axis " + std::to_string(*axis) : "",
          ")");
  const Shape out = reduced_shape(in, axis, keepdims);
  Tensor<T> result =
      axis ? record_new<T>(name, out, e.device(), [e, ax = *axis](Buffer& b) { on_device(b.device, [&](auto ex) { ex.template reduce_axis<R<T>>(e, ax, b.as<T>()); }); },
                           reads_of(e))
           : record_new<T>(name, out, e.device(), [e](Buffer& b) { on_device(b.device, [&](auto ex) { ex.template reduce_all<R<T>>(e, b.as<T>()); }); },
                           reads_of(e));
  if constexpr (Track)
    if (tracked(e)) autograd::detail::track_reduce<R<T>>(result, e, axis.value_or(0), !axis, keepdims);
  return result;
}

/// The sum and mean of the library's own statements that autograd never
/// records (eval_untracked's kin): over all elements, or along `axis`.
template <class X>
auto sum_untracked(X&& x, std::optional<int> axis = std::nullopt, bool keepdims = false) {
  return reduce<SumReducer, false>("sum", std::forward<X>(x), axis, keepdims, false);
}
template <class X>
auto mean_untracked(X&& x, std::optional<int> axis = std::nullopt, bool keepdims = false) {
  return reduce<MeanReducer, false>("mean", std::forward<X>(x), axis, keepdims, false);
}

template <class X>
void require_floating() {
  static_assert(std::is_floating_point_v<value_t<expr_t<X>>>,
                "deft: mean and norm need a floating-point operand; use deft::cast<float>(x)");
}

}  // namespace detail

/// Sum of all elements (a 0-d tensor), or along `axis`.
template <Operand X>
auto sum(X&& x) { return detail::reduce<detail::SumReducer>("sum", std::forward<X>(x), std::nullopt, false, false); }
/// Sums along `axis` (negative counts from the end); keepdims keeps it with extent 1.
template <Operand X>
auto sum(X&& x, int axis, bool keepdims = false) {
  return detail::reduce<detail::SumReducer>("sum", std::forward<X>(x), axis, keepdims, false);
}
/// Arithmetic mean (floating point only; NaN for an empty tensor).
template <Operand X>
auto mean(X&& x) {
  detail::require_floating<X>();
  return detail::reduce<detail::MeanReducer>("mean", std::forward<X>(x), std::nullopt, false, false);
}
/// Means along `axis` (see sum).
template <Operand X>
auto mean(X&& x, int axis, bool keepdims = false) {
  detail::require_floating<X>();
  return detail::reduce<detail::MeanReducer>("mean", std::forward<X>(x), axis, keepdims, false);
}
/// Largest element (NaN if any is NaN); throws for an empty tensor.
template <Operand X>
auto max(X&& x) { return detail::reduce<detail::MaxReducer>("max", std::forward<X>(x), std::nullopt, false, true); }
/// Maxima along `axis` (see sum).
template <Operand X>
auto max(X&& x, int axis, bool keepdims = false) {
  return detail::reduce<detail::MaxReducer>("max", std::forward<X>(x), axis, keepdims, true);
}
/// Smallest element (NaN if any is NaN); throws for an empty tensor.
template <Operand X>
auto min(X&& x) { return detail::reduce<detail::MinReducer>("min", std::forward<X>(x), std::nullopt, false, true); }
/// Minima along `axis` (see sum).
template <Operand X>
auto min(X&& x, int axis, bool keepdims = false) {
  return detail::reduce<detail::MinReducer>("min", std::forward<X>(x), axis, keepdims, true);
}
/// Euclidean (L2) norm (floating point only).
template <Operand X>
auto norm(X&& x) {
  detail::require_floating<X>();
  return detail::reduce<detail::NormReducer>("norm", std::forward<X>(x), std::nullopt, false, false);
}
/// L2 norms along `axis` (see sum).
template <Operand X>
auto norm(X&& x, int axis, bool keepdims = false) {
  detail::require_floating<X>();
  return detail::reduce<detail::NormReducer>("norm", std::forward<X>(x), axis, keepdims, false);
}

/// Flat index of the first largest element (int64, 0-d), or indices along `axis`.
template <Operand X>
Tensor<std::int64_t> argmax(X&& x) {
  auto e = as_expr(std::forward<X>(x));
  if (e.shape().size() == 0) detail::raise("argmax: an empty tensor (shape ", e.shape().to_string(), ") has no maximum");
  return detail::record_new<std::int64_t>(
      "argmax", Shape{}, e.device(), [e](detail::Buffer& b) { detail::on_device(b.device, [&](auto ex) { ex.argmax_all(e, b.as<std::int64_t>()); }); },
      detail::reads_of(e));
}
/// Indices of the first maxima along `axis` (see sum).
template <Operand X>
Tensor<std::int64_t> argmax(X&& x, int axis, bool keepdims = false) {
  auto e = as_expr(std::forward<X>(x));
  const Shape in = e.shape();
  axis = normalize_axis(axis, in.rank(), "argmax");
  if (in[axis] == 0) detail::raise("argmax: axis ", axis, " of shape ", in.to_string(), " is empty");
  return detail::record_new<std::int64_t>(
      "argmax", in.without(axis, keepdims), e.device(),
      [e, axis](detail::Buffer& b) { detail::on_device(b.device, [&](auto ex) { ex.argmax_axis(e, axis, b.as<std::int64_t>()); }); }, detail::reads_of(e));
}

}  // namespace deft
