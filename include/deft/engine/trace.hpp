// Trace: the tasks one thread records while a trace is active, kept as
// prototypes that can be recorded again (hybridize). A replay re-records a
// copy of every traced task with the same kernel, reading and writing the
// same buffers, so intermediate storage is allocated once and the front end
// (building expressions, checking shapes, autograd) is skipped.
#pragma once
#include <cstddef>
#include <memory>
#include <unordered_map>
#include <vector>

#include "task.hpp"

namespace deft::detail {

class Trace;

/// The trace the calling thread is recording into, if any.
inline Trace*& active_trace() {
  thread_local Trace* trace = nullptr;
  return trace;
}

class Trace {
 public:
  struct Step {
    std::shared_ptr<Task> prototype;  // never run: a copy is recorded per replay
    std::shared_ptr<Buffer> output;
    std::vector<std::size_t> inner;               // traced tasks it waits for
    std::vector<std::weak_ptr<Task>> outer;       // tasks recorded before the trace
  };

  /// Called by Engine::record for every task recorded while this trace is active.
  void capture(const Task& t) {
    Step s;
    s.prototype = t.clone();
    s.output = t.output.lock();
    for (const auto& d : t.deps) {
      const auto it = index_.find(d.get());
      if (it != index_.end()) s.inner.push_back(it->second);
      else s.outer.push_back(d);
    }
    index_.emplace(&t, steps_.size());
    steps_.push_back(std::move(s));
  }

  const std::vector<Step>& steps() const { return steps_; }
  static constexpr std::size_t none = std::size_t(-1);
  /// The step writing `b` if it is the only one and no step after it reads
  /// `b`, else `none`. A replay may give that step a new buffer each time:
  /// a block's output then reaches the caller without a copy.
  std::size_t sole_unread_writer(const Buffer* b) const {
    std::size_t found = none;
    for (std::size_t i = 0; i < steps_.size(); ++i)
      if (steps_[i].output.get() == b) {
        if (found != none) return none;
        found = i;
      }
    for (const auto& s : steps_)
      for (std::size_t j : s.inner)
        if (j == found) return none;
    return found;
  }
  /// The tasks of the latest replay: the next one must not overwrite a buffer they still read.
  std::vector<std::shared_ptr<Task>>& last_replay() { return last_; }
  /// Forgets the task identities of the tracing run (they are only needed while capturing).
  void seal() { index_.clear(); }

 private:
  std::vector<Step> steps_;
  std::unordered_map<const Task*, std::size_t> index_;
  std::vector<std::shared_ptr<Task>> last_;
};

/// Makes the calling thread record into `t` for the scope's lifetime.
class TraceScope {
 public:
  explicit TraceScope(Trace& t) : previous_(active_trace()) { active_trace() = &t; }
  ~TraceScope() {
    active_trace()->seal();
    active_trace() = previous_;
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* previous_;
};

}  // namespace deft::detail
