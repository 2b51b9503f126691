// Expression nodes ("what"): a tree whose type encodes the computation.
// Building one computes its shape (throwing on mismatch) and nothing else.
// Leaves share ownership of the storage version they read, so an expression
// may be kept, copied and evaluated long after its operands went away.
// view(out) gives a kernel the tree as raw pointers and strides; flat_view(),
// where every node has one (no cast, no map), gives it as bare pointers for
// the common case of every leaf reading the whole output contiguously.
#pragma once
#include <array>
#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

#include "../autograd/meta.hpp"
#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../engine/buffer.hpp"
#include "kernel_views.hpp"
#include "ops.hpp"

namespace deft {

template <Element T>
class Tensor;

/// Base of every expression node. It lives in namespace deft so that
/// argument-dependent lookup finds deft's operators for any node.
struct ExpressionBase {};

namespace detail {
using ExprTag = ExpressionBase;
template <class T>
struct is_tensor : std::false_type {};
template <class T>
struct is_tensor<Tensor<T>> : std::true_type {};
}  // namespace detail

/// A deferred expression node (not a tensor).
template <class E>
concept Expression = std::is_base_of_v<detail::ExprTag, std::remove_cvref_t<E>>;
/// Anything that can appear in an expression: a node or a tensor.
template <class E>
concept Operand = Expression<E> || detail::is_tensor<std::remove_cvref_t<E>>::value;
/// A plain number usable as a scalar operand.
template <class S>
concept Scalar = std::is_arithmetic_v<std::remove_cvref_t<S>> && !std::is_same_v<std::remove_cvref_t<S>, bool>;

namespace detail {

/// Reads a stored tensor (a snapshot of one storage version).
template <Element T>
struct Leaf : ExprTag {
  using value_type = T;
  static constexpr int cost = 1;
  static constexpr bool calls_user_code = false;  // a map() function somewhere in the tree (engine: always to a worker)
  static constexpr bool is_constant = false;

  // `source` is what the leaf reads; `buffer` owns it. A task writing a
  // buffer in place drops the ownership its own reads of that buffer hold
  // (it keeps the buffer alive while it runs), so that they do not count as
  // foreign readers of the next version.
  std::shared_ptr<Buffer> buffer;
  const Buffer* source = nullptr;
  std::int64_t offset = 0;
  Shape extent;
  // The autograd record of the tensor read, set only while recording.
  std::shared_ptr<autograd::detail::MetaBase> grad;

  Leaf() = default;
  Leaf(std::shared_ptr<Buffer> b, std::int64_t off, const Shape& s,
       std::shared_ptr<autograd::detail::MetaBase> g = nullptr)
      : buffer(std::move(b)), source(buffer.get()), offset(off), extent(s), grad(std::move(g)) {}

  /// A leaf reading `src` without owning it (a write's own current value).
  Leaf(const Buffer* src, std::int64_t off, const Shape& s) : source(src), offset(off), extent(s) {}
  Leaf(Leaf&&) = default;
  Leaf(const Leaf&) = default;
  Leaf& operator=(Leaf&&) = default;
  Leaf& operator=(const Leaf&) = default;
  // Inline: a tree is moved level by level, and each move leaves a shell to destroy.
  DEFT_ALWAYS_INLINE ~Leaf() = default;

  const Shape& shape() const { return extent; }
  Device device() const { return source->device; }
  template <class F>
  void for_each_leaf(F&& f) const { f(*this); }
  template <class F>
  void for_each_leaf(F&& f) { f(*this); }

  LeafView<T> view(const Shape& out) const {
    LeafView<T> v;
    v.data = source->as<const T>() + offset;
    v.row = v.data;
    const auto st = contiguous_strides(extent);
    const int lead = out.rank() - extent.rank();
    for (int i = 0; i < out.rank(); ++i) {
      const int j = i - lead;
      v.strides[i] = (j < 0 || extent[j] == 1) ? 0 : st[j];
    }
    return v;
  }
  /// The view when this leaf reads the whole output contiguously (see flat_view).
  DenseLeafView<T> flat_view() const { return {source->as<const T>() + offset}; }
};

/// A number broadcast to any shape.
template <Element T>
struct Constant : ExprTag {
  using value_type = T;
  static constexpr int cost = 0;
  static constexpr bool calls_user_code = false;
  static constexpr bool is_constant = true;
  T value;

  explicit Constant(T v) : value(v) {}
  Shape shape() const { return {}; }
  Device device() const { return deft::cpu(); }
  template <class F>
  void for_each_leaf(F&&) const {}
  template <class F>
  void for_each_leaf(F&&) {}
  ConstantView<T> view(const Shape&) const { return {value}; }
  ConstantView<T> flat_view() const { return {value}; }
};

template <class E>
using value_t = typename std::remove_cvref_t<E>::value_type;

/// Whether autograd records an operation reading `e`: recording is on and
/// some leaf of `e` has an autograd record.
template <class E>
bool tracked(const E& e) {
  if (!autograd::is_recording()) return false;
  bool any = false;
  e.for_each_leaf([&](const auto& leaf) { any = any || leaf.grad != nullptr; });
  return any;
}

/// The device of an operand list, checking that all non-constant ones agree.
template <class A, class B>
Device common_device(const A& a, const B& b, const char* op) {
  if constexpr (A::is_constant) return b.device();
  else if constexpr (B::is_constant) return a.device();
  else {
    if (!(a.device() == b.device()))
      raise(op, ": operands live on different devices, ", a.device(), " and ", b.device());
    return a.device();
  }
}

template <class Op, class A>
struct Unary : ExprTag {
  using value_type = value_t<A>;
  static constexpr int cost = Op::cost + A::cost;
  static constexpr bool calls_user_code = A::calls_user_code;
  static constexpr bool is_constant = A::is_constant;
  static_assert(!Op::floating_only || std::is_floating_point_v<value_type>,
                "deft: this function needs a floating-point operand; convert with deft::cast<float>(x)");
  A a;

  explicit Unary(const A& x) : a(x) {}
  explicit Unary(A&& x) : a(std::move(x)) {}
  Shape shape() const { return a.shape(); }
  Device device() const { return a.device(); }
  template <class F>
  void for_each_leaf(F&& f) const { a.for_each_leaf(f); }
  template <class F>
  void for_each_leaf(F&& f) { a.for_each_leaf(f); }
  auto view(const Shape& out) const { return UnaryView<Op, decltype(a.view(out))>{a.view(out)}; }
  auto flat_view() const
    requires requires { a.flat_view(); }
  {
    return UnaryView<Op, decltype(a.flat_view())>{a.flat_view()};
  }
};

template <class T, class X>
decltype(auto) operand(X&& x);

template <class Op, class A, class B>
struct Binary : ExprTag {
  using value_type = value_t<A>;
  static constexpr int cost = Op::cost + A::cost + B::cost;
  static constexpr bool calls_user_code = A::calls_user_code || B::calls_user_code;
  static constexpr bool is_constant = A::is_constant && B::is_constant;
  static_assert(std::is_same_v<value_t<A>, value_t<B>>,
                "deft: operands have different element types; convert one with deft::cast<U>(x)");
  A a;
  B b;
  Shape extent;
  Device dev;

  // From operator arguments of element type T: a tensor's leaf (or a
  // number's constant) is built in place as the member, not built and then
  // moved; a subtree is moved once per level it climbs.
  template <class T, class X, class Y>
  Binary(std::type_identity<T>, X&& x, Y&& y)
      : a(operand<T>(std::forward<X>(x))), b(operand<T>(std::forward<Y>(y))),
        extent(broadcast_shapes(a.shape(), b.shape(), Op::name)), dev(common_device(a, b, Op::name)) {}
  const Shape& shape() const { return extent; }
  Device device() const { return dev; }
  template <class F>
  void for_each_leaf(F&& f) const {
    a.for_each_leaf(f);
    b.for_each_leaf(f);
  }
  template <class F>
  void for_each_leaf(F&& f) {
    a.for_each_leaf(f);
    b.for_each_leaf(f);
  }
  auto view(const Shape& out) const {
    return BinaryView<Op, decltype(a.view(out)), decltype(b.view(out))>{a.view(out), b.view(out)};
  }
  auto flat_view() const
    requires requires { a.flat_view(); b.flat_view(); }
  {
    return BinaryView<Op, decltype(a.flat_view()), decltype(b.flat_view())>{a.flat_view(), b.flat_view()};
  }
};

template <class C, class A, class B>
struct Select : ExprTag {
  using value_type = value_t<A>;
  static constexpr int cost = 1 + C::cost + A::cost + B::cost;
  static constexpr bool calls_user_code = C::calls_user_code || A::calls_user_code || B::calls_user_code;
  static constexpr bool is_constant = false;
  static_assert(std::is_same_v<value_t<A>, value_t<B>> && std::is_same_v<value_t<C>, value_t<A>>,
                "deft: where(cond, a, b) needs cond, a and b of one element type; use deft::cast<U>(x)");
  C c;
  A a;
  B b;
  Shape extent;
  Device dev;

  Select(C cond, A x, B y)
      : c(std::move(cond)), a(std::move(x)), b(std::move(y)),
        extent(broadcast_shapes(c.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where")),
        dev(common_device(a, b, "where")) {
    if constexpr (A::is_constant && B::is_constant) dev = c.device();  // two numbers live wherever cond does
    else if constexpr (!C::is_constant)
      if (!(c.device() == dev)) raise("where: condition on ", c.device(), " but values on ", dev);
  }
  const Shape& shape() const { return extent; }
  Device device() const { return dev; }
  template <class F>
  void for_each_leaf(F&& f) const {
    c.for_each_leaf(f);
    a.for_each_leaf(f);
    b.for_each_leaf(f);
  }
  template <class F>
  void for_each_leaf(F&& f) {
    c.for_each_leaf(f);
    a.for_each_leaf(f);
    b.for_each_leaf(f);
  }
  auto view(const Shape& out) const {
    return SelectView<decltype(c.view(out)), decltype(a.view(out)), decltype(b.view(out))>{c.view(out), a.view(out),
                                                                                          b.view(out)};
  }
  auto flat_view() const
    requires requires { c.flat_view(); a.flat_view(); b.flat_view(); }
  {
    return SelectView<decltype(c.flat_view()), decltype(a.flat_view()), decltype(b.flat_view())>{
        c.flat_view(), a.flat_view(), b.flat_view()};
  }
};

template <Element U, class A>
struct Cast : ExprTag {
  using value_type = U;
  static constexpr int cost = 1 + A::cost;
  static constexpr bool calls_user_code = A::calls_user_code;
  static constexpr bool is_constant = A::is_constant;
  A a;

  explicit Cast(A x) : a(std::move(x)) {}
  Shape shape() const { return a.shape(); }
  Device device() const { return a.device(); }
  template <class F>
  void for_each_leaf(F&& f) const { a.for_each_leaf(f); }
  template <class F>
  void for_each_leaf(F&& f) { a.for_each_leaf(f); }
  auto view(const Shape& out) const { return CastView<U, decltype(a.view(out))>{a.view(out)}; }
};

/// f(x) for every element x of `a`, with a user's function.
template <class F, class A>
struct Map : ExprTag {
  using value_type = std::remove_cvref_t<std::invoke_result_t<const F&, value_t<A>>>;
  static_assert(Element<value_type>, "deft::map: the function must return float, double, int32_t or int64_t");
  static constexpr int cost = 8 + A::cost;  // an opaque scalar call
  static constexpr bool calls_user_code = true;  // the engine never runs it on a recording thread
  static constexpr bool is_constant = A::is_constant;
  F f;
  A a;

  Map(F fn, A x) : f(std::move(fn)), a(std::move(x)) {}
  Shape shape() const { return a.shape(); }
  Device device() const { return a.device(); }
  template <class G>
  void for_each_leaf(G&& g) const { a.for_each_leaf(g); }
  template <class G>
  void for_each_leaf(G&& g) { a.for_each_leaf(g); }
  auto view(const Shape& out) const { return MapView<F, decltype(a.view(out))>{f, a.view(out)}; }
};

template <class X>
using expr_t = std::remove_cvref_t<decltype(as_expr(std::declval<X>()))>;

/// The element type of the first tensor-like argument.
template <class A, class B>
using element_of = value_t<expr_t<std::conditional_t<Operand<A>, A, B>>>;

/// A tensor-like argument as an expression (a reference to a node, so that
/// it is moved only into its parent), or a number as a constant of type T.
template <class T, class X>
decltype(auto) operand(X&& x) {
  if constexpr (Operand<X>) {
    return as_expr(std::forward<X>(x));
  } else {
    using N = std::remove_cvref_t<X>;
    static_assert(!(std::is_integral_v<T> && std::is_floating_point_v<N>),
                  "deft: a floating-point number cannot combine with an integer tensor; use deft::cast<float>(x)");
    if constexpr (std::is_integral_v<T> && std::is_integral_v<N> && !std::is_same_v<N, bool>)
      if (!std::in_range<T>(+x))  // + : a character type promoted (in_range takes standard integers only)  // it would wrap around: x < 3000000000 on int32 would compare with -1294967296
        raise("the number ", +x, " does not fit the ", dtype_name_of<T>, " tensor it combines with");
    return Constant<T>(static_cast<T>(x));
  }
}

/// An operand seen with a larger shape it broadcasts to.
template <class A>
struct BroadcastTo : ExprTag {
  using value_type = value_t<A>;
  static constexpr int cost = A::cost;
  static constexpr bool calls_user_code = A::calls_user_code;
  static constexpr bool is_constant = A::is_constant;
  A a;
  Shape extent;

  BroadcastTo(A x, const Shape& target) : a(std::move(x)), extent(target) {
    if (!(broadcast_shapes(a.shape(), target, "assign") == target))
      raise("assign: a value of shape ", a.shape().to_string(), " cannot be broadcast to shape ", target.to_string());
  }
  const Shape& shape() const { return extent; }
  Device device() const { return a.device(); }
  template <class F>
  void for_each_leaf(F&& f) const { a.for_each_leaf(f); }
  template <class F>
  void for_each_leaf(F&& f) { a.for_each_leaf(f); }
  auto view(const Shape& out) const { return a.view(out); }
  auto flat_view() const
    requires requires { a.flat_view(); }
  {
    return a.flat_view();
  }
};

}  // namespace detail
}  // namespace deft
