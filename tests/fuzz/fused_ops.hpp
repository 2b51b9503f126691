// Runtime op codes to deft calls: with_u(op, f) calls f with a generic lambda
// applying that op, so f's body is instantiated once per op. Included only by
// the fused_*.cpp translation units.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "fused.hpp"

namespace fz::detail {

#define FZ_FWD(x) std::forward<decltype(x)>(x)

template <class F>
void with_u(UOp op, F&& f) {
  switch (op) {
    case UOp::neg: return f([](auto&& x) { return -FZ_FWD(x); });
    case UOp::abs: return f([](auto&& x) { return deft::abs(FZ_FWD(x)); });
    case UOp::exp: return f([](auto&& x) { return deft::exp(FZ_FWD(x)); });
    case UOp::log: return f([](auto&& x) { return deft::log(FZ_FWD(x)); });
    case UOp::sqrt: return f([](auto&& x) { return deft::sqrt(FZ_FWD(x)); });
    case UOp::tanh: return f([](auto&& x) { return deft::tanh(FZ_FWD(x)); });
    case UOp::sigmoid: return f([](auto&& x) { return deft::sigmoid(FZ_FWD(x)); });
    case UOp::relu: return f([](auto&& x) { return deft::relu(FZ_FWD(x)); });
    case UOp::cast_i32: return f([](auto&& x) { return deft::cast<float>(deft::cast<std::int32_t>(FZ_FWD(x))); });
  }
}

template <class F>
void with_cmp(BOp op, F&& f) {
  switch (op) {
    case BOp::lt: return f([](auto&& x, auto&& y) { return FZ_FWD(x) < FZ_FWD(y); });
    case BOp::le: return f([](auto&& x, auto&& y) { return FZ_FWD(x) <= FZ_FWD(y); });
    case BOp::gt: return f([](auto&& x, auto&& y) { return FZ_FWD(x) > FZ_FWD(y); });
    case BOp::ge: return f([](auto&& x, auto&& y) { return FZ_FWD(x) >= FZ_FWD(y); });
    case BOp::eq: return f([](auto&& x, auto&& y) { return FZ_FWD(x) == FZ_FWD(y); });
    case BOp::ne: return f([](auto&& x, auto&& y) { return FZ_FWD(x) != FZ_FWD(y); });
    default: return;
  }
}

// The arithmetic ops: with_b's first half.
template <class F>
void with_b_arith(BOp op, F&& f) {
  switch (op) {
    case BOp::add: return f([](auto&& x, auto&& y) { return FZ_FWD(x) + FZ_FWD(y); });
    case BOp::sub: return f([](auto&& x, auto&& y) { return FZ_FWD(x) - FZ_FWD(y); });
    case BOp::mul: return f([](auto&& x, auto&& y) { return FZ_FWD(x) * FZ_FWD(y); });
    case BOp::div: return f([](auto&& x, auto&& y) { return FZ_FWD(x) / FZ_FWD(y); });
    case BOp::maximum: return f([](auto&& x, auto&& y) { return deft::maximum(FZ_FWD(x), FZ_FWD(y)); });
    case BOp::minimum: return f([](auto&& x, auto&& y) { return deft::minimum(FZ_FWD(x), FZ_FWD(y)); });
    case BOp::pow: return f([](auto&& x, auto&& y) { return deft::pow(FZ_FWD(x), FZ_FWD(y)); });
    default: throw std::logic_error("deft_fuzz: op outside with_b_arith");
  }
}

// The inner ops of the deeper patterns (inner_b in fused.hpp).
template <class F>
void with_b_inner(BOp op, F&& f) {
  switch (op) {
    case BOp::sub: return f([](auto&& x, auto&& y) { return FZ_FWD(x) - FZ_FWD(y); });
    case BOp::div: return f([](auto&& x, auto&& y) { return FZ_FWD(x) / FZ_FWD(y); });
    case BOp::maximum: return f([](auto&& x, auto&& y) { return deft::maximum(FZ_FWD(x), FZ_FWD(y)); });
    case BOp::pow: return f([](auto&& x, auto&& y) { return deft::pow(FZ_FWD(x), FZ_FWD(y)); });
    default: throw std::logic_error("deft_fuzz: op outside with_b_inner");
  }
}

template <class F>
void with_b(BOp op, F&& f) {
  switch (op) {
    case BOp::add: case BOp::sub: case BOp::mul: case BOp::div:
    case BOp::maximum: case BOp::minimum: case BOp::pow:
      return with_b_arith(op, FZ_FWD(f));
    default: return with_cmp(op, FZ_FWD(f));
  }
}

template <class F>
void with_u_inner(UOp op, F&& f) {
  switch (op) {
    case UOp::neg: return f([](auto&& x) { return -FZ_FWD(x); });
    case UOp::abs: return f([](auto&& x) { return deft::abs(FZ_FWD(x)); });
    case UOp::exp: return f([](auto&& x) { return deft::exp(FZ_FWD(x)); });
    case UOp::relu: return f([](auto&& x) { return deft::relu(FZ_FWD(x)); });
    default: throw std::logic_error("deft_fuzz: op outside with_u_inner");
  }
}
template <class F>
void with_u_math(UOp op, F&& f) {
  switch (op) {
    case UOp::neg: return f([](auto&& x) { return -FZ_FWD(x); });
    case UOp::abs: return f([](auto&& x) { return deft::abs(FZ_FWD(x)); });
    case UOp::exp: return f([](auto&& x) { return deft::exp(FZ_FWD(x)); });
    case UOp::log: return f([](auto&& x) { return deft::log(FZ_FWD(x)); });
    case UOp::sqrt: return f([](auto&& x) { return deft::sqrt(FZ_FWD(x)); });
    case UOp::tanh: return f([](auto&& x) { return deft::tanh(FZ_FWD(x)); });
    default: throw std::logic_error("deft_fuzz: op outside with_u_math");
  }
}

/// Calls sink(expr) for the two operands of a binary op, each a tensor or a number.
template <class B, class S>
void apply_b(B&& bop, const Arg& x, const Arg& y, S&& sink) {
  if (x.scalar) sink(bop(x.s, *y.t));
  else if (y.scalar) sink(bop(*x.t, y.s));
  else sink(bop(*x.t, *y.t));
}

/// Calls sink(where(c, x, y)) with x and y each a tensor or a number.
template <class C, class S>
void apply_where(C&& cond, const Arg& x, const Arg& y, S&& sink) {
  if (x.scalar && y.scalar) sink(deft::where(FZ_FWD(cond), x.s, y.s));
  else if (x.scalar) sink(deft::where(FZ_FWD(cond), x.s, *y.t));
  else if (y.scalar) sink(deft::where(FZ_FWD(cond), *x.t, y.s));
  else sink(deft::where(FZ_FWD(cond), *x.t, *y.t));
}

/// Runs `body(sink)` with a sink that binds (`target = e`) or writes (`target.assign(e)`).
template <class Body>
void with_sink(Sink kind, deft::Tensor<float>& target, Body&& body) {
  if (kind == Sink::bind) body([&](auto&& e) { target = FZ_FWD(e); });
  else body([&](auto&& e) { target.assign(FZ_FWD(e)); });
}

}  // namespace fz::detail
