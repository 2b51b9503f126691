// back_off: the wait between two polls of something another thread or
// process finishes (an MPI request, an NCCL call).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

namespace deft::detail {

/// Waits before poll number `polls` + 1 (counted from 0): the first polls
/// only yield the core (the other side is usually microseconds behind),
/// later ones sleep 10 us longer each time, up to `longest_us`, so that a
/// long wait leaves the core to the workers.
inline void back_off(int polls, std::int64_t longest_us) {
  constexpr int yields = 256;
  if (polls < yields) {
    std::this_thread::yield();
    return;
  }
  const std::int64_t grown = 10 * std::int64_t(polls - yields + 1);
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(grown, longest_us)));
}

}  // namespace deft::detail
