// Reductions: every one over a tensor; `sum` (whole or per axis) also over a
// fused U(t) or B(t, t), consumed block by block (see reduce_fuses).
#include "fused_ops.hpp"

namespace fz {

bool reduce_fuses(Red r, bool, const Plan& p) {
  return p.pat == Pat::leaf || ((p.pat == Pat::u || p.pat == Pat::b) && r == Red::sum);
}

namespace {
template <class E>
deft::Tensor<float> sum_of(bool all, int axis, bool keepdims, const E& e) {
  return all ? deft::sum(e) : deft::sum(e, axis, keepdims);
}
}  // namespace

deft::Tensor<float> fused_reduce(Red r, bool all, int axis, bool keepdims, const Plan& p, const Arg* a) {
  deft::Tensor<float> out;
  switch (p.pat) {
    case Pat::leaf: {
      const deft::Tensor<float>& x = *a[0].t;
      switch (r) {
        case Red::sum: return sum_of(all, axis, keepdims, x);
        case Red::mean: return all ? deft::mean(x) : deft::mean(x, axis, keepdims);
        case Red::min: return all ? deft::min(x) : deft::min(x, axis, keepdims);
        case Red::norm: return all ? deft::norm(x) : deft::norm(x, axis, keepdims);
        case Red::max: return all ? deft::max(x) : deft::max(x, axis, keepdims);
        case Red::argmax: return deft::cast<float>(all ? deft::argmax(x) : deft::argmax(x, axis, keepdims));
      }
      return out;
    }
    case Pat::u:
      detail::with_u(p.u[0], [&](auto U) { out = sum_of(all, axis, keepdims, U(*a[0].t)); });
      return out;
    case Pat::b:
      detail::with_b(p.b[0], [&](auto B) { out = sum_of(all, axis, keepdims, B(*a[0].t, *a[1].t)); });
      return out;
    default: throw std::logic_error("deft_fuzz: pattern outside fused_reduce");
  }
}

}  // namespace fz
