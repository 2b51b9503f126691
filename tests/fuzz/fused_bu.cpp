// B(t, U(t)) fused, for `t = e` (13 x 6 kernels).
#include "fused_ops.hpp"

namespace fz::detail {
void write_bu(deft::Tensor<float>& target, const Plan& p, const Arg* a) {
  with_b(p.b[0], [&](auto B) { with_u_math(p.u[0], [&](auto U) { target = B(*a[0].t, U(*a[1].t)); }); });
}
}  // namespace fz::detail
