// B1(B2(t, t), t) fused, for `t = e` (13 x 4 kernels).
#include "fused_ops.hpp"

namespace fz::detail {

void write_bb(deft::Tensor<float>& target, const Plan& p, const Arg* a) {
  with_b(p.b[0], [&](auto B1) { with_b_inner(p.b[1], [&](auto B2) { target = B1(B2(*a[0].t, *a[1].t), *a[2].t); }); });
}
}  // namespace fz::detail
