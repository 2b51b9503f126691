// Runtime trees to compile-time deft expressions.
//
// deft's expressions are types, so a tree chosen at run time cannot become one
// fused template of arbitrary shape. The top of a tree (depth <= 2, the
// "patterns" below) is built as ONE fused deft expression through a runtime
// switch over the ops; the operands under it are evaluated first into their own
// deferred tensors, so a depth-8 tree becomes a chain of fused tasks with no
// sync in between. The fused depth is capped for compile time: every pattern
// instance is a separate kernel instantiation (about 450 of them, a build of
// about a minute on two cores), so the deeper patterns serve `t = e` only and
// fuse the op subsets below.
#pragma once
#include <string>
#include <vector>

#include <deft/deft.hpp>

#include "program.hpp"

namespace fz {

/// The fused shape of a tree's top. t: a tensor operand; s: a plain number.
enum class Pat : std::uint8_t {
  leaf,       // t (or s): no expression
  u,          // U(t)
  b,          // B(x, y), x and y each t or s (not both s)
  uu,         // U1(U2(t))
  ub,         // U(B(t, t))
  bb,         // B1(B2(t, t), t)
  bu,         // B(t, U(t))
  where,      // where(t, x, y), x and y each t or s
  where_cmp,  // where(C(t, t), x, y), C a comparison
};

/// Where an expression is consumed; later sites accept fewer patterns (each
/// pattern there is another set of instantiations).
enum class Site : std::uint8_t { bind /* t = e */, assign /* t.assign(e) */, compound /* t op= e */, reduce };

struct Plan {
  Pat pat = Pat::leaf;
  UOp u[2]{};
  BOp b[2]{};
  std::vector<const Node*> args;  // the pattern's operands, left to right
};

// The op sets the deeper patterns are instantiated for (the rest of a tree is
// evaluated into its own tensor first): B1(B2(t, t), t) and U(B(t, t)) fuse
// four inner B2/B, U1(U2(t)) four inner U2, B(t, U(t)) six U. Each inner op
// multiplies the kernels CI compiles; these four cover operand order (sub),
// infinities and NaN (div), NaN propagation (maximum) and a transcendental
// with special values (pow). Every op fuses at the top of a tree.
inline bool inner_b(BOp b) { return b == BOp::sub || b == BOp::div || b == BOp::maximum || b == BOp::pow; }
inline bool inner_u(UOp u) { return u == UOp::neg || u == UOp::abs || u == UOp::exp || u == UOp::relu; }
inline bool math_u(UOp u) { return int(u) <= int(UOp::tanh); }
/// In-place updates fuse U(t) and B(t, t) for += and *= (others take a tensor or a number).
inline bool compound_fuses(BOp op) { return op == BOp::add || op == BOp::mul; }

/// Which pattern a node's top becomes at a site (never fails: at worst the
/// whole node is one operand, evaluated into its own tensor).
Plan plan_for(const Node& n, Site site);
/// Whether operand i of a plan may stay a plain number at a site.
bool scalar_ok(const Plan& p, std::size_t i, Site site);

/// An operand: a tensor (a slot itself, so that `t = f(t)` keeps t's only
/// handle and may write in place, or an owned temporary) or a number.
struct Arg {
  deft::Tensor<float> own;
  const deft::Tensor<float>* t = nullptr;
  float s = 0;
  bool scalar = false;
};

enum class Sink : std::uint8_t { bind /* target = e */, assign /* target.assign(e) */ };

// Each evaluates the plan's expression over `args` into the sink. Defined in
// separate translation units so that the build uses both cores.
/// `target = e` (Site::bind plans) or `target.assign(e)` (Site::assign plans).
void fused_write(Sink sink, deft::Tensor<float>& target, const Plan& p, const Arg* args);
void fused_compound(deft::Tensor<float>& target, BOp op, const Plan& p, const Arg* args);
deft::Tensor<float> fused_reduce(Red r, bool all, int axis, bool keepdims, const Plan& p, const Arg* args);
/// Whether fused_reduce takes this plan as it is (else the runner evaluates the operand first).
bool reduce_fuses(Red r, bool all, const Plan& p);

namespace detail {
void write_small(Sink, deft::Tensor<float>&, const Plan&, const Arg*);  // leaf u b where
void write_uu(deft::Tensor<float>&, const Plan&, const Arg*);            // uu where_cmp: bind only
void write_ub(deft::Tensor<float>&, const Plan&, const Arg*);  // bind only
void write_bb(deft::Tensor<float>&, const Plan&, const Arg*);
void write_bu(deft::Tensor<float>&, const Plan&, const Arg*);
}  // namespace detail

/// C++ source of a plan's expression over operand names (for reproducers).
std::string plan_code(const Plan& p, const std::vector<std::string>& names);
std::string ucode(UOp u, const std::string& x);
std::string bcode(BOp b, const std::string& x, const std::string& y);

}  // namespace fz
