// Times two checkouts' CPU GEMMs (bench/gemm_ab.py builds each into a shared
// object) in alternation on the same operands: per shape, the median over
// pairs of new time / old time, and whether the results are the same bits.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using Run = void (*)(std::int64_t, std::int64_t, std::int64_t, const float*, bool, const float*, bool, float*, int);

static Run load(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "gemm_ab: %s\n", dlerror());
    std::exit(2);
  }
  return reinterpret_cast<Run>(dlsym(h, "deft_gemm_ab_run"));
}

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: gemm_ab OLD.so NEW.so m n k ta tb threads pairs\n");
    return 2;
  }
  const Run old_run = load(argv[1]), new_run = load(argv[2]);
  const std::int64_t m = std::atoll(argv[3]), n = std::atoll(argv[4]), k = std::atoll(argv[5]);
  const bool ta = argv[6][0] == '1', tb = argv[7][0] == '1';
  const int threads = std::atoi(argv[8]), pairs = std::atoi(argv[9]);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(std::size_t(m * k)), b(std::size_t(k * n)), c0(std::size_t(m * n)), c1(std::size_t(m * n));
  for (auto& x : a) x = u(g);
  for (auto& x : b) x = u(g);
  using clock = std::chrono::steady_clock;
  auto time = [&](Run f, float* c) {
    const auto t0 = clock::now();
    f(m, n, k, a.data(), ta, b.data(), tb, c, threads);
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  time(old_run, c0.data());  // warm-up: pools started, pages touched
  time(new_run, c1.data());
  std::vector<double> ratio;
  for (int i = 0; i < pairs; ++i) {
    const double t_old = time(old_run, c0.data()), t_new = time(new_run, c1.data());
    ratio.push_back(t_new / t_old);
  }
  std::sort(ratio.begin(), ratio.end());
  const bool same = std::memcmp(c0.data(), c1.data(), c0.size() * sizeof(float)) == 0;
  std::printf("| %lldx%lldx%lld%s%s | %d | %.3f (%.3f-%.3f) | %s |\n", (long long)m, (long long)n, (long long)k,
              ta ? ", A transposed" : "", tb ? ", B transposed" : "", threads, ratio[ratio.size() / 2],
              ratio[ratio.size() / 4], ratio[ratio.size() * 3 / 4], same ? "yes" : "no");
}
