// record: what a tiny deferred op costs (100,000 `y = x + 1` on 4 floats:
// recording alone, record + run, a chain where every op runs, a sync per op,
// synchronous mode), against libtorch eager and a plain loop.
// sync_vs_deferred: the seeds' 1000 x `y = x + 1` on 2000 x 2000, a sync per
// step against one wait_all (which runs one step and discards 999).
#include <deft/device/cuda/lanes.hpp>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace bench {
namespace {

// What the GPU lanes' record (device/cuda/lanes.hpp) adds to each GPU op, on
// the host alone: a queue that does nothing stands for CUDA's events.
struct NoQueue {
  void order(int, int) const {}
  void order_at(int, std::uint64_t, const std::shared_ptr<void>&, int) const {}
  void marked(int, std::uint64_t) const {}
  void finished_at(int, std::uint64_t) const {}
  void queued(int, const deft::detail::MemoryUses&) const {}
};

// Four chains of ops, one per compute lane of a GPU's six (with the copy
// and collective lanes), over 240 pooled blocks and 16 parameters: each op
// reads its chain's last output and a parameter, writes the block the pool
// hands out next (whose readers on other lanes it waits for), and every
// eighth also reads another chain's output (a wait). With `marks`, the
// engine's ready mark after each op goes through the record. With two
// threads, each drives two of the chains over half the pool, as two workers
// queueing GPU work at once contend for the record's one lock.
void bench_lane_bookkeeping() {
  namespace gpu = deft::detail::gpu;
  const char* g = "record";
  constexpr int ops = 100000, lanes = 6, chains = 4, blocks = 256, pooled = blocks - 16;
  constexpr std::size_t block_bytes = 4096;
  static std::vector<char> memory(blocks * block_bytes);
  const auto block = [](int i) { return memory.data() + std::size_t(i) * block_bytes; };
  using Tracker = gpu::LaneTracker<NoQueue>;
  // `count` ops over chains [first, first + n) and pool blocks [from, to).
  const auto drive = [&](Tracker& tracker, bool marks, int first, int n, int from, int to, int count) {
    const auto make = [] { return std::make_shared<int>(0); };
    std::vector<int> last(static_cast<std::size_t>(n));
    for (int c = 0; c < n; ++c) last[std::size_t(c)] = from + c;
    int next = from + n;
    for (int i = 0; i < count; ++i) {
      const int c = i % n, out = next;
      next = next + 1 == to ? from : next + 1;
      deft::detail::MemoryUses uses{{block(last[std::size_t(c)]), block(blocks - 1 - i % 16)}, {block(out)}};
      if (i % 8 == 7) uses.reads.push_back(block(last[std::size_t((c + 1) % n)]));
      tracker.before(first + c, uses);
      tracker.after(first + c, uses);
      if (marks) clobber(tracker.mark(first + c, make).get());
      last[std::size_t(c)] = out;
    }
  };
  const auto run = [&](bool marks, int threads) {
    Tracker tracker(lanes, NoQueue{});
    for (int i = 0; i < blocks; ++i) tracker.add_block(block(i), block_bytes);
    if (threads == 1) return drive(tracker, marks, 0, chains, 0, pooled, ops);
    const int per = chains / threads, part = pooled / threads;
    std::vector<std::thread> team;
    for (int t = 0; t < threads; ++t)
      team.emplace_back([&, t] { drive(tracker, marks, t * per, per, t * part, (t + 1) * part, ops / threads); });
    for (auto& th : team) th.join();
  };
  auto times = measure_interleaved({[&] { run(true, 1); }, [&] { run(false, 1); }, [&] { run(true, 2); }});
  const std::string name = "GPU lanes' record per op (host only)";
  add_time(g, name, "deft", 1, "6 lanes", "ns/op", times[0], ops);
  add_time(g, name, "deft-no-marks", 1, "6 lanes", "ns/op", times[1], ops);
  add_time(g, name, "deft", 2, "6 lanes", "ns/op", times[2], ops);
}

}  // namespace

void bench_overhead() {
  using namespace deft;
  const char* g = "record";
  constexpr int n = 100000;
  const int w = engine::num_workers();
  auto x = random::uniform<float>(0, 1, {4});
  Tensor<float> y = x + 1;
  wait_all();

  // Recording alone (timed up to the sync point); each assignment supersedes
  // the previous, unrun one, so the sync point itself runs one task.
  auto rec = measure_split([&] { for (int i = 0; i < n; ++i) y = x + 1; }, [] { wait_all(); });
  add_time(g, "record only y=x+1", "deft", w, "4", "ns/op", rec, n);
  auto both = measure([&] {
    for (int i = 0; i < n; ++i) y = x + 1;
    wait_all();
  });
  add_time(g, "record+run y=x+1", "deft", w, "4", "ns/op", both, n);
  // Every op must run: each reads the previous value.
  auto chain = measure([&] {
    for (int i = 0; i < n; ++i) y += 1;
    wait_all();
  });
  add_time(g, "record+run y+=1 (all run)", "deft", w, "4", "ns/op", chain, n);
  // A sync per op: record, run at the sync point.
  constexpr int n_sync = 20000;
  auto sync = measure([&] {
    for (int i = 0; i < n_sync; ++i) {
      y = x + 1;
      y.wait_to_read();
    }
  });
  add_time(g, "y=x+1; wait_to_read", "deft", w, "4", "ns/op", sync, n_sync);
  // Synchronous mode: every statement runs on the calling thread before it returns.
  engine::set_mode(engine::Mode::synchronous);
  auto inline_run = measure([&] { for (int i = 0; i < n; ++i) y = x + 1; });
  engine::set_mode(engine::Mode::deferred);
  add_time(g, "synchronous mode y=x+1", "deft", w, "4", "ns/op", inline_run, n);

#if DEFT_BENCH_HAVE_TORCH
  // Eager: every op runs when written (the same work as deft's "all run" chain).
  torch_peer::set_threads(w);
  add_time(g, "record+run y=x+1", "torch", w, "4", "ns/op", torch_peer::tiny_ops(n, false), n);
  add_time(g, "record+run y+=1 (all run)", "torch", w, "4", "ns/op", torch_peer::tiny_ops(n, true), n);
#else
  skip(g, "torch", "libtorch not found");
#endif
  // Reference: the same four additions as a plain loop.
  std::vector<float> xs = x.to_vector(), ys(4);
  auto hand = measure([&] {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < 4; ++j) ys[j] = xs[j] + 1;
      clobber(ys.data());
    }
  });
  add_time(g, "record+run y=x+1", "hand", 1, "4", "ns/op", hand, n);
  bench_lane_bookkeeping();
}

void bench_seeds() {
  using namespace deft;
  const char* g = "sync_vs_deferred";
  constexpr int steps = 1000;
  const std::string size = "2000x2000";
  const int w = engine::num_workers();
  auto x = random::uniform<float>(0, 1, {2000, 2000});
  Tensor<float> y = x + 1;
  wait_all();

  auto sync = measure([&] {
    for (int i = 0; i < steps; ++i) {
      y = x + 1;
      y.wait_to_read();
    }
  });
  add_time(g, "y=x+1 x1000, sync each step", "deft", w, size, "ms", sync);
  auto deferred = measure([&] {
    for (int i = 0; i < steps; ++i) y = x + 1;
    wait_all();
  });
  add_time(g, "y=x+1 x1000, one wait_all", "deft", w, size, "ms", deferred);
  add(g, "ratio sync/deferred", "deft", w, size, "x", sync.median / deferred.median, sync.min / deferred.min);

  // When every step reads the previous one nothing can be discarded.
  auto sync_chain = measure([&] {
    for (int i = 0; i < steps; ++i) {
      y += 1;
      y.wait_to_read();
    }
  });
  add_time(g, "y+=1 x1000, sync each step", "deft", w, size, "ms", sync_chain);
  auto deferred_chain = measure([&] {
    for (int i = 0; i < steps; ++i) y += 1;
    wait_all();
  });
  add_time(g, "y+=1 x1000, one wait_all", "deft", w, size, "ms", deferred_chain);

  const std::vector<float> xv = x.to_vector();
  const FloatBuf xs(xv);
  FloatBuf ys(xv.size());
#if DEFT_BENCH_HAVE_TORCH
  torch_peer::set_threads(w);
  // Eager: all 1000 steps run (a fresh output each step, as `y = x + 1` does in Python).
  add_time(g, "y=x+1 x1000, sync each step", "torch", w, size, "ms", torch_peer::seeds(xs.data(), 2000, 2000, steps));
#else
  skip(g, "torch", "libtorch not found");
#endif
  // One step, for comparison with a hand-written loop.
  add(g, "y=x+1 one step", "deft", w, size, "ms", sync.median * 1e3 / steps, sync.min * 1e3 / steps);
  constexpr int hand_steps = 50;
  const float* xp = xs.data();
  float* yp = ys.data();
  const std::int64_t m = std::int64_t(xv.size());
  auto hand = measure([&] {
    for (int s = 0; s < hand_steps; ++s) {
      for (std::int64_t j = 0; j < m; ++j) yp[j] = xp[j] + 1;
      clobber(yp);
    }
  });
  add_time(g, "y=x+1 one step", "hand", 1, size, "ms", hand, hand_steps);
#if DEFT_BENCH_HAVE_OPENMP
  set_omp_threads(w);
  auto omp = measure([&] {
    for (int s = 0; s < hand_steps; ++s) {
#pragma omp parallel for schedule(static)
      for (std::int64_t j = 0; j < m; ++j) yp[j] = xp[j] + 1;
      clobber(yp);
    }
  });
  add_time(g, "y=x+1 one step", "hand-omp", w, size, "ms", omp, hand_steps);
#endif
}

}  // namespace bench
