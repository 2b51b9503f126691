// ThreadPool: a fixed set of workers sharing one FIFO of jobs. A job is either
// a ready task or a helper for a parallel loop; loops are split into chunks
// that the calling thread and any idle worker claim with an atomic counter.
// A worker that runs out of jobs polls for a short while before it sleeps
// (at most all the workers and one fewer than the cores, so that they and a
// thread at a sync point fit the cores): handing a job to a polling worker
// costs well under a microsecond, waking a sleeping one several. A loop's
// first helper goes to pollers through one atomic slot instead of the
// locked FIFO: a poller claims it with one exchange, and runs the loop's
// last chunk first. Threads running large tasks, and their loops' helpers,
// hold cores: such a loop takes helpers only while a core is free.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "../core/config.hpp"
#include "task_slice.hpp"
#include "../core/spin_lock.hpp"
#include "task.hpp"
#include "../core/thresholds.hpp"


namespace deft::detail {

class ThreadPool {
 public:
  using TaskRunner = void (*)(std::shared_ptr<Task>);

  /// `cores`: how many threads may compute at once (0: the hardware's threads).
  ThreadPool(int workers, TaskRunner run_task, int cores = 0);
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Finishes every queued job, then joins the workers.
  ~ThreadPool();

  int size() const { return static_cast<int>(threads_.size()); }

  /// How long an idle worker polls before it sleeps (0: sleep at once).
  static std::atomic<std::int64_t>& poll_ns() {
    static std::atomic<std::int64_t> ns{thresholds::worker_poll_ns};
    return ns;
  }

  void push(ReadyList& ready);

  /// Counts this thread as computing until the matching leave_core(): a
  /// large task on any thread, or a helper in a loop. A loop started by such
  /// a thread takes helpers only while fewer threads compute than there are
  /// cores: a helper beyond them would share a core with a thread the loop
  /// waits for, and the loop's pieces would wait on each other's time slices.
  void enter_core() {
    busy_.fetch_add(1, std::memory_order_relaxed);
    ++cores_held();
  }
  void leave_core() {
    --cores_held();
    busy_.fetch_sub(1, std::memory_order_relaxed);
  }

  /// Runs body(i) for i in [0, chunks), on this thread and on idle workers.
  /// Returns when all chunks ran; rethrows the first exception a chunk threw.
  template <class Body>
  void parallel_for(std::int64_t chunks, Body&& body) {
    if (chunks <= 1) {
      if (chunks == 1) body(std::int64_t{0});
      return;
    }
    // Everything else is one function for every body: each elementwise
    // expression has its own body type, and this was compiled once per type.
    run_loop(chunks, &body,
             [](void* ctx, std::int64_t i) { (*static_cast<std::remove_reference_t<Body>*>(ctx))(i); });
  }

 private:
  void run_loop(std::int64_t chunks, void* context, void (*call)(void*, std::int64_t));

  // Chunks [0, shared) are claimed through `next`. When a helper is offered
  // to the pollers, the last chunk is not among them: it belongs to whoever
  // takes the offer (the poller that claims it, or the caller that takes it
  // back), so that a poller runs the same chunk, and reads the same part of
  // the operands, each time the loop comes round, and keeps them in its L2.
  // Were every chunk claimed through `next`, which of two threads took the
  // first would be a race, and the halves would change cores between calls.
  struct Loop {
    ProfiledTask owner;  // the task running this loop, named only while a trace records
    std::int64_t count = 0;
    std::int64_t shared = 0;
    bool limited = false;  // started by a thread that holds a core: helpers need a free one
    void* context = nullptr;
    void (*call)(void*, std::int64_t) = nullptr;
    std::atomic<std::int64_t> next{0};
    std::atomic<int> helpers_done{0};
    std::mutex error_mutex;
    std::exception_ptr error;

    void run_chunk(std::int64_t i) {
      try {
        call(context, i);
      } catch (...) {
        std::lock_guard lk(error_mutex);
        if (!error) error = std::current_exception();
        next.store(shared, std::memory_order_relaxed);  // stop handing out chunks
      }
    }
    void run_chunks() {
      for (std::int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < shared;) {
        run_chunk(i);
        // Claims only grow: after the last chunk none is left, and one more
        // claim would pull the counter's line from the other thread again.
        if (i == shared - 1) return;
      }
    }
    /// The chunk of the offered helper (see above).
    void run_offered_chunk() { run_chunk(count - 1); }
  };
  struct Job {
    std::shared_ptr<Task> task;
    Loop* loop = nullptr;
  };
  // The FIFO of jobs: a ring that doubles when full and never shrinks (the
  // queue holds a few jobs per worker at most). A std::deque would add about
  // 7 KB of code to every program that syncs.
  class JobRing {
   public:
    bool empty() const { return count_ == 0; }
    void push_back(Job job) {
      if (count_ == capacity_) grow();
      slots_[(head_ + count_) & (capacity_ - 1)] = std::move(job);
      ++count_;
    }
    Job pop_front() {
      Job job = std::move(slots_[head_]);
      head_ = (head_ + 1) & (capacity_ - 1);
      --count_;
      return job;
    }
    /// Drops the helper jobs of `loop`, keeping the others in order; returns how many it dropped.
    int remove(const Loop* loop) {
      std::size_t kept = 0;
      for (std::size_t i = 0; i < count_; ++i) {
        Job& job = slots_[(head_ + i) & (capacity_ - 1)];
        if (job.loop == loop) continue;
        if (kept != i) slots_[(head_ + kept) & (capacity_ - 1)] = std::move(job);
        ++kept;
      }
      const auto removed = static_cast<int>(count_ - kept);
      count_ = kept;
      return removed;
    }

   private:
    void grow() {
      const std::size_t capacity = capacity_ ? capacity_ * 2 : 16;
      auto fresh = std::make_unique<Job[]>(capacity);
      for (std::size_t i = 0; i < count_; ++i) fresh[i] = std::move(slots_[(head_ + i) & (capacity_ - 1)]);
      slots_ = std::move(fresh);
      capacity_ = capacity;
      head_ = 0;
    }

    std::unique_ptr<Job[]> slots_;
    std::size_t capacity_ = 0;  // zero or a power of two
    std::size_t head_ = 0, count_ = 0;
  };

  // Cores held by this thread (enter_core): a loop it starts is limited.
  static int& cores_held() {
    thread_local int held = 0;
    return held;
  }
  // Takes a core for a helper of a limited loop, if one is free.
  bool reserve_core() {
    for (int n = busy_.load(std::memory_order_relaxed); n < cores_;)
      if (busy_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) {
        ++cores_held();
        return true;
      }
    return false;
  }

  void notify(int jobs) {
    if (jobs == 1) cv_.notify_one();
    else cv_.notify_all();
  }

  // Polls for up to poll_ns(), if fewer than max_polling_ workers already
  // poll, helping each offered loop meanwhile. Returns when a job or the
  // stop arrives or the budget ends.
  void poll();
  // Runs chunks of `loop` as one of its helpers: `offered`, the one that
  // took the offer, starts with the last chunk.
  static void help(Loop& loop, bool offered);

  void work();

  TaskRunner run_task_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_;
  JobRing jobs_;
  std::atomic<int> queued_{0};   // jobs_.size(), readable without the lock by polling workers
  std::atomic<int> polling_{0};  // workers in poll()
  // A loop whose helper a poller may take (null: none), claimed without the
  // lock: deft_bench's loop of two 300 ns pieces took 856-952 ns this way on
  // a 2-core VM, 1018-1091 ns through the FIFO's lock, queue and counters.
  // A limited loop is offered with its address's lowest bit set, so that a
  // poller reserves a core before it claims the offer.
  std::atomic<std::uintptr_t> offer_{0};
  int max_polling_ = 0;
  int cores_ = 1;
  std::atomic<int> busy_{0};  // threads that hold a core (enter_core, reserve_core)
  int sleeping_ = 0;  // workers in cv_.wait (guarded by m_)
  std::atomic<bool> stop_{false};
};

/// Holds a core of `pool` while it lives (ThreadPool::enter_core); none for a null pool.
class CoreHold {
 public:
  explicit CoreHold(ThreadPool* pool) : pool_(pool) {
    if (pool_) pool_->enter_core();
  }
  ~CoreHold() {
    if (pool_) pool_->leave_core();
  }
  CoreHold(const CoreHold&) = delete;
  CoreHold& operator=(const CoreHold&) = delete;

 private:
  ThreadPool* pool_;
};

#if DEFT_DEFINE_RUNTIME
DEFT_DECL ThreadPool::ThreadPool(int workers, TaskRunner run_task, int cores) : run_task_(run_task) {
  workers = std::max(workers, 1);
  // Pollers plus one thread at a sync point must fit the cores: a poller
  // that took a core from a computing thread would cost more than it saves.
  if (cores < 1) cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  max_polling_ = std::min(workers, cores - 1);
  cores_ = cores;
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] {
    worker_index() = i;
    work();
  });
}

DEFT_DECL ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(m_);
    stop_.store(true, std::memory_order_relaxed);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

DEFT_DECL void ThreadPool::push(ReadyList& ready) {
  if (ready.empty()) return;
  int sleeping;
  {
    std::lock_guard lk(m_);
    for (auto& t : ready) jobs_.push_back(Job{std::move(t), nullptr});
    queued_.fetch_add(static_cast<int>(ready.size()), std::memory_order_release);
    sleeping = sleeping_;
  }
  // Always wake sleepers for tasks: two pushers could both count on the
  // same polling worker, and a task may wait for another one to start.
  if (sleeping > 0) notify(static_cast<int>(ready.size()));
  ready.clear();
}

DEFT_DECL void ThreadPool::run_loop(std::int64_t chunks, void* context, void (*call)(void*, std::int64_t)) {
  Loop loop;
  loop.owner = profiled_task();  // null unless a trace records: then helpers' slices name it
  loop.count = chunks;
  loop.context = context;
  loop.call = call;
  // The calling thread works too (a worker, or a user thread running a task
  // at its sync point): with size() - 1 helpers at most size() threads run.
  int helpers = static_cast<int>(std::min<std::int64_t>(chunks - 1, size() - 1));
  // A loop of a thread that holds a core takes helpers only for the cores
  // no one holds (the caller's is among the held ones); each reserves its
  // core before it starts (poll, work).
  loop.limited = cores_held() > 0;
  if (loop.limited) helpers = std::min(helpers, std::max(0, cores_ - busy_.load(std::memory_order_relaxed)));
  // One helper is offered to the pollers first (if none is offered already),
  // with the last chunk as its own.
  const std::uintptr_t mine = reinterpret_cast<std::uintptr_t>(&loop) | (loop.limited ? 1 : 0);
  std::uintptr_t none = 0;
  loop.shared = chunks - 1;  // published by the offer
  const bool offered = helpers > 0 && polling_.load(std::memory_order_relaxed) > 0 &&
                       offer_.compare_exchange_strong(none, mine, std::memory_order_release, std::memory_order_relaxed);
  if (!offered) loop.shared = chunks;
  const int queued = helpers - (offered ? 1 : 0);
  int sleeping = 0, polling = 0;
  if (queued > 0) {  // an offered helper alone needs neither the lock nor the queue's counter
    std::lock_guard lk(m_);
    for (int i = 0; i < queued; ++i) jobs_.push_back(Job{nullptr, &loop});
    // Counted before the jobs are published: a poller leaves poll() as soon
    // as it sees them, and counting after that woke a sleeper for nothing
    // (a futex call of ~1 us in each batch-1 forward). Every worker counted
    // here looks at the queue under m_ before it sleeps, so it takes a job.
    polling = polling_.load(std::memory_order_relaxed);
    queued_.fetch_add(queued, std::memory_order_release);
    sleeping = sleeping_;
  }
  // A loop needs no helper to finish (this thread runs every chunk no helper
  // took), so polling workers may take its helpers without a wake-up.
  if (queued > 0 && sleeping > 0 && helpers > polling) notify(queued);
  loop.run_chunks();
  // Take back helpers no worker has started (and run the offered chunk);
  // wait for those that have.
  int removed = 0;
  if (std::uintptr_t expected = mine; offered && offer_.compare_exchange_strong(expected, 0, std::memory_order_relaxed)) {
    removed = 1;
    loop.run_offered_chunk();
  }
  if (queued > 0) {
    std::lock_guard lk(m_);
    const int unstarted = jobs_.remove(&loop);
    queued_.fetch_sub(unstarted, std::memory_order_relaxed);
    removed += unstarted;
  }
  // A started helper is running its last chunk: spin a little before
  // giving the core away (a yield is a system call, ~1 us on a VM).
  const int started = helpers - removed;
  for (int spins = 0; loop.helpers_done.load(std::memory_order_acquire) < started; ++spins) {
    if (spins < thresholds::helper_spin_count) cpu_relax();
    else std::this_thread::yield();
  }
  if (loop.error) std::rethrow_exception(loop.error);
}

DEFT_DECL void ThreadPool::help(Loop& loop, bool offered) {
  {
    HelpSlice slice(loop.owner);  // the profiler's record of this help, if a trace records
    if (offered) {
      loop.run_offered_chunk();
      // With two chunks the caller has the other: a claim would only pull
      // the counter's line from the thread about to wait on it.
      if (loop.shared > 1) loop.run_chunks();
    } else {
      loop.run_chunks();
    }
  }
  loop.helpers_done.fetch_add(1, std::memory_order_release);
}

DEFT_DECL void ThreadPool::poll() {
  const std::int64_t budget = poll_ns().load(std::memory_order_relaxed);
  if (budget <= 0) return;
  int n = polling_.load(std::memory_order_relaxed);
  do {
    if (n >= max_polling_) return;
  } while (!polling_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
  auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(budget);
  for (unsigned i = 1;; ++i) {
    // The caller takes an offer back once its own chunks are done: only an
    // exchange that still finds it claims it. A poller stays counted while
    // it helps (one fewer counter update on the way to the loop's chunks),
    // then polls again with a fresh budget.
    if (const std::uintptr_t seen = offer_.load(std::memory_order_relaxed)) {
      // A limited loop's offer is left to its caller while every core is held.
      const bool reserved = (seen & 1) && reserve_core();
      const std::uintptr_t taken = (seen & 1) && !reserved ? 0 : offer_.exchange(0, std::memory_order_acquire);
      const bool holds = reserved || (taken & 1);  // another limited loop came in between: it holds one anyway
      if (holds && !reserved) enter_core();
      if (Loop* loop = reinterpret_cast<Loop*>(taken & ~std::uintptr_t(1))) help(*loop, true);
      if (holds) leave_core();
      if (taken) {
        i = 0;
        until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(budget);
        continue;
      }
    }
    if (queued_.load(std::memory_order_acquire) > 0 || stop_.load(std::memory_order_relaxed)) break;
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  polling_.fetch_sub(1, std::memory_order_relaxed);
}

DEFT_DECL void ThreadPool::work() {
  for (;;) {
    Job job;
    poll();
    {
      std::unique_lock lk(m_);
      ++sleeping_;
      cv_.wait(lk, [&] { return stop_.load(std::memory_order_relaxed) || !jobs_.empty(); });
      --sleeping_;
      if (jobs_.empty()) return;
      job = jobs_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (job.loop) {
      if (!job.loop->limited) {
        help(*job.loop, false);
      } else if (reserve_core()) {
        help(*job.loop, false);
        leave_core();
      } else {  // every core is held: the loop's own threads run its chunks
        job.loop->helpers_done.fetch_add(1, std::memory_order_release);
      }
    } else {
      run_task_(std::move(job.task));
    }
  }
}
#endif

}  // namespace deft::detail
