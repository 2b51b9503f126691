// deft_bench_dist: deft's collectives across processes against raw MPI on the
// same buffers, in the same run (mpirun -np N deft_bench_dist; rank 0 prints).
//   1. allreduce (sum, float32) from 1 KiB to 64 MiB: dist::allreduce with
//      the rendezvous and watchdog (the default), without them, and a bare
//      MPI_Allreduce; interleaved repeats, medians; ratio = MPI's time / deft's
//      (deft's share of MPI's bandwidth: 1 is equal); then broadcast and
//      allgather at 4 and 16 KiB the same way.
//   2. the chapter's MLP (784-256-10, global batch 256 and 32) and LeNet
//      steps (global batch 256, SGD)
//      with two workers per process (one more than compute needs, as
//      dist::init adds), written out and as an nn::TrainStep (the whole
//      step traced, its collectives included): steps per second, how much of the gradients'
//      allreduce the backward hides, estimated as
//      (local step + allreduce alone - distributed step) / allreduce alone,
//      and read off the engine's trace of a few steps: for each bucket's
//      collective, the share of its time during which other tasks computed.
// Options: --repeats N (default 15), --max-mib N (default 64).
#include <deft/dist.hpp>
#include <deft/engine/profiler.hpp>
#include <deft/nn.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dense_net.hpp"

using namespace deft;
using clock_type = std::chrono::steady_clock;

namespace {

int repeats = 15;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times each of `fs` once per round, in turn, after one warm-up of each; every
// rank runs the same calls, and a barrier starts each call, so rank 0's time
// covers the slowest rank. Seconds, medians.
std::vector<double> interleaved(const std::vector<std::function<void()>>& fs) {
  std::vector<std::vector<double>> t(fs.size());
  for (int round = -1; round < repeats; ++round)
    for (std::size_t i = 0; i < fs.size(); ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = clock_type::now();
      fs[i]();
      const double s = std::chrono::duration<double>(clock_type::now() - start).count();
      if (round >= 0) t[i].push_back(s);
    }
  std::vector<double> out;
  for (auto& v : t) out.push_back(median(v));
  return out;
}

// One task's run in an engine trace (engine::trace_to's Chrome JSON, one event a line).
struct Slice {
  std::string name;
  double begin, end;  // microseconds
};

std::vector<Slice> read_trace(const std::string& path) {
  std::vector<Slice> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"ph\":\"X\"") == std::string::npos) continue;
    const auto field = [&](const char* key) { return line.find(key) + std::string(key).size(); };
    const auto name_at = field("\"name\":\"");
    Slice sl{line.substr(name_at, line.find('"', name_at) - name_at), 0, 0};
    sl.begin = std::atof(line.c_str() + field("\"ts\":"));
    sl.end = sl.begin + std::atof(line.c_str() + field("\"dur\":"));
    out.push_back(std::move(sl));
  }
  return out;
}

// For each collective in the trace (tasks named "allreduce", in the order
// they ran): the share of its time covered by tasks that computed (any but
// collectives and bucket packing) on other threads.
std::vector<double> hidden_per_collective(const std::vector<Slice>& slices) {
  std::vector<std::pair<double, double>> compute;
  for (const Slice& s : slices)
    if (s.name != "allreduce" && s.name != "allreduce pack") compute.emplace_back(s.begin, s.end);
  std::sort(compute.begin(), compute.end());
  std::vector<Slice> collectives;
  for (const Slice& s : slices)
    if (s.name == "allreduce") collectives.push_back(s);
  std::sort(collectives.begin(), collectives.end(), [](const Slice& a, const Slice& b) { return a.begin < b.begin; });
  std::vector<double> hidden;
  for (const Slice& c : collectives) {
    double covered = 0, reached = c.begin;  // the union of compute intervals within [begin, end)
    for (const auto& [b, e] : compute) {
      if (b >= c.end) break;
      const double from = std::max(b, reached), to = std::min(e, c.end);
      if (to > from) covered += to - from;
      reached = std::max(reached, to);
    }
    hidden.push_back(c.end > c.begin ? covered / (c.end - c.begin) : 1.0);
  }
  return hidden;
}

void allreduce_rows(std::int64_t max_bytes) {
  auto plain = std::make_shared<dist::MpiCommunicator>(MPI_COMM_WORLD, dist::Options{.rendezvous = false});
  if (dist::rank() == 0) {
    std::printf("\nallreduce, sum of float32, %d ranks (median of %d interleaved repeats)\n", dist::size(), repeats);
    std::printf("%10s %12s %12s %12s %10s %10s %10s\n", "bytes", "MPI us", "deft us", "deft-bare us", "MPI GB/s",
                "deft/MPI", "bare/MPI");
  }
  for (std::int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    const std::int64_t n = bytes / 4;
    std::vector<float> in(static_cast<std::size_t>(n), 1.0f), out(static_cast<std::size_t>(n));
    Tensor<float> a(in, Shape{n}), b(in, Shape{n});
    const auto times = interleaved({
        [&] { MPI_Allreduce(in.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        [&] {
          dist::allreduce(a);
          a.wait_to_read();
        },
        [&] {
          dist::allreduce(b, dist::ReduceOp::sum, plain);
          b.wait_to_read();
        },
    });
    if (dist::rank() == 0)
      std::printf("%10lld %12.1f %12.1f %12.1f %10.2f %10.3f %10.3f\n", static_cast<long long>(bytes), times[0] * 1e6,
                  times[1] * 1e6, times[2] * 1e6, double(bytes) / times[0] / 1e9, times[0] / times[1],
                  times[0] / times[2]);
  }
}

// Small broadcasts and allgathers (up to thresholds::rendezvous_data_max_bytes
// their data travels inside the rendezvous), as allreduce_rows times them.
void small_rows() {
  auto plain = std::make_shared<dist::MpiCommunicator>(MPI_COMM_WORLD, dist::Options{.rendezvous = false});
  if (dist::rank() == 0) {
    std::printf("\nbroadcast from rank 0 and allgather of float32, %d ranks (median of %d interleaved repeats)\n",
                dist::size(), repeats);
    std::printf("%-10s %10s %12s %12s %12s %10s %10s\n", "", "bytes", "MPI us", "deft us", "deft-bare us", "deft/MPI",
                "bare/MPI");
  }
  for (std::int64_t bytes : {std::int64_t(4096), std::int64_t(16384)}) {
    const std::int64_t n = bytes / 4;
    std::vector<float> in(static_cast<std::size_t>(n), 1.0f), out(static_cast<std::size_t>(n) * dist::size());
    Tensor<float> a(in, Shape{n}), b(in, Shape{n});
    const auto row = [&](const char* what, const std::vector<double>& t) {
      if (dist::rank() == 0)
        std::printf("%-10s %10lld %12.1f %12.1f %12.1f %10.3f %10.3f\n", what, static_cast<long long>(bytes), t[0] * 1e6,
                    t[1] * 1e6, t[2] * 1e6, t[0] / t[1], t[0] / t[2]);
    };
    row("broadcast", interleaved({
                         [&] { MPI_Bcast(in.data(), int(n), MPI_FLOAT, 0, MPI_COMM_WORLD); },
                         [&] {
                           dist::broadcast(a, 0);
                           a.wait_to_read();
                         },
                         [&] {
                           dist::broadcast(b, 0, plain);
                           b.wait_to_read();
                         },
                     }));
    row("allgather", interleaved({
                         [&] { MPI_Allgather(in.data(), int(n), MPI_FLOAT, out.data(), int(n), MPI_FLOAT, MPI_COMM_WORLD); },
                         [&] { dist::allgather(a).wait_to_read(); },
                         [&] { dist::allgather(b, plain).wait_to_read(); },
                     }));
  }
}

void traced_buckets(const std::function<void()>& step, int steps);

// One model's step across the ranks; `make` builds it, `sample` is one input's shape.
void step_rows(const char* title, const std::function<std::shared_ptr<nn::Sequential>()>& make,
               std::vector<std::int64_t> sample, std::size_t bucket, std::int64_t batch = 256) {
  engine::set_num_workers(2);  // one computes, one more as dist::init adds (a collective waits on it)
  const std::int64_t rows = batch / dist::size();
  random::seed(1);
  auto shape = [&](std::int64_t n) {
    Shape s{n};
    for (std::int64_t e : sample) s.push_back(e);
    return s;
  };
  auto labels = [](std::int64_t n) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::int64_t(i % 10);
    return Tensor<std::int64_t>(v, Shape{n});
  };
  const Tensor<float> x = random::normal<float>(0, 1, shape(rows)), x_all = random::normal<float>(0, 1, shape(batch));
  const Tensor<std::int64_t> y = labels(rows), y_all = labels(batch);

  auto local = make(), shared = make(), single = make(), hybrid = make();
  for (auto* net : {local.get(), shared.get(), single.get(), hybrid.get()}) (void)(*net)(x.rows(0, 1));
  nn::Trainer t_local(local->collect_params(), nn::SGD{0.01f}), t_shared(shared->collect_params(), nn::SGD{0.01f}),
      t_single(single->collect_params(), nn::SGD{0.01f}), t_hybrid(hybrid->collect_params(), nn::SGD{0.01f});
  for (auto* t : {&t_shared, &t_hybrid}) {
    t->set_communicator(dist::world());
    t->set_allreduce_bucket_bytes(bucket);
  }
  nn::TrainStep traced(*hybrid, nn::SoftmaxCrossEntropyLoss(), t_hybrid);
  auto traced_step = [&] {
    (void)traced(x, y, batch);
    wait_all();
  };
  traced_step();  // runs plainly
  traced_step();  // traces
  std::vector<Tensor<float>> grads;
  std::int64_t floats = 0;
  for (nn::Parameter* p : local->collect_params()) {
    grads.push_back(p->data().clone());
    floats += p->data().size();
  }

  auto step = [&](nn::Sequential& net, nn::Trainer& tr, const Tensor<float>& xs, const Tensor<std::int64_t>& ys) {
    {
      autograd::record rec;
      nn::SoftmaxCrossEntropyLoss()(net(xs), ys).backward();
    }
    tr.step(batch);
    wait_all();
  };
  const auto times = interleaved({
      [&] { step(*local, t_local, x, y); },  // this rank's rows, no communication
      [&] {                                  // the gradients' allreduce alone, same buckets
        dist::allreduce(grads, dist::ReduceOp::sum, bucket);
        wait_all();
      },
      [&] { step(*shared, t_shared, x, y); },          // the data-parallel step
      [&] { step(*single, t_single, x_all, y_all); },  // the whole batch in this process
      traced_step,                                     // the data-parallel step, replayed
  });
  if (dist::rank() == 0) {
    const double hidden = (times[0] + times[1] - times[2]) / times[1];
    std::printf("\n%s step, global batch %lld, %lld parameters, 2 workers per process, %d ranks, buckets of %zu KiB\n",
                title, static_cast<long long>(batch), static_cast<long long>(floats), dist::size(), bucket >> 10);
    std::printf("  step on this rank's %lld rows alone:  %8.3f ms\n", static_cast<long long>(rows), times[0] * 1e3);
    std::printf("  gradients' allreduce alone:          %8.3f ms\n", times[1] * 1e3);
    std::printf("  data-parallel step:                  %8.3f ms  (%.0f samples/s)\n", times[2] * 1e3,
                double(batch) / times[2]);
    std::printf("  data-parallel TrainStep (replayed):  %8.3f ms  (%.0f samples/s; %lld traces, %lld replays)\n",
                times[4] * 1e3, double(batch) / times[4], static_cast<long long>(traced.traces()),
                static_cast<long long>(traced.replays()));
    std::printf("  whole batch in one process:          %8.3f ms  (%.0f samples/s)\n", times[3] * 1e3,
                double(batch) / times[3]);
    std::printf("  allreduce hidden by the step:        %8.0f %%\n", 100.0 * std::clamp(hidden, 0.0, 1.0));
    std::printf("  speed-up over one process:           %8.2fx\n", times[3] / times[2]);
  }
  traced_buckets([&] { step(*shared, t_shared, x, y); }, 7);
}

// The same data-parallel step traced by the engine (`steps` of them): each
// bucket's share of time hidden by computation, median over the steps, in
// the order the buckets' collectives ran (the last layers' first).
void traced_buckets(const std::function<void()>& step, int steps) {
  static int traced = 0;  // one file per model: DEFT_BENCH_KEEP_TRACE=1 keeps them for chrome://tracing
  const std::string path =
      "deft_dist_trace_" + std::to_string(traced++) + "_rank" + std::to_string(dist::rank()) + ".json";
  step();  // warm
  engine::trace_to(path);
  for (int i = 0; i < steps; ++i) step();
  engine::trace_stop();
  const std::vector<double> all = hidden_per_collective(read_trace(path));
  if (!std::getenv("DEFT_BENCH_KEEP_TRACE")) std::remove(path.c_str());
  if (dist::rank() != 0 || all.empty()) return;
  const std::size_t per_step = all.size() / std::size_t(steps);
  std::printf("  hidden per bucket, from the trace (median of %d steps, in launch order):", steps);
  for (std::size_t b = 0; b < per_step; ++b) {
    std::vector<double> v;
    for (int i = 0; i < steps; ++i) v.push_back(all[std::size_t(i) * per_step + b]);
    std::printf(" %.0f%%", 100.0 * median(v));
  }
  std::printf("\n");
}

std::shared_ptr<nn::Sequential> mlp() {
  auto net = bench::dense_net({{256, nn::Act::relu}, {10, nn::Act::none}});
  net->initialize(nn::init::xavier());
  return net;
}

// D2L's LeNet with ReLU and max pooling, as the example trainer builds it.
std::shared_ptr<nn::Sequential> lenet() {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2D>(6, 5, 1, 2, nn::Act::relu), std::make_shared<nn::MaxPool2D>(2),
           std::make_shared<nn::Conv2D>(16, 5, 1, 0, nn::Act::relu), std::make_shared<nn::MaxPool2D>(2),
           std::make_shared<nn::Dense>(120, nn::Act::relu), std::make_shared<nn::Dense>(84, nn::Act::relu),
           std::make_shared<nn::Dense>(10));
  net->initialize(nn::init::xavier());
  return net;
}

}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  std::int64_t max_mib = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--max-mib") max_mib = std::max(1, std::atoi(argv[i + 1]));
  }
  allreduce_rows(max_mib << 20);
  small_rows();
  // Buckets of 64 KiB (the default is 25 MiB, one bucket for these models),
  // so that the first buckets' sums can overlap the rest of the backward.
  step_rows("MLP 784-256-10", mlp, {784}, std::size_t(64) << 10);
  step_rows("MLP 784-256-10", mlp, {784}, std::size_t(64) << 10, 32);  // small batches: recording weighs more
  step_rows("LeNet", lenet, {1, 28, 28}, std::size_t(64) << 10);
  dist::finalize();
}
