// B1(B2(t, t), t) fused, for `t = e` (13 x 7 kernels).
#include "fused_ops.hpp"

namespace fz::detail {

// The inner ops plan_for() fuses here (see bb_inner there).
template <class F>
void with_b_inner(BOp op, F&& f) {
  switch (op) {
    case BOp::add: return f([](auto&& x, auto&& y) { return FZ_FWD(x) + FZ_FWD(y); });
    case BOp::sub: return f([](auto&& x, auto&& y) { return FZ_FWD(x) - FZ_FWD(y); });
    case BOp::mul: return f([](auto&& x, auto&& y) { return FZ_FWD(x) * FZ_FWD(y); });
    case BOp::div: return f([](auto&& x, auto&& y) { return FZ_FWD(x) / FZ_FWD(y); });
    case BOp::lt: return f([](auto&& x, auto&& y) { return FZ_FWD(x) < FZ_FWD(y); });
    case BOp::maximum: return f([](auto&& x, auto&& y) { return deft::maximum(FZ_FWD(x), FZ_FWD(y)); });
    case BOp::pow: return f([](auto&& x, auto&& y) { return deft::pow(FZ_FWD(x), FZ_FWD(y)); });
    default: return;
  }
}

void write_bb(deft::Tensor<float>& target, const Plan& p, const Arg* a) {
  with_b(p.b[0], [&](auto B1) { with_b_inner(p.b[1], [&](auto B2) { target = B1(B2(*a[0].t, *a[1].t), *a[2].t); }); });
}
}  // namespace fz::detail
