// Creation functions: full, zeros, ones, arange. Each records one task (so an
// unused tensor is never filled); from-values construction is Tensor's own.
#pragma once
#include <cmath>
#include <cstdint>

#include "../core/config.hpp"

#include "../eval/executor.hpp"
#include "../expr/nodes.hpp"
#include "../tensor.hpp"

namespace deft {

namespace detail {
/// Element i of arange (on either device).
template <class T>
struct ArangeAt {
  T start, step;
  DEFT_HD T operator()(std::int64_t i) const { return static_cast<T>(start + static_cast<T>(i) * step); }
};
}  // namespace detail

/// A tensor of `shape` with every element `value`.
template <Element T = float>
Tensor<T> full(const Shape& shape, T value, Device device = cpu()) {
  const detail::BroadcastTo<detail::Constant<T>> e(detail::Constant<T>(value), shape);
  return detail::record_new<T>(
      "full", shape, device, [e](detail::Buffer& out) { detail::on_device(out.device, [&](auto ex) { ex.evaluate(e, out.as<T>()); }); }, [](detail::Task&) {});
}
/// A tensor of zeros.
template <Element T = float>
Tensor<T> zeros(const Shape& shape, Device device = cpu()) { return full<T>(shape, T(0), device); }
/// A tensor of ones.
template <Element T = float>
Tensor<T> ones(const Shape& shape, Device device = cpu()) { return full<T>(shape, T(1), device); }

/// start, start + step, ... up to (not including) stop, as numpy.arange.
template <Element T = float>
Tensor<T> arange(T start, T stop, T step = T(1), Device device = cpu()) {
  if (step == T(0)) detail::raise("arange: step must not be zero");
  const double span = (double(stop) - double(start)) / double(step);
  if (std::isnan(span) || std::isinf(span))
    detail::raise("arange: cannot compute the length from start ", start, ", stop ", stop, ", step ", step);
  if (span > 0x1p62)  // beyond this the count does not fit an int64 extent
    detail::raise<std::length_error>("arange: ", span, " elements (start ", start, ", stop ", stop, ", step ", step,
                                     ") are more than fit in memory");
  const std::int64_t n = span > 0 ? std::int64_t(std::ceil(span)) : 0;
  return detail::record_new<T>(
      "arange", Shape{n}, device,
      [f = detail::ArangeAt<T>{start, step}, n](detail::Buffer& out) {
        detail::on_device(out.device, [&](auto ex) { ex.generate(n, f, out.as<T>()); });
      },
      [](detail::Task&) {});
}
/// 0, 1, ..., stop - 1.
template <Element T = float>
Tensor<T> arange(T stop) { return arange<T>(T(0), stop); }

}  // namespace deft
