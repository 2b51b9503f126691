// CPU random numbers (eval/gpu/random.hpp is the GPU's): the same numbers for
// the same deft::random call on either device (eval/random_draw.hpp), in
// pairs split across workers.
#pragma once
#include <cstdint>

#include "../random_draw.hpp"
#include "elementwise.hpp"

namespace deft::detail::cpu {

/// out[0, n) = the numbers of the deft::random call (key, stream).
template <class T, Distribution D>
void fill_random(T* out, std::int64_t n, std::uint64_t key, std::uint64_t stream, double a, double b) {
  parallel_range((n + 1) / 2, 40, 32, [&](std::int64_t q0, std::int64_t q1) {
    for (std::int64_t q = q0; q < q1; ++q) store_pair<T, D>(out, n, q, key, stream, a, b);
  });
}

}  // namespace deft::detail::cpu
