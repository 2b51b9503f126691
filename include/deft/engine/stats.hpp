// Counters the engine keeps about its work, and the snapshot users read.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ostream>

namespace deft::engine {

/// A snapshot of the engine's counters (see engine::stats()).
struct Stats {
  std::uint64_t tasks_recorded = 0;   ///< tasks created by assignments, reductions, products...
  std::uint64_t tasks_run = 0;        ///< tasks whose kernel ran to completion
  std::uint64_t tasks_discarded = 0;  ///< tasks never run because nobody could read their result
  std::uint64_t tasks_failed = 0;     ///< tasks whose kernel threw
  std::uint64_t tasks_skipped = 0;    ///< tasks not run because an input had failed
  std::uint64_t flushes = 0;          ///< submissions forced by the recorded-work bound
  std::uint64_t backpressure_waits = 0;  ///< times a recording thread waited for in-flight work
  std::size_t tasks_pending = 0;      ///< recorded or in-flight tasks now (not yet run or discarded)
  std::size_t peak_tasks_pending = 0; ///< the most tasks unfinished work ever held at once
  std::size_t bytes_pending = 0;      ///< output bytes of recorded or in-flight tasks now
  std::size_t peak_bytes_pending = 0; ///< the most bytes unfinished work ever held at once
  std::size_t bytes_allocated = 0;    ///< bytes of tensor storage alive now
  std::size_t peak_bytes_allocated = 0; ///< the most tensor storage ever alive at once

  friend std::ostream& operator<<(std::ostream& os, const Stats& s) {
    return os << "recorded " << s.tasks_recorded << ", run " << s.tasks_run << ", discarded "
              << s.tasks_discarded << ", failed " << s.tasks_failed << ", skipped " << s.tasks_skipped
              << ", flushes " << s.flushes << ", backpressure waits " << s.backpressure_waits
              << ", peak pending " << s.peak_tasks_pending << " tasks / " << s.peak_bytes_pending << " B, allocated " << s.bytes_allocated
              << " B (peak " << s.peak_bytes_allocated << " B)";
  }
};

}  // namespace deft::engine

namespace deft::detail {

/// Process-wide counters; atomics so that any thread may update them.
struct Counters {
  std::atomic<std::uint64_t> recorded{0}, run{0}, discarded{0}, failed{0}, skipped{0};
  std::atomic<std::uint64_t> flushes{0}, backpressure_waits{0};
  std::atomic<std::size_t> pending_tasks{0}, peak_pending_tasks{0};
  std::atomic<std::size_t> pending_bytes{0}, peak_pending_bytes{0};
  std::atomic<std::size_t> allocated_bytes{0}, peak_allocated_bytes{0};
  // Tasks recorded but not yet submitted, and their output bytes (drive flushing).
  std::atomic<std::size_t> recorded_live{0}, recorded_live_bytes{0};

  static void raise_peak(std::atomic<std::size_t>& peak, std::size_t now) {
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {}
  }
  /// A task writing `b` bytes was recorded / has finished or been discarded.
  void add_pending(std::size_t b) {
    raise_peak(peak_pending_tasks, pending_tasks.fetch_add(1, std::memory_order_relaxed) + 1);
    raise_peak(peak_pending_bytes, pending_bytes.fetch_add(b, std::memory_order_relaxed) + b);
  }
  void sub_pending(std::size_t b) {
    pending_tasks.fetch_sub(1, std::memory_order_relaxed);
    pending_bytes.fetch_sub(b, std::memory_order_relaxed);
  }
  void add_allocated(std::size_t b) {
    raise_peak(peak_allocated_bytes, allocated_bytes.fetch_add(b, std::memory_order_relaxed) + b);
  }
  void sub_allocated(std::size_t b) { allocated_bytes.fetch_sub(b, std::memory_order_relaxed); }
};

inline Counters& counters() {
  static Counters c;  // trivially destructible: safe to touch during static destruction
  return c;
}

}  // namespace deft::detail
