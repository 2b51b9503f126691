// GPU random numbers (eval/cpu/random.hpp is the CPU's): the same numbers
// for the same deft::random call on either device (eval/random_draw.hpp).
#pragma once
#include <cstdint>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "../../core/config.hpp"
#include "../random_draw.hpp"

namespace deft::detail::gpu {

/// Writes the element pair q of one deft::random call (see store_pair).
template <class T, Distribution D>
struct RandomPairs {
  T* out;
  std::int64_t n;
  std::uint64_t key, stream;
  double a, b;
  DEFT_HD void operator()(std::int64_t q) const { store_pair<T, D>(out, n, q, key, stream, a, b); }
};

/// out[0, n) = the numbers of the deft::random call (key, stream), the same
/// the CPU draws (eval/cpu/random.hpp).
template <class T, Distribution D, class Policy>
void fill_random(const Policy& policy, T* out, std::int64_t n, std::uint64_t key, std::uint64_t stream, double a,
                 double b) {
  if (n <= 0) return;
  thrust::for_each(policy, thrust::counting_iterator<std::int64_t>(0),
                   thrust::counting_iterator<std::int64_t>((n + 1) / 2), RandomPairs<T, D>{out, n, key, stream, a, b});
}

}  // namespace deft::detail::gpu
