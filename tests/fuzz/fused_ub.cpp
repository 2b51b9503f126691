// U(B(t, t)) fused, for `t = e` (9 x 4 kernels).
#include "fused_ops.hpp"

namespace fz::detail {
void write_ub(deft::Tensor<float>& target, const Plan& p, const Arg* a) {
  with_u(p.u[0], [&](auto U) { with_b_inner(p.b[0], [&](auto B) { target = U(B(*a[0].t, *a[1].t)); }); });
}
}  // namespace fz::detail
