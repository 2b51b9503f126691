// The engine's profiler: a Chrome trace (JSON for Perfetto or chrome://tracing)
// of the tasks that run, one lane per thread that ran tasks (each worker, and
// each thread that ran tasks itself while waiting at a sync point), one slice
// per task with its name, output size and dependency count, and one "help"
// slice per stretch a worker spent on another task's split loop.
//
// Off by default. Off, a task pays one relaxed atomic load (TaskSlice,
// engine/task_slice.hpp) and a split loop one more; on, two clock reads and a
// short critical section per slice. Include this header to profile
// (engine::trace_to, ScopedTrace); deft/deft.hpp does not.
#pragma once
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "task_slice.hpp"
#include "../core/thresholds.hpp"

namespace deft::detail {

/// Writes `s` as a JSON string body (quotes, backslashes and control characters escaped).
inline void json_escape(std::string& out, const char* s) {
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
}

/// Opens `path` for writing or raises std::runtime_error naming it and the reason.
inline std::ofstream open_for_writing(const std::string& path, const char* who) {
  std::ofstream f(path, std::ios::out | std::ios::trunc);
  if (!f) raise<std::runtime_error>(who, ": cannot open '", path, "' for writing: ", std::strerror(errno));
  return f;
}

class Profiler final : public SliceSink {
 public:
  /// Never destroyed: workers may still finish tasks while the process exits.
  static Profiler& get() {
    static Profiler* p = new Profiler();
    return *p;
  }

  /// Starts a trace into `path`; returns its number (ScopedTrace stops only its own).
  std::uint64_t start(const std::string& path) {
    std::lock_guard lk(m_);
    if (active_)
      raise<std::logic_error>("engine::trace_to('", path, "'): already tracing to '", path_,
                              "'; call engine::trace_stop() first");
    open_for_writing(path, "engine::trace_to");  // a bad path fails here, not at exit
    if (!exit_hook_) {
      std::atexit([] { get().stop_at_exit(); });
      exit_hook_ = true;
    }
    path_ = path;
    slices_.clear();
    lanes_.clear();
    dropped_ = 0;
    origin_ = Clock::now();
    active_ = true;
    slice_sink().store(this, std::memory_order_release);
    return ++generation_;
  }

  /// Stops recording and writes the file; returns the number of task slices
  /// written. With `only` (a number from start()) it stops that trace only,
  /// and does nothing if another or none is recording.
  std::size_t stop(std::uint64_t only = 0) {
    std::unique_lock lk(m_);
    if (only && (!active_ || generation_ != only)) return 0;
    if (!active_) raise<std::logic_error>("engine::trace_stop(): no trace is being recorded (start one with engine::trace_to)");
    slice_sink().store(nullptr, std::memory_order_relaxed);
    active_ = false;
    auto slices = std::move(slices_);
    auto lanes = std::move(lanes_);
    const auto path = path_;
    const auto dropped = std::exchange(dropped_, 0);
    lk.unlock();
    write(path, slices, lanes, dropped);
    return std::size_t(std::count_if(slices.begin(), slices.end(), [](const Slice& s) { return !s.help; }));
  }

  bool active() {
    std::lock_guard lk(m_);
    return active_;
  }

  /// One finished task (called by TaskSlice), or with `help` one stretch of
  /// another thread's task run by this thread (HelpSlice).
  void add(ProfiledTask t, std::size_t bytes, Clock::time_point begin, Clock::time_point end, std::size_t deps,
           bool failed, bool help) override {
    std::lock_guard lk(m_);
    if (!active_ || begin < origin_) return;  // began before this trace started
    if (slices_.size() >= thresholds::max_trace_slices) {
      ++dropped_;
      return;
    }
    slices_.push_back(Slice{t.name, bytes, deps, t.id, lane_of_this_thread(), micros(begin), micros(end), failed, help});
  }

 private:
  struct Slice {
    const char* name;
    std::size_t bytes, deps;
    std::uint64_t task;
    int lane;
    double begin_us, end_us;
    bool failed, help;
  };
  struct Lane {
    std::thread::id thread;
    int worker;  // the pool index, or -1 for a thread outside the pool
  };

  double micros(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }

  int lane_of_this_thread() {
    const auto me = std::this_thread::get_id();
    for (std::size_t i = 0; i < lanes_.size(); ++i)
      if (lanes_[i].thread == me) return int(i);
    lanes_.push_back(Lane{me, worker_index()});
    return int(lanes_.size() - 1);
  }

  void stop_at_exit() noexcept {
    try {
      if (active()) stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  static void write(const std::string& path, const std::vector<Slice>& slices, const std::vector<Lane>& lanes,
                    std::size_t dropped) {
    // Workers first (in pool order), then the other threads in order of appearance.
    std::vector<int> order(lanes.size());
    for (std::size_t i = 0; i < lanes.size(); ++i) order[i] = int(i);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const int wa = lanes[a].worker, wb = lanes[b].worker;
      if ((wa < 0) != (wb < 0)) return wa >= 0;
      return wa >= 0 && wa < wb;
    });
    std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    out += R"({"ph":"M","pid":1,"tid":0,"name":"process_name","args":{"name":"deft engine"}})";
    char buf[256];
    int callers = 0;
    for (std::size_t rank = 0; rank < order.size(); ++rank) {
      const int lane = order[rank];
      if (lanes[lane].worker >= 0) std::snprintf(buf, sizeof buf, "worker %d", lanes[lane].worker);
      else std::snprintf(buf, sizeof buf, "caller thread %d", ++callers);
      out += ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(lane + 1) +
             ",\"name\":\"thread_name\",\"args\":{\"name\":\"" + buf + "\"}}";
      out += ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(lane + 1) +
             ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(rank) + "}}";
    }
    for (const auto& s : slices) {
      out += ",\n{\"ph\":\"X\",\"cat\":\"";
      out += s.help ? "help" : "task";
      out += "\",\"pid\":1,\"tid\":" + std::to_string(s.lane + 1) + ",\"name\":\"";
      json_escape(out, s.name);
      if (s.help) {  // a worker running chunks of another thread's task: "helps" names that task
        std::snprintf(buf, sizeof buf, " (help)\",\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"helps\":%llu}}", s.begin_us,
                      s.end_us - s.begin_us, static_cast<unsigned long long>(s.task));
      } else {
        std::snprintf(buf, sizeof buf,
                      "\",\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"bytes\":%zu,\"deps\":%zu,\"task\":%llu,\"status\":\"%s\"}}",
                      s.begin_us, s.end_us - s.begin_us, s.bytes, s.deps, static_cast<unsigned long long>(s.task),
                      s.failed ? "failed" : "ok");
      }
      out += buf;
    }
    out += "\n],\"otherData\":{\"slices\":" + std::to_string(slices.size()) +
           ",\"dropped_slices\":" + std::to_string(dropped) + "}}\n";
    auto f = open_for_writing(path, "engine::trace_stop");
    f << out;
    f.flush();
    if (!f) raise<std::runtime_error>("engine::trace_stop: writing '", path, "' failed: ", std::strerror(errno));
  }

  std::mutex m_;
  bool active_ = false, exit_hook_ = false;
  std::uint64_t generation_ = 0;
  std::string path_;
  Clock::time_point origin_;
  std::vector<Slice> slices_;
  std::vector<Lane> lanes_;
  std::size_t dropped_ = 0;
};

}  // namespace deft::detail

namespace deft::engine {

/// Starts recording a Chrome trace of the tasks that run from now on; the
/// file is written by trace_stop() (or ~ScopedTrace, or at exit if still
/// recording). `path` is opened at once, so a bad path throws
/// std::runtime_error here; std::logic_error if a trace is already recording.
/// Only tasks that *run* are traced: deferred work appears when a sync point
/// runs it, so end the traced region with wait_all() to include everything.
inline void trace_to(const std::string& path) { (void)detail::Profiler::get().start(path); }

/// Stops recording and writes the trace file; returns how many task slices it
/// holds (help slices not counted). std::logic_error when no trace is recording; std::runtime_error
/// naming the file when it cannot be written.
inline std::size_t trace_stop() { return detail::Profiler::get().stop(); }

/// True between trace_to() and trace_stop().
inline bool tracing() { return detail::Profiler::get().active(); }

/// Records a trace for its lifetime: trace_to(path) now, trace_stop() when it
/// goes out of scope (a write failure then is printed to stderr, not thrown).
class ScopedTrace {
 public:
  /// Starts tracing into `path` (see trace_to for the errors).
  explicit ScopedTrace(const std::string& path) : generation_(detail::Profiler::get().start(path)) {}
  /// Writes the file unless this trace was already stopped (trace_stop()).
  ~ScopedTrace() {
    try {
      detail::Profiler::get().stop(generation_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }
  ScopedTrace(const ScopedTrace&) = delete;
  ScopedTrace& operator=(const ScopedTrace&) = delete;

 private:
  std::uint64_t generation_;
};

}  // namespace deft::engine
