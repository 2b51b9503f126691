// parallel: independent subtrees (`dot(a, b) + dot(c, d)`, ten independent
// products) with all workers against one worker, an FMA loop on every
// thread as the reference for how well this machine's cores scale, and
// deft's workers beside an OpenMP pool in the same process.
#include "common.hpp"

#include <chrono>
#include <thread>

#if DEFT_BENCH_HAVE_OPENMP
#include <omp.h>
#endif

namespace bench {
namespace {
using namespace deft;
// --- (c) independent subtrees ----------------------------------------------------
// f on one worker and on all, and the speed-up; times in `unit` per `per` calls of the work f repeats.
void speedup_rows(const char* g, const std::string& name, const std::string& size, const std::function<void()>& f,
                  const std::string& unit = "ms", double per = 1) {
  const int all = engine::num_workers();
  engine::set_num_workers(1);
  const Summary one = measure(f);
  add_time(g, name, "deft", 1, size, unit, one, per);
  engine::set_num_workers(all);
  const Summary many = measure(f);
  add_time(g, name, "deft", all, size, unit, many, per);
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

#if DEFT_BENCH_HAVE_OPENMP
/// deft's workers and an OpenMP pool in one process, on all threads each: a
/// bias add by deft and the same loop by OpenMP, each timed right after a
/// call of its own kind and right after the other's. libgomp's idle threads
/// spin for a while after a loop (OMP_WAIT_POLICY, GOMP_SPINCOUNT) and deft's
/// idle workers poll for engine::worker_poll(), so each can find the cores
/// still taken by the other. Run once as is and once with
/// OMP_WAIT_POLICY=passive.
void neighbour_rows(const char* g) {
  constexpr std::int64_t R = 1024, C = 2048;
  const int all = engine::num_workers();
  auto tx = random::uniform<float>(-4, 4, {R, C});
  auto tb = random::uniform<float>(-1, 1, {C});
  Tensor<float> ty = tx + tb;
  ty.wait_to_read();
  const float *px = storage_of(tx), *pb = storage_of(tb);
  FloatBuf y(R * C);
  float* py = y.data();
  set_omp_threads(all);
  const auto with_deft = [&] {
    ty = tx + tb;
    ty.wait_to_read();
  };
  const auto with_omp = [&] {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < R; ++i)
      for (std::int64_t j = 0; j < C; ++j) py[i * C + j] = px[i * C + j] + pb[j];
    clobber(py);
  };
  // In turn: deft, deft, omp, deft, omp, omp. Call 1 follows deft, call 3
  // follows OpenMP, call 2 follows deft, call 5 follows OpenMP.
  const auto s = measure_interleaved({with_deft, with_deft, with_omp, with_deft, with_omp, with_omp});
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const std::string size = std::string("1024x2048, OMP_WAIT_POLICY=") + (policy ? policy : "unset");
  add_time(g, "bias add after its own kind", "deft", all, size, "ms", s[1]);
  add_time(g, "bias add after its own kind", "hand-omp", all, size, "ms", s[5]);
  add_time(g, "bias add after the other's", "deft", all, size, "ms", s[3]);
  add_time(g, "bias add after the other's", "hand-omp", all, size, "ms", s[2]);
  add(g, "slowed by the other's call", "deft", all, size, "x", s[3].median / s[1].median, s[3].min / s[1].min);
  add(g, "slowed by the other's call", "hand-omp", all, size, "x", s[2].median / s[5].median, s[2].min / s[5].min);
}
#endif

}  // namespace

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
    // Handing half of a loop to a polling worker: two pieces that each spin
    // for 300 ns (600 ns on one thread), 2000 loops back to back per repeat.
    // On all threads, what a loop takes beyond 300 ns is the hand-off.
    constexpr int loops = 2000;
    const auto spin = [] {
      const auto start = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - start < std::chrono::nanoseconds(300)) {
      }
    };
    speedup_rows(g, "loop of two 300 ns pieces", "2x300ns", [&] {
      for (int i = 0; i < loops; ++i) detail::Engine::get().parallel_for(2, [&](std::int64_t) { spin(); });
    }, "ns", loops);
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
    // 64 rows: small products whose own row split gains little, so most of
    // any speed-up comes from running the two products side by side.
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
#if DEFT_BENCH_HAVE_OPENMP
  neighbour_rows(g);
#else
  skip(g, "hand-omp", "OpenMP not found");
#endif
}

}  // namespace bench
