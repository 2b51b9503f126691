// Division by a divisor fixed when a kernel is launched. A GPU has no
// integer divider: a 64-bit `/` or `%` compiles to a subroutine of dozens
// of instructions, and the index arithmetic of a gather that splits a flat
// index into four coordinates then costs more than its memory traffic
// (measured on an H200: a batch norm's rank-3 broadcast over 12.8M floats
// moved under 3% of the copy bandwidth). Below 2^31,
// n / d is a multiply-high, an add and a shift, with a multiplier and shift
// computed once on the host (Granlund and Montgomery, "Division by invariant
// integers using multiplication", 1994); above it the plain division stays.
#pragma once
#include <bit>
#include <cstdint>

#include "../../core/config.hpp"

namespace deft::detail::gpu {

class Divider {
 public:
  Divider() = default;
  /// Divides numerators in [0, max_numerator] by d (d >= 1).
  Divider(std::int64_t d, std::int64_t max_numerator) : d_(d) {
    constexpr std::int64_t limit = std::int64_t(1) << 31;
    narrow_ = d >= 1 && d < limit && max_numerator < limit;
    if (!narrow_) return;
    // shift: the least s with 2^s >= d; multiplier: floor(2^32 (2^s - d) / d) + 1, below 2^32.
    shift_ = std::uint32_t(std::bit_width(std::uint64_t(d - 1)));
    const std::uint64_t ud = std::uint64_t(d);
    multiplier_ = std::uint32_t(((std::uint64_t(1) << 32) * ((std::uint64_t(1) << shift_) - ud)) / ud + 1);
  }

  DEFT_HD std::int64_t divisor() const { return d_; }

  DEFT_HD std::int64_t quotient(std::int64_t n) const {
    if (!narrow_) return n / d_;
    const auto un = std::uint32_t(n);
    // un + high < 2^32: high < un < 2^31.
    return std::int64_t((high_product(un, multiplier_) + un) >> shift_);
  }

  /// q = n / d, returns n % d.
  DEFT_HD std::int64_t split(std::int64_t n, std::int64_t& q) const {
    q = quotient(n);
    return n - q * d_;
  }

 private:
  DEFT_HD static std::uint32_t high_product(std::uint32_t a, std::uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return std::uint32_t((std::uint64_t(a) * b) >> 32);
#endif
  }

  std::int64_t d_ = 1;
  std::uint32_t multiplier_ = 1, shift_ = 0;
  bool narrow_ = false;
};

}  // namespace deft::detail::gpu
