// Shared pieces of the stress, fault-injection and memory-bound tests: sizes
// that CI keeps small and a person can raise by environment variable, a
// watchdog that turns a hang into a failure with a diagnosis, and the
// process's resident memory.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

#include <unistd.h>

#include <deft/deft.hpp>

namespace stress {

/// The value of environment variable `name` (a positive integer), or `fallback`.
inline std::int64_t env_count(const char* name, std::int64_t fallback) {
  if (const char* v = std::getenv(name)) {
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (end != v && *end == '\0' && n > 0) return n;
    std::fprintf(stderr, "ignoring %s=%s (want a positive integer)\n", name, v);
  }
  return fallback;
}

/// The seed of a run: DEFT_STRESS_SEED, or `fallback` (CI runs are reproducible).
inline std::uint64_t env_seed(std::uint64_t fallback) {
  return static_cast<std::uint64_t>(env_count("DEFT_STRESS_SEED", static_cast<std::int64_t>(fallback)));
}

/// Aborts the process, after printing what it was doing and the engine's
/// counters, when the scope is not left within `limit`: a deadlock fails the
/// test quickly and says where instead of running into CTest's timeout.
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds limit) : what_(std::move(what)) {
    thread_ = std::thread([this, limit] {
      std::unique_lock lk(m_);
      if (cv_.wait_for(lk, limit, [this] { return done_; })) return;
      std::cerr << "watchdog: '" << what_ << "' made no progress for " << limit.count()
                << " s (deadlock?). Engine: " << deft::engine::stats() << std::endl;
      std::abort();
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lk(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// Resident set size of this process in bytes (Linux), 0 where unknown.
inline std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace stress
