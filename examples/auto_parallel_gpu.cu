// Automatic parallelism with a GPU, after the two GPU experiments of the
// seeds' chapter (compiled by nvcc against deft::cuda):
//
// 1. CPU and GPU at once: ten products on the CPU and ten on gpu(0), timed
//    alone and then recorded together before one wait_all(). Nothing in the
//    program says "in parallel": the engine hands the CPU tasks to its
//    workers while the GPU tasks queue on the device's stream.
// 2. Computing and copying at once: products on gpu(0) whose results are
//    copied to the host, first with a wait between the two phases, then
//    recorded together: each copy waits only for the event of the product it
//    reads, on its own stream, while the later products keep computing.
//
//   auto_parallel_gpu [--cpu-size N] [--gpu-size N] [--copy-size N] [--rounds N]
//
// The copies land in page-locked host tensors (to(cpu()) from a GPU
// allocates them from deft's pinned pool), written by DMA at the link's
// rate. Pinning is slow, so the pool keeps the blocks: part 2's products
// (--copy-size, 2048: 16 MiB each) get the same blocks back every round.
#include <deft/deft.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

using namespace deft;
using Clock = std::chrono::steady_clock;

static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

template <class F>
static double median_seconds(int rounds, F&& f) {
  f();  // warm-up: handles, pools, caches
  std::vector<double> t;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    f();
    t.push_back(since(start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// The chapter's run(x): ten products, recorded only (nothing waits here).
static std::vector<Tensor<float>> run(const Tensor<float>& x) {
  std::vector<Tensor<float>> ys;
  for (int i = 0; i < 10; ++i) ys.push_back(dot(x, x));
  return ys;
}

int main(int argc, char** argv) try {
  std::int64_t cpu_n = 512, gpu_n = 4096, copy_n = 2048;
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--cpu-size") cpu_n = std::stoll(argv[i + 1]);
    else if (a == "--gpu-size") gpu_n = std::stoll(argv[i + 1]);
    else if (a == "--copy-size") copy_n = std::stoll(argv[i + 1]);
    else if (a == "--rounds") rounds = std::max(1, std::stoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: auto_parallel_gpu [--cpu-size N] [--gpu-size N] [--copy-size N] [--rounds N]\n");
      return 2;
    }
  }
  if (num_gpus() == 0) {
    std::printf("auto_parallel_gpu: this machine has no CUDA GPU; nothing to show\n");
    return 0;
  }
  std::printf("deft %d.%d.%d: %d CPU workers and %d GPU(s); median of %d rounds\n", DEFT_VERSION_MAJOR,
              DEFT_VERSION_MINOR, DEFT_VERSION_PATCH, engine::num_workers(), num_gpus(), rounds);
  random::seed(1);
  const Tensor<float> x_cpu = random::uniform<float>(0, 1, {cpu_n, cpu_n});
  const Tensor<float> x_gpu = random::uniform<float>(0, 1, {gpu_n, gpu_n}, gpu(0));
  wait_all();

  std::printf("\n== 1. Ten products on the CPU (%lld^2) and ten on gpu(0) (%lld^2) ==\n", (long long)cpu_n,
              (long long)gpu_n);
  const double t_cpu = median_seconds(rounds, [&] {
    auto ys = run(x_cpu);
    wait_all();
  });
  const double t_gpu = median_seconds(rounds, [&] {
    auto ys = run(x_gpu);
    wait_all();
  });
  const double t_both = median_seconds(rounds, [&] {
    auto a = run(x_cpu);
    auto b = run(x_gpu);
    wait_all();
  });
  std::printf("CPU alone %.4f sec, GPU alone %.4f sec, both recorded together %.4f sec\n", t_cpu, t_gpu, t_both);
  std::printf("together / (CPU + GPU) = %.2f (1 would be one after the other; max/sum = %.2f is full overlap)\n",
              t_both / (t_cpu + t_gpu), std::max(t_cpu, t_gpu) / (t_cpu + t_gpu));

  std::printf("\n== 2. Ten products on gpu(0) (%lld^2) and their copies to the host ==\n", (long long)copy_n);
  const Tensor<float> x_copy = random::uniform<float>(0, 1, {copy_n, copy_n}, gpu(0));
  const double t_run = median_seconds(rounds, [&] {
    auto ys = run(x_copy);
    wait_all();
  });
  const double t_phases = median_seconds(rounds, [&] {
    auto ys = run(x_copy);
    wait_all();  // the products first...
    std::vector<Tensor<float>> host;
    for (auto& y : ys) host.push_back(y.to(cpu()));
    wait_all();  // ...then the copies
  });
  const double t_overlap = median_seconds(rounds, [&] {
    auto ys = run(x_copy);
    std::vector<Tensor<float>> host;
    for (auto& y : ys) host.push_back(y.to(cpu()));
    wait_all();  // one sync point: each copy follows its own product
  });
  std::printf("products alone %.4f sec; products, wait, copies %.4f sec; recorded together %.4f sec\n", t_run,
              t_phases, t_overlap);
  std::printf("copies alone about %.4f sec (%.1f GB/s); ", t_phases - t_run,
              10.0 * double(copy_n * copy_n) * sizeof(float) / std::max(t_phases - t_run, 1e-9) / 1e9);
  // At best, the shorter phase hides entirely behind the longer one.
  const double shorter = std::min(t_run, t_phases - t_run);
  std::printf("overlap: %.0f%% of the shorter phase ran hidden behind the other\n",
              shorter > 0 ? 100.0 * (t_phases - t_overlap) / shorter : 0.0);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "auto_parallel_gpu: %s\n", e.what());
  return 1;
}
