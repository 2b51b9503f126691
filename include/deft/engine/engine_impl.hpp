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

DEFT_DECL Engine& Engine::get() {
  static Engine* engine = [] {
    auto* e = new Engine();
    std::atexit([] { get().shutdown(); });
    return e;
  }();
  return *engine;
}

DEFT_DECL void Engine::record(const std::shared_ptr<Task>& t, const std::shared_ptr<Task>& overwritten) {
  if (TraceRecorder* trace = active_trace()) trace->capture(t);
  auto& c = counters();
  TaskList<4> cancelled;  // in place: a tiny op's overwrite allocates nothing
  if (mode_.load(std::memory_order_relaxed) == engine::Mode::synchronous) {  // run it here, now
    {
      std::lock_guard lk(m_);
      if (overwritten) cancel_overwritten_locked(overwritten, *t, cancelled);
      c.count_recorded(t->bytes);
      t->counted = true;
    }
    wait(t);
    if (t->error) {
      std::lock_guard lk(m_);
      if (first_error_ == t->error) first_error_ = nullptr;  // reported here, not again by wait_all
      std::rethrow_exception(t->error);
    }
    return;
  }
  {
    Ready ready;
    std::unique_lock lk(m_);
    if (overwritten) cancel_overwritten_locked(overwritten, *t, cancelled);
    const bool small = add_recorded_locked(t, ready);
    dispatch_locked(lk, ready, small);
    throttle_locked(lk);
  }
  for (auto& w : cancelled) w->release_closure();  // outside the lock: it may free a chain of tasks
}

DEFT_NOINLINE DEFT_DECL bool Engine::record_again_with(const std::shared_ptr<Task>& t, void* context, void (*rebuild)(void*, Task&)) {
  if (active_trace() || mode_.load(std::memory_order_relaxed) == engine::Mode::synchronous) return false;
  Ready ready;
  std::unique_lock lk(m_);
  // Under the lock: the holders t had (a worker, a reader's deps) all let
  // it go after their last critical section on it, and the weak references
  // (recorded_, a trace's) read only its state until it is recorded again.
  if (t.use_count() != 1 || t->state.load(std::memory_order_relaxed) != Task::State::done || t->error) return false;
  rebuild(context, *t);
  t->state.store(Task::State::recorded, std::memory_order_release);
  const bool small = add_recorded_locked(t, ready);
  dispatch_locked(lk, ready, small);
  throttle_locked(lk);
  return true;
}

DEFT_DECL void Engine::record_all(const std::vector<std::shared_ptr<Task>>& tasks) {
  if (active_trace() || mode_.load(std::memory_order_relaxed) == engine::Mode::synchronous) {
    for (const auto& t : tasks) record(t);
    return;
  }
  Ready ready;
  std::unique_lock lk(m_);
  bool small = true;
  for (const auto& t : tasks) small = add_recorded_locked(t, ready) && small;
  dispatch_locked(lk, ready, small);
  throttle_locked(lk);
}

DEFT_DECL void Engine::wait(const std::shared_ptr<Task>& t, const std::shared_ptr<Buffer>& held) {
  if (t->finished()) return;
  Buffer* const output = held && same_owner(t->output, held) ? held.get() : nullptr;
  Ready ready;
  std::unique_lock lk(m_);
  // The usual sync point waits for the task recorded last: drop its entry
  // now, or its weak reference would keep the task's memory (shared with
  // its control block) from the allocator until compact_recorded().
  if (!recorded_.empty() && same_owner(recorded_.back(), t)) {
    t->listed = false;
    recorded_.pop_back();
  }
  if (runnable_alone(*t)) {  // the usual case: run it here, without submit_locked's work list
    start_locked(*t);
    lk.unlock();
    execute(t, ready, lk, output);
  } else {
    submit_locked(t, ready);
  }
  help_locked(lk, ready, [&] { return t->finished(); });
  if (t->finished()) return;
  t->awaited = true;
  done_cv_.wait(lk, [&] { return t->finished(); });
}

DEFT_DECL void Engine::wait_all() {
  std::unique_lock lk(m_);
  drain_locked(lk);
  auto e = std::exchange(first_error_, nullptr);
  lk.unlock();
  if (e) std::rethrow_exception(e);
}

DEFT_DECL void Engine::quiesce() {
  std::unique_lock lk(m_);
  drain_locked(lk);
}

DEFT_DECL std::exception_ptr Engine::quiesce_and_take_failure() {
  std::unique_lock lk(m_);
  drain_locked(lk);
  return std::exchange(first_error_, nullptr);
}

DEFT_DECL void Engine::restore_failure(std::exception_ptr e) {
  if (!e) return;
  std::lock_guard lk(m_);
  first_error_ = std::move(e);
}

DEFT_DECL void Engine::set_mode(engine::Mode m) {
  if (m == engine::Mode::synchronous) quiesce();
  mode_.store(m);
}

DEFT_DECL engine::Limits Engine::limits() {
  std::lock_guard lk(m_);
  return limits_;
}

DEFT_DECL void Engine::set_limits(const engine::Limits& l) {
  if (l.max_recorded_tasks == 0 || l.max_inflight_tasks == 0)
    raise("engine limits: task bounds must be at least 1");
  if (l.gpu_lanes < 1 || l.gpu_lanes > thresholds::gpu_lanes)
    raise("engine limits: gpu_lanes must be between 1 and ", thresholds::gpu_lanes, ", not ", l.gpu_lanes);
  std::lock_guard lk(m_);
  limits_ = l;
  lanes_.set_count(l.gpu_lanes);
}

DEFT_DECL engine::Stats Engine::stats() {
  std::lock_guard lk(m_);
  return counters().snapshot();
}

DEFT_DECL void Engine::reset_stats() {
  std::lock_guard lk(m_);
  counters().reset();
}

DEFT_DECL int Engine::num_workers() {
  std::lock_guard lk(m_);
  return pool_ ? pool_->size() : 0;
}

DEFT_DECL void Engine::set_num_workers(int n) {
  if (n < 1) raise("set_num_workers: need at least one worker, got ", n);
  // One resize at a time: another one's pool, installed while this one
  // joined the old workers unlocked, must not be destroyed undrained.
  std::lock_guard resizing(resize_m_);
  std::unique_lock lk(m_);
  drain_locked(lk);
  auto old = replace_pool_locked(nullptr);
  lk.unlock();
  old.reset();  // joins the old workers
  lk.lock();
  if (!shut_down_) replace_pool_locked(std::make_unique<ThreadPool>(n, &Engine::run));
}

DEFT_DECL Engine::Engine() {
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

DEFT_DECL void Engine::shutdown() {
  std::unique_lock lk(m_);
  ++draining_;
  done_cv_.wait(lk, [&] { return inflight_tasks_ == 0; });
  --draining_;
  shut_down_ = true;
  auto old = replace_pool_locked(nullptr);
  lk.unlock();
  old.reset();
}

DEFT_DECL void Engine::drain_locked(Lock& lk) {
  Ready ready;
  if (submit_all_locked(ready)) dispatch_locked(lk, ready, true);
  else help_locked(lk, ready, [] { return false; });
  if (inflight_tasks_ == 0) return;
  ++draining_;
  done_cv_.wait(lk, [&] { return inflight_tasks_ == 0; });
  --draining_;
}

DEFT_DECL bool Engine::add_recorded_locked(const std::shared_ptr<Task>& t, Ready& ready) {
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

DEFT_DECL void Engine::throttle_locked(Lock& lk) {
  if (!over_inflight_bound()) return;
  counters().backpressure_waits.add(1);
  ++throttled_;
  done_cv_.wait(lk, [&] { return below_resume_mark(); });
  --throttled_;
}

DEFT_DECL bool Engine::over_inflight_bound() const {
  return inflight_tasks_ > limits_.max_inflight_tasks || inflight_bytes_ > limits_.max_inflight_bytes;
}

DEFT_DECL bool Engine::below_resume_mark() const {
  return inflight_tasks_ <= limits_.max_inflight_tasks / 2 && inflight_bytes_ <= limits_.max_inflight_bytes / 2;
}

DEFT_DECL void Engine::cancel_overwritten_locked(const std::shared_ptr<Task>& prev, Task& next, TaskList<4>& cancelled) {
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

DEFT_DECL void Engine::compact_recorded() {
  std::erase_if(recorded_, [](const std::weak_ptr<Task>& w) {
    auto t = w.lock();
    if (!t) return true;
    if (t->state.load(std::memory_order_relaxed) == Task::State::recorded) return false;
    t->listed = false;
    return true;
  });
}

DEFT_DECL bool Engine::submit_all_locked(Ready& ready) {
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

DEFT_DECL bool Engine::runnable_alone(const Task& t) {
  if (t.state.load(std::memory_order_relaxed) != Task::State::recorded) return false;
  for (const auto& d : t.deps)
    if (!d->finished()) return false;
  return true;
}

DEFT_DECL void Engine::start_locked(Task& t) {
  t.state.store(Task::State::submitted, std::memory_order_relaxed);
  counters().count_left_recorded(t.bytes);
  ++inflight_tasks_;
  inflight_bytes_ += t.bytes;
  t.pending = 0;
}

DEFT_DECL void Engine::submit_locked(const std::shared_ptr<Task>& root, Ready& ready, std::size_t& tasks,
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

DEFT_DECL void Engine::submit_locked(const std::shared_ptr<Task>& root, Ready& ready) {
  std::size_t tasks = 0, work = 0;
  bool hand_off = false;
  submit_locked(root, ready, tasks, work, hand_off);
}

template <class Done>
void Engine::help_locked(Lock& lk, Ready& ready, Done done) {
  while (!done() && !ready.empty()) {
    auto next = std::move(ready.back());
    ready.pop_back();
    dispatch_locked(lk, ready);  // the rest run in parallel on the workers
    lk.unlock();
    execute(next, ready, lk);
  }
  dispatch_locked(lk, ready);
}

DEFT_DECL void Engine::dispatch_locked(Lock& lk, Ready& ready, bool here) {
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

DEFT_DECL std::unique_ptr<ThreadPool> Engine::replace_pool_locked(std::unique_ptr<ThreadPool> next) {
  running_pool_.store(next.get(), std::memory_order_release);
  std::swap(pool_, next);
  return next;
}

DEFT_DECL void Engine::run(std::shared_ptr<Task> t) {
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

DEFT_DECL void Engine::execute(const std::shared_ptr<Task>& t, Ready& ready, Lock& lk, Buffer* held) {
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
          // A large task holds a core: its loops then take helpers only for
          // free cores (a collective or a user's map() may wait, and holds none).
          const bool holds = t->work >= thresholds::core_hold_min_work && !t->hand_off;
          CoreHold core(holds ? running_pool_.load(std::memory_order_acquire) : nullptr);
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
