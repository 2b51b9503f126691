// The seeds' memory experiment (D2L "asynchronous computation", MXNet): an
// MLP 512 -> 2048 -> 512 -> 1 trained with L2 loss and SGD (lr 0.005) on
// 100 batches of X ~ N(0, 1) (1024 x 512), y = 1; once with a sync point
// per batch (the loss read as a number) and once with none. With MXNet the
// second run's memory grows with the queued batches; deft bounds the work
// deferral may hold (engine::Limits), so it stays within a small bound.
//
//   train_mlp_synthetic [--batches N] [--batch-size N]
#include <deft/nn.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

using namespace deft;
using Clock = std::chrono::steady_clock;

namespace {

/// VmRSS (resident) or VmHWM (peak resident) of this process in MB; -1 if unknown.
double memory_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    double kb = 0;
    if (key == std::string(field) + ":" && in >> kb) return kb / 1024.0;
    std::getline(in, key);
  }
  return -1;
}

struct Run {
  double seconds, loss, rss_increase_mb;
};

}  // namespace

int main(int argc, char** argv) {
  int batches = 100;
  std::int64_t batch_size = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batches") batches = std::atoi(argv[i + 1]);
    else if (a == "--batch-size") batch_size = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: train_mlp_synthetic [--batches N] [--batch-size N]\n");
      return 2;
    }
  }
  if (batches < 1 || batch_size < 1) {
    std::fprintf(stderr, "train_mlp_synthetic: --batches and --batch-size must be at least 1\n");
    return 2;
  }

  random::seed(1);
  nn::Sequential net;
  net.add(std::make_shared<nn::Dense>(2048, nn::Act::relu), std::make_shared<nn::Dense>(512, nn::Act::relu),
          std::make_shared<nn::Dense>(1));
  net.initialize(nn::init::normal(0.01));
  nn::Trainer trainer(net.collect_params(), nn::SGD{.learning_rate = 0.005f});
  const nn::L2Loss loss;

  // A first batch initializes the parameters (deferred initialization).
  loss(net(random::normal<float>(0, 1, {batch_size, 512})), ones<float>({batch_size})).wait_to_read();
  std::printf("MLP 512-2048-512-1, %d batches of %lld x 512, SGD lr 0.005, %d workers\n", batches,
              static_cast<long long>(batch_size), engine::num_workers());

  auto train = [&](bool sync_each_batch) {
    wait_all();
    const double rss0 = memory_mb("VmRSS");
    const auto t0 = Clock::now();
    Tensor<float> last_loss;
    for (int i = 0; i < batches; ++i) {
      const Tensor<float> x = random::normal<float>(0, 1, {batch_size, 512});
      const Tensor<float> y = ones<float>({batch_size});
      {
        autograd::record rec;
        Tensor<float> l = loss(net(x), y);
        l.backward();
        last_loss = l.detach();
      }
      trainer.step(batch_size);
      if (sync_each_batch) (void)mean(last_loss).item();  // the sync point (the seeds' asscalar)
      if ((i + 1) % 50 == 0)
        std::printf("  batch %d, time %.4f sec\n", i + 1, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    wait_all();
    return Run{std::chrono::duration<double>(Clock::now() - t0).count(), mean(last_loss).item(),
               memory_mb("VmRSS") - rss0};
  };

  std::printf("with a sync point per batch:\n");
  const Run synced = train(true);
  std::printf("  %.1f ms per batch, final loss %.6f, increased memory: %.1f MB\n", synced.seconds * 1e3 / batches,
              synced.loss, synced.rss_increase_mb);
  std::printf("without sync points (deft bounds the deferred work):\n");
  const Run free_running = train(false);
  std::printf("  %.1f ms per batch, final loss %.6f, increased memory: %.1f MB\n", free_running.seconds * 1e3 / batches,
              free_running.loss, free_running.rss_increase_mb);
  const auto s = engine::stats();
  std::printf("engine: peak %zu pending tasks / %.1f MB; %llu backpressure waits; peak RSS %.1f MB\n",
              s.peak_tasks_pending, double(s.peak_bytes_pending) / (1 << 20),
              static_cast<unsigned long long>(s.backpressure_waits), memory_mb("VmHWM"));
  return 0;
}
