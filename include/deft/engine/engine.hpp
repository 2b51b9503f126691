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
#include "../device/allocator.hpp"
#include "../device/backend.hpp"
#include "gpu_lanes.hpp"
#include "../core/light_mutex.hpp"
#include "task_slice.hpp"
#include "stats.hpp"
#include "task.hpp"
#include "thread_pool.hpp"
#include "../core/thresholds.hpp"

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
  static Engine& get();

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
  void record(const std::shared_ptr<Task>& t, const std::shared_ptr<Task>& overwritten = nullptr);

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
  bool record_again_with(const std::shared_ptr<Task>& t, void* context, void (*rebuild)(void*, Task&));

  /// record() for each of `tasks`, in order, under one lock: a hybridized
  /// replay records a whole forward at once.
  void record_all(const std::vector<std::shared_ptr<Task>>& tasks);

  /// Blocks until `t` finished, submitting it and what it needs first. The
  /// waiting thread works instead of sleeping: it runs the ready tasks on
  /// the way to `t` one at a time and hands the others to the workers, so a
  /// chain of small tasks costs no hand-off between threads. `held`: a
  /// buffer t writes, which the caller holds; when it is t's output, the
  /// run uses it instead of locking t's weak reference (a replay's chain
  /// also writes other buffers, which are left to the task).
  void wait(const std::shared_ptr<Task>& t, const std::shared_ptr<Buffer>& held = nullptr);

  /// Runs every live recorded task; rethrows (and clears) the first failure since the last call.
  void wait_all();

  /// Runs every live recorded task, reporting no failure: they stay for
  /// wait_all() and the sync points of the tensors that failed.
  void quiesce();

  /// quiesce(), then takes the first failure since the last wait_all() (null
  /// if none), unreported. A call that waits for all work on its caller's
  /// behalf (measure_shares) takes the earlier failures first and puts them
  /// back after (restore_failure), so that it reports only its own, and the
  /// caller's next wait_all() still reports them.
  std::exception_ptr quiesce_and_take_failure();
  /// Makes `e` (from quiesce_and_take_failure; null: nothing) the first failure again.
  void restore_failure(std::exception_ptr e);

  /// Calls f(recorded_) under the engine's lock: no recorded task is submitted
  /// (nor its deps changed) meanwhile, so f may walk their graph (graph_dump.hpp).
  template <class F>
  void inspect_recorded(F&& f) {
    std::lock_guard lk(m_);
    f(std::as_const(recorded_));
  }

  engine::Mode mode() const { return mode_.load(); }
  void set_mode(engine::Mode m);

  engine::Limits limits();
  void set_limits(const engine::Limits& l);

  /// The counters, read under the lock so that they agree with each other.
  engine::Stats stats();
  void reset_stats();

  int num_workers();
  void set_num_workers(int n);

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
  Engine();

  // Finishes submitted work and joins the workers; later work runs inline.
  void shutdown();

  // Submits every recorded task and waits until no task is in flight,
  // running tasks here meanwhile (all of them when they are small).
  void drain_locked(Lock& lk);

  // Counts `t` as recorded; past the recorded-work bound submits everything.
  // True unless that flushed work big enough to hand to the workers.
  bool add_recorded_locked(const std::shared_ptr<Task>& t, Ready& ready);

  // Holds a recording thread back while in-flight work passes its bound, until
  // it falls to half of it (one wake-up per many tasks, not one per task).
  void throttle_locked(Lock& lk);

  bool over_inflight_bound() const;
  // Where a recording thread held back by over_inflight_bound() goes on.
  bool below_resume_mark() const;

  // record()'s `overwritten`: cancels the unsubmitted writers of the buffer
  // `prev` writes and makes `next` wait for the submitted ones.
  void cancel_overwritten_locked(const std::shared_ptr<Task>& prev, Task& next, TaskList<4>& cancelled);

  void compact_recorded();

  // Submits every recorded task. True when they are small enough to run on
  // this thread (thresholds::inline_task_work).
  bool submit_all_locked(Ready& ready);

  // Marks `root` and every recorded task it needs as submitted; tasks with
  // nothing left to wait for go to `ready`. Adds their number and work to
  // `tasks` and `work`; sets hand_off if one of them must run on a worker.
  void submit_locked(const std::shared_ptr<Task>& root, Ready& ready, std::size_t& tasks, std::size_t& work,
                     bool& hand_off);
  // A recorded task with nothing left to wait for.
  static bool runnable_alone(const Task& t);
  // Submits `t` (a recorded task): it now counts as in flight.
  void start_locked(Task& t);
  void submit_locked(const std::shared_ptr<Task>& root, Ready& ready);

  // Runs ready tasks on this thread one at a time, handing the others to the
  // workers, until done() or nothing is ready here. Returns holding lk.
  template <class Done>
  void help_locked(Lock& lk, Ready& ready, Done done);

  // Hands ready tasks to the workers; or runs them, and the successors they
  // make ready, on this thread: when `here` (work too small to hand off) or
  // once the pool is gone. Successors of tasks on the workers stay there.
  void dispatch_locked(Lock& lk, Ready& ready, bool here = false);

  // Installs `next` as the pool (under m_, or in the constructor) and
  // returns the old one, to be joined outside the lock.
  std::unique_ptr<ThreadPool> replace_pool_locked(std::unique_ptr<ThreadPool> next);

  static void run(std::shared_ptr<Task> t);

  // Runs one task (or skips it) and collects the successors it made ready.
  // Called with `lk` (on m_) unlocked; returns with it locked, so that a
  // caller that goes on under the lock does not take it twice. `held`: t's
  // output, kept alive by the caller.
  void execute(const std::shared_ptr<Task>& t, Ready& ready, Lock& lk, Buffer* held = nullptr);

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
  GpuLanes lanes_;  // where GPU tasks run (limits_.gpu_lanes streams per device)
  std::atomic<engine::Mode> mode_{engine::Mode::deferred};
  std::unique_ptr<ThreadPool> pool_;  // replaced under m_ (replace_pool_locked)
  // The same pool for kernels, which read it without the lock: the
  // release store publishes a new pool's construction to them.
  std::atomic<ThreadPool*> running_pool_{nullptr};
  bool shut_down_ = false;
};

}  // namespace deft::detail

#if DEFT_DEFINE_RUNTIME
#include "engine_impl.hpp"
#endif
