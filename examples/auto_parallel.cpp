// Automatic parallelism, after the D2L chapter's exercise ("设计实验，看看MXNet
//有没有自动并行执行它们"): ten independent dot products, and dot(a, b) + dot(c, d).
//
// deft records each product as one task. Tasks that do not depend on each
// other are handed to the workers together at the sync point, so they run at
// the same time without the program saying so. `--trace FILE` also writes a
// Chrome trace (engine::trace_to) of both experiments at a small size.
// docs/tutorial.md walks through this program and its output.
#include <deft/deft.hpp>
#include <deft/engine/profiler.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace deft;
using Clock = std::chrono::steady_clock;

static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The exercise's run(x): ten independent products, then one sync point.
static void run(const Tensor<float>& x) {
  std::vector<Tensor<float>> ys;
  ys.reserve(10);
  for (int i = 0; i < 10; ++i) ys.push_back(dot(x, x));
  wait_all();
}

/// Median seconds of one run(x) over `rounds` rounds (after one warm-up round).
static double time_run(const Tensor<float>& x, int rounds) {
  run(x);
  std::vector<double> t;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    run(x);
    t.push_back(since(start));
  }
  return median(t);
}

static void ten_dots(int all) {
  std::printf("\n== 1. Ten independent dot(x, x), one wait_all ==\n");
  for (const int n : {64, 1000}) {
    auto x = random::uniform<float>(0, 1, {n, n});
    x.wait_to_read();
    const int rounds = n < 200 ? 201 : 5;
    engine::set_num_workers(1);
    const double t1 = time_run(x, rounds);
    engine::set_num_workers(all);
    const double tn = time_run(x, rounds);
    std::printf("x of %d x %d: 1 worker %.6f sec, %d workers %.6f sec, speed-up %.2fx (median of %d rounds)\n", n, n,
                t1, all, tn, t1 / tn, rounds);
  }
}

struct Finish {
  double p = -1, q = -1, s = -1;
};

/// Records p = dot(a, b), q = dot(c, d) and s = p + q, starts the work from a
/// helper thread (s.wait_to_read()) and notes when p, q and s become ready.
static Finish watch_two_products(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& c,
                                 const Tensor<float>& d) {
  Tensor<float> p = dot(a, b);
  Tensor<float> q = dot(c, d);
  Tensor<float> s = p + q;
  Finish f;
  const auto start = Clock::now();
  std::thread sync([&] {
    s.wait_to_read();
    f.s = since(start);
  });
  while (f.p < 0 || f.q < 0) {  // is_ready() never blocks
    if (f.p < 0 && p.is_ready()) f.p = since(start);
    if (f.q < 0 && q.is_ready()) f.q = since(start);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  sync.join();
  return f;
}

static void two_products(int all) {
  std::printf("\n== 2. s = dot(a, b) + dot(c, d): both products at once ==\n");
  // 64-row products: each could also be split into row blocks, but the
  // trace (--trace) shows the two tasks running side by side, one on each
  // core, with no helper while both cores are held.
  auto a = random::uniform<float>(0, 1, {64, 4096});
  auto b = random::uniform<float>(0, 1, {4096, 1024});
  auto c = random::uniform<float>(0, 1, {64, 4096});
  auto d = random::uniform<float>(0, 1, {4096, 1024});
  wait_all();
  for (const int w : {1, all}) {
    engine::set_num_workers(w);
    watch_two_products(a, b, c, d);  // warm-up
    std::vector<Finish> runs;
    for (int r = 0; r < 5; ++r) runs.push_back(watch_two_products(a, b, c, d));
    const Finish f = runs[2];  // a typical run (the full list is in the median below)
    std::vector<double> total;
    for (const auto& r : runs) total.push_back(r.s);
    std::printf("%d worker%s: dot(a, b) ready at %.4f sec, dot(c, d) ready at %.4f sec, sum ready at %.4f sec"
                " (median total %.4f sec)\n",
                w, w == 1 ? " " : "s", f.p, f.q, f.s, median(total));
  }

  // 1000 x 1000: one product alone would split its rows across every core;
  // two at once run side by side, one on each core.
  auto a2 = random::uniform<float>(0, 1, {1000, 1000});
  auto b2 = random::uniform<float>(0, 1, {1000, 1000});
  auto c2 = random::uniform<float>(0, 1, {1000, 1000});
  auto d2 = random::uniform<float>(0, 1, {1000, 1000});
  wait_all();
  for (const int w : {1, all}) {
    engine::set_num_workers(w);
    std::vector<double> t;
    for (int r = 0; r < 6; ++r) {
      const auto start = Clock::now();
      Tensor<float> s = dot(a2, b2) + dot(c2, d2);
      s.wait_to_read();
      if (r > 0) t.push_back(since(start));  // round 0 is the warm-up
    }
    std::printf("1000 x 1000, %d worker%s: dot(a, b) + dot(c, d) in %.4f sec (median of 5)\n", w, w == 1 ? " " : "s",
                median(t));
  }
}

/// --trace FILE: a Chrome trace of ten 64 x 64 products, of dot(a, b) +
/// dot(c, d) with 64-row and with 1000 x 1000 operands (docs/tutorial.md,
/// section 11, shows the picture).
static void trace(int all, const std::string& path) {
  std::printf("\n== 3. A trace of both experiments ==\n");
  engine::set_num_workers(all);
  auto x = random::uniform<float>(0, 1, {64, 64});
  auto a = random::uniform<float>(0, 1, {64, 4096});
  auto b = random::uniform<float>(0, 1, {4096, 1024});
  auto c = random::uniform<float>(0, 1, {64, 4096});
  auto d = random::uniform<float>(0, 1, {4096, 1024});
  auto big = random::uniform<float>(0, 1, {1000, 1000});
  wait_all();
  run(x);  // warm-up: not traced
  engine::trace_to(path);
  run(x);
  Tensor<float> s = dot(a, b) + dot(c, d);
  s.wait_to_read();
  Tensor<float> s2 = dot(big, big) + dot(big, big);
  s2.wait_to_read();
  const std::size_t slices = engine::trace_stop();
  std::printf("trace written to %s: %zu tasks\n", path.c_str(), slices);
}

int main(int argc, char** argv) {
  std::string trace_path;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--trace") trace_path = argv[i + 1];
  const int all = engine::num_workers();
  std::printf("deft %d.%d.%d, %d workers available\n", DEFT_VERSION_MAJOR, DEFT_VERSION_MINOR, DEFT_VERSION_PATCH,
              all);
  const auto start = Clock::now();
  ten_dots(all);
  two_products(all);
  if (!trace_path.empty()) trace(all, trace_path);
  engine::set_num_workers(all);
  std::printf("\nwhole program: %.1f sec\n", since(start));
}
