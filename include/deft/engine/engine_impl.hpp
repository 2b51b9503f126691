// The scheduler's internals (engine/engine.hpp declares them): flushing and
// backpressure, cancelling overwritten work, submitting a task's graph,
// running tasks on the calling thread or the workers. Only engine.hpp
// includes this file, at its end, where Engine is complete.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace deft::detail {

inline Engine::Engine() {
  int workers = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* env = std::getenv("DEFT_NUM_WORKERS")) {
    const int n = std::atoi(env);
    if (n >= 1) workers = n;
    else std::fprintf(stderr, "deft: ignoring DEFT_NUM_WORKERS=%s (want a positive integer)\n", env);
  }
  if (const char* env = std::getenv("DEFT_ENGINE")) {
    if (std::strcmp(env, "synchronous") == 0 || std::strcmp(env, "naive") == 0) mode_ = engine::Mode::synchronous;
    else if (std::strcmp(env, "deferred") != 0)
      std::fprintf(stderr, "deft: ignoring DEFT_ENGINE=%s (want 'deferred' or 'synchronous')\n", env);
  }
  replace_pool_locked(std::make_unique<ThreadPool>(workers < 1 ? 1 : workers, &Engine::run));
}

inline void Engine::shutdown() {
  std::unique_lock lk(m_);
  ++draining_;
  done_cv_.wait(lk, [&] { return inflight_tasks_ == 0; });
  --draining_;
  shut_down_ = true;
  auto old = replace_pool_locked(nullptr);
  lk.unlock();
  old.reset();
}

inline void Engine::drain_locked(Lock& lk) {
  Ready ready;
  if (submit_all_locked(ready)) dispatch_locked(lk, ready, true);
  else help_locked(lk, ready, [] { return false; });
  if (inflight_tasks_ == 0) return;
  ++draining_;
  done_cv_.wait(lk, [&] { return inflight_tasks_ == 0; });
  --draining_;
}

inline bool Engine::add_recorded_locked(const std::shared_ptr<Task>& t, Ready& ready) {
  auto& c = counters();
  c.count_recorded(t->bytes);
  t->counted = true;
  if (!t->listed) {
    t->listed = true;
    recorded_.push_back(t);
  }
  const auto live = c.live_tasks();
  if (recorded_.size() > 2 * live + 64) compact_recorded();
  if (live > limits_.max_recorded_tasks || c.live_bytes() > limits_.max_recorded_bytes) {
    c.flushes.add(1);
    const bool small = submit_all_locked(ready);
    if (small) c.flushes_run_here.add(1);
    return small;
  }
  return true;
}

inline void Engine::throttle_locked(Lock& lk) {
  if (!over_inflight_bound()) return;
  counters().backpressure_waits.add(1);
  ++throttled_;
  done_cv_.wait(lk, [&] { return below_resume_mark(); });
  --throttled_;
}

inline bool Engine::over_inflight_bound() const {
  return inflight_tasks_ > limits_.max_inflight_tasks || inflight_bytes_ > limits_.max_inflight_bytes;
}

inline bool Engine::below_resume_mark() const {
  return inflight_tasks_ <= limits_.max_inflight_tasks / 2 && inflight_bytes_ <= limits_.max_inflight_bytes / 2;
}

inline void Engine::cancel_overwritten_locked(const std::shared_ptr<Task>& prev, Task& next, TaskList<4>& cancelled) {
  if (prev->finished()) return;
  const auto out = prev->output.lock();
  auto& c = counters();
  TaskList<4> writers;
  writers.push_back(prev);
  while (!writers.empty()) {
    auto w = std::move(writers.back());
    writers.pop_back();
    if (w->finished()) continue;
    if (w->state.load(std::memory_order_relaxed) != Task::State::recorded) {
      next.deps.push_back(std::move(w));
      continue;
    }
    w->state.store(Task::State::cancelled, std::memory_order_release);
    c.count_left_recorded(w->bytes);
    c.count_finished(w->bytes);
    c.discarded.add(1);
    for (const auto& d : w->deps)
      if (out && d->output.lock() == out) writers.push_back(d);
    cancelled.push_back(std::move(w));
  }
}

inline void Engine::compact_recorded() {
  std::erase_if(recorded_, [](const std::weak_ptr<Task>& w) {
    auto t = w.lock();
    if (!t) return true;
    if (t->state.load(std::memory_order_relaxed) == Task::State::recorded) return false;
    t->listed = false;
    return true;
  });
}

inline bool Engine::submit_all_locked(Ready& ready) {
  std::size_t tasks = 0, work = 0;
  bool hand_off = false;
  for (auto& w : recorded_)
    if (auto t = w.lock()) {
      t->listed = false;
      submit_locked(t, ready, tasks, work, hand_off);
    }
  recorded_.clear();
  return !hand_off && work <= tasks * thresholds::inline_task_work;
}

inline bool Engine::runnable_alone(const Task& t) {
  if (t.state.load(std::memory_order_relaxed) != Task::State::recorded) return false;
  for (const auto& d : t.deps)
    if (!d->finished()) return false;
  return true;
}

inline void Engine::start_locked(Task& t) {
  t.state.store(Task::State::submitted, std::memory_order_relaxed);
  counters().count_left_recorded(t.bytes);
  ++inflight_tasks_;
  inflight_bytes_ += t.bytes;
  t.pending = 0;
}

inline void Engine::submit_locked(const std::shared_ptr<Task>& root, Ready& ready, std::size_t& tasks,
                                  std::size_t& work, bool& hand_off) {
  auto& stack = submit_stack_;  // reused: no allocation per sync point
  stack.push_back(root);
  while (!stack.empty()) {
    auto t = std::move(stack.back());
    stack.pop_back();
    if (t->state.load(std::memory_order_relaxed) != Task::State::recorded) continue;
    start_locked(*t);
    ++tasks;
    work += t->work;
    hand_off = hand_off || t->hand_off;
    for (const auto& d : t->deps) {
      if (d->finished()) continue;
      d->successors.push_back(t);
      ++t->pending;
      if (d->state.load(std::memory_order_relaxed) == Task::State::recorded) stack.push_back(d);
    }
    if (t->pending == 0) ready.push_back(std::move(t));
  }
}

inline void Engine::submit_locked(const std::shared_ptr<Task>& root, Ready& ready) {
  std::size_t tasks = 0, work = 0;
  bool hand_off = false;
  submit_locked(root, ready, tasks, work, hand_off);
}

template <class Done>
inline void Engine::help_locked(Lock& lk, Ready& ready, Done done) {
  while (!done() && !ready.empty()) {
    auto next = std::move(ready.back());
    ready.pop_back();
    dispatch_locked(lk, ready);  // the rest run in parallel on the workers
    lk.unlock();
    execute(next, ready, lk);
  }
  dispatch_locked(lk, ready);
}

inline void Engine::dispatch_locked(Lock& lk, Ready& ready, bool here) {
  if (ready.empty()) return;
  if (pool_ && !here) {
    pool_->push(ready);
    return;
  }
  while (!ready.empty()) {
    auto t = std::move(ready.back());
    ready.pop_back();
    lk.unlock();
    execute(t, ready, lk);
  }
}

inline std::unique_ptr<ThreadPool> Engine::replace_pool_locked(std::unique_ptr<ThreadPool> next) {
  running_pool_.store(next.get(), std::memory_order_release);
  std::swap(pool_, next);
  return next;
}

inline void Engine::run(std::shared_ptr<Task> t) {
  Engine& e = get();
  Ready ready;
  std::unique_lock lk(e.m_, std::defer_lock);
  for (;;) {
    e.execute(t, ready, lk);
    if (ready.empty()) return;
    // Keep one successor on this thread (its inputs are hot in cache).
    t = std::move(ready.back());
    ready.pop_back();
    e.dispatch_locked(lk, ready);
    lk.unlock();
  }
}

inline void Engine::execute(const std::shared_ptr<Task>& t, Ready& ready, Lock& lk, Buffer* held) {
  enum class Outcome { run, failed, skipped, discarded } outcome = Outcome::run;
  std::exception_ptr err = t->inherited_error;
  for (const auto& d : t->deps)
    if (!err && d->error) err = d->error;
  // The output, locked unless the caller holds it; released before the
  // engine's lock is taken (the last reference frees the buffer).
  if (WriterHold hold(t->output, held); Buffer* out = hold.get()) {
    if (err) {
      outcome = Outcome::skipped;
    } else {
      try {
        TaskSlice slice(*t);  // profiler: one relaxed load unless engine::trace_to is on
        if (out->device.type == DeviceType::cpu) {
          out->allocate();
          t->execute(*out);
        } else {
          lanes_.run(*t, *out);
        }
      } catch (...) {
        err = std::current_exception();
        outcome = Outcome::failed;
      }
    }
    out->error = err;
  } else {
    outcome = Outcome::discarded;  // nobody can read the result
    err = nullptr;
  }
  t->error = err;
  t->release_closure();
  t->deps.clear();
  lk.lock();
  auto& c = counters();
  c.count_finished(t->bytes);
  (outcome == Outcome::run       ? c.run
   : outcome == Outcome::failed  ? c.failed
   : outcome == Outcome::skipped ? c.skipped
                                 : c.discarded).add(1);
  const bool own_failure = outcome == Outcome::failed;
  t->state.store(Task::State::done, std::memory_order_release);
  --inflight_tasks_;
  inflight_bytes_ -= t->bytes;
  if (own_failure && !first_error_) first_error_ = err;
  for (auto& s : t->successors)
    if (--s->pending == 0) ready.push_back(std::move(s));
  t->successors.clear();
  // Wake sleepers only when one of their conditions may now hold: a
  // notification per finished task costs a futex call and a wake-up each.
  if (t->awaited || (draining_ > 0 && inflight_tasks_ == 0) || (throttled_ > 0 && below_resume_mark()))
    done_cv_.notify_all();
}

}  // namespace deft::detail
