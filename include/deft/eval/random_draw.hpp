// The numbers behind deft::random, shared by the CPU and GPU fills: a
// counter-based generator (Philox4x32-10), so element i of a call depends
// only on (seed, call number, i): the same numbers whatever the number of
// workers, on any device.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <type_traits>

#include "../core/config.hpp"
#include "../expr/ops.hpp"

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

enum class Distribution { uniform, normal };

/// A drawn double as an element of T. Uniform draws stay below `hi` even
/// where rounding (to double, or to float) reaches it: lo + (hi - lo) * u
/// rounds up to hi for u close enough to 1 wherever hi's last place is
/// coarser than 2^-53 (2^30 + u with u > 1 - 2^-23; 2^52 + u with u > 1/2).
template <class T, Distribution D>
DEFT_HD T to_element(double v, double hi) {
  if constexpr (std::is_integral_v<T>) {
    double r = std::floor(v);
    if (r >= hi) r = hi - 1;  // (whole-number bounds: hi - 1 >= lo)
    return convert<T>(r);     // saturates: hi - 1 rounds to 2^63 for int64's top
  } else {
    T r = static_cast<T>(v);
    if constexpr (D == Distribution::uniform)
      while (double(r) >= hi) r = std::nextafter(r, -std::numeric_limits<T>::infinity());
    return r;
  }
}

/// Writes elements 2q and 2q + 1 (those below n) of a call with key `key`
/// and stream `stream`: uniform in [a, b), or normal with mean a and standard
/// deviation b. Element i uses Philox block i / 2: one pair of 32-bit words
/// per uniform, a Box-Muller pair per two normals.
template <class T, Distribution D>
DEFT_HD void store_pair(T* out, std::int64_t n, std::int64_t q, std::uint64_t key, std::uint64_t stream, double a,
                        double b) {
  const auto w = Philox::block(key, stream, std::uint64_t(q));
  double v[2];
  if constexpr (D == Distribution::uniform) {
    // One rounding, written out: nvcc contracts a + (b - a) * u into an
    // FMA and a host compiler may not, and the floor of an integer draw
    // would then differ between the CPU and a GPU.
    v[0] = std::fma(b - a, unit_interval<double>(w[0], w[1]), a);
    v[1] = std::fma(b - a, unit_interval<double>(w[2], w[3]), a);
  } else {
    const double u1 = 1.0 - unit_interval<double>(w[0], w[1]);  // (0, 1]: log is finite
    const double u2 = unit_interval<double>(w[2], w[3]);
    const double r = std::sqrt(-2.0 * std::log(u1));
    v[0] = a + b * r * std::cos(2 * std::numbers::pi * u2);
    v[1] = a + b * r * std::sin(2 * std::numbers::pi * u2);
  }
  for (int j = 0; j < 2 && 2 * q + j < n; ++j) out[2 * q + j] = to_element<T, D>(v[j], b);
}

}  // namespace deft::detail
