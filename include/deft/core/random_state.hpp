// The state of deft::random: a seed and the number of calls made since
// seeding. A call's numbers depend only on (seed, call number), so a
// replayed trace (engine/trace.hpp) that takes call numbers in the order the
// traced program took them draws what that program would have drawn.
#pragma once
#include <cstdint>
#include <mutex>
#include <utility>

namespace deft::detail {

struct RandomState {
  std::mutex m;
  std::uint64_t seed = 0x5EED;
  std::uint64_t calls = 0;
  static RandomState& get() {
    static RandomState s;
    return s;
  }
  /// The seed and the first of `n` consecutive call numbers, taken together.
  std::pair<std::uint64_t, std::uint64_t> take(std::uint64_t n) {
    std::lock_guard lk(m);
    const std::uint64_t first = calls;
    calls += n;
    return {seed, first};
  }
  std::pair<std::uint64_t, std::uint64_t> next_call() { return take(1); }
};

}  // namespace deft::detail
