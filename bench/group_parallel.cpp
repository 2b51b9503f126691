// parallel: independent subtrees (`dot(a, b) + dot(c, d)`, ten independent
// products) with all workers against one worker, and an FMA loop on every
// thread as the reference for how well this machine's cores scale.
#include "common.hpp"

#include <thread>

namespace bench {
namespace {
using namespace deft;
// --- (c) independent subtrees ----------------------------------------------------
void speedup_rows(const char* g, const std::string& name, const std::string& size, const std::function<void()>& f) {
  const int all = engine::num_workers();
  engine::set_num_workers(1);
  const Summary one = measure(f);
  add_time(g, name, "deft", 1, size, "ms", one);
  engine::set_num_workers(all);
  const Summary many = measure(f);
  add_time(g, name, "deft", all, size, "ms", many);
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
}

}  // namespace bench
