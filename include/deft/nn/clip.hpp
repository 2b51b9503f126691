// Gradient clipping by the global norm (Gluon's utils.clip_global_norm,
// PyTorch's clip_grad_norm_). The norm and the scale stay tensors: where
// Gluon reads the norm back to the host, deft adds no sync point, so the
// clipping defers like the rest of a step and a TrainStep can trace it.
#pragma once
#include <algorithm>
#include <cmath>
#include <concepts>
#include <utility>
#include <vector>

#include "../autograd/meta.hpp"
#include "../expr/operators.hpp"
#include "../ops/reduction.hpp"
#include "block.hpp"

namespace deft::nn {

/// Scales `arrays` in place by min(1, max_norm / (norm + 1e-6)), where norm
/// is the 2-norm of all their elements together, and returns that norm (a
/// scalar tensor on the first array's device, deferred). The arrays may
/// live on several devices: each device sums its arrays' squares, the norm
/// is formed on the first one's, and each device gets one copy of the
/// scale. A NaN or infinite norm makes the arrays NaN: check the returned
/// norm where that can happen. Not differentiated. std::invalid_argument
/// for no arrays or a max_norm that is not a positive finite number.
template <std::floating_point T>
Tensor<T> clip_global_norm(std::vector<Tensor<T>>& arrays, T max_norm) {
  if (arrays.empty()) detail::raise("clip_global_norm: no arrays given");
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    detail::raise("clip_global_norm: max_norm must be a positive finite number, got ", max_norm);
  autograd::pause no_recording;
  // Per device, in order of first appearance: its arrays' squares summed
  // there, then the scale. One copy each way per device, not per array.
  std::vector<std::pair<Device, Tensor<T>>> per_device;
  auto on = [&](Device d) {
    auto it = std::ranges::find(per_device, d, &std::pair<Device, Tensor<T>>::first);
    return it == per_device.end() ? nullptr : &it->second;
  };
  for (const auto& a : arrays) {
    if (Tensor<T>* squares = on(a.device())) *squares = *squares + sum(a * a);
    else per_device.emplace_back(a.device(), sum(a * a));
  }
  const Device home = per_device[0].first;
  Tensor<T> squares = per_device[0].second;
  for (std::size_t i = 1; i < per_device.size(); ++i) squares = squares + per_device[i].second.to(home);
  Tensor<T> norm = sqrt(squares);
  const Tensor<T> scale = minimum(max_norm / (norm + T(1e-6)), T(1));
  for (auto& [d, s] : per_device) s = d == home ? scale : scale.to(d);
  for (auto& a : arrays) a *= *on(a.device());
  return norm;
}

/// Clips the gradients of `params` together by their global norm, as
/// above, on every device they live on: for data parallelism, between
/// Trainer::allreduce_grads() and Trainer::update(), when every device holds
/// the summed gradients. Each device computes the same norm from the same
/// bits, so the copies stay equal. Returns the norm on the first device.
/// std::invalid_argument for no parameters or parameters on different
/// devices; std::logic_error for one without a value yet.
inline Tensor<float> clip_global_norm(const std::vector<Parameter*>& params, float max_norm) {
  if (params.empty()) detail::raise("clip_global_norm: no parameters given");
  for (const Parameter* p : params) {
    if (!p->initialized())
      detail::raise<std::logic_error>("clip_global_norm: parameter '", p->name(), "' has no value yet");
    if (p->devices() != params[0]->devices())
      detail::raise("clip_global_norm: parameter '", p->name(), "' lives on ", detail::device_list(p->devices()),
                    " but '", params[0]->name(), "' on ", detail::device_list(params[0]->devices()));
  }
  Tensor<float> first_norm;
  for (const Device d : params[0]->devices()) {
    std::vector<Tensor<float>> grads;
    for (Parameter* p : params) grads.push_back(p->grad(d));
    Tensor<float> norm = clip_global_norm(grads, max_norm);
    if (!first_norm) first_norm = std::move(norm);
  }
  return first_norm;
}

}  // namespace deft::nn
