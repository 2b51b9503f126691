// back_off: the wait between two polls of something another thread or
// process finishes (an MPI request, an NCCL call).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace deft::detail {

/// Sleeps `us` microseconds. Linux lengthens a thread's sleeps by its timer
/// slack, 50 us unless set (bench/poll_sleep: a 10 us sleep took 65.6 us,
/// 17.5 us this way), so the slack is lowered to 1 us for the sleep and then
/// restored.
inline void sleep_us(std::int64_t us) {
#if defined(__linux__)
  const int slack_ns = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  const bool lower = slack_ns > 1000;
  if (lower) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  if (lower) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack_ns), 0, 0, 0);
#else
  std::this_thread::sleep_for(std::chrono::microseconds(us));
#endif
}

/// Waits before poll number `polls` + 1 (counted from 0): the first polls
/// follow each other at once (a peer a microsecond behind is then found
/// without a system call; docs/distributed.md has the small collectives'
/// times both ways), the next ones only yield the core, later ones sleep
/// 10 us longer each time, up to `longest_us`, so that a long wait leaves
/// the core to the workers.
inline void back_off(int polls, std::int64_t longest_us) {
  constexpr int spins = 64;    // a few microseconds of polls
  constexpr int yields = 256;  // then a few hundred microseconds
  if (polls < spins) return;
  if (polls < spins + yields) {
    std::this_thread::yield();
    return;
  }
  const std::int64_t grown = 10 * std::int64_t(polls - spins - yields + 1);
  sleep_us(std::min(grown, longest_us));
}

}  // namespace deft::detail
