// Random tensors from a counter-based generator (Philox4x32-10): element i of
// a call's output depends only on (seed, call number, i), so the numbers are
// the same whatever the number of workers, on any device.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <numbers>
#include <type_traits>

#include "../core/config.hpp"
#include "../eval/executor.hpp"
#include "../tensor.hpp"

namespace deft::detail {

struct Philox {
  static DEFT_HD std::array<std::uint32_t, 4> block(std::uint64_t key, std::uint64_t stream, std::uint64_t index) {
    std::uint32_t c0 = std::uint32_t(index), c1 = std::uint32_t(index >> 32), c2 = std::uint32_t(stream),
                  c3 = std::uint32_t(stream >> 32);
    std::uint32_t k0 = std::uint32_t(key), k1 = std::uint32_t(key >> 32);
    for (int round = 0; round < 10; ++round) {
      const std::uint64_t p0 = std::uint64_t(0xD2511F53u) * c0, p1 = std::uint64_t(0xCD9E8D57u) * c2;
      const std::uint32_t n0 = std::uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = std::uint32_t(p0 >> 32) ^ c3 ^ k1;
      c0 = n0;
      c1 = std::uint32_t(p1);
      c2 = n2;
      c3 = std::uint32_t(p0);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return {c0, c1, c2, c3};
  }
};

/// A uniform number in [0, 1) from 24 (float) or 53 (double) random bits.
template <class T>
DEFT_HD T unit_interval(std::uint32_t hi, std::uint32_t lo) {
  if constexpr (std::is_same_v<T, float>) return float(hi >> 8) * 0x1.0p-24f;
  else return double((std::uint64_t(hi) << 21) ^ (lo >> 11)) * 0x1.0p-53;
}

/// The generator state: a seed and the number of calls made since seeding.
struct RandomState {
  std::mutex m;
  std::uint64_t seed = 0x5EED;
  std::uint64_t calls = 0;
  static RandomState& get() {
    static RandomState s;
    return s;
  }
  std::pair<std::uint64_t, std::uint64_t> next_call() {
    std::lock_guard lk(m);
    return {seed, calls++};
  }
};

enum class Distribution { uniform, normal };

/// A drawn double as an element of T. Uniform draws stay below `hi` even
/// where rounding to float would reach it.
template <class T, Distribution D>
DEFT_HD T to_element(double v, double hi) {
  if constexpr (std::is_integral_v<T>) {
    return convert<T>(std::floor(v));  // saturates: v may round up to hi = 2^63 for int64
  } else {
    T r = static_cast<T>(v);
    if constexpr (D == Distribution::uniform)
      while (double(r) >= hi) r = std::nextafter(r, -std::numeric_limits<T>::infinity());
    return r;
  }
}

// Element i of a call uses Philox block i / 2: two 32-bit words per element
// (one pair per uniform, a Box-Muller pair per two normals).
template <class T, Distribution D, class Executor>
inline void fill_random(Executor ex, T* out, std::int64_t n, std::uint64_t key, std::uint64_t stream, double a, double b) {
  ex.parallel_range((n + 1) / 2, 40, 32, [&](std::int64_t q0, std::int64_t q1) {
    for (std::int64_t q = q0; q < q1; ++q) {
      const auto w = Philox::block(key, stream, std::uint64_t(q));
      double v[2];
      if constexpr (D == Distribution::uniform) {
        v[0] = a + (b - a) * unit_interval<double>(w[0], w[1]);
        v[1] = a + (b - a) * unit_interval<double>(w[2], w[3]);
      } else {
        const double u1 = 1.0 - unit_interval<double>(w[0], w[1]);  // (0, 1]: log is finite
        const double u2 = unit_interval<double>(w[2], w[3]);
        const double r = std::sqrt(-2.0 * std::log(u1));
        v[0] = a + b * r * std::cos(2 * std::numbers::pi * u2);
        v[1] = a + b * r * std::sin(2 * std::numbers::pi * u2);
      }
      for (int j = 0; j < 2 && 2 * q + j < n; ++j) out[2 * q + j] = to_element<T, D>(v[j], b);
    }
  });
}

template <Element T, Distribution D>
Tensor<T> random_tensor(const char* name, double a, double b, const Shape& shape, Device device) {
  // Checks that record_new makes, before taking a call number: a call that
  // throws does not shift the numbers of later calls.
  require_backend(device, name);
  (void)bytes_for<T>(shape);
  const auto call = RandomState::get().next_call();
  return record_new<T>(
      name, shape, device,
      [a, b, key = call.first, stream = call.second, n = shape.size()](Buffer& out) {
        on_device(out.device, [&](auto ex) { fill_random<T, D>(ex, out.as<T>(), n, key, stream, a, b); });
      },
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

/// Uniform numbers in [lo, hi) (integers: lo, ..., hi - 1).
template <Element T = float>
Tensor<T> uniform(double lo, double hi, const Shape& shape, Device device = cpu()) {
  if (!(lo < hi)) detail::raise("random::uniform: needs lo < hi, got lo = ", lo, ", hi = ", hi);
  if (!std::isfinite(hi - lo))
    detail::raise("random::uniform: needs finite bounds and a finite hi - lo, got lo = ", lo, ", hi = ", hi);
  if constexpr (std::is_integral_v<T>) {
    // hi is excluded: lo .. hi - 1 must be values of T.
    if (lo < double(std::numeric_limits<T>::lowest()) || hi > double(std::numeric_limits<T>::max()) + 1.0)
      detail::raise("random::uniform<", dtype_name_of<T>, ">: bounds lo = ", lo, ", hi = ", hi, " exceed the range of ",
                    dtype_name_of<T>);
  }
  return detail::random_tensor<T, detail::Distribution::uniform>("uniform", lo, hi, shape, device);
}

/// Normal numbers with the given mean and standard deviation (floating point).
template <Element T = float>
Tensor<T> normal(double mean, double stddev, const Shape& shape, Device device = cpu()) {
  static_assert(std::is_floating_point_v<T>, "deft: random::normal makes floating-point tensors");
  if (!(stddev >= 0)) detail::raise("random::normal: the standard deviation must be >= 0, got ", stddev);
  if (!std::isfinite(mean) || !std::isfinite(stddev))
    detail::raise("random::normal: needs a finite mean and standard deviation, got mean = ", mean, ", stddev = ", stddev);
  return detail::random_tensor<T, detail::Distribution::normal>("normal", mean, stddev, shape, device);
}

}  // namespace deft::random
