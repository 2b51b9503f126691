// SpinLock: a lock for critical sections of a few instructions that are
// taken on every operation (a tensor handle's current version). Taking and
// releasing it is one locked instruction, where std::mutex costs two and two
// calls; a waiter spins briefly, then yields its core.
#pragma once
#include <atomic>
#include <thread>

#include "config.hpp"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#endif

namespace deft::detail {

/// Tells the core this thread is spinning (x86 `pause`, ARM `yield`).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield");
#endif
}

class SpinLock {
 public:
  void lock() noexcept {
    if (!held_.exchange(true, std::memory_order_acquire)) [[likely]] return;
    lock_contended();
  }
  bool try_lock() noexcept {
    return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  // Out of line: lock() is taken for every leaf of every statement.
  DEFT_NOINLINE void lock_contended() noexcept {
    while (held_.exchange(true, std::memory_order_acquire)) {
      // Read-only spinning keeps the line shared until the holder releases it.
      // A holder may sleep (a write waits for in-flight work while holding
      // it), so a waiter gives its core away after a short spin.
      for (int spins = 0; held_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 64) cpu_relax();
        else std::this_thread::yield();
      }
    }
  }

  std::atomic<bool> held_{false};
};

}  // namespace deft::detail
