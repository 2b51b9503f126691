// Creation functions: full, zeros, ones, arange. Each records one task (so an
// unused tensor is never filled); from-values construction is Tensor's own.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

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
  DEFT_HD T operator()(std::int64_t i) const {
    if constexpr (std::is_integral_v<T>) {  // in unsigned arithmetic: no signed overflow on the way
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(start) + static_cast<U>(i) * static_cast<U>(step));
    } else {
      return static_cast<T>(start + static_cast<T>(i) * step);
    }
  }
};

/// arange's length: exact for integers (a double is not beyond 2^53), the
/// ceiling of the span for floating types.
template <class T>
std::int64_t arange_length(T start, T stop, T step) {
  if (step == T(0)) raise("arange: step must not be zero");
  const auto too_many = [&](const auto& n) {
    raise<std::length_error>("arange: ", n, " elements (start ", start, ", stop ", stop, ", step ", step,
                             ") are more than fit in memory");
  };
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    if (step > 0 ? stop <= start : stop >= start) return 0;
    const U distance = step > 0 ? U(U(stop) - U(start)) : U(U(start) - U(stop));
    const U stride = step > 0 ? U(step) : U(U(0) - U(step));
    const std::uint64_t n = std::uint64_t(distance / stride + (distance % stride != 0));
    if (n > (std::uint64_t(1) << 62)) too_many(n);
    return std::int64_t(n);
  } else {
    const double span = (double(stop) - double(start)) / double(step);
    if (std::isnan(span) || std::isinf(span))
      raise("arange: cannot compute the length from start ", start, ", stop ", stop, ", step ", step);
    if (span > 0x1p62) too_many(span);  // beyond this the count does not fit an int64 extent
    return span > 0 ? std::int64_t(std::ceil(span)) : 0;
  }
}
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
  const std::int64_t n = detail::arange_length(start, stop, step);
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
