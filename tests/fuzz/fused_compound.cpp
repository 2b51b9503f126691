// Fused right-hand sides of in-place updates: `t op= x` for a tensor or a
// number, and `t += e`, `t *= e` for e = U(t) or B(t, t) (see compound_fuses).
#include "fused_ops.hpp"

namespace fz {

void fused_compound(deft::Tensor<float>& t, BOp op, const Plan& p, const Arg* a) {
  auto apply = [&](auto&& x) {  // a tensor or a number: all four updates
    switch (op) {
      case BOp::add: t += FZ_FWD(x); break;
      case BOp::sub: t -= FZ_FWD(x); break;
      case BOp::mul: t *= FZ_FWD(x); break;
      default: t /= FZ_FWD(x); break;
    }
  };
  auto apply_expr = [&](auto&& e) {
    if (op == BOp::add) t += FZ_FWD(e);
    else if (op == BOp::mul) t *= FZ_FWD(e);
    else throw std::logic_error("deft_fuzz: update outside compound_fuses");
  };
  switch (p.pat) {
    case Pat::leaf:
      if (a[0].scalar) apply(a[0].s);
      else apply(*a[0].t);
      return;
    case Pat::u: return detail::with_u(p.u[0], [&](auto U) { apply_expr(U(*a[0].t)); });
    case Pat::b: return detail::with_b(p.b[0], [&](auto B) { apply_expr(B(*a[0].t, *a[1].t)); });
    default: throw std::logic_error("deft_fuzz: pattern outside fused_compound");
  }
}

}  // namespace fz
