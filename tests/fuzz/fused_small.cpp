// Pattern choice, reproducer code, and the small fused patterns
// (leaf, U(t), B(x, y), where) for `t = e` and `t.assign(e)`.
#include <stdexcept>

#include "fused_ops.hpp"

namespace fz {

Plan plan_for(const Node& n, Site site) {
  Plan p;
  const bool expr = site == Site::bind || site == Site::assign;  // where
#ifdef DEFT_FUZZ_SHALLOW
  const bool deep = false;  // a sanitizer build (tests/fuzz/CMakeLists.txt)
#else
  const bool deep = site == Site::bind;  // U(U), U(B), B(B), B(U), where(C): bound only
#endif
  auto fusable = [](const Node& k, Node::Kind kind) { return !k.cut && k.kind == kind; };
  switch (n.kind) {
    case Node::unary: {
      const Node& k = n.kids[0];
      p.u[0] = n.u;
      if (deep && fusable(k, Node::unary) && inner_u(k.u)) {
        p.pat = Pat::uu;
        p.u[1] = k.u;
        p.args = {&k.kids[0]};
      } else if (deep && fusable(k, Node::binary) && inner_b(k.b)) {
        p.pat = Pat::ub;
        p.b[0] = k.b;
        p.args = {&k.kids[0], &k.kids[1]};
      } else {
        p.pat = Pat::u;
        p.args = {&k};
      }
      return p;
    }
    case Node::binary: {
      const Node &k0 = n.kids[0], &k1 = n.kids[1];
      p.b[0] = n.b;
      if (deep && fusable(k0, Node::binary) && inner_b(k0.b)) {
        p.pat = Pat::bb;
        p.b[1] = k0.b;
        p.args = {&k0.kids[0], &k0.kids[1], &k1};
      } else if (deep && fusable(k1, Node::unary) && math_u(k1.u)) {
        p.pat = Pat::bu;
        p.u[0] = k1.u;
        p.args = {&k0, &k1.kids[0]};
      } else {
        p.pat = Pat::b;
        p.args = {&k0, &k1};
      }
      return p;
    }
    case Node::select: {
      const Node& c = n.kids[0];
      if (!expr) break;
      if (deep && fusable(c, Node::binary) && is_comparison(c.b)) {
        p.pat = Pat::where_cmp;
        p.b[0] = c.b;
        p.args = {&c.kids[0], &c.kids[1], &n.kids[1], &n.kids[2]};
      } else {
        p.pat = Pat::where;
        p.args = {&c, &n.kids[1], &n.kids[2]};
      }
      return p;
    }
    default: break;
  }
  p.pat = Pat::leaf;
  p.args = {&n};
  return p;
}

bool scalar_ok(const Plan& p, std::size_t i, Site site) {
  switch (p.pat) {
    case Pat::leaf: return site == Site::compound;  // `t += 2.f`; `t = 2.f` is not deft
    case Pat::b: return site == Site::bind && (i == 1 || p.args[1]->kind != Node::scalar);  // B(s, s) is not an expression
    case Pat::where: return i >= 1;
    case Pat::where_cmp: return i == 3;
    default: return false;
  }
}

std::string ucode(UOp u, const std::string& x) {
  if (u == UOp::cast_i32) return "deft::cast<float>(deft::cast<std::int32_t>(" + x + "))";
  if (u == UOp::neg) return "-(" + x + ")";
  return std::string(name(u)) + "(" + x + ")";
}
std::string bcode(BOp b, const std::string& x, const std::string& y) {
  if (infix(b)) return "(" + x + " " + name(b) + " " + y + ")";
  return std::string(name(b)) + "(" + x + ", " + y + ")";
}

std::string plan_code(const Plan& p, const std::vector<std::string>& a) {
  switch (p.pat) {
    case Pat::leaf: return a[0];
    case Pat::u: return ucode(p.u[0], a[0]);
    case Pat::b: return bcode(p.b[0], a[0], a[1]);
    case Pat::uu: return ucode(p.u[0], ucode(p.u[1], a[0]));
    case Pat::ub: return ucode(p.u[0], bcode(p.b[0], a[0], a[1]));
    case Pat::bb: return bcode(p.b[0], bcode(p.b[1], a[0], a[1]), a[2]);
    case Pat::bu: return bcode(p.b[0], a[0], ucode(p.u[0], a[1]));
    case Pat::where: return "deft::where(" + a[0] + ", " + a[1] + ", " + a[2] + ")";
    case Pat::where_cmp: return "deft::where(" + bcode(p.b[0], a[0], a[1]) + ", " + a[2] + ", " + a[3] + ")";
  }
  return "?";
}

void fused_write(Sink sink, deft::Tensor<float>& target, const Plan& p, const Arg* args) {
  switch (p.pat) {
#ifndef DEFT_FUZZ_SHALLOW
    case Pat::uu:
    case Pat::where_cmp: return detail::write_uu(target, p, args);
    case Pat::ub: return detail::write_ub(target, p, args);
    case Pat::bb: return detail::write_bb(target, p, args);
    case Pat::bu: return detail::write_bu(target, p, args);
#endif
    default: return detail::write_small(sink, target, p, args);
  }
}

namespace detail {

void write_small(Sink kind, deft::Tensor<float>& target, const Plan& p, const Arg* a) {
  auto bind = [&](auto&& e) { target = FZ_FWD(e); };
  auto assign = [&](auto&& e) { target.assign(FZ_FWD(e)); };
  switch (p.pat) {
    case Pat::leaf:
      if (kind == Sink::bind) bind(*a[0].t);
      else assign(*a[0].t);
      return;
    case Pat::u:
      return with_u(p.u[0], [&](auto U) {
        if (kind == Sink::bind) bind(U(*a[0].t));
        else assign(U(*a[0].t));
      });
    case Pat::b:  // numbers as operands only when binding (scalar_ok)
      return with_b(p.b[0], [&](auto B) {
        if (kind == Sink::bind) apply_b(B, a[0], a[1], bind);
        else assign(B(*a[0].t, *a[1].t));
      });
    case Pat::where: return with_sink(kind, target, [&](auto&& sink) { apply_where(*a[0].t, a[1], a[2], sink); });
    default: throw std::logic_error("deft_fuzz: pattern outside write_small");
  }
}

}  // namespace detail
}  // namespace fz
