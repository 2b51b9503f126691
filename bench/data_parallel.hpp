// The seeds' data-parallel step over a list of devices, with the gradients
// summed in buckets (Trainer::step's default) and one sum per parameter:
// shared by the CPU benchmarks (cpu(0), cpu(1)) and the GPU ones (the host
// and gpu(0); two GPUs where there are two).
#pragma once
#include <deft/nn.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dense_net.hpp"
#include "harness.hpp"

namespace bench {

/// Rows "data-parallel step <label> 8x64" for deft (one bucket) and
/// deft-per-param: batch 256 split over `devices`, eight Dense layers of 64
/// (16 parameters), SGD, from the same weights. Prints the tasks each
/// records per step and warns unless both end with the same bits.
inline void data_parallel_rows(const char* g, const std::vector<deft::Device>& devices, const std::string& label) {
  using namespace deft;
  const std::string name = "data-parallel step " + label + " 8x64", size = "256x64";
  const int w = engine::num_workers();
  random::seed(13);
  const Tensor<float> x = random::normal<float>(0, 1, {256, 64});
  const Tensor<std::int64_t> y = cast<std::int64_t>(random::uniform<float>(0, 10, {256}));
  const auto xs = split_and_load(x, devices);
  const auto ys = split_and_load(y, devices);
  const nn::SoftmaxCrossEntropyLoss loss;
  std::vector<std::shared_ptr<nn::Sequential>> nets;
  std::vector<nn::Trainer> trainers;
  for (const std::size_t bucket : {thresholds::allreduce_bucket_bytes, std::size_t(0)}) {
    auto net = dense_net({{64, nn::Act::relu}, {64, nn::Act::relu}, {64, nn::Act::relu}, {64, nn::Act::relu},
                          {64, nn::Act::relu}, {64, nn::Act::relu}, {64, nn::Act::relu}, {10, nn::Act::none}});
    random::seed(14);
    net->initialize(nn::init::xavier(), devices);
    (void)(*net)(xs[0]).to_vector();  // draws the weights now, from the same seed for both nets
    trainers.emplace_back(net->collect_params(), nn::SGD{.learning_rate = 0.01f});
    trainers.back().set_allreduce_bucket_bytes(bucket);
    nets.push_back(std::move(net));
  }
  std::vector<std::uint64_t> tasks(2);
  auto step = [&](std::size_t k) {
    return [&, k] {
      const auto before = engine::stats().tasks_recorded;
      {
        autograd::record rec;
        for (std::size_t d = 0; d < devices.size(); ++d) loss((*nets[k])(xs[d]), ys[d]).backward();
      }
      trainers[k].step(256);
      tasks[k] = engine::stats().tasks_recorded - before;
      wait_all();
    };
  };
  const auto t = measure_interleaved({step(0), step(1)});
  add_time(g, name, "deft", w, size, "us", t[0]);
  add_time(g, name, "deft-per-param", w, size, "us", t[1]);
  std::printf("%-12s tasks recorded per step: %llu with one bucket, %llu with a sum per parameter\n", g,
              static_cast<unsigned long long>(tasks[0]), static_cast<unsigned long long>(tasks[1]));
  const Device last = devices.back();
  if (nets[0]->collect_params().front()->data(last).to_vector() != nets[1]->collect_params().front()->data(last).to_vector())
    std::printf("%-12s WARNING: %s: buckets and one sum per parameter trained different weights\n", g, name.c_str());
}

}  // namespace bench
