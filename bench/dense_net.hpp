// A chain of Dense layers from (units, activation) pairs: the seeds' nets,
// shared by the CPU benchmarks (group_training.cpp) and the GPU ones
// (gpu_bench.cu).
#pragma once
#include <deft/nn.hpp>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

namespace bench {

inline std::shared_ptr<deft::nn::Sequential> dense_net(
    std::initializer_list<std::pair<std::int64_t, deft::nn::Act>> layers) {
  auto net = std::make_shared<deft::nn::Sequential>();
  for (const auto& [units, act] : layers) net->add(std::make_shared<deft::nn::Dense>(units, act));
  return net;
}

}  // namespace bench
