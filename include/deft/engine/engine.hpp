// The engine: records tasks, hands them to the workers at sync points or when
// recorded work passes a bound, makes recording threads wait when in-flight
// work passes a second bound, and carries failures to the sync points.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/random_state.hpp"
#include "allocator.hpp"
#include "device_backend.hpp"
#include "light_mutex.hpp"
#include "profiler.hpp"
#include "stats.hpp"
#include "task.hpp"
#include "thread_pool.hpp"
#include "thresholds.hpp"
#include "trace.hpp"

namespace deft::engine {

enum class Mode {
  deferred,    ///< record now, run at a sync point or when a bound is passed
  synchronous  ///< every statement runs before it returns (debugging; like MXNet's NaiveEngine)
};

/// Bounds on the work deferral may hold (see docs/engine.md).
struct Limits {
  std::size_t max_recorded_tasks = thresholds::max_recorded_tasks;  ///< recorded tasks before they go to the workers
  std::size_t max_recorded_bytes = thresholds::max_recorded_bytes;  ///< storage they will allocate (Task::bytes) before they go to the workers
  std::size_t max_inflight_tasks = thresholds::max_inflight_tasks;  ///< submitted tasks before recording waits
  std::size_t max_inflight_bytes = thresholds::max_inflight_bytes;  ///< storage they allocate before recording waits
  int gpu_lanes = thresholds::gpu_lanes;  ///< streams of each GPU that independent work spreads over (1: all in one, in order; at most thresholds::gpu_lanes)
};

}  // namespace deft::engine

namespace deft::detail {

class Engine {
 public:
  // Tasks ready to run. In place: a sync point and a worker's run each
  // collect one or two, and a heap list cost a malloc/free per statement.
  using Ready = ReadyList;
  using Lock = std::unique_lock<LightMutex>;

  /// The process-wide engine. Never destroyed (tensors may outlive main);
  /// its workers are drained and joined at exit.
  static Engine& get() {
    static Engine* engine = [] {
      auto* e = new Engine();
      std::atexit([] { get().shutdown(); });
      return e;
    }();
    return *engine;
  }

  /// Takes a newly built task. In deferred mode it returns at once (unless a
  /// bound makes it wait); in synchronous mode the task has run when it returns.
  /// `overwritten`: t fully overwrites the buffer this task writes, without
  /// reading it. Its unsubmitted writers (it, and the earlier in-place
  /// writers it waits for) are then dead work and cancelled; t waits for the
  /// submitted ones, which would otherwise finish after it and leave a stale
  /// value. A caller that writes an existing buffer in place publishes t as
  /// its producer only after this returns: every thread records its tasks
  /// under the engine's lock after reading their inputs' producers, so that
  /// write is ordered after those reads.
  void record(const std::shared_ptr<Task>& t, const std::shared_ptr<Task>& overwritten = nullptr) {
    if (Trace* trace = active_trace()) trace->capture(t);
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

  /// Records `t` again, a task that ran and that nobody but the caller's one
  /// reference holds: `rebuild(Task&)` gives it its new kernel and declares
  /// its reads, under the lock, as for a task just built. A loop writing a
  /// tensor in place (`y = a * b + c; y.wait_to_read();`) then reuses one
  /// task instead of building and freeing one per statement. False, with
  /// nothing done, when t cannot be reused (it failed, is still pending, is
  /// shared, or a trace or synchronous mode wants the plain record()).
  template <class Rebuild>
  bool record_again(const std::shared_ptr<Task>& t, Rebuild&& rebuild) {
    // One function for every caller: only the rebuild is the caller's type.
    using F = std::remove_reference_t<Rebuild>;
    return record_again_with(t, &rebuild, [](void* f, Task& task) { (*static_cast<F*>(f))(task); });
  }
  DEFT_NOINLINE bool record_again_with(const std::shared_ptr<Task>& t, void* context, void (*rebuild)(void*, Task&)) {
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

  /// record() for each of `tasks`, in order, under one lock: a hybridized
  /// replay records a whole forward at once.
  void record_all(const std::vector<std::shared_ptr<Task>>& tasks) {
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

  /// Blocks until `t` finished, submitting it and what it needs first. The
  /// waiting thread works instead of sleeping: it runs the ready tasks on
  /// the way to `t` one at a time and hands the others to the workers, so a
  /// chain of small tasks costs no hand-off between threads. `held`: a
  /// buffer t writes, which the caller holds; when it is t's output, the
  /// run uses it instead of locking t's weak reference (a replay's chain
  /// also writes other buffers, which are left to the task).
  void wait(const std::shared_ptr<Task>& t, const std::shared_ptr<Buffer>& held = nullptr) {
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

  /// Runs every live recorded task; rethrows (and clears) the first failure since the last call.
  void wait_all() {
    std::unique_lock lk(m_);
    drain_locked(lk);
    auto e = std::exchange(first_error_, nullptr);
    lk.unlock();
    if (e) std::rethrow_exception(e);
  }

  /// Runs every live recorded task, reporting no failure: they stay for
  /// wait_all() and the sync points of the tensors that failed.
  void quiesce() {
    std::unique_lock lk(m_);
    drain_locked(lk);
  }

  /// quiesce(), then takes the first failure since the last wait_all() (null
  /// if none), unreported. A call that waits for all work on its caller's
  /// behalf (measure_shares) takes the earlier failures first and puts them
  /// back after (restore_failure), so that it reports only its own, and the
  /// caller's next wait_all() still reports them.
  std::exception_ptr quiesce_and_take_failure() {
    std::unique_lock lk(m_);
    drain_locked(lk);
    return std::exchange(first_error_, nullptr);
  }
  /// Makes `e` (from quiesce_and_take_failure; null: nothing) the first failure again.
  void restore_failure(std::exception_ptr e) {
    if (!e) return;
    std::lock_guard lk(m_);
    first_error_ = std::move(e);
  }

  /// Calls f(recorded_) under the engine's lock: no recorded task is submitted
  /// (nor its deps changed) meanwhile, so f may walk their graph (graph_dump.hpp).
  template <class F>
  void inspect_recorded(F&& f) {
    std::lock_guard lk(m_);
    f(std::as_const(recorded_));
  }

  engine::Mode mode() const { return mode_.load(); }
  void set_mode(engine::Mode m) {
    if (m == engine::Mode::synchronous) quiesce();
    mode_.store(m);
  }

  engine::Limits limits() {
    std::lock_guard lk(m_);
    return limits_;
  }
  void set_limits(const engine::Limits& l) {
    if (l.max_recorded_tasks == 0 || l.max_inflight_tasks == 0)
      raise("engine limits: task bounds must be at least 1");
    if (l.gpu_lanes < 1 || l.gpu_lanes > thresholds::gpu_lanes)
      raise("engine limits: gpu_lanes must be between 1 and ", thresholds::gpu_lanes, ", not ", l.gpu_lanes);
    std::lock_guard lk(m_);
    limits_ = l;
    gpu_lanes_.store(l.gpu_lanes, std::memory_order_relaxed);
  }

  /// The counters, read under the lock so that they agree with each other.
  engine::Stats stats() {
    std::lock_guard lk(m_);
    const auto& c = counters();
    engine::Stats s;
    s.tasks_recorded = c.recorded.get();
    s.tasks_run = c.run.get();
    s.tasks_discarded = c.discarded.get() + c.dropped_tasks.load() - c.dropped_at_reset;
    s.tasks_failed = c.failed.get();
    s.tasks_skipped = c.skipped.get();
    s.flushes = c.flushes.get();
    s.flushes_run_here = c.flushes_run_here.get();
    s.backpressure_waits = c.backpressure_waits.get();
    s.tasks_pending = c.now_pending_tasks();
    s.peak_tasks_pending = c.peak_pending_tasks.get();
    s.bytes_pending = c.now_pending_bytes();
    s.peak_bytes_pending = c.peak_pending_bytes.get();
    s.bytes_allocated = c.allocated_bytes.load();
    s.peak_bytes_allocated = c.peak_allocated_bytes.load();
    return s;
  }
  void reset_stats() {
    std::lock_guard lk(m_);
    auto& c = counters();
    for (auto* n : {&c.recorded, &c.run, &c.discarded, &c.failed, &c.skipped, &c.flushes, &c.flushes_run_here,
                    &c.backpressure_waits})
      n->set(0);
    c.dropped_at_reset = c.dropped_tasks.load();
    c.peak_pending_tasks.set(c.now_pending_tasks());
    c.peak_pending_bytes.set(c.now_pending_bytes());
    c.peak_allocated_bytes.store(c.allocated_bytes.load());
  }

  int num_workers() {
    std::lock_guard lk(m_);
    return pool_ ? pool_->size() : 0;
  }
  void set_num_workers(int n) {
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

  /// Runs body(i) for i in [0, chunks) on the workers (used by kernels).
  template <class Body>
  void parallel_for(std::int64_t chunks, Body&& body) {
    ThreadPool* p = running_pool_.load(std::memory_order_acquire);
    if (p && chunks > 1) {
      p->parallel_for(chunks, body);
    } else {
      for (std::int64_t i = 0; i < chunks; ++i) body(i);
    }
  }
  int parallelism() const {
    ThreadPool* p = running_pool_.load(std::memory_order_acquire);
    return p ? p->size() : 1;
  }

 private:
  Engine() {
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

  // Finishes submitted work and joins the workers; later work runs inline.
  void shutdown() {
    std::unique_lock lk(m_);
    ++draining_;
    done_cv_.wait(lk, [&] { return inflight_tasks_ == 0; });
    --draining_;
    shut_down_ = true;
    auto old = replace_pool_locked(nullptr);
    lk.unlock();
    old.reset();
  }

  // Submits every recorded task and waits until no task is in flight,
  // running tasks here meanwhile (all of them when they are small).
  void drain_locked(Lock& lk) {
    Ready ready;
    if (submit_all_locked(ready)) dispatch_locked(lk, ready, true);
    else help_locked(lk, ready, [] { return false; });
    if (inflight_tasks_ == 0) return;
    ++draining_;
    done_cv_.wait(lk, [&] { return inflight_tasks_ == 0; });
    --draining_;
  }

  // Counts `t` as recorded; past the recorded-work bound submits everything.
  // True unless that flushed work big enough to hand to the workers.
  bool add_recorded_locked(const std::shared_ptr<Task>& t, Ready& ready) {
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

  // Holds a recording thread back while in-flight work passes its bound, until
  // it falls to half of it (one wake-up per many tasks, not one per task).
  void throttle_locked(Lock& lk) {
    if (!over_inflight_bound()) return;
    counters().backpressure_waits.add(1);
    ++throttled_;
    done_cv_.wait(lk, [&] { return below_resume_mark(); });
    --throttled_;
  }

  bool over_inflight_bound() const {
    return inflight_tasks_ > limits_.max_inflight_tasks || inflight_bytes_ > limits_.max_inflight_bytes;
  }
  // Where a recording thread held back by over_inflight_bound() goes on.
  bool below_resume_mark() const {
    return inflight_tasks_ <= limits_.max_inflight_tasks / 2 && inflight_bytes_ <= limits_.max_inflight_bytes / 2;
  }

  // record()'s `overwritten`: cancels the unsubmitted writers of the buffer
  // `prev` writes and makes `next` wait for the submitted ones.
  void cancel_overwritten_locked(const std::shared_ptr<Task>& prev, Task& next, TaskList<4>& cancelled) {
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

  void compact_recorded() {
    std::erase_if(recorded_, [](const std::weak_ptr<Task>& w) {
      auto t = w.lock();
      if (!t) return true;
      if (t->state.load(std::memory_order_relaxed) == Task::State::recorded) return false;
      t->listed = false;
      return true;
    });
  }

  // Submits every recorded task. True when they are small enough to run on
  // this thread (thresholds::inline_task_work).
  bool submit_all_locked(Ready& ready) {
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

  // Marks `root` and every recorded task it needs as submitted; tasks with
  // nothing left to wait for go to `ready`. Adds their number and work to
  // `tasks` and `work`; sets hand_off if one of them must run on a worker.
  void submit_locked(const std::shared_ptr<Task>& root, Ready& ready, std::size_t& tasks, std::size_t& work,
                     bool& hand_off) {
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
  // A recorded task with nothing left to wait for.
  static bool runnable_alone(const Task& t) {
    if (t.state.load(std::memory_order_relaxed) != Task::State::recorded) return false;
    for (const auto& d : t.deps)
      if (!d->finished()) return false;
    return true;
  }
  // Submits `t` (a recorded task): it now counts as in flight.
  void start_locked(Task& t) {
    t.state.store(Task::State::submitted, std::memory_order_relaxed);
    counters().count_left_recorded(t.bytes);
    ++inflight_tasks_;
    inflight_bytes_ += t.bytes;
    t.pending = 0;
  }
  void submit_locked(const std::shared_ptr<Task>& root, Ready& ready) {
    std::size_t tasks = 0, work = 0;
    bool hand_off = false;
    submit_locked(root, ready, tasks, work, hand_off);
  }

  // Runs ready tasks on this thread one at a time, handing the others to the
  // workers, until done() or nothing is ready here. Returns holding lk.
  template <class Done>
  void help_locked(Lock& lk, Ready& ready, Done done) {
    while (!done() && !ready.empty()) {
      auto next = std::move(ready.back());
      ready.pop_back();
      dispatch_locked(lk, ready);  // the rest run in parallel on the workers
      lk.unlock();
      execute(next, ready, lk);
    }
    dispatch_locked(lk, ready);
  }

  // Hands ready tasks to the workers; or runs them, and the successors they
  // make ready, on this thread: when `here` (work too small to hand off) or
  // once the pool is gone. Successors of tasks on the workers stay there.
  void dispatch_locked(Lock& lk, Ready& ready, bool here = false) {
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

  // Installs `next` as the pool (under m_, or in the constructor) and
  // returns the old one, to be joined outside the lock.
  std::unique_ptr<ThreadPool> replace_pool_locked(std::unique_ptr<ThreadPool> next) {
    running_pool_.store(next.get(), std::memory_order_release);
    std::swap(pool_, next);
    return next;
  }

  static void run(std::shared_ptr<Task> t) {
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

  // Runs one task (or skips it) and collects the successors it made ready.
  // Called with `lk` (on m_) unlocked; returns with it locked, so that a
  // caller that goes on under the lock does not take it twice. `held`: t's
  // output, kept alive by the caller.
  void execute(const std::shared_ptr<Task>& t, Ready& ready, Lock& lk, Buffer* held = nullptr) {
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
            run_on_lane(*t, *out);
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

  // A GPU task: on a lane of its device (lane_for), its output marked there.
  void run_on_lane(Task& t, Buffer& out) {
    DeviceBackend& b = backend_of(out.device);
    const int lane = lane_for(t, out, std::min(b.lanes(), gpu_lanes_.load(std::memory_order_relaxed)));
    LaneScope on(out.device.index, lane);
    out.allocate();
    t.execute(out);
    out.ready_mark = b.mark(out.device.index);
    out.lane = lane;
    out.lane_taken.store(false, std::memory_order_relaxed);
    t.for_each_other_output([&](Buffer& other) {
      if (other.device != out.device) return;  // (a mark is one device's)
      other.ready_mark = out.ready_mark;
      other.lane = lane;
      other.lane_taken.store(false, std::memory_order_relaxed);
    });
  }
  // Where a GPU task runs, for speed only (the lanes' record orders the
  // work, eval/gpu/lanes.hpp): a write in place stays on its buffer's lane;
  // a reader goes on on the lane its input was written on, unless another
  // reader went on there already; that fork, and work reading no GPU
  // buffer, takes the next lane in turn. Chains thus stay on one lane and
  // independent subtrees spread over them.
  int lane_for(const Task& t, Buffer& out, int lanes) {
    if (lanes <= 1) return 0;
    if (out.data && out.lane >= 0 && out.lane < lanes) return out.lane;
    int forked_from = -1;
    for (Buffer* in : t.gpu_inputs)
      if (in && in->device == out.device && in->lane >= 0 && in->lane < lanes) {
        if (!in->lane_taken.exchange(true, std::memory_order_relaxed)) return in->lane;
        if (forked_from < 0) forked_from = in->lane;
      }
    auto& turn = next_lane_[std::size_t(out.device.index) % next_lane_.size()];
    const int next = int(turn.fetch_add(1, std::memory_order_relaxed) % unsigned(lanes));
    return next == forked_from ? (next + 1) % lanes : next;
  }

  LightMutex m_;
  std::mutex resize_m_;  // set_num_workers: held for a whole resize, taken before m_
  std::condition_variable_any done_cv_;  // a task finished that someone waits for (see execute)
  int draining_ = 0;                 // threads waiting for every submitted task
  int throttled_ = 0;                // recording threads held back by the in-flight bound
  std::vector<std::weak_ptr<Task>> recorded_;
  std::vector<std::shared_ptr<Task>> submit_stack_;  // submit_locked's work list (reused)
  std::size_t inflight_tasks_ = 0, inflight_bytes_ = 0;
  std::exception_ptr first_error_;
  engine::Limits limits_;
  std::atomic<int> gpu_lanes_{thresholds::gpu_lanes};  // limits_.gpu_lanes, read without the lock
  // Each GPU's turn of lanes (devices past the 16th share): one shared turn
  // would leave lanes idle on a device whose tasks alternate with another's.
  std::array<std::atomic<unsigned>, 16> next_lane_{};
  std::atomic<engine::Mode> mode_{engine::Mode::deferred};
  std::unique_ptr<ThreadPool> pool_;  // replaced under m_ (replace_pool_locked)
  // The same pool for kernels, which read it without the lock: the
  // release store publishes a new pool's construction to them.
  std::atomic<ThreadPool*> running_pool_{nullptr};
  bool shut_down_ = false;
};

}  // namespace deft::detail

namespace deft {

namespace detail {
/// Sync points are refused while a trace records: the traced graph could not
/// replay what the program did with the value.
inline void refuse_sync_in_trace(const char* what) {
  if (active_trace())
    raise<std::logic_error>(what, " inside a hybridized forward: a traced graph cannot read values (to_vector, item, "
                                  "wait_to_read, printing, wait_all, branching on data); read them outside the block");
}

/// The tasks recorded before the trace that the steps of `chain` read and
/// that have not finished: a replay of them waits for these.
inline void add_outer_deps(const Trace::Plan& plan, const Trace::Chain& chain, Task& t) {
  for (std::size_t i : chain.steps)
    for (const auto& w : plan.steps[i].outer)
      if (auto d = w.lock(); d && !d->finished()) t.deps.push_back(std::move(d));
}

/// A task that writes a traced input (a placeholder) anew before a replay:
/// unrecorded, its reads declared.
struct Refill {
  std::shared_ptr<Task> task;
  std::shared_ptr<Buffer> input;
};

/// What one replay's chain tasks do differently, per chain (empty when
/// nothing does): the random steps draw new numbers, as many calls as the
/// traced program made and in its order (dead steps too), so they draw what
/// that program would; the copy-outs write new buffers (put in `copies`).
inline std::vector<ChainReplay> chain_replays(const Trace::Plan& plan, std::size_t new_output,
                                              std::vector<std::shared_ptr<Buffer>>& copies) {
  std::vector<ChainReplay> per_chain;
  if (plan.random_steps.empty() && plan.copy_outs.empty()) return per_chain;
  per_chain.resize(plan.chains.size());
  if (!plan.random_steps.empty()) {
    const auto [key, first] = RandomState::get().take(plan.random_steps.size());
    for (std::size_t r = 0; r < plan.random_steps.size(); ++r)
      if (const std::size_t i = plan.random_steps[r], ci = plan.chain_of[i]; ci != Trace::none)
        per_chain[ci].draws.emplace_back(i, plan.steps[i].prototype->redrawn(key, first + r));
  }
  copies.resize(plan.copy_outs.size());
  for (std::size_t j = 0; j < plan.copy_outs.size(); ++j) {
    const std::size_t i = plan.copy_outs[j].step;
    if (i == new_output) raise<std::logic_error>("replay: a copy-out of the step given a new buffer");
    copies[j] = std::make_shared<Buffer>(plan.copy_outs[j].copy->bytes, plan.steps[i].output->device);
    per_chain[plan.chain_of[i]].copies.emplace_back(j, copies[j]);
  }
  return per_chain;
}

/// Records the steps of `trace` again after `refills`. Each refill waits for
/// every task of the previous replay still running, and the replay for the
/// refills, so nothing overwrites a buffer the previous replay still reads.
/// A plan on one GPU (Trace::replays_as_program) replays as one ProgramTask.
/// Otherwise each chain (Trace::Chain) is a task; on the CPU, when every
/// chain waits for the first (Plan::rooted), the last refill runs inside the
/// first chain's task (the others are tasks of their own): a chain of
/// layers is then one task, and step `new_output`
/// (Trace::sole_unread_writer, or Trace::none) writes a new buffer.
struct Replayed {
  std::shared_ptr<Buffer> output;               // new_output's new buffer; null when none was made
  std::vector<std::shared_ptr<Buffer>> copies;  // Plan::copy_outs' new buffers; empty for a device program
};
inline Replayed replay(Trace& trace, std::vector<Refill> refills, std::size_t new_output = Trace::none) {
  const auto& plan = trace.plan();
  const bool program = trace.replays_as_program();
  Replayed out;
  std::vector<ChainReplay> per_chain;
  if (!program) per_chain = chain_replays(*plan, new_output, out.copies);
  auto& tasks = trace.last_replay();
  for (auto& r : refills) {
    for (const auto& t : tasks)
      if (!t->finished()) r.task->deps.push_back(t);
    if (const auto& p = r.input->producer; p && !p->finished()) r.task->deps.push_back(p);
  }
  tasks.clear();
  const Refill head_refill = std::move(refills.back());
  refills.pop_back();
  const auto& refill = head_refill.task;
  const auto& input = head_refill.input;
  for (auto& r : refills) {
    r.task->output = r.input;
    refill->deps.push_back(r.task);
    tasks.push_back(r.task);
  }
  auto set_refill_producers = [&] {
    for (auto& r : refills) r.input->producer = r.task;
  };
  if (program) {
    refill->output = input;
    auto run = std::make_shared<ProgramTask>(plan, trace.program_slot(), input);
    run->deps.push_back(refill);
    for (const auto& c : plan->chains) add_outer_deps(*plan, c, *run);
    run->output = plan->steps[plan->last_live].output;
    tasks.push_back(refill);
    tasks.push_back(run);
    Engine::get().record_all(tasks);
    set_refill_producers();
    input->producer = refill;
    for (const auto& s : plan->steps)
      if (s.output) s.output->producer = run;
    return {};
  }
  const bool fold = plan->rooted && !refill->hand_off && !plan->chains.front().hand_off;
  std::shared_ptr<Task> head = refill;  // every chain waits for it (directly or through the first chain)
  if (!fold) {
    refill->output = input;
    tasks.push_back(refill);
  }
  const std::size_t first_chain = tasks.size();
  std::shared_ptr<Buffer>& made = out.output;
  for (std::size_t ci = 0; ci < plan->chains.size(); ++ci) {
    const auto& c = plan->chains[ci];
    const bool with_refill = fold && ci == 0;
    auto t = std::make_shared<ChainTask>(plan, ci, with_refill ? refill : nullptr, input,
                                         per_chain.empty() ? ChainReplay{} : std::move(per_chain[ci]));
    if (with_refill) {
      for (auto& d : refill->deps) t->deps.push_back(std::move(d));
      refill->deps.clear();
      t->inherited_error = refill->inherited_error;
      head = t;
    } else {
      t->deps.push_back(head);
    }
    for (std::size_t a : c.after)
      if (tasks[first_chain + a] != head) t->deps.push_back(tasks[first_chain + a]);
    add_outer_deps(*plan, c, *t);
    const std::size_t last = c.steps.back();
    if (last == new_output) {
      made = std::make_shared<Buffer>(plan->steps[last].output->bytes, plan->steps[last].output->device);
      t->output = made;
    } else {
      t->output = plan->steps[last].output;
    }
    tasks.push_back(std::move(t));
  }
  Engine::get().record_all(tasks);
  // Producers are set once recorded (see Tensor::write); the buffers are the
  // trace's own, read by no task outside this replay but the next one's.
  set_refill_producers();
  input->producer = fold ? tasks[first_chain] : refill;
  for (std::size_t ci = 0; ci < plan->chains.size(); ++ci)
    for (std::size_t i : plan->chains[ci].steps)
      (i == new_output ? made : plan->steps[i].output)->producer = tasks[first_chain + ci];
  for (std::size_t j = 0; j < out.copies.size(); ++j)
    out.copies[j]->producer = tasks[first_chain + plan->chain_of[plan->copy_outs[j].step]];
  return out;
}
}  // namespace detail

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
