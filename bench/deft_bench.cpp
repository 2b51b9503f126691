// deft_bench: the cost of deferral and the gain from it, in three groups.
//
//   record            what recording one deferred op costs (100,000 tiny `y = x + 1`)
//   sync_vs_deferred  the seed chapter's 1000 x `y = x + 1` on 2000 x 2000,
//                     a sync per step versus one wait_all
//   parallel          independent subtrees: all workers over one worker
//
// Every figure is the median (and min) of --repeats timed repeats after one
// warm-up. A hand-written loop gives the reference for the `y = x + 1` step.
//
// usage: deft_bench [--filter SUBSTRING] [--csv FILE] [--repeats N]
//   --filter  runs only the groups whose name contains SUBSTRING
//   --csv     also writes the rows as group,case,library,threads,size,unit,median,min
#include <deft/deft.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace deft;
using Clock = std::chrono::steady_clock;

namespace {

struct Row {
  std::string group, name, library;
  int threads;
  std::string size, unit;
  double median, min;
};

struct Options {
  std::string filter;
  std::string csv;
  int repeats = 7;
};

std::vector<Row> rows;
Options opts;

double seconds_of(const std::function<void()>& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Summary {
  double median, min;
};

/// One warm-up, then opts.repeats calls of timed() followed by untimed(); seconds of timed().
Summary measure_split(const std::function<void()>& timed, const std::function<void()>& untimed) {
  timed();
  untimed();
  std::vector<double> t;
  for (int r = 0; r < opts.repeats; ++r) {
    t.push_back(seconds_of(timed));
    untimed();
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

/// One warm-up call of `f`, then opts.repeats timed calls; seconds.
Summary measure(const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < opts.repeats; ++r) t.push_back(seconds_of(f));
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front()};
}

/// Like measure, but times only `record` and runs wait_all() after each call, untimed.
Summary measure_until_sync(const std::function<void()>& record) {
  return measure_split(record, [] { wait_all(); });
}

void add(const std::string& group, const std::string& name, const std::string& library, int threads,
         const std::string& size, const std::string& unit, double median, double min) {
  rows.push_back({group, name, library, threads, size, unit, median, min});
  std::printf("%-18s %-28s %-8s %7d %-16s %-7s %12.4f %12.4f\n", group.c_str(), name.c_str(), library.c_str(),
              threads, size.c_str(), unit.c_str(), median, min);
  std::fflush(stdout);
}

bool selected(const char* group) { return opts.filter.empty() || std::strstr(group, opts.filter.c_str()); }

/// Keeps the compiler from dropping a hand-written loop whose result is unused.
inline void clobber(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

// --- (a) recording cost -------------------------------------------------------
void bench_record() {
  const char* g = "record";
  constexpr int n = 100000;
  const int w = engine::num_workers();
  auto x = random::uniform<float>(0, 1, {4});
  Tensor<float> y = x + 1;
  wait_all();

  // Recording alone (timed up to the sync point); each assignment supersedes
  // the previous, unrun one, so the sync point itself runs one task.
  auto rec = measure_until_sync([&] {
    for (int i = 0; i < n; ++i) y = x + 1;
  });
  add(g, "record_only y=x+1", "deft", w, "4", "ns/op", rec.median / n * 1e9, rec.min / n * 1e9);

  auto both = measure([&] {
    for (int i = 0; i < n; ++i) y = x + 1;
    wait_all();
  });
  add(g, "record+run y=x+1", "deft", w, "4", "ns/op", both.median / n * 1e9, both.min / n * 1e9);

  // Every op must run: each reads the previous value.
  auto chain = measure([&] {
    for (int i = 0; i < n; ++i) y += 1;
    wait_all();
  });
  add(g, "record+run y+=1 (all run)", "deft", w, "4", "ns/op", chain.median / n * 1e9, chain.min / n * 1e9);

  // A sync per op: record, hand to a worker, wait for it.
  constexpr int n_sync = 10000;
  auto sync = measure([&] {
    for (int i = 0; i < n_sync; ++i) {
      y = x + 1;
      y.wait_to_read();
    }
  });
  add(g, "y=x+1; wait_to_read", "deft", w, "4", "ns/op", sync.median / n_sync * 1e9, sync.min / n_sync * 1e9);

  // Synchronous mode: every statement runs on the calling thread before it returns.
  engine::set_mode(engine::Mode::synchronous);
  auto inline_run = measure([&] {
    for (int i = 0; i < n; ++i) y = x + 1;
  });
  engine::set_mode(engine::Mode::deferred);
  add(g, "synchronous mode y=x+1", "deft", w, "4", "ns/op", inline_run.median / n * 1e9, inline_run.min / n * 1e9);

  // Reference: the same four additions as a plain loop.
  std::vector<float> xs = x.to_vector(), ys(4);
  auto hand = measure([&] {
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < 4; ++j) ys[j] = xs[j] + 1;
      clobber(ys.data());
    }
  });
  add(g, "y=x+1", "hand", 1, "4", "ns/op", hand.median / n * 1e9, hand.min / n * 1e9);
}

// --- (b) the seeds' 1000 x y = x + 1 -------------------------------------------
void bench_sync_vs_deferred() {
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
  add(g, "sync_each_step x1000", "deft", w, size, "ms", sync.median * 1e3, sync.min * 1e3);
  auto deferred = measure([&] {
    for (int i = 0; i < steps; ++i) y = x + 1;
    wait_all();
  });
  add(g, "deferred_wait_all x1000", "deft", w, size, "ms", deferred.median * 1e3, deferred.min * 1e3);
  add(g, "ratio sync/deferred", "deft", w, size, "x", sync.median / deferred.median, sync.min / deferred.min);

  // When every step reads the previous one nothing can be discarded.
  auto sync_chain = measure([&] {
    for (int i = 0; i < steps; ++i) {
      y += 1;
      y.wait_to_read();
    }
  });
  add(g, "y+=1 sync_each_step x1000", "deft", w, size, "ms", sync_chain.median * 1e3, sync_chain.min * 1e3);
  auto deferred_chain = measure([&] {
    for (int i = 0; i < steps; ++i) y += 1;
    wait_all();
  });
  add(g, "y+=1 deferred x1000", "deft", w, size, "ms", deferred_chain.median * 1e3, deferred_chain.min * 1e3);
  add(g, "ratio y+=1 sync/deferred", "deft", w, size, "x", sync_chain.median / deferred_chain.median,
      sync_chain.min / deferred_chain.min);

  // One step, for comparison with the hand-written loop.
  add(g, "y=x+1 step (sync)", "deft", w, size, "ms/step", sync.median * 1e3 / steps, sync.min * 1e3 / steps);
  const std::vector<float> xs = x.to_vector();
  std::vector<float> ys(xs.size());
  constexpr int hand_steps = 50;
  auto hand = measure([&] {
    for (int s = 0; s < hand_steps; ++s) {
      const float* xp = xs.data();
      float* yp = ys.data();
      const std::size_t m = xs.size();
      for (std::size_t j = 0; j < m; ++j) yp[j] = xp[j] + 1;
      clobber(yp);
    }
  });
  add(g, "y=x+1 step", "hand", 1, size, "ms/step", hand.median * 1e3 / hand_steps, hand.min * 1e3 / hand_steps);
}

// --- (c) independent subtrees ----------------------------------------------------
void speedup_rows(const char* g, const std::string& name, const std::string& size, const std::function<void()>& f) {
  const int all = engine::num_workers();
  engine::set_num_workers(1);
  const Summary one = measure(f);
  add(g, name, "deft", 1, size, "ms", one.median * 1e3, one.min * 1e3);
  engine::set_num_workers(all);
  const Summary many = measure(f);
  add(g, name, "deft", all, size, "ms", many.median * 1e3, many.min * 1e3);
  add(g, name + " speed-up", "deft", all, size, "x", one.median / many.median, one.min / many.min);
}

/// FMA chains on one thread: a compute-bound reference for how well this
/// machine's cores scale (no memory traffic, no deft).
float fma_spin(long iterations) {
  using B = xsimd::batch<float>;
  static volatile float seed_m = 0.9999999f, seed_c = 1e-7f;  // opaque: no constant folding
  const B m(seed_m), c(seed_c);
  B acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = B(seed_m + float(i) * seed_c);
  for (long it = 0; it < iterations; ++it)
    for (auto& a : acc) a = xsimd::fma(a, m, c);
  float s = 0;
  for (auto& a : acc) s += xsimd::hadd(a);
  return s;
}

void bench_parallel() {
  const char* g = "parallel";
  {
    // Reference: the same FMA loop on every thread at once, by hand (std::thread).
    const int all = engine::num_workers();
    constexpr long iterations = 10000000;  // about 15 ms on one AVX-512 core
    auto spin = [&](int threads) {
      std::vector<std::thread> ts;
      std::vector<float> out(threads);
      for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { out[t] = fma_spin(iterations); });
      for (auto& t : ts) t.join();
      clobber(out.data());
    };
    const Summary one = measure([&] { spin(1); });
    const Summary many = measure([&] { spin(all); });
    add(g, "fma loop, same work/thread", "hand", 1, "-", "ms", one.median * 1e3, one.min * 1e3);
    add(g, "fma loop, same work/thread", "hand", all, "-", "ms", many.median * 1e3, many.min * 1e3);
    add(g, "fma loop throughput gain", "hand", all, "-", "x", all * one.median / many.median,
        all * one.min / many.min);
  }
  {
    auto x = random::uniform<float>(0, 1, {512, 512});
    x.wait_to_read();
    speedup_rows(g, "ten independent dots", "512x512", [&] {
      std::vector<Tensor<float>> ys;
      for (int i = 0; i < 10; ++i) ys.push_back(dot(x, x));
      wait_all();
    });
  }
  {
    auto a = random::uniform<float>(0, 1, {1000, 1000});
    auto b = random::uniform<float>(0, 1, {1000, 1000});
    auto c = random::uniform<float>(0, 1, {1000, 1000});
    auto d = random::uniform<float>(0, 1, {1000, 1000});
    wait_all();
    speedup_rows(g, "dot(a,b)+dot(c,d)", "1000x1000", [&] {
      Tensor<float> s = dot(a, b) + dot(c, d);
      s.wait_to_read();
    });
  }
  {
    // 64 rows: one product is a single block of rows and runs on one thread,
    // so any speed-up comes from running the two products side by side.
    auto a = random::uniform<float>(0, 1, {64, 4096});
    auto b = random::uniform<float>(0, 1, {4096, 1024});
    auto c = random::uniform<float>(0, 1, {64, 4096});
    auto d = random::uniform<float>(0, 1, {4096, 1024});
    wait_all();
    speedup_rows(g, "dot(a,b)+dot(c,d)", "64x4096x1024", [&] {
      Tensor<float> s = dot(a, b) + dot(c, d);
      s.wait_to_read();
    });
  }
}

void write_csv(const std::string& path) {
  std::ofstream out(path);
  if (!out) {
    std::fprintf(stderr, "deft_bench: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  out << "group,case,library,threads,size,unit,median,min\n";
  for (const auto& r : rows)
    out << r.group << ',' << '"' << r.name << '"' << ',' << r.library << ',' << r.threads << ',' << r.size << ','
        << r.unit << ',' << r.median << ',' << r.min << '\n';
}

/// The first field of /proc/loadavg (other processes competing for the cores), or "n/a".
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  return in >> first ? first : "n/a";
}

void usage() {
  std::fprintf(stderr, "usage: deft_bench [--filter SUBSTRING] [--csv FILE] [--repeats N]\n"
                       "groups: record, sync_vs_deferred, parallel\n");
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--filter" || a == "--csv" || a == "--repeats") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--filter") opts.filter = v;
      else if (a == "--csv") opts.csv = v;
      else opts.repeats = std::max(1, std::atoi(v.c_str()));
    } else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::printf("deft_bench: deft %d.%d.%d, %d workers, median and min of %d repeats after 1 warm-up, load average before start %s\n",
              DEFT_VERSION_MAJOR, DEFT_VERSION_MINOR, DEFT_VERSION_PATCH, engine::num_workers(), opts.repeats,
              load_average().c_str());
  std::printf("%-18s %-28s %-8s %7s %-16s %-7s %12s %12s\n", "group", "case", "library", "threads", "size", "unit",
              "median", "min");
  if (selected("record")) bench_record();
  if (selected("sync_vs_deferred")) bench_sync_vs_deferred();
  if (selected("parallel")) bench_parallel();
  if (rows.empty()) {
    std::fprintf(stderr, "deft_bench: no group matches --filter %s\n", opts.filter.c_str());
    usage();
    return 2;
  }
  if (!opts.csv.empty()) write_csv(opts.csv);
  return 0;
}
