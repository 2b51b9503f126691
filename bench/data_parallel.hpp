// The seeds' data-parallel step over a list of devices: gradients summed in
// buckets (Trainer::step's default) against one sum per parameter, and a
// batch split by each device's speed against an even split. Shared by the
// CPU benchmarks (cpu(0), cpu(1)) and the GPU ones (the host and gpu(0); two
// GPUs where there are two).
#pragma once
#include <deft/nn.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dense_net.hpp"
#include "harness.hpp"

namespace bench {

/// One data-parallel training set-up: batch 256 of 64 features split over
/// `devices` in proportion to `shares`, eight Dense layers of 64 (16
/// parameters), SGD; weights drawn from the same seed whatever the devices.
struct DataParallelStep {
  std::vector<deft::Device> devices;
  std::vector<deft::Tensor<float>> xs;
  std::vector<deft::Tensor<std::int64_t>> ys;
  std::shared_ptr<deft::nn::Sequential> net;
  std::unique_ptr<deft::nn::Trainer> trainer;
  std::unique_ptr<deft::nn::TrainStep<deft::nn::SoftmaxCrossEntropyLoss>> traced;  // set: the step is a TrainStep
  std::uint64_t tasks = 0;  // recorded by the latest step

  DataParallelStep(const std::vector<deft::Device>& on, const std::vector<double>& shares, std::size_t bucket_bytes,
                   bool hybridize = false)
      : devices(on) {
    using namespace deft;
    random::seed(13);
    const Tensor<float> x = random::normal<float>(0, 1, {256, 64});
    const Tensor<std::int64_t> y = cast<std::int64_t>(random::uniform<float>(0, 10, {256}));
    xs = split_and_load(x, devices, shares);
    ys = split_and_load(y, devices, shares);
    net = dense_net({{64, nn::Act::relu}, {64, nn::Act::relu}, {64, nn::Act::relu}, {64, nn::Act::relu},
                     {64, nn::Act::relu}, {64, nn::Act::relu}, {64, nn::Act::relu}, {10, nn::Act::none}});
    random::seed(14);
    net->initialize(nn::init::xavier(), devices);
    (void)(*net)(xs[0]).to_vector();  // draws the weights now
    trainer = std::make_unique<nn::Trainer>(net->collect_params(), nn::SGD{.learning_rate = 0.01f});
    trainer->set_allreduce_bucket_bytes(bucket_bytes);
    if (hybridize)
      traced = std::make_unique<nn::TrainStep<nn::SoftmaxCrossEntropyLoss>>(*net, nn::SoftmaxCrossEntropyLoss(), *trainer);
  }
  /// One step, waited for.
  void operator()() {
    using namespace deft;
    const nn::SoftmaxCrossEntropyLoss loss;
    const auto before = engine::stats().tasks_recorded;
    if (traced) {
      (void)(*traced)(xs, ys);
    } else {
      {
        autograd::record rec;
        for (std::size_t d = 0; d < devices.size(); ++d) loss((*net)(xs[d]), ys[d]).backward();
      }
      trainer->step(256);
    }
    tasks = engine::stats().tasks_recorded - before;
    wait_all();
  }
  std::vector<float> first_weights() const { return net->collect_params().front()->data(devices.back()).to_vector(); }
};

/// Rows "data-parallel step <label> 8x64" for deft (one bucket),
/// deft-per-param and deft-TrainStep (the bucketed step traced and
/// replayed), split evenly. Prints the tasks each records per step and
/// warns unless all end with the same bits.
inline void data_parallel_rows(const char* g, const std::vector<deft::Device>& devices, const std::string& label) {
  const std::string name = "data-parallel step " + label + " 8x64", size = "256x64";
  const std::vector<double> even(devices.size(), 1.0);
  const std::size_t bucket = deft::thresholds::allreduce_bucket_bytes;
  DataParallelStep buckets(devices, even, bucket), per_param(devices, even, 0), traced(devices, even, bucket, true);
  const auto t = measure_interleaved({[&] { buckets(); }, [&] { per_param(); }, [&] { traced(); }});
  const int w = deft::engine::num_workers();
  add_time(g, name, "deft", w, size, "us", t[0]);
  add_time(g, name, "deft-per-param", w, size, "us", t[1]);
  add_time(g, name, "deft-TrainStep", w, size, "us", t[2]);
  std::printf("%-12s tasks recorded per step: %llu with one bucket, %llu with a sum per parameter, %llu replayed "
              "(%lld traces)\n",
              g, static_cast<unsigned long long>(buckets.tasks), static_cast<unsigned long long>(per_param.tasks),
              static_cast<unsigned long long>(traced.tasks), static_cast<long long>(traced.traced->traces()));
  if (buckets.first_weights() != per_param.first_weights() || buckets.first_weights() != traced.first_weights())
    std::printf("%-12s WARNING: %s: buckets, one sum per parameter and TrainStep trained different weights\n", g,
                name.c_str());
}

/// Rows "data-parallel step <label> 8x64, rows by speed": each device's step
/// alone on the whole batch is timed first (measure_shares), then the batch
/// is split in proportion to the speed each managed (deft) against an even
/// split (deft-even-split). Prints the split found.
inline void data_parallel_shares_rows(const char* g, const std::vector<deft::Device>& devices,
                                      const std::string& label) {
  const std::string name = "data-parallel step " + label + " 8x64, rows by speed", size = "256x64";
  const std::size_t bucket = deft::thresholds::allreduce_bucket_bytes;
  std::vector<std::unique_ptr<DataParallelStep>> alone;
  for (const deft::Device& d : devices) alone.push_back(std::make_unique<DataParallelStep>(std::vector{d}, std::vector{1.0}, bucket));
  const std::vector<double> shares = deft::measure_shares(
      devices,
      [&](deft::Device d) {
        for (auto& a : alone)
          if (a->devices.front() == d) (*a)();
      },
      opts.repeats);  // steps per second
  DataParallelStep by_speed(devices, shares, bucket), even(devices, std::vector<double>(devices.size(), 1.0), bucket);
  const auto t = measure_interleaved({[&] { by_speed(); }, [&] { even(); }});
  const int w = deft::engine::num_workers();
  add_time(g, name, "deft", w, size, "us", t[0]);
  add_time(g, name, "deft-even-split", w, size, "us", t[1]);
  std::printf("%-12s rows by speed:", g);
  for (std::size_t d = 0; d < devices.size(); ++d)
    std::printf(" %s %lld rows (%.0f rows/s alone)", devices[d].to_string().c_str(),
                static_cast<long long>(by_speed.xs[d].shape()[0]), 256 * shares[d]);
  std::printf("\n");
}

}  // namespace bench
