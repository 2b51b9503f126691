// ThreadPool: a fixed set of workers sharing one FIFO of jobs. A job is either
// a ready task or a helper for a parallel loop; loops are split into chunks
// that the calling thread and any idle worker claim with an atomic counter.
#pragma once
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "profiler.hpp"
#include "task.hpp"

namespace deft::detail {

class ThreadPool {
 public:
  using TaskRunner = void (*)(std::shared_ptr<Task>);

  ThreadPool(int workers, TaskRunner run_task) : run_task_(run_task) {
    workers = std::max(workers, 1);
    threads_.reserve(workers);
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] {
      worker_index() = i;
      work();
    });
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Finishes every queued job, then joins the workers.
  ~ThreadPool() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const { return static_cast<int>(threads_.size()); }

  void push(std::vector<std::shared_ptr<Task>>& ready) {
    if (ready.empty()) return;
    {
      std::lock_guard lk(m_);
      for (auto& t : ready) jobs_.push_back(Job{std::move(t), nullptr});
    }
    if (ready.size() == 1) cv_.notify_one();
    else cv_.notify_all();
    ready.clear();
  }

  /// Runs body(i) for i in [0, chunks), on this thread and on idle workers.
  /// Returns when all chunks ran; rethrows the first exception a chunk threw.
  template <class Body>
  void parallel_for(std::int64_t chunks, Body&& body) {
    if (chunks <= 1) {
      if (chunks == 1) body(std::int64_t{0});
      return;
    }
    Loop loop;
    loop.owner = profiled_task();  // null unless a trace records: then helpers' slices name it
    loop.count = chunks;
    loop.context = &body;
    loop.call = [](void* ctx, std::int64_t i) { (*static_cast<std::remove_reference_t<Body>*>(ctx))(i); };
    // The calling thread works too (a worker, or a user thread running a task
    // at its sync point): with size() - 1 helpers at most size() threads run.
    const int helpers = static_cast<int>(std::min<std::int64_t>(chunks - 1, size() - 1));
    {
      std::lock_guard lk(m_);
      for (int i = 0; i < helpers; ++i) jobs_.push_back(Job{nullptr, &loop});
    }
    if (helpers == 1) cv_.notify_one();
    else cv_.notify_all();
    loop.run_chunks();
    // Take back helpers no worker has started; wait for those that have.
    int removed = 0;
    {
      std::lock_guard lk(m_);
      auto it = std::remove_if(jobs_.begin(), jobs_.end(), [&](const Job& j) { return j.loop == &loop; });
      removed = static_cast<int>(jobs_.end() - it);
      jobs_.erase(it, jobs_.end());
    }
    const int started = helpers - removed;
    while (loop.helpers_done.load(std::memory_order_acquire) < started) std::this_thread::yield();
    if (loop.error) std::rethrow_exception(loop.error);
  }

 private:
  struct Loop {
    ProfiledTask owner;  // the task running this loop, named only while a trace records
    std::int64_t count = 0;
    void* context = nullptr;
    void (*call)(void*, std::int64_t) = nullptr;
    std::atomic<std::int64_t> next{0};
    std::atomic<int> helpers_done{0};
    std::mutex error_mutex;
    std::exception_ptr error;

    void run_chunks() {
      for (std::int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
        try {
          call(context, i);
        } catch (...) {
          std::lock_guard lk(error_mutex);
          if (!error) error = std::current_exception();
          next.store(count, std::memory_order_relaxed);  // stop handing out chunks
        }
      }
    }
  };
  struct Job {
    std::shared_ptr<Task> task;
    Loop* loop;
  };

  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock lk(m_);
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      if (job.loop) {
        {
          HelpSlice slice(job.loop->owner);  // the profiler's record of this help, if a trace records
          job.loop->run_chunks();
        }
        job.loop->helpers_done.fetch_add(1, std::memory_order_release);
      } else {
        run_task_(std::move(job.task));
      }
    }
  }

  TaskRunner run_task_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
};

}  // namespace deft::detail
