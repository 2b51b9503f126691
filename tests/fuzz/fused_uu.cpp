// U1(U2(t)) and where(C(t, t), t, x) fused, for `t = e` (9 x 4 + 6 x 2 kernels).
#include "fused_ops.hpp"

namespace fz::detail {
void write_uu(deft::Tensor<float>& target, const Plan& p, const Arg* a) {
  if (p.pat == Pat::uu) {
    with_u(p.u[0], [&](auto U1) { with_u_inner(p.u[1], [&](auto U2) { target = U1(U2(*a[0].t)); }); });
    return;
  }
  with_cmp(p.b[0], [&](auto C) {
    if (a[3].scalar) target = deft::where(C(*a[0].t, *a[1].t), *a[2].t, a[3].s);
    else target = deft::where(C(*a[0].t, *a[1].t), *a[2].t, *a[3].t);
  });
}
}  // namespace fz::detail
