// The elementwise vocabulary: operators and functions that build expression
// nodes from tensors, expressions and plain numbers (numpy broadcasting).
#pragma once
#include <concepts>
#include <type_traits>
#include <utility>

#include "../tensor.hpp"
#include "../expr/nodes.hpp"

namespace deft {
namespace detail {

template <class X, class Y>
concept binary_args = (Operand<X> && (Operand<Y> || Scalar<Y>)) || (Scalar<X> && Operand<Y>);

template <class Op, class X, class Y>
auto make_binary(X&& x, Y&& y) {
  using T = element_of<X, Y>;
  using A = std::remove_cvref_t<decltype(operand<T>(std::forward<X>(x)))>;
  using B = std::remove_cvref_t<decltype(operand<T>(std::forward<Y>(y)))>;
  return Binary<Op, A, B>(std::type_identity<T>{}, std::forward<X>(x), std::forward<Y>(y));
}

}  // namespace detail

#define DEFT_BINARY_OPERATOR(symbol, Op)                                       \
  template <class X, class Y>                                                  \
    requires detail::binary_args<X, Y>                                         \
  auto operator symbol(X&& x, Y&& y) {                                         \
    return detail::make_binary<detail::Op>(std::forward<X>(x), std::forward<Y>(y)); \
  }
DEFT_BINARY_OPERATOR(+, Add)
DEFT_BINARY_OPERATOR(-, Sub)
DEFT_BINARY_OPERATOR(*, Mul)
DEFT_BINARY_OPERATOR(/, Div)
DEFT_BINARY_OPERATOR(<, Less)
DEFT_BINARY_OPERATOR(<=, LessEqual)
DEFT_BINARY_OPERATOR(>, Greater)
DEFT_BINARY_OPERATOR(>=, GreaterEqual)
DEFT_BINARY_OPERATOR(==, Equal)
DEFT_BINARY_OPERATOR(!=, NotEqual)
#undef DEFT_BINARY_OPERATOR

#define DEFT_BINARY_FUNCTION(name, Op)                                         \
  template <class X, class Y>                                                  \
    requires detail::binary_args<X, Y>                                         \
  auto name(X&& x, Y&& y) {                                                    \
    return detail::make_binary<detail::Op>(std::forward<X>(x), std::forward<Y>(y)); \
  }
DEFT_BINARY_FUNCTION(maximum, Maximum)
DEFT_BINARY_FUNCTION(minimum, Minimum)
DEFT_BINARY_FUNCTION(pow, Pow)
#undef DEFT_BINARY_FUNCTION

#define DEFT_UNARY_FUNCTION(name, Op)                                          \
  template <Operand X>                                                         \
  auto name(X&& x) {                                                           \
    return detail::Unary<detail::Op, detail::expr_t<X>>(as_expr(std::forward<X>(x))); \
  }
DEFT_UNARY_FUNCTION(operator-, Neg)
DEFT_UNARY_FUNCTION(abs, Abs)
DEFT_UNARY_FUNCTION(exp, Exp)
DEFT_UNARY_FUNCTION(log, Log)
DEFT_UNARY_FUNCTION(sqrt, Sqrt)
DEFT_UNARY_FUNCTION(tanh, Tanh)
DEFT_UNARY_FUNCTION(sin, Sin)
DEFT_UNARY_FUNCTION(cos, Cos)
DEFT_UNARY_FUNCTION(sigmoid, Sigmoid)
/// max(x, 0) elementwise (NaN stays NaN); its derivative is 0 for x <= 0.
DEFT_UNARY_FUNCTION(relu, Relu)
#undef DEFT_UNARY_FUNCTION


/// a where cond is nonzero, b elsewhere (each may be a number).
template <Operand C, class A, class B>
  requires(Operand<A> || Scalar<A>) && (Operand<B> || Scalar<B>)
auto where(C&& cond, A&& a, B&& b) {
  auto c = as_expr(std::forward<C>(cond));
  using T = detail::value_t<decltype(c)>;
  auto x = detail::operand<T>(std::forward<A>(a));
  auto y = detail::operand<T>(std::forward<B>(b));
  return detail::Select<decltype(c), decltype(x), decltype(y)>(std::move(c), std::move(x), std::move(y));
}

/// x limited to [lo, hi] elementwise (NaN stays NaN); the gradient passes
/// where lo <= x <= hi and is 0 outside, as PyTorch's clamp. std::invalid_argument when lo > hi.
template <Operand X>
auto clip(X&& x, detail::value_t<detail::expr_t<X>> lo, detail::value_t<detail::expr_t<X>> hi) {
  if (!(lo <= hi)) detail::raise("clip: the lower bound ", lo, " is above the upper bound ", hi);
  auto e = as_expr(std::forward<X>(x));
  return where(e < lo, lo, where(e > hi, hi, e));
}

/// f(x) elementwise, for a function deft does not have: `map([](float v) {
/// return v < 0 ? 0.1f * v : v; }, x)`. It runs one element at a time, may be
/// called on any worker and in any order (so it must not depend on shared
/// state), and an exception it throws fails the task: the sync points that
/// read the result rethrow it.
template <class F, Operand X>
  requires std::invocable<const F&, detail::value_t<detail::expr_t<X>>>
auto map(F f, X&& x) {
  auto a = as_expr(std::forward<X>(x));
  return detail::Map<F, decltype(a)>(std::move(f), std::move(a));
}

/// Elementwise conversion to U (float to integer saturates; NaN becomes 0).
template <Element U, Operand X>
auto cast(X&& x) {
  auto a = as_expr(std::forward<X>(x));
  return detail::Cast<U, decltype(a)>(std::move(a));
}

}  // namespace deft
