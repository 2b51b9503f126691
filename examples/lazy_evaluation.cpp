// Lazy evaluation and asynchronous computation, after the D2L chapter
// ("惰性计算" / "异步计算", MXNet edition) in C++ with deft.
//
// Every experiment of the chapter appears here in order:
//   1. a = 1 + 1; a = 2 + 2; a = 3 + 3 needs only the last assignment
//   2. the front end queues work and returns; a sync point waits for it
//   3. the sync functions: wait_to_read, wait_all, to_vector, item, printing
//   4. 1000 x `y = x + 1` with a sync per step and without
//   5. memory: a training loop with a sync per batch and without
// `--graph FILE` also writes the task graph behind `c = a * b + 2` (Graphviz DOT).
// docs/tutorial.md walks through this program and its output.
#include <deft/deft.hpp>
#include <deft/engine/graph_dump.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

using namespace deft;
using Clock = std::chrono::steady_clock;

/// The chapter's Benchmark helper as an RAII timer: prints "<prefix> time: X sec"
/// when the scope ends.
class Benchmark {
 public:
  explicit Benchmark(std::string prefix = "") : prefix_(prefix.empty() ? "" : prefix + " "), start_(Clock::now()) {}
  ~Benchmark() { std::printf("%stime: %.4f sec\n", prefix_.c_str(), seconds()); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  Benchmark(const Benchmark&) = delete;
  Benchmark& operator=(const Benchmark&) = delete;

 private:
  std::string prefix_;
  Clock::time_point start_;
};

static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// A field of /proc/self/status in MB (VmRSS: resident now, VmHWM: peak resident); -1 if unavailable.
static double proc_status_mb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  double kb = -1;
  while (in >> key) {
    if (key == std::string(field) + ":") {
      in >> kb;
      return kb / 1024.0;
    }
    std::getline(in, key);
  }
  return -1;
}
/// Resets VmHWM to the current RSS (Linux >= 4.0); false if not permitted.
static bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

static void print_stats(const char* label) {
  const auto s = engine::stats();
  std::printf("%s: recorded %llu, run %llu, discarded %llu\n", label, (unsigned long long)s.tasks_recorded,
              (unsigned long long)s.tasks_run, (unsigned long long)s.tasks_discarded);
}

static void section(const char* title) { std::printf("\n== %s ==\n", title); }

// --- 1. Only the last of three assignments is computed -----------------------
static void three_assignments() {
  section("1. a = 1 + 1; a = 2 + 2; a = 3 + 3");
  wait_all();
  engine::reset_stats();
  Tensor<float> a = ones({1}) + 1;
  a = ones({1}) + 2;
  a = ones({1}) + 3;
  std::cout << a << "\n";
  print_stats("engine");
}

// --- 2. The front end queues; the back end computes ---------------------------
static std::string graph_path;  // --graph FILE: the pending graph behind c as Graphviz DOT

static void front_end_back_end() {
  section("2. The front end queues work, a sync point waits for it");
  auto a = ones({1, 2});
  auto b = ones({1, 2});
  Tensor<float> c = a * b + 2;
  std::cout << "c is ready before printing: " << std::boolalpha << c.is_ready() << "\n";
  if (!graph_path.empty())  // no sync point: it only looks at what is recorded
    std::cout << "pending tasks behind c: " << dump_graph(c, graph_path) << " (written to " << graph_path << ")\n";
  std::cout << c << "\n";
  std::cout << "c is ready after printing: " << c.is_ready() << "\n\n";

  Tensor<float> x, y;
  {
    Benchmark t("Workloads are queued.");
    x = random::uniform<float>(0, 1, {2000, 2000});
    y = sum(dot(x, x));
  }
  {
    Benchmark t("Workloads are finished.");
    std::cout << "sum = " << y << "\n";
  }
}

// --- 3. Sync functions ---------------------------------------------------------
static void sync_functions() {
  section("3. Sync functions");
  auto x = random::uniform<float>(0, 1, {2000, 2000});
  x.wait_to_read();
  Tensor<float> y, z;
  {
    Benchmark t("y = dot(x, x); y.wait_to_read():");
    y = dot(x, x);
    y.wait_to_read();
  }
  {
    Benchmark t("y = dot(x, x); z = dot(x, x); wait_all():");
    y = dot(x, x);
    z = dot(x, x);
    wait_all();
  }
  {
    Benchmark t("y = dot(x, x); y.to_vector():");
    y = dot(x, x);
    const std::vector<float> v = y.to_vector();
    std::printf("  (copied %zu values out)\n", v.size());
  }
  {
    Benchmark t("y = dot(x, x); norm(y).item():");
    y = dot(x, x);
    const float n = norm(y).item();
    std::printf("  (norm = %g)\n", n);
  }
}

// --- 4. 1000 x `y = x + 1` ------------------------------------------------------
static void thousand_steps() {
  section("4. 1000 x y = x + 1 on a 2000 x 2000 tensor");
  auto x = random::uniform<float>(0, 1, {2000, 2000});
  Tensor<float> y = x + 1;
  wait_all();  // warm-up: x and y exist, the workers are awake

  engine::reset_stats();
  {
    Benchmark t("synchronous (wait_to_read every step).");
    for (int i = 0; i < 1000; ++i) {
      y = x + 1;
      y.wait_to_read();
    }
  }
  print_stats("  engine");

  engine::reset_stats();
  {
    Benchmark t("deferred (one wait_all at the end).");
    for (int i = 0; i < 1000; ++i) y = x + 1;
    wait_all();
  }
  print_stats("  engine");
  std::printf("  y[0] = %g (x[0] + 1 = %g)\n", y.to_vector()[0], x.to_vector()[0] + 1);

  // When every step is needed nothing can be dropped: y = y + 1 reads the
  // previous y, so all 1000 steps run; deferral saves only the round trips.
  y = x + 1;
  wait_all();
  engine::reset_stats();
  {
    Benchmark t("every step needed, synchronous (y = y + 1; wait_to_read).");
    for (int i = 0; i < 1000; ++i) {
      y = y + 1;
      y.wait_to_read();
    }
  }
  print_stats("  engine");
  engine::reset_stats();
  {
    Benchmark t("every step needed, deferred (y = y + 1; one wait_all).");
    for (int i = 0; i < 1000; ++i) y = y + 1;
    wait_all();
  }
  print_stats("  engine");
  std::printf("  y[0] - x[0] = %g (expected 2001)\n", y.to_vector()[0] - x.to_vector()[0]);
}

// --- 5. Memory: a training loop with and without a sync per batch -------------
// The chapter trains an MLP on batches of 1024 random 512-feature rows with an
// L2 loss and SGD (lr 0.005). Here: 512 -> 2048 (relu) -> 1, gradients by hand.
struct Mlp {
  Tensor<float> w1, w2;
};

static Mlp make_mlp() {
  random::seed(42);
  Mlp net{random::normal<float>(0, 0.01, {512, 2048}), random::normal<float>(0, 0.01, {2048, 1})};
  wait_all();
  return net;
}

/// One SGD step on a fresh batch; returns the batch's mean L2 loss (deferred).
static Tensor<float> train_step(Mlp& net, float lr) {
  constexpr int batch = 1024;
  auto X = random::normal<float>(0, 1, {batch, 512});  // the data iterator's batch
  auto y = ones({batch, 1});
  // forward
  Tensor<float> z = dot(X, net.w1);     // (1024, 2048)
  Tensor<float> h = relu(z);
  Tensor<float> out = dot(h, net.w2);   // (1024, 1)
  Tensor<float> diff = out - y;
  Tensor<float> loss = mean(0.5f * diff * diff);
  // backward (L2 loss 0.5 (out - y)^2, averaged over the batch)
  Tensor<float> dout = diff * (1.0f / batch);
  Tensor<float> g2 = dot(transpose(h), dout);                     // (2048, 1)
  Tensor<float> dz = dout * net.w2.reshape({1, 2048}) * (z > 0);  // (1024, 2048)
  Tensor<float> g1 = dot(transpose(X), dz);                       // (512, 2048)
  // update in place
  net.w1 -= lr * g1;
  net.w2 -= lr * g2;
  return loss;
}

static void train(const char* title, bool sync_each_batch) {
  constexpr int num_batches = 100;
  constexpr float lr = 0.005f;
  Mlp net = make_mlp();
  train_step(net, lr).wait_to_read();  // warm-up, like the chapter's first batch
  wait_all();

  std::printf("\n-- %s --\n", title);
  const bool peak_ok = reset_peak_rss();
  const double rss0 = proc_status_mb("VmRSS");
  engine::reset_stats();
  const auto start = Clock::now();
  double loss_sum = 0;
  for (int i = 0; i < num_batches; ++i) {
    Tensor<float> l = train_step(net, lr);
    if (sync_each_batch) loss_sum += l.item();  // the sync point: item(), MXNet's asscalar()
    if ((i + 1) % 25 == 0) std::printf("batch %d, time %f sec\n", i + 1, since(start));
  }
  wait_all();
  const double total = since(start);
  const double rss1 = proc_status_mb("VmRSS");
  const double hwm = proc_status_mb("VmHWM");
  const auto s = engine::stats();
  std::printf("total time %.3f sec\n", total);
  if (sync_each_batch) std::printf("mean loss over the batches %.4f\n", loss_sum / num_batches);
  std::printf("engine: recorded %llu, run %llu, discarded %llu, flushes %llu, backpressure waits %llu\n",
              (unsigned long long)s.tasks_recorded, (unsigned long long)s.tasks_run,
              (unsigned long long)s.tasks_discarded, (unsigned long long)s.flushes,
              (unsigned long long)s.backpressure_waits);
  std::printf("peak bytes pending %.1f MB, peak tensor storage %.1f MB\n", s.peak_bytes_pending / 1e6,
              s.peak_bytes_allocated / 1e6);
  std::printf("increased memory (VmRSS after - before): %.1f MB\n", rss1 - rss0);
  if (peak_ok && hwm >= 0) std::printf("peak RSS during the loop - RSS before: %.1f MB\n", hwm - rss0);
}

static void memory_experiment() {
  section("5. Memory: 100 training batches (1024 x 512 -> 2048 -> 1)");
  train("a sync per batch (loss.item())", true);
  train("no sync until the end (wait_all)", false);
}

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--graph") graph_path = argv[i + 1];
  std::printf("deft %d.%d.%d, %d workers\n", DEFT_VERSION_MAJOR, DEFT_VERSION_MINOR, DEFT_VERSION_PATCH,
              engine::num_workers());
  const auto start = Clock::now();
  three_assignments();
  front_end_back_end();
  sync_functions();
  thousand_steps();
  memory_experiment();
  std::printf("\nwhole program: %.1f sec\n", since(start));
}
