// Fused expressions consumed by in-place updates (`t op= e`) and reductions.
// Fewer patterns than for `t = e`: each one here multiplies by 4 updates or by
// the reductions it feeds.
#include "fused_ops.hpp"

namespace fz {

void fused_compound(deft::Tensor<float>& t, BOp op, const Plan& p, const Arg* a) {
  auto apply = [&](auto&& e) {
    switch (op) {
      case BOp::add: t += FZ_FWD(e); break;
      case BOp::sub: t -= FZ_FWD(e); break;
      case BOp::mul: t *= FZ_FWD(e); break;
      default: t /= FZ_FWD(e); break;
    }
  };
  switch (p.pat) {
    case Pat::leaf:
      if (a[0].scalar) apply(a[0].s);
      else apply(*a[0].t);
      return;
    case Pat::u: return detail::with_u(p.u[0], [&](auto U) { apply(U(*a[0].t)); });
    case Pat::b: return detail::with_b(p.b[0], [&](auto B) { apply(B(*a[0].t, *a[1].t)); });
    default: return;
  }
}

namespace {

deft::Tensor<float> from_index(deft::Tensor<std::int64_t> idx) { return deft::cast<float>(idx); }

/// Every reduction over a tensor; over an expression only those reduce_fuses() allows.
template <bool Leaf, class E>
deft::Tensor<float> reduce_expr(Red r, bool all, int axis, bool keepdims, const E& e) {
  if constexpr (Leaf) {
    switch (r) {
      case Red::mean: return all ? deft::mean(e) : deft::mean(e, axis, keepdims);
      case Red::min: return all ? deft::min(e) : deft::min(e, axis, keepdims);
      case Red::norm: return all ? deft::norm(e) : deft::norm(e, axis, keepdims);
      case Red::max: return all ? deft::max(e) : deft::max(e, axis, keepdims);
      case Red::argmax: return from_index(all ? deft::argmax(e) : deft::argmax(e, axis, keepdims));
      default: break;
    }
  } else {
    if (r == Red::max) return deft::max(e);
    if (r == Red::argmax) return from_index(deft::argmax(e, axis, keepdims));
  }
  return all ? deft::sum(e) : deft::sum(e, axis, keepdims);
}

}  // namespace

bool reduce_fuses(Red r, bool all, const Plan& p) {
  if (p.pat == Pat::leaf) return true;
  if (p.pat != Pat::u && p.pat != Pat::b) return false;
  return r == Red::sum || (r == Red::max && all) || (r == Red::argmax && !all);
}

deft::Tensor<float> fused_reduce(Red r, bool all, int axis, bool keepdims, const Plan& p, const Arg* a) {
  deft::Tensor<float> out;
  switch (p.pat) {
    case Pat::leaf: return reduce_expr<true>(r, all, axis, keepdims, *a[0].t);
    case Pat::u:
      detail::with_u(p.u[0], [&](auto U) { out = reduce_expr<false>(r, all, axis, keepdims, U(*a[0].t)); });
      return out;
    case Pat::b:
      detail::with_b(p.b[0], [&](auto B) { out = reduce_expr<false>(r, all, axis, keepdims, B(*a[0].t, *a[1].t)); });
      return out;
    default: return out;
  }
}

}  // namespace fz
