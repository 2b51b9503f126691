// What every task run pays for the profiler (engine/profiler.hpp): a relaxed
// load of the recording sink, null unless a Chrome trace records. The
// engine's threads time their tasks (TaskSlice) and their stretches of
// other threads' split loops (HelpSlice) into it; programs that never
// profile do not include the recorder.
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>

#include "task.hpp"

namespace deft::detail {

/// The calling thread's index in the engine's pool, or -1 outside it (set by ThreadPool).
inline int& worker_index() {
  thread_local int index = -1;
  return index;
}

/// A task as the profiler names it: its name and a number unique within one
/// trace (addresses are not: a freed task's memory is reused by the next).
struct ProfiledTask {
  const char* name = nullptr;  // null: not traced
  std::uint64_t id = 0;
};

/// The task this thread is running, while a trace records.
inline ProfiledTask& current_profiled_task() {
  thread_local ProfiledTask task;
  return task;
}

/// Where the slices go while a trace records (the Profiler).
class SliceSink {
 public:
  using Clock = std::chrono::steady_clock;
  /// One finished task, or with `help` one stretch of another thread's task run by this thread.
  virtual void add(ProfiledTask t, std::size_t bytes, Clock::time_point begin, Clock::time_point end,
                   std::size_t deps, bool failed, bool help) = 0;

 protected:
  ~SliceSink() = default;
};

/// The recording sink, null while no trace records. A sink is never
/// destroyed: a worker may still hand it a slice after the trace stopped.
inline std::atomic<SliceSink*>& slice_sink() {
  static std::atomic<SliceSink*> sink{nullptr};
  return sink;
}

/// A number for a task about to run (unique within a process, so within a trace).
inline std::uint64_t next_profiled_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

/// Times one task run for the profiler; when tracing is off it costs one relaxed load.
class TaskSlice {
 public:
  explicit TaskSlice(const Task& t) noexcept : sink_(slice_sink().load(std::memory_order_relaxed)) {
    if (!sink_) return;
    bytes_ = t.bytes;
    deps_ = t.deps.size();
    unwinding_ = std::uncaught_exceptions();
    me_ = ProfiledTask{t.name, next_profiled_id()};
    outer_ = std::exchange(current_profiled_task(), me_);
    begin_ = SliceSink::Clock::now();
  }
  ~TaskSlice() {
    if (!sink_) return;
    const auto end = SliceSink::Clock::now();
    current_profiled_task() = outer_;
    try {
      sink_->add(me_, bytes_, begin_, end, deps_, std::uncaught_exceptions() > unwinding_, false);
    } catch (...) {  // out of memory for the slice: the trace misses it, the task's own outcome stands
    }
  }
  TaskSlice(const TaskSlice&) = delete;
  TaskSlice& operator=(const TaskSlice&) = delete;

 private:
  SliceSink* sink_;
  ProfiledTask me_, outer_;
  std::size_t bytes_ = 0, deps_ = 0;
  int unwinding_ = 0;
  SliceSink::Clock::time_point begin_;
};

/// The task a split loop started on this thread belongs to, for its helpers'
/// slices; unnamed (after one relaxed load) when no trace records.
inline ProfiledTask profiled_task() noexcept {
  return slice_sink().load(std::memory_order_relaxed) ? current_profiled_task() : ProfiledTask{};
}

/// Times a worker's stretch of chunks of `owner`'s split loop (no-op for an unnamed owner).
class HelpSlice {
 public:
  explicit HelpSlice(ProfiledTask owner) noexcept : owner_(owner) {
    if (owner_.name) begin_ = SliceSink::Clock::now();
  }
  ~HelpSlice() {
    if (!owner_.name) return;
    SliceSink* sink = slice_sink().load(std::memory_order_relaxed);
    if (!sink) return;  // the trace stopped meanwhile
    try {
      sink->add(owner_, 0, begin_, SliceSink::Clock::now(), 0, false, true);
    } catch (...) {  // the trace misses this slice; the loop's result stands
    }
  }
  HelpSlice(const HelpSlice&) = delete;
  HelpSlice& operator=(const HelpSlice&) = delete;

 private:
  ProfiledTask owner_;
  SliceSink::Clock::time_point begin_;
};

}  // namespace deft::detail
