// The engine's public controls: the global sync point wait_all(), workers,
// mode, bounds and counters (deft::engine). Each forwards to the one
// process-wide scheduler (engine/engine.hpp).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>

#include "engine.hpp"

namespace deft {

/// Sync point: runs all recorded work and waits for it; rethrows the first
/// failure since the previous wait_all() (MXNet's waitall).
inline void wait_all() {
  detail::refuse_sync_in_trace("wait_all()");
  std::exception_ptr failure;
  try {
    detail::Engine::get().wait_all();
  } catch (...) {
    failure = std::current_exception();
  }
  if (auto* gpus = detail::gpu_backend()) gpus->synchronize_all();  // GPU work runs after its task was queued
  if (failure) std::rethrow_exception(failure);
}

namespace engine {

inline void set_num_workers(int n) { detail::Engine::get().set_num_workers(n); }
/// How long an idle worker polls for new work before it sleeps (default
/// thresholds::worker_poll_ns). Polling makes bursts of small parallel loops
/// cheap to start; 0 makes idle workers sleep at once (a busy shared machine).
inline void set_worker_poll(std::chrono::nanoseconds d) {
  detail::ThreadPool::poll_ns().store(std::max<std::int64_t>(0, d.count()));
}
/// The current polling time of idle workers (see set_worker_poll).
inline std::chrono::nanoseconds worker_poll() { return std::chrono::nanoseconds(detail::ThreadPool::poll_ns().load()); }
inline int num_workers() { return detail::Engine::get().num_workers(); }
/// Switching to synchronous first finishes all recorded work.
inline void set_mode(Mode m) { detail::Engine::get().set_mode(m); }
inline Mode mode() { return detail::Engine::get().mode(); }
inline void set_limits(const Limits& l) { detail::Engine::get().set_limits(l); }
inline Limits limits() { return detail::Engine::get().limits(); }

inline Stats stats() {
  return detail::Engine::get().stats();
}

/// Zeroes the event counters and resets the peaks to the current levels.
inline void reset_stats() { detail::Engine::get().reset_stats(); }

}  // namespace engine
}  // namespace deft
