// LightMutex: the engine's lock. Every statement takes it two or three times
// (record, sync point, finish), each time for a few dozen instructions;
// std::mutex costs a call into pthread to lock and another to unlock (about
// 60 instructions a pair), this one an inline atomic each way. A waiter spins
// briefly (the holder is about to leave), then sleeps on the atomic (C++20
// wait: a futex on Linux), and unlock wakes a sleeper only when there is one.
#pragma once
#include <atomic>

#include "spin_lock.hpp"

namespace deft::detail {

class LightMutex {
 public:
  void lock() noexcept {
    int expected = free;
    if (!state_.compare_exchange_strong(expected, held, std::memory_order_acquire, std::memory_order_relaxed))
      lock_contended();
  }
  bool try_lock() noexcept {
    int expected = free;
    return state_.compare_exchange_strong(expected, held, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (state_.exchange(free, std::memory_order_release) == held_with_sleepers) state_.notify_one();
  }

 private:
  static constexpr int free = 0, held = 1, held_with_sleepers = 2;

  DEFT_NOINLINE void lock_contended() noexcept {
    for (int spins = 0; spins < 100; ++spins) {
      cpu_relax();
      int expected = free;
      if (state_.load(std::memory_order_relaxed) == free &&
          state_.compare_exchange_weak(expected, held, std::memory_order_acquire, std::memory_order_relaxed))
        return;
    }
    // Mark the lock as having a sleeper before sleeping, so that its holder's
    // unlock wakes one; a thread that takes it this way keeps the mark (there
    // may be other sleepers), costing at most one needless wake-up.
    while (state_.exchange(held_with_sleepers, std::memory_order_acquire) != free)
      state_.wait(held_with_sleepers, std::memory_order_relaxed);
  }

  std::atomic<int> state_{free};
};

}  // namespace deft::detail
