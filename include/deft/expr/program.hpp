// An elementwise expression as data: its nodes as a list of steps, its
// leaves and constants in arrays. Autograd differentiates an expression
// through this form (eval/cpu/program.hpp interprets it), so that a
// program's backward compiles one kernel per element type instead of one
// fused kernel per derivative of every expression it records: the kernels
// of those derivatives were half the compile time of a test file full of
// expressions (g++ -O1, test_elementwise.cpp 131 s with, 62 s without).
// The operations keep the functors of expr/ops.hpp, so a value computed
// here is the value the fused forward computed.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/shape.hpp"
#include "nodes.hpp"
#include "ops.hpp"

namespace deft::detail {

enum class ProgramOp : std::uint8_t {
  leaf, constant,
  neg, abs, exp, log, sqrt, tanh, sin, cos, sigmoid, relu,
  add, sub, mul, div, maximum, minimum, pow,
  less, less_equal, greater, greater_equal, equal, not_equal,
  select,  // where(a, b, c)
  none     // not expressible: the expression keeps its compile-time derivative
};

template <class Op>
constexpr ProgramOp program_op() {
  using std::is_same_v;
  if constexpr (is_same_v<Op, Neg>) return ProgramOp::neg;
  else if constexpr (is_same_v<Op, Abs>) return ProgramOp::abs;
  else if constexpr (is_same_v<Op, Exp>) return ProgramOp::exp;
  else if constexpr (is_same_v<Op, Log>) return ProgramOp::log;
  else if constexpr (is_same_v<Op, Sqrt>) return ProgramOp::sqrt;
  else if constexpr (is_same_v<Op, Tanh>) return ProgramOp::tanh;
  else if constexpr (is_same_v<Op, Sin>) return ProgramOp::sin;
  else if constexpr (is_same_v<Op, Cos>) return ProgramOp::cos;
  else if constexpr (is_same_v<Op, Sigmoid>) return ProgramOp::sigmoid;
  else if constexpr (is_same_v<Op, Relu>) return ProgramOp::relu;
  else if constexpr (is_same_v<Op, Add>) return ProgramOp::add;
  else if constexpr (is_same_v<Op, Sub>) return ProgramOp::sub;
  else if constexpr (is_same_v<Op, Mul>) return ProgramOp::mul;
  else if constexpr (is_same_v<Op, Div>) return ProgramOp::div;
  else if constexpr (is_same_v<Op, Maximum>) return ProgramOp::maximum;
  else if constexpr (is_same_v<Op, Minimum>) return ProgramOp::minimum;
  else if constexpr (is_same_v<Op, Pow>) return ProgramOp::pow;
  else if constexpr (is_same_v<Op, Less>) return ProgramOp::less;
  else if constexpr (is_same_v<Op, LessEqual>) return ProgramOp::less_equal;
  else if constexpr (is_same_v<Op, Greater>) return ProgramOp::greater;
  else if constexpr (is_same_v<Op, GreaterEqual>) return ProgramOp::greater_equal;
  else if constexpr (is_same_v<Op, Equal>) return ProgramOp::equal;
  else if constexpr (is_same_v<Op, NotEqual>) return ProgramOp::not_equal;
  else return ProgramOp::none;
}

/// Whether op's result carries no gradient to its operands (a mask).
constexpr bool is_comparison(ProgramOp op) { return op >= ProgramOp::less && op <= ProgramOp::not_equal; }

inline constexpr int program_max_steps = 48;
inline constexpr int program_max_leaves = 16;

/// One node: its operation and operands (earlier steps).
struct ProgramStep {
  ProgramOp op = ProgramOp::leaf;
  std::uint8_t a = 0, b = 0, c = 0;
  std::uint8_t index = 0;  // leaf: its place in leaves; constant: in constants
  bool below = false;      // a recorded leaf is at or under this step
  bool grad = false;       // a gradient flows into this step
  bool passes = false;     // ... and it is the program's upstream gradient, unchanged (through + and -'s left)
  std::int8_t output = -1;  // a leaf with a gradient the kernel computes: the output that receives it
};

/// Steps, leaves and constants of a floating-point elementwise expression
/// (steps in post-order: the last is the root), with which leaves receive
/// a gradient: the upstream gradient itself (`passed`: reached through sums
/// only, so no kernel computes it), or an output of the kernel. Leaves
/// reading the same recorded value with the same extent share one output.
template <class T>
struct ElementwiseProgram {
  std::array<ProgramStep, program_max_steps> steps{};
  std::array<Leaf<T>, program_max_leaves> leaves{};
  std::array<T, program_max_steps> constants{};
  std::array<std::uint8_t, program_max_leaves> output_leaf{};  // output k: the leaf whose shape and record it has
  std::array<std::uint8_t, program_max_leaves> passed{};       // leaves whose gradient is the upstream one
  int n_steps = 0, n_leaves = 0, n_constants = 0, n_outputs = 0, n_passed = 0;
  Shape shape;
  Device device;
};

// --- which expressions have a program ----------------------------------------

template <class E>
struct ProgramSize {
  static constexpr bool ok = false;
  static constexpr int steps = 0, leaves = 0;
};
template <class T>
struct ProgramSize<Leaf<T>> {
  static constexpr bool ok = std::is_floating_point_v<T>;
  static constexpr int steps = 1, leaves = 1;
};
template <class T>
struct ProgramSize<Constant<T>> {
  static constexpr bool ok = std::is_floating_point_v<T>;
  static constexpr int steps = 1, leaves = 0;
};
template <class A>
struct ProgramSize<BroadcastTo<A>> : ProgramSize<A> {};
template <class Op, class A>
struct ProgramSize<Unary<Op, A>> {
  static constexpr bool ok = program_op<Op>() != ProgramOp::none && ProgramSize<A>::ok;
  static constexpr int steps = 1 + ProgramSize<A>::steps, leaves = ProgramSize<A>::leaves;
};
template <class Op, class A, class B>
struct ProgramSize<Binary<Op, A, B>> {
  static constexpr bool ok = program_op<Op>() != ProgramOp::none && ProgramSize<A>::ok && ProgramSize<B>::ok;
  static constexpr int steps = 1 + ProgramSize<A>::steps + ProgramSize<B>::steps;
  static constexpr int leaves = ProgramSize<A>::leaves + ProgramSize<B>::leaves;
};
template <class C, class A, class B>
struct ProgramSize<Select<C, A, B>> {
  static constexpr bool ok = ProgramSize<C>::ok && ProgramSize<A>::ok && ProgramSize<B>::ok;
  static constexpr int steps = 1 + ProgramSize<C>::steps + ProgramSize<A>::steps + ProgramSize<B>::steps;
  static constexpr int leaves = ProgramSize<C>::leaves + ProgramSize<A>::leaves + ProgramSize<B>::leaves;
};

/// Whether `E` can be written as an ElementwiseProgram: floating point,
/// deft's operations only (no cast, no map), and within the arrays' sizes.
template <class E>
inline constexpr bool has_program = ProgramSize<E>::ok && ProgramSize<E>::steps <= program_max_steps &&
                                    ProgramSize<E>::leaves <= program_max_leaves;

// --- building one ------------------------------------------------------------

/// A step built by append(): its place, and whether a recorded leaf is below.
struct Emitted {
  std::uint8_t step;
  bool grad;
};

template <class T>
Emitted push_step(ElementwiseProgram<T>& p, ProgramStep s, bool grad) {
  s.below = grad;
  p.steps[p.n_steps] = s;
  return {std::uint8_t(p.n_steps++), grad};
}

template <class T>
Emitted append(ElementwiseProgram<T>& p, Leaf<T>&& e) {
  const bool grad = e.grad != nullptr;
  ProgramStep s{ProgramOp::leaf};
  s.index = std::uint8_t(p.n_leaves);
  p.leaves[p.n_leaves++] = std::move(e);
  return push_step(p, s, grad);
}
template <class T>
Emitted append(ElementwiseProgram<T>& p, Constant<T>&& e) {
  ProgramStep s{ProgramOp::constant};
  s.index = std::uint8_t(p.n_constants);
  p.constants[p.n_constants++] = e.value;
  return push_step(p, s, false);
}
template <class T, class A>
Emitted append(ElementwiseProgram<T>& p, BroadcastTo<A>&& e) {
  return append(p, std::move(e.a));  // leaves' views broadcast to the output by themselves
}
template <class T, class Op, class A>
Emitted append(ElementwiseProgram<T>& p, Unary<Op, A>&& e) {
  const Emitted a = append(p, std::move(e.a));
  return push_step(p, ProgramStep{program_op<Op>(), a.step}, a.grad);
}
template <class T, class Op, class A, class B>
Emitted append(ElementwiseProgram<T>& p, Binary<Op, A, B>&& e) {
  const Emitted a = append(p, std::move(e.a));
  const Emitted b = append(p, std::move(e.b));
  constexpr ProgramOp op = program_op<Op>();
  return push_step(p, ProgramStep{op, a.step, b.step}, !is_comparison(op) && (a.grad || b.grad));
}
template <class T, class C, class A, class B>
Emitted append(ElementwiseProgram<T>& p, Select<C, A, B>&& e) {
  const Emitted c = append(p, std::move(e.c));
  const Emitted a = append(p, std::move(e.a));
  const Emitted b = append(p, std::move(e.b));
  return push_step(p, ProgramStep{ProgramOp::select, c.step, a.step, b.step}, a.grad || b.grad);
}

template <class T>
void mark_gradient_paths(ElementwiseProgram<T>& p);

/// The program of expression `e` (has_program<E>), which it takes apart.
template <class E>
ElementwiseProgram<value_t<E>> program_of(E&& e) {
  using T = value_t<E>;
  ElementwiseProgram<T> p;
  p.shape = e.shape();
  p.device = e.device();
  append(p, std::move(e));
  mark_gradient_paths(p);
  return p;
}

/// The kernel views of p's leaves and, last, of the gradient `up` of its
/// value, over p's shape collapsed as far as all of them allow (collapse()).
template <class T>
Shape program_views(const ElementwiseProgram<T>& p, const Leaf<T>& up,
                    std::array<LeafView<T>, program_max_leaves + 1>& views) {
  const int n = p.n_leaves + 1;
  for (int l = 0; l < p.n_leaves; ++l) views[l] = p.leaves[l].view(p.shape);
  views[p.n_leaves] = up.view(p.shape);
  std::array<LeafLayout, program_max_leaves + 1> layouts;
  for (int l = 0; l < n; ++l) layouts[l] = LeafLayout{&views[l].strides, &views[l].inner};
  return collapse_layouts(layouts.data(), n, p.shape);
}

/// op's value at a, b, c (its operands; V a scalar or a SIMD batch).
template <class V>
DEFT_HD DEFT_ALWAYS_INLINE inline V program_forward(ProgramOp op, const V& a, const V& b, const V& c) {
  switch (op) {
    case ProgramOp::neg: return Neg{}(a);
    case ProgramOp::abs: return Abs{}(a);
    case ProgramOp::exp: return Exp{}(a);
    case ProgramOp::log: return Log{}(a);
    case ProgramOp::sqrt: return Sqrt{}(a);
    case ProgramOp::tanh: return Tanh{}(a);
    case ProgramOp::sin: return Sin{}(a);
    case ProgramOp::cos: return Cos{}(a);
    case ProgramOp::sigmoid: return Sigmoid{}(a);
    case ProgramOp::relu: return Relu{}(a);
    case ProgramOp::add: return Add{}(a, b);
    case ProgramOp::sub: return Sub{}(a, b);
    case ProgramOp::mul: return Mul{}(a, b);
    case ProgramOp::div: return Div{}(a, b);
    case ProgramOp::maximum: return Maximum{}(a, b);
    case ProgramOp::minimum: return Minimum{}(a, b);
    case ProgramOp::pow: return Pow{}(a, b);
    case ProgramOp::less: return Less{}(a, b);
    case ProgramOp::less_equal: return LessEqual{}(a, b);
    case ProgramOp::greater: return Greater{}(a, b);
    case ProgramOp::greater_equal: return GreaterEqual{}(a, b);
    case ProgramOp::equal: return Equal{}(a, b);
    case ProgramOp::not_equal: return NotEqual{}(a, b);
    case ProgramOp::select: return Where{}(a, b, c);
    default: return a;
  }
}

/// The gradients of op's operands a and b, given them, op's value y and the
/// gradient g of y (for select, a is the condition and ga, gb go to the
/// values it chooses between). The rules of the
/// compile-time derivatives (autograd/backprop.hpp): relu'(0) = 0, a tie of
/// maximum or minimum goes to the left operand, masks pass no gradient.
template <class V>
DEFT_HD DEFT_ALWAYS_INLINE inline void program_adjoint(ProgramOp op, const V& a, const V& b, const V& y, const V& g, V& ga,
                                                V& gb) {
  const V zero(0), one(1), two(2);
  switch (op) {
    case ProgramOp::neg: ga = Neg{}(g); break;
    case ProgramOp::abs: ga = Where{}(Greater{}(a, zero), g, Where{}(Less{}(a, zero), Neg{}(g), zero)); break;
    case ProgramOp::exp: ga = g * y; break;
    case ProgramOp::log: ga = g / a; break;
    case ProgramOp::sqrt: ga = g / (y * two); break;
    case ProgramOp::tanh: ga = g * (one - y * y); break;
    case ProgramOp::sin: ga = g * Cos{}(a); break;
    case ProgramOp::cos: ga = Neg{}(g * Sin{}(a)); break;
    case ProgramOp::sigmoid: ga = g * y * (one - y); break;
    case ProgramOp::relu: ga = Where{}(Greater{}(a, zero), g, zero); break;
    case ProgramOp::add: ga = g; gb = g; break;
    case ProgramOp::sub: ga = g; gb = Neg{}(g); break;
    case ProgramOp::mul: ga = g * b; gb = g * a; break;
    case ProgramOp::div: ga = g / b; gb = Neg{}(g * a) / (b * b); break;
    case ProgramOp::maximum: {
      const V left = GreaterEqual{}(a, b);
      ga = Where{}(left, g, zero);
      gb = Where{}(left, zero, g);
      break;
    }
    case ProgramOp::minimum: {
      const V left = LessEqual{}(a, b);
      ga = Where{}(left, g, zero);
      gb = Where{}(left, zero, g);
      break;
    }
    case ProgramOp::pow:
      ga = g * b * Pow{}(a, b - one);
      gb = g * y * Log{}(a);
      break;
    case ProgramOp::select:
      ga = Where{}(a, g, zero);
      gb = Where{}(a, zero, g);
      break;
    default: break;
  }
}

/// Marks the steps a gradient reaches, from the root down, and gives each
/// recorded leaf it reaches an output.
template <class T>
void mark_gradient_paths(ElementwiseProgram<T>& p) {
  const auto below = [&](int i) { return p.steps[i].below; };
  if (p.n_steps == 0 || !below(p.n_steps - 1)) return;
  p.steps[p.n_steps - 1].grad = true;
  p.steps[p.n_steps - 1].passes = true;
  for (int i = p.n_steps - 1; i >= 0; --i) {
    ProgramStep& s = p.steps[i];
    if (!s.grad) continue;
    switch (s.op) {
      case ProgramOp::leaf: {
        if (s.passes) {
          p.passed[p.n_passed++] = s.index;
          break;
        }
        const auto& leaf = p.leaves[s.index];
        for (int k = 0; k < p.n_outputs && s.output < 0; ++k) {
          const auto& other = p.leaves[p.output_leaf[k]];
          if (other.grad == leaf.grad && other.extent == leaf.extent) s.output = std::int8_t(k);
        }
        if (s.output < 0) {
          p.output_leaf[p.n_outputs] = s.index;
          s.output = std::int8_t(p.n_outputs++);
        }
        break;
      }
      case ProgramOp::constant: break;
      case ProgramOp::select:  // the condition is a mask
        p.steps[s.b].grad = below(s.b);
        p.steps[s.c].grad = below(s.c);
        break;
      default:
        if (is_comparison(s.op)) break;
        p.steps[s.a].grad = below(s.a);
        p.steps[s.a].passes = s.passes && (s.op == ProgramOp::add || s.op == ProgramOp::sub);
        if (s.op >= ProgramOp::add) {
          p.steps[s.b].grad = below(s.b);
          p.steps[s.b].passes = s.passes && s.op == ProgramOp::add;
        }
    }
  }
}

}  // namespace deft::detail
