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
  std::uint64_t flushes_run_here = 0; ///< of those, small enough to run on the recording thread (thresholds::inline_task_work)
  std::uint64_t backpressure_waits = 0;  ///< times a recording thread waited for in-flight work
  std::size_t tasks_pending = 0;      ///< recorded or in-flight tasks now (not yet run or discarded)
  std::size_t peak_tasks_pending = 0; ///< the most tasks unfinished work ever held at once
  std::size_t bytes_pending = 0;      ///< storage that recorded or in-flight tasks allocate (none for in-place writes)
  std::size_t peak_bytes_pending = 0; ///< the most bytes unfinished work ever held at once
  std::size_t bytes_allocated = 0;    ///< bytes of tensor storage alive now
  std::size_t peak_bytes_allocated = 0; ///< the most tensor storage ever alive at once

  friend std::ostream& operator<<(std::ostream& os, const Stats& s) {
    return os << "recorded " << s.tasks_recorded << ", run " << s.tasks_run << ", discarded "
              << s.tasks_discarded << ", failed " << s.tasks_failed << ", skipped " << s.tasks_skipped
              << ", flushes " << s.flushes << " (" << s.flushes_run_here << " run here), backpressure waits " << s.backpressure_waits
              << ", peak pending " << s.peak_tasks_pending << " tasks / " << s.peak_bytes_pending << " B, allocated " << s.bytes_allocated
              << " B (peak " << s.peak_bytes_allocated << " B)";
  }
};

}  // namespace deft::engine

namespace deft::detail {

/// A counter changed only under the engine's lock: a relaxed load and store
/// instead of a locked read-modify-write, whose cache line would otherwise
/// bounce between the recording thread and the workers on every task.
/// Any thread may read it.
struct GuardedCount {
  std::atomic<std::uint64_t> v{0};
  void add(std::uint64_t d) { v.store(v.load(std::memory_order_relaxed) + d, std::memory_order_relaxed); }
  void sub(std::uint64_t d) { v.store(v.load(std::memory_order_relaxed) - d, std::memory_order_relaxed); }
  void set(std::uint64_t x) { v.store(x, std::memory_order_relaxed); }
  std::uint64_t get() const { return v.load(std::memory_order_relaxed); }
};

/// Process-wide counters. Those of the task life cycle change under the
/// engine's lock; a recorded task freed unrun by its last owner (on any
/// thread, without that lock) is counted apart as "dropped" and subtracted.
struct Counters {
  // Under the engine's lock.
  GuardedCount recorded, run, discarded, failed, skipped, flushes, flushes_run_here, backpressure_waits;
  GuardedCount recorded_live, recorded_live_bytes;  // recorded, not yet submitted (drives flushing)
  GuardedCount pending_tasks, pending_bytes;        // recorded or in flight
  GuardedCount peak_pending_tasks, peak_pending_bytes;
  std::uint64_t dropped_at_reset = 0;
  // Anywhere: recorded tasks freed unrun.
  alignas(64) std::atomic<std::uint64_t> dropped_tasks{0}, dropped_bytes{0};
  // Anywhere: tensor storage.
  alignas(64) std::atomic<std::size_t> allocated_bytes{0}, peak_allocated_bytes{0};

  static void raise_peak(std::atomic<std::size_t>& peak, std::size_t now) {
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {}
  }
  // Dropped tasks were counted recorded (under the lock) before they were
  // dropped, so these differences do not go below zero.
  std::uint64_t live_tasks() const { return recorded_live.get() - dropped_tasks.load(std::memory_order_relaxed); }
  std::uint64_t live_bytes() const { return recorded_live_bytes.get() - dropped_bytes.load(std::memory_order_relaxed); }
  std::uint64_t now_pending_tasks() const { return pending_tasks.get() - dropped_tasks.load(std::memory_order_relaxed); }
  std::uint64_t now_pending_bytes() const { return pending_bytes.get() - dropped_bytes.load(std::memory_order_relaxed); }

  /// Under the engine's lock: a task writing `b` bytes was recorded.
  void count_recorded(std::size_t b) {
    recorded.add(1);
    recorded_live.add(1);
    recorded_live_bytes.add(b);
    pending_tasks.add(1);
    pending_bytes.add(b);
    if (const auto n = now_pending_tasks(); n > peak_pending_tasks.get()) peak_pending_tasks.set(n);
    if (const auto n = now_pending_bytes(); n > peak_pending_bytes.get()) peak_pending_bytes.set(n);
  }
  /// Under the engine's lock: a recorded task was submitted or cancelled.
  void count_left_recorded(std::size_t b) {
    recorded_live.sub(1);
    recorded_live_bytes.sub(b);
  }
  /// Under the engine's lock: a task ran, failed, was skipped or cancelled.
  void count_finished(std::size_t b) {
    pending_tasks.sub(1);
    pending_bytes.sub(b);
  }
  /// Anywhere, without the lock: a recorded task was freed unrun.
  void count_dropped(std::size_t b) {
    dropped_tasks.fetch_add(1, std::memory_order_relaxed);
    dropped_bytes.fetch_add(b, std::memory_order_relaxed);
  }

  void add_allocated(std::size_t b) {
    raise_peak(peak_allocated_bytes, allocated_bytes.fetch_add(b, std::memory_order_relaxed) + b);
  }
  void sub_allocated(std::size_t b) { allocated_bytes.fetch_sub(b, std::memory_order_relaxed); }

  /// What engine::stats() reports (under the engine's lock).
  engine::Stats snapshot() const {
    engine::Stats s;
    s.tasks_recorded = recorded.get();
    s.tasks_run = run.get();
    s.tasks_discarded = discarded.get() + dropped_tasks.load() - dropped_at_reset;
    s.tasks_failed = failed.get();
    s.tasks_skipped = skipped.get();
    s.flushes = flushes.get();
    s.flushes_run_here = flushes_run_here.get();
    s.backpressure_waits = backpressure_waits.get();
    s.tasks_pending = now_pending_tasks();
    s.peak_tasks_pending = peak_pending_tasks.get();
    s.bytes_pending = now_pending_bytes();
    s.peak_bytes_pending = peak_pending_bytes.get();
    s.bytes_allocated = allocated_bytes.load();
    s.peak_bytes_allocated = peak_allocated_bytes.load();
    return s;
  }
  /// Zeroes the event counters and resets the peaks to the current levels.
  void reset() {
    for (auto* n : {&recorded, &run, &discarded, &failed, &skipped, &flushes, &flushes_run_here,
                    &backpressure_waits})
      n->set(0);
    dropped_at_reset = dropped_tasks.load();
    peak_pending_tasks.set(now_pending_tasks());
    peak_pending_bytes.set(now_pending_bytes());
    peak_allocated_bytes.store(allocated_bytes.load());
  }
};

inline Counters& counters() {
  static Counters c;  // trivially destructible: safe to touch during static destruction
  return c;
}

}  // namespace deft::detail
