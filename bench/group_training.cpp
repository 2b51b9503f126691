// training: deft's nn + autograd against libtorch's eager autograd, same
// initial weights and data, same thread count.
//   - the seeds' MLP training step (batch 1024, 512 -> 2048 -> 512 -> 1, ReLU,
//     L2 loss, SGD lr 0.005): ms per step, ending with every value computed;
//     and the peak memory a few steps add, each library measured alone in a
//     child process (peak RSS above the RSS after set-up);
//   - the seeds' 512 -> 256 -> 128 -> 2 forward at batch 1, imperative and
//     hybridized, each result read (us per call);
//   - a training step of 512 -> 256 -> 128 -> 10 at batch 32 and of
//     32 -> 16 -> 16 -> 10 at batch 8 (softmax cross-entropy, SGD with
//     momentum), written out and as nn::TrainStep (us per step);
//   - the small one with its gradients clipped by their global norm: the
//     norm read back each step (Gluon's way), deferred, and as a TrainStep;
//   - the seeds' data-parallel step on cpu(0) and cpu(1) with the gradients
//     summed in one bucket, against one sum per parameter (us per step);
//   - a training-mode BatchNorm's forward and backward over (128, 16, 28, 28),
//     against the same step written out by hand (OpenMP over the channels);
//   - one Fashion-MNIST epoch of the example's MLP (784 -> 256 -> 10, SGD
//     with momentum, batch 256, the same batches in the same order): seconds
//     per epoch and samples per second.
#include <deft/data.hpp>
#include <deft/nn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <unistd.h>

#include "common.hpp"
#include "data_parallel.hpp"
#include "dense_net.hpp"

#include <chrono>

namespace bench {
namespace {

using namespace deft;

/// The parameters of a net as (in, out) weights and (out) biases, in order.
std::vector<std::vector<float>> weights_of(nn::Block& net) {
  std::vector<std::vector<float>> w;
  for (auto* p : net.collect_params()) w.push_back(p->data().to_vector());
  return w;
}

// --- the seeds' MLP step ------------------------------------------------------

constexpr std::int64_t step_batch = 1024;

struct StepSetup {
  Tensor<float> x, y;
  std::shared_ptr<nn::Sequential> net;
  std::vector<std::vector<float>> weights;
};

StepSetup step_setup() {
  StepSetup s;
  random::seed(7);
  s.x = random::normal<float>(0, 1, {step_batch, 512});
  s.y = ones<float>({step_batch});
  s.net = dense_net({{2048, nn::Act::relu}, {512, nn::Act::relu}, {1, nn::Act::none}});
  s.net->initialize(nn::init::normal(0.01));
  (void)(*s.net)(s.x).to_vector();  // deferred initialization
  s.weights = weights_of(*s.net);   // the peers start from the same weights
  return s;
}

/// Times deft's step; *loss gets the mean loss of the last step.
Summary deft_step(StepSetup& s, float* loss_out) {
  nn::Trainer trainer(s.net->collect_params(), nn::SGD{.learning_rate = 0.005f});
  const nn::L2Loss loss;
  return measure([&] {
    Tensor<float> l;
    {
      autograd::record rec;
      l = loss((*s.net)(s.x), s.y);
      l.backward();
    }
    trainer.step(step_batch);
    wait_all();
    *loss_out = mean(l).item();
  });
}

/// A line of /proc/self/status in MiB (VmRSS, VmHWM), -1 when unknown.
double status_mib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::strlen(key) + 1) / 1024.0;
  return -1;
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, std::size_t(n)) : std::string();
}

void step_rows(const char* g) {
  const std::string name = "mlp step 512-2048-512-1", size = "1024x512";
  const int w = engine::num_workers();
  StepSetup s = step_setup();
  float deft_loss = 0;
  add_time(g, name, "deft", w, size, "ms", deft_step(s, &deft_loss));
#if DEFT_BENCH_HAVE_TORCH
  torch_peer::set_threads(w);
  const auto xv = s.x.to_vector();
  float torch_loss = 0;
  add_time(g, name, "torch", w, size, "ms", torch_peer::mlp_step(xv.data(), step_batch, s.weights, 0.005f, &torch_loss));
  std::printf("%-12s loss after the timed steps: deft %.6f, torch %.6f (both start from the same weights)\n", g,
              deft_loss, torch_loss);
#else
  skip(g, "torch", "libtorch not found");
#endif
  // Peak memory: each library alone in a fresh process, so that neither
  // reuses pages the other freed.
  const std::string self = self_path();
  for (const char* lib : {"deft", "torch"}) {
#if !DEFT_BENCH_HAVE_TORCH
    if (std::string(lib) == "torch") continue;
#endif
    const double mib = self.empty() ? -1 : child_number(self + " --peak-memory " + lib + " --repeats 3", "peak_mib ");
    if (mib < 0) {
      skip(g, lib, "peak memory: the child process failed (needs /proc)");
      continue;
    }
    add(g, "mlp step peak memory", lib, w, size, "MiB", mib, mib);
  }
  const double dm = find_median(g, "mlp step peak memory", "deft", w, size),
               tm = find_median(g, "mlp step peak memory", "torch", w, size);
  if (dm > 0 && tm > 0) std::printf("%-12s peak memory deft / torch %.2f\n", g, dm / tm);
}

// --- batch-1 forward, imperative and hybridized -------------------------------

void forward_rows(const char* g) {
  const std::string name = "forward 512-256-128-2", size = "1x512";
  const int w = engine::num_workers();
  constexpr int calls = 200;  // per timed repeat
  random::seed(11);
  const Tensor<float> x = random::normal<float>(0, 1, {1, 512});
  auto net = dense_net({{256, nn::Act::relu}, {128, nn::Act::relu}, {2, nn::Act::none}});
  net->initialize(nn::init::xavier());
  const auto imperative = (*net)(x).to_vector();
  const auto weights = weights_of(*net);
  auto loop = [&] {
    for (int i = 0; i < calls; ++i) (*net)(x).wait_to_read();
  };
  add_time(g, name + " imperative", "deft", w, size, "us", measure(loop), calls);
  net->hybridize();
  const auto hybrid = (*net)(x).to_vector();
  add_time(g, name + " hybridized", "deft", w, size, "us", measure(loop), calls);
  check_same(g, name + " hybridized vs imperative", hybrid.data(), imperative.data(), hybrid.size(), 0);
  {  // what idle workers' polling buys: the same loop with workers that sleep at once
    const auto poll = engine::worker_poll();
    engine::set_worker_poll(std::chrono::nanoseconds(0));
    add_time(g, name + " hybridized, workers sleep at once", "deft", w, size, "us", measure(loop), calls);
    engine::set_worker_poll(poll);
  }
  if (w > 1) {  // what splitting each layer in two buys: the same loop on one thread
    engine::set_num_workers(1);
    add_time(g, name + " hybridized", "deft", 1, size, "us", measure(loop), calls);
    engine::set_num_workers(w);
  }
#if DEFT_BENCH_HAVE_TORCH
  const auto xv = x.to_vector();
  std::vector<float> out(2);
  const Summary t = torch_peer::small_forward(xv.data(), weights, calls, out.data());
  add_time(g, name + " imperative", "torch", w, size, "us", t, calls);
  add_time(g, name + " hybridized", "torch", w, size, "us", t, calls);  // eager: libtorch's only C++ mode here
  check_same(g, name + " torch vs deft", out.data(), imperative.data(), out.size(), 1e-5);
#else
  skip(g, "torch", "libtorch not found");
#endif
}

// --- a small-batch training step, plain and as a TrainStep ----------------------

// Where the front end (expressions, autograd tape, optimizer loop) costs as
// much as the arithmetic: the same step written out and replayed by TrainStep.
void train_step_rows(const char* g, std::int64_t batch, std::int64_t in, std::int64_t h1, std::int64_t h2) {
  const std::string name = "train step " + std::to_string(in) + "-" + std::to_string(h1) + "-" + std::to_string(h2) + "-10",
                    size = std::to_string(batch) + "x" + std::to_string(in);
  const int w = engine::num_workers();
  constexpr int steps = 100;  // per timed repeat
  random::seed(13);
  const Tensor<float> x = random::normal<float>(0, 1, {batch, in});
  std::vector<std::int64_t> labels(batch);
  for (std::int64_t i = 0; i < batch; ++i) labels[std::size_t(i)] = (i * 7) % 10;
  const Tensor<std::int64_t> y(labels, {batch});
  auto make = [&] {
    auto net = dense_net({{h1, nn::Act::relu}, {h2, nn::Act::relu}, {10, nn::Act::none}});
    net->initialize(nn::init::xavier());
    (void)(*net)(x).to_vector();  // deferred initialization
    return net;
  };
  auto plain = make(), hybrid = make();
  const auto from = plain->collect_params(), to = hybrid->collect_params();
  for (std::size_t i = 0; i < from.size(); ++i) to[i]->set_data(from[i]->data().clone());
  const nn::SGD sgd{.learning_rate = 0.01f, .momentum = 0.9f};
  nn::Trainer plain_trainer(from, sgd), hybrid_trainer(to, sgd);
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  nn::TrainStep step(*hybrid, loss_fn, hybrid_trainer);
  Tensor<float> plain_loss, hybrid_loss;
  auto plain_loop = [&] {
    for (int i = 0; i < steps; ++i) {
      {
        autograd::record rec;
        plain_loss = loss_fn((*plain)(x), y);
        plain_loss.backward();
      }
      plain_trainer.step(batch);
    }
    plain_loss.wait_to_read();
  };
  auto hybrid_loop = [&] {
    for (int i = 0; i < steps; ++i) hybrid_loss = step(x, y).loss;
    hybrid_loss.wait_to_read();
  };
  plain_loop();  // the same steps on both sides before the check
  hybrid_loop();
  const auto pl = plain_loss.to_vector(), hl = hybrid_loss.to_vector();
  check_same(g, name + " TrainStep vs plain, loss after 100 steps", hl.data(), pl.data(), pl.size(), 1e-5);
  add_time(g, name + " plain", "deft", w, size, "us", measure(plain_loop), steps);
  add_time(g, name + " TrainStep", "deft", w, size, "us", measure(hybrid_loop), steps);
  const double p = find_median(g, name + " plain", "deft", w, size), h = find_median(g, name + " TrainStep", "deft", w, size);
  if (p > 0 && h > 0)
    std::printf("%-12s %s %s: plain / TrainStep %.2f (traces %lld)\n", g, name.c_str(), size.c_str(), p / h,
                (long long)step.traces());
}

// --- gradient clipping: reading the norm each step against keeping it deferred --

// Gluon's clip_global_norm reads the norm back to the host, a sync point per
// step; deft's keeps it a tensor, so steps stay deferred and TrainStep can
// trace the clipping. The front-end-bound step, clipped to a norm that most
// steps exceed: the norm read each step, deferred, and as a TrainStep.
void clip_rows(const char* g) {
  constexpr std::int64_t batch = 8, in = 32;
  constexpr float max_norm = 0.5f;
  const std::string name = "clipped train step 32-16-16-10", size = "8x32";
  const int w = engine::num_workers();
  constexpr int steps = 100;  // per timed repeat
  random::seed(17);
  const Tensor<float> x = random::normal<float>(0, 1, {batch, in});
  std::vector<std::int64_t> labels(batch);
  for (std::int64_t i = 0; i < batch; ++i) labels[std::size_t(i)] = (i * 3) % 10;
  const Tensor<std::int64_t> y(labels, {batch});
  std::vector<std::shared_ptr<nn::Sequential>> nets;
  for (int i = 0; i < 3; ++i) {
    nets.push_back(dense_net({{16, nn::Act::relu}, {16, nn::Act::relu}, {10, nn::Act::none}}));
    nets.back()->initialize(nn::init::xavier());
    (void)(*nets.back())(x).to_vector();  // deferred initialization
    if (i > 0) {
      const auto from = nets[0]->collect_params(), to = nets.back()->collect_params();
      for (std::size_t k = 0; k < from.size(); ++k) to[k]->set_data(from[k]->data().clone());
    }
  }
  const nn::SGD sgd{.learning_rate = 0.01f, .momentum = 0.9f};
  nn::Trainer read_trainer(nets[0]->collect_params(), sgd), deferred_trainer(nets[1]->collect_params(), sgd),
      traced_trainer(nets[2]->collect_params(), sgd);
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  nn::TrainStep step(*nets[2], loss_fn, traced_trainer);
  step.set_max_grad_norm(max_norm);
  Tensor<float> read_loss, deferred_loss, traced_loss;
  int clipped = 0;  // steps whose norm exceeded the bound (the reading loop counts them)
  auto written_out = [&](nn::Sequential& net, nn::Trainer& trainer, Tensor<float>& l, bool read) {
    {
      autograd::record rec;
      l = loss_fn(net(x), y);
      l.backward();
    }
    trainer.allreduce_grads();
    const Tensor<float> norm = nn::clip_global_norm(net.collect_params(), max_norm);
    if (read) clipped += norm.item() > max_norm;  // Gluon's way: a host number each step
    trainer.update(batch);
  };
  auto read_loop = [&] {
    for (int i = 0; i < steps; ++i) written_out(*nets[0], read_trainer, read_loss, true);
    read_loss.wait_to_read();
  };
  auto deferred_loop = [&] {
    for (int i = 0; i < steps; ++i) written_out(*nets[1], deferred_trainer, deferred_loss, false);
    deferred_loss.wait_to_read();
  };
  auto traced_loop = [&] {
    for (int i = 0; i < steps; ++i) traced_loss = step(x, y).loss;
    traced_loss.wait_to_read();
  };
  read_loop();  // the same steps on every side before the checks
  deferred_loop();
  traced_loop();
  std::printf("%-12s %s: %d of %d steps clipped\n", g, name.c_str(), clipped, steps);
  const auto rl = read_loss.to_vector(), dl = deferred_loss.to_vector(), tl = traced_loss.to_vector();
  check_same(g, name + " deferred vs norm read, loss after 100 steps", dl.data(), rl.data(), rl.size(), 1e-5);
  check_same(g, name + " TrainStep vs norm read, loss after 100 steps", tl.data(), rl.data(), rl.size(), 1e-5);
  add_time(g, name + ", norm read each step", "deft", w, size, "us", measure(read_loop), steps);
  add_time(g, name + ", deferred", "deft", w, size, "us", measure(deferred_loop), steps);
  add_time(g, name + ", TrainStep", "deft", w, size, "us", measure(traced_loop), steps);
  const double r = find_median(g, name + ", norm read each step", "deft", w, size),
               d = find_median(g, name + ", deferred", "deft", w, size),
               t = find_median(g, name + ", TrainStep", "deft", w, size);
  if (r > 0 && d > 0 && t > 0)
    std::printf("%-12s %s: norm read / deferred %.2f, norm read / TrainStep %.2f\n", g, name.c_str(), r / d, r / t);
}

// --- one Fashion-MNIST epoch ----------------------------------------------------

void epoch_rows(const char* g) {
  std::filesystem::path dir;
  try {
    dir = data::find_fashion_mnist_dir();
  } catch (const std::exception&) {
    skip(g, "deft", "Fashion-MNIST not found (scripts/setup.sh installs dataset-fashion-mnist)");
    return;
  }
  const auto train = data::load_fashion_mnist(dir, data::Split::train, data::Layout::flat);
  const std::int64_t n = train.size(), batch = 256, features = train.images.shape()[1];
  const std::string name = "fashion-mnist mlp epoch", size = std::to_string(n) + "x" + std::to_string(features);
  const int w = engine::num_workers();
  constexpr float lr = 0.1f, momentum = 0.9f;

  random::seed(3);
  auto net = dense_net({{256, nn::Act::relu}, {10, nn::Act::none}});
  net->initialize(nn::init::xavier());
  (void)(*net)(train.images.rows(0, 1)).to_vector();
  const auto weights = weights_of(*net);
  nn::Trainer trainer(net->collect_params(), nn::SGD{.learning_rate = lr, .momentum = momentum});
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  float deft_loss = 0;
  const Summary d = measure([&] {
    Tensor<float> last;
    for (std::int64_t i = 0; i < n; i += batch) {
      const std::int64_t e = std::min(n, i + batch);
      {
        autograd::record rec;
        last = loss_fn((*net)(train.images.rows(i, e)), train.labels.rows(i, e));
        last.backward();
      }
      trainer.step(e - i);
    }
    deft_loss = mean(last).item();
  });
  add_time(g, name, "deft", w, size, "s", d);
  std::printf("%-12s deft: %.0f samples/s\n", g, double(n) / d.median);
#if DEFT_BENCH_HAVE_TORCH
  const auto xs = train.images.to_vector();
  const auto ys = train.labels.to_vector();
  float torch_loss = 0;
  const Summary t = torch_peer::mlp_epoch(xs.data(), ys.data(), n, features, batch, weights, lr, momentum, &torch_loss);
  add_time(g, name, "torch", w, size, "s", t);
  std::printf("%-12s torch: %.0f samples/s; mean loss of the last batch: deft %.4f, torch %.4f\n", g,
              double(n) / t.median, deft_loss, torch_loss);
#else
  skip(g, "torch", "libtorch not found");
#endif
}

// --- a training-mode BatchNorm, forward and backward ---------------------------

/// BatchNorm over (n, c, s) with the batch's statistics, and its gradients
/// for the upstream g, per channel: mean and biased variance (two passes),
/// y, then Σg and Σg·x̂ (one pass) and dx.
void hand_batch_norm(const float* x, const float* g, const float* gamma, const float* beta, std::int64_t n,
                     std::int64_t c, std::int64_t s, float* y, float* dx, float* dgamma, float* dbeta) {
#if DEFT_BENCH_HAVE_OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const float count = float(n * s);
    float sum = 0, squares = 0, sum_g = 0, sum_g_x_hat = 0;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) sum += x[(i * c + ch) * s + k];
    const float mean = sum / count;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) {
        const float d = x[(i * c + ch) * s + k] - mean;
        squares += d * d;
      }
    const float inv_std = 1.0f / std::sqrt(squares / count + 1e-5f), scale = gamma[ch] * inv_std;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) {
        const std::int64_t at = (i * c + ch) * s + k;
        const float x_hat = (x[at] - mean) * inv_std;
        y[at] = x_hat * gamma[ch] + beta[ch];
        sum_g += g[at];
        sum_g_x_hat += g[at] * x_hat;
      }
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t k = 0; k < s; ++k) {
        const std::int64_t at = (i * c + ch) * s + k;
        const float x_hat = (x[at] - mean) * inv_std;
        dx[at] = scale * (g[at] - sum_g / count - x_hat * sum_g_x_hat / count);
      }
    dgamma[ch] = sum_g_x_hat;
    dbeta[ch] = sum_g;
  }
}

void batch_norm_rows(const char* g) {
  constexpr std::int64_t n = 128, c = 16, s = 28 * 28;
  const std::string name = "batchnorm train forward+backward", size = "128x16x28x28";
  random::seed(17);
  auto bn = std::make_shared<nn::BatchNorm>();
  bn->initialize();
  Tensor<float> x = random::normal<float>(1, 2, {n, c, 28, 28});
  const Tensor<float> up = random::normal<float>(0, 1, {n, c, 28, 28});
  x.attach_grad();
  Tensor<float> y;
  const auto deft_step = [&] {
    {
      autograd::record rec;
      y = (*bn)(x);
      y.backward(up);
    }
    x.grad().wait_to_read();
    bn->gamma().grad().wait_to_read();
    bn->beta().grad().wait_to_read();
  };
  deft_step();  // the parameters' shapes are inferred from the first input
  const FloatBuf hx(values_of(x)), hg(values_of(up)), gamma(values_of(bn->gamma().data())),
      beta(values_of(bn->beta().data()));
  FloatBuf hy(n * c * s), hdx(n * c * s), hdgamma(c), hdbeta(c);
  const auto hand_step = [&] {
    hand_batch_norm(hx.data(), hg.data(), gamma.data(), beta.data(), n, c, s, hy.data(), hdx.data(), hdgamma.data(),
                    hdbeta.data());
    clobber(hdx.data());
  };
  const int w = engine::num_workers();
#if DEFT_BENCH_HAVE_OPENMP
  set_omp_threads(w);
  const char* hand = "hand-omp";
#else
  const char* hand = "hand";
#endif
  // Samples of 5 steps in a row, each after OpenMP's threads are put to
  // sleep: timed right after the OpenMP loop, deft's step shared the cores
  // with their spinning (median 2.4-4.7 ms against a minimum of 1.3 ms).
  const auto t = measure_interleaved({deft_step, hand_step}, 5, pause_omp_threads);
  add_time(g, name, "deft", w, size, "ms", t[0]);
  add_time(g, name, hand, w, size, "ms", t[1]);
  check_same(g, "hand BatchNorm y", hy.data(), values_of(y).data(), hy.size(), 1e-4);
  check_same(g, "hand BatchNorm dx", hdx.data(), values_of(x.grad()).data(), hdx.size(), 1e-3);
  check_same(g, "hand BatchNorm dgamma", hdgamma.data(), values_of(bn->gamma().grad()).data(), c, 1e-3);
}

}  // namespace

void bench_training() {
  const char* g = "training";
  step_rows(g);
  forward_rows(g);
  train_step_rows(g, 32, 512, 256, 128);  // arithmetic-bound
  train_step_rows(g, 8, 32, 16, 16);      // front-end-bound
  clip_rows(g);
  batch_norm_rows(g);
  data_parallel_rows(g, {cpu(0), cpu(1)}, "cpu,cpu1");
  data_parallel_shares_rows(g, {cpu(0), cpu(1)}, "cpu,cpu1");
  epoch_rows(g);
}

int training_peak_memory_child(const std::string& lib) {
  StepSetup s = step_setup();
  const auto xv = s.x.to_vector();
  std::ofstream("/proc/self/clear_refs") << "5";  // peak RSS := current RSS
  const double base = status_mib("VmRSS");
  float loss = 0;
  if (lib == "deft") (void)deft_step(s, &loss);
#if DEFT_BENCH_HAVE_TORCH
  else if (lib == "torch") {
    torch_peer::set_threads(engine::num_workers());
    (void)torch_peer::mlp_step(xv.data(), step_batch, s.weights, 0.005f, &loss);
  }
#endif
  else return 2;
  const double peak = status_mib("VmHWM");
  if (base < 0 || peak < 0) return 1;
  std::printf("peak_mib %.1f\n", peak - base);
  return 0;
}

}  // namespace bench
