// Random tensors: deft::random's calls and its seed. The numbers come from
// eval/random_draw.hpp, the call counter from core/random_state.hpp.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/random_state.hpp"
#include "../eval/executor.hpp"
#include "../eval/random_draw.hpp"
#include "../tensor.hpp"

namespace deft::detail {

/// Fills a tensor with the numbers of call `stream` of seed `key`. A trace
/// replays it with the call numbers of the replay (redrawn), so each replay
/// draws new numbers, those the traced code would have drawn.
template <Element T, Distribution D>
struct RandomFill {
  double a, b;
  std::uint64_t key, stream;
  std::int64_t n;
  void operator()(Buffer& out) const {
    on_device(out.device, [&](auto ex) { ex.template fill_random<T, D>(out.as<T>(), n, key, stream, a, b); });
  }
  RandomFill redrawn(std::uint64_t new_key, std::uint64_t new_stream) const {
    RandomFill r = *this;
    r.key = new_key;
    r.stream = new_stream;
    return r;
  }
};

template <Element T, Distribution D>
Tensor<T> random_tensor(const char* name, double a, double b, const Shape& shape, Device device) {
  // Checks that record_new makes, before taking a call number: a call that
  // throws does not shift the numbers of later calls.
  require_backend(device, name);
  (void)bytes_for<T>(shape);
  const auto call = RandomState::get().next_call();
  return record_new<T>(name, shape, device, RandomFill<T, D>{a, b, call.first, call.second, shape.size()},
                       [](Task&) {});
}

}  // namespace deft::detail

namespace deft::random {

/// Seeds the generator: later calls give the same numbers after the same seed.
inline void seed(std::uint64_t s) {
  auto& st = detail::RandomState::get();
  std::lock_guard lk(st.m);
  st.seed = s;
  st.calls = 0;
}

/// Uniform numbers in [lo, hi) (integers: lo, ..., hi - 1, from whole-number bounds).
template <Element T = float>
Tensor<T> uniform(double lo, double hi, const Shape& shape, Device device = cpu()) {
  if (!(lo < hi)) detail::raise("random::uniform: needs lo < hi, got lo = ", lo, ", hi = ", hi);
  if (!std::isfinite(hi - lo))
    detail::raise("random::uniform: needs finite bounds and a finite hi - lo, got lo = ", lo, ", hi = ", hi);
  // Integers: lo .. hi - 1, so a fractional bound has no meaning (floor
  // would give values below lo).
  if constexpr (std::is_integral_v<T>)
    if (lo != std::floor(lo) || hi != std::floor(hi))
      detail::raise("random::uniform<", dtype_name_of<T>, ">: needs whole-number bounds, got lo = ", lo, ", hi = ", hi);
  // The bounds must be values of T (integers: lo .. hi - 1, hi excluded).
  constexpr double top = double(std::numeric_limits<T>::max()) + (std::is_integral_v<T> ? 1.0 : 0.0);
  if (lo < double(std::numeric_limits<T>::lowest()) || hi > top)
    detail::raise("random::uniform<", dtype_name_of<T>, ">: bounds lo = ", lo, ", hi = ", hi, " exceed the range of ",
                  dtype_name_of<T>);
  return detail::random_tensor<T, detail::Distribution::uniform>("uniform", lo, hi, shape, device);
}

/// Normal numbers with the given mean and standard deviation (floating point).
template <Element T = float>
Tensor<T> normal(double mean, double stddev, const Shape& shape, Device device = cpu()) {
  static_assert(std::is_floating_point_v<T>, "deft: random::normal makes floating-point tensors");
  if (!(stddev >= 0)) detail::raise("random::normal: the standard deviation must be >= 0, got ", stddev);
  if (!std::isfinite(mean) || !std::isfinite(stddev))
    detail::raise("random::normal: needs a finite mean and standard deviation, got mean = ", mean, ", stddev = ", stddev);
  if (std::abs(mean) > double(std::numeric_limits<T>::max()) || stddev > double(std::numeric_limits<T>::max()))
    detail::raise("random::normal<", dtype_name_of<T>, ">: mean = ", mean, ", stddev = ", stddev, " exceed the range of ",
                  dtype_name_of<T>);
  return detail::random_tensor<T, detail::Distribution::normal>("normal", mean, stddev, shape, device);
}

}  // namespace deft::random
