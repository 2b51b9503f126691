// Reverse-mode derivatives of elementwise expressions, at compile time.
// backprop(e, up, visit) walks the expression tree `e` with `up`, the
// gradient of e's value, and calls visit(leaf, g) for every recorded leaf,
// where g is that leaf's share of the gradient as one more expression. So a
// fused forward tree gives one fused backward expression per leaf, with no
// temporary per node; subtrees without recorded leaves are skipped.
#pragma once
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "../core/error.hpp"
#include "../expr/nodes.hpp"
#include "../ops/elementwise.hpp"

namespace deft::autograd::detail {

using deft::detail::Binary;
using deft::detail::BroadcastTo;
using deft::detail::Cast;
using deft::detail::Constant;
using deft::detail::Leaf;
using deft::detail::Map;
using deft::detail::Select;
using deft::detail::Unary;
using deft::detail::value_t;

/// Whether some leaf of `e` has an autograd record (regardless of recording).
template <class E>
bool needs_grad(const E& e) {
  bool any = false;
  e.for_each_leaf([&](const auto& leaf) { any = any || leaf.grad != nullptr; });
  return any;
}

[[noreturn]] inline void no_gradient_through_cast() {
  deft::detail::raise<std::logic_error>("backward: cast between integer and floating point has no gradient");
}
[[noreturn]] inline void no_gradient_through_map() {
  deft::detail::raise<std::logic_error>(
      "backward: deft::map(f, x) has no gradient (deft cannot differentiate a user function); "
      "write f with deft's operations, or compute it under autograd::pause");
}
[[noreturn]] inline void no_gradient_through_integers() {
  deft::detail::raise<std::logic_error>("backward: integer operations have no gradient");
}

/// Raises what backprop(e, ...) would, without computing anything. (Declared
/// first: each overload calls others, which argument-dependent lookup would
/// not find, the nodes living in deft::detail.)
template <class A>
void check_differentiable(const BroadcastTo<A>& e);
template <class U, class A>
void check_differentiable(const Cast<U, A>& e);
template <class F, class A>
void check_differentiable(const Map<F, A>& e);
template <class C, class A, class B>
void check_differentiable(const Select<C, A, B>& e);
template <class Op, class A>
void check_differentiable(const Unary<Op, A>& e);
template <class Op, class A, class B>
void check_differentiable(const Binary<Op, A, B>& e);
template <class T>
void check_differentiable(const Leaf<T>&) {}
template <class T>
void check_differentiable(const Constant<T>&) {}
template <class A>
void check_differentiable(const BroadcastTo<A>& e) { check_differentiable(e.a); }
template <class U, class A>
void check_differentiable(const Cast<U, A>& e) {
  if (!needs_grad(e.a)) return;
  if constexpr (std::is_floating_point_v<U> && std::is_floating_point_v<value_t<A>>) check_differentiable(e.a);
  else no_gradient_through_cast();
}
template <class F, class A>
void check_differentiable(const Map<F, A>& e) {
  if (needs_grad(e.a)) no_gradient_through_map();
}
template <class C, class A, class B>
void check_differentiable(const Select<C, A, B>& e) {
  check_differentiable(e.a);
  check_differentiable(e.b);
}
template <class Op, class A>
void check_differentiable(const Unary<Op, A>& e) { check_differentiable(e.a); }
template <class Op, class A, class B>
void check_differentiable(const Binary<Op, A, B>& e) {
  if (!std::is_floating_point_v<value_t<A>> && (needs_grad(e.a) || needs_grad(e.b))) no_gradient_through_integers();
  check_differentiable(e.a);
  check_differentiable(e.b);
}

template <class T, class Up, class V>
void backprop(const Leaf<T>& e, Up&& up, V& visit) {
  if (e.grad) visit(e, std::forward<Up>(up));
}
template <class T, class Up, class V>
void backprop(const Constant<T>&, Up&&, V&) {}
template <class A, class Up, class V>
void backprop(const BroadcastTo<A>& e, Up&& up, V& visit) {
  backprop(e.a, std::forward<Up>(up), visit);
}
template <class U, class A, class Up, class V>
void backprop(const Cast<U, A>& e, Up&& up, V& visit) {
  using From = value_t<A>;
  if constexpr (std::is_floating_point_v<U> && std::is_floating_point_v<From>) {
    if (needs_grad(e.a)) backprop(e.a, cast<From>(std::forward<Up>(up)), visit);
  } else if (needs_grad(e.a)) {
    no_gradient_through_cast();
  }
}
template <class F, class A, class Up, class V>
void backprop(const Map<F, A>& e, Up&&, V&) {
  if (needs_grad(e.a)) no_gradient_through_map();
}
template <class C, class A, class B, class Up, class V>
void backprop(const Select<C, A, B>& e, Up&& up, V& visit) {
  using T = value_t<A>;
  if (needs_grad(e.a)) backprop(e.a, where(e.c, up, T(0)), visit);
  if (needs_grad(e.b)) backprop(e.b, where(e.c, T(0), up), visit);
}

// d/da of op(a), times up.
template <class Op, class A, class Up>
auto unary_grad(const A& a, Up&& up) {
  namespace d = deft::detail;
  using T = value_t<A>;
  if constexpr (std::is_same_v<Op, d::Neg>) return -std::forward<Up>(up);
  else if constexpr (std::is_same_v<Op, d::Abs>) return where(a > T(0), up, where(a < T(0), -up, T(0)));
  else if constexpr (std::is_same_v<Op, d::Exp>) return std::forward<Up>(up) * exp(a);
  else if constexpr (std::is_same_v<Op, d::Log>) return std::forward<Up>(up) / a;
  else if constexpr (std::is_same_v<Op, d::Sqrt>) return std::forward<Up>(up) / (sqrt(a) * T(2));
  else if constexpr (std::is_same_v<Op, d::Tanh>) return std::forward<Up>(up) * (T(1) - tanh(a) * tanh(a));
  else if constexpr (std::is_same_v<Op, d::Sin>) return std::forward<Up>(up) * cos(a);
  else if constexpr (std::is_same_v<Op, d::Cos>) return -(std::forward<Up>(up) * sin(a));
  else if constexpr (std::is_same_v<Op, d::Relu>) return where(a > T(0), std::forward<Up>(up), T(0));
  else if constexpr (std::is_same_v<Op, d::Sigmoid>) return std::forward<Up>(up) * sigmoid(a) * (T(1) - sigmoid(a));
  else static_assert(sizeof(Op) == 0, "deft autograd: no derivative for this operation");
}

template <class Op, class A, class Up, class V>
void backprop(const Unary<Op, A>& e, Up&& up, V& visit) {
  if (needs_grad(e.a)) backprop(e.a, unary_grad<Op>(e.a, std::forward<Up>(up)), visit);
}

template <class Op, class A, class B, class Up, class V>
void backprop(const Binary<Op, A, B>& e, Up&& up, V& visit) {
  namespace d = deft::detail;
  using T = value_t<A>;
  const auto& a = e.a;
  const auto& b = e.b;
  const bool ga = needs_grad(a), gb = needs_grad(b);
  if (!ga && !gb) return;
  if constexpr (!std::is_floating_point_v<T>) {
    no_gradient_through_integers();
  } else if constexpr (std::is_same_v<Op, d::Add>) {
    if (ga) backprop(a, up, visit);
    if (gb) backprop(b, up, visit);
  } else if constexpr (std::is_same_v<Op, d::Sub>) {
    if (ga) backprop(a, up, visit);
    if (gb) backprop(b, -up, visit);
  } else if constexpr (std::is_same_v<Op, d::Mul>) {
    if (ga) backprop(a, up * b, visit);
    if (gb) backprop(b, up * a, visit);
  } else if constexpr (std::is_same_v<Op, d::Div>) {
    if (ga) backprop(a, up / b, visit);
    if (gb) backprop(b, -(up * a) / (b * b), visit);
  } else if constexpr (std::is_same_v<Op, d::Maximum>) {  // ties go to the left operand
    if (ga) backprop(a, where(a >= b, up, T(0)), visit);
    if (gb) backprop(b, where(a >= b, T(0), up), visit);
  } else if constexpr (std::is_same_v<Op, d::Minimum>) {
    if (ga) backprop(a, where(a <= b, up, T(0)), visit);
    if (gb) backprop(b, where(a <= b, T(0), up), visit);
  } else if constexpr (std::is_same_v<Op, d::Pow>) {
    if (ga) backprop(a, up * b * pow(a, b - T(1)), visit);
    if (gb) backprop(b, up * pow(a, b) * log(a), visit);
  } else {
    // Comparisons are piecewise constant: their gradient is zero.
    static_assert(std::is_same_v<Op, d::Less> || std::is_same_v<Op, d::LessEqual> || std::is_same_v<Op, d::Greater> ||
                      std::is_same_v<Op, d::GreaterEqual> || std::is_same_v<Op, d::Equal> ||
                      std::is_same_v<Op, d::NotEqual>,
                  "deft autograd: no derivative for this operation");
  }
}

}  // namespace deft::autograd::detail
