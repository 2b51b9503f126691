// Gradient clipping by the global norm (Gluon's utils.clip_global_norm,
// PyTorch's clip_grad_norm_). The norm and the scale stay tensors: where
// Gluon reads the norm back to the host, deft adds no sync point, so the
// clipping defers like the rest of a step and a TrainStep can trace it.
#pragma once
#include <algorithm>
#include <cmath>
#include <concepts>
#include <optional>
#include <utility>
#include <vector>

#include "../autograd/meta.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/reduction.hpp"
#include "block.hpp"

namespace deft::nn {

namespace detail_clip {
/// The 2-norm of all elements of `arrays` together and the clipping scale
/// min(1, max_norm / (norm + 1e-6)), both on the first array's device; the
/// arrays may live on several devices (see clip_global_norm).
template <std::floating_point T>
std::pair<Tensor<T>, Tensor<T>> clipping_scale(const std::vector<Tensor<T>>& arrays, T max_norm) {
  // Per device, in order of first appearance: its arrays' squares summed
  // there; one copy to the first device each, not one per array.
  std::vector<std::pair<Device, Tensor<T>>> per_device;
  for (const auto& a : arrays) {
    const auto it = std::ranges::find(per_device, a.device(), &std::pair<Device, Tensor<T>>::first);
    Tensor<T> squares = detail::sum_untracked(a * a);
    if (it != per_device.end()) detail::assign_untracked(it->second, it->second + squares);
    else per_device.emplace_back(a.device(), std::move(squares));
  }
  const Device home = per_device[0].first;
  Tensor<T> squares = per_device[0].second;
  for (std::size_t i = 1; i < per_device.size(); ++i)
    detail::assign_untracked(squares, squares + per_device[i].second.to(home));
  Tensor<T> norm = detail::eval_untracked(sqrt(squares));
  // + 0 * norm: NaN for a NaN or infinite norm (squares past float's range
  // when gradients explode), where the quotient alone would be 0 and zero
  // the arrays silently; nothing for a finite one.
  Tensor<T> scale = detail::eval_untracked(minimum(max_norm / (norm + T(1e-6)), T(1)) + norm * T(0));
  return {std::move(norm), std::move(scale)};
}

/// Multiplies each array by `scale`, copied once to each other device.
template <std::floating_point T>
void scale_by(std::vector<Tensor<T>>& arrays, const Tensor<T>& scale) {
  std::vector<Tensor<T>> on_device{scale};
  for (auto& a : arrays) {
    auto it = std::ranges::find_if(on_device, [&](const Tensor<T>& s) { return s.device() == a.device(); });
    if (it == on_device.end()) it = on_device.insert(on_device.end(), scale.to(a.device()));
    a *= *it;
  }
}

inline void check_max_norm(double max_norm) {
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    detail::raise("clip_global_norm: max_norm must be a positive finite number, got ", max_norm);
}
}  // namespace detail_clip

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
  detail_clip::check_max_norm(double(max_norm));
  autograd::pause no_recording;
  auto [norm, scale] = detail_clip::clipping_scale(arrays, max_norm);
  detail_clip::scale_by(arrays, scale);
  return norm;
}

/// Clips the gradients of `params` together by their global norm, as
/// above, on every device they live on: for data parallelism, between
/// Trainer::allreduce_grads() and Trainer::update(), when every device holds
/// the summed gradients. The copies must stay equal to the bit, so each
/// device scales by the same number. Devices of one kind each compute it
/// from their own copy (the same bits through the same kernels; no
/// copies). A mix of kinds (the CPU and a GPU) sums in different orders:
/// there the first device computes it and sends each other one a copy.
/// Returns the norm on the first device. std::invalid_argument for no
/// parameters or parameters on different devices; std::logic_error for
/// one without a value yet.
DEFT_DECL Tensor<float> clip_global_norm(const std::vector<Parameter*>& params, float max_norm);

#if DEFT_DEFINE_NN
DEFT_DECL Tensor<float> clip_global_norm(const std::vector<Parameter*>& params, float max_norm) {
  if (params.empty()) detail::raise("clip_global_norm: no parameters given");
  for (const Parameter* p : params) {
    if (!p->initialized())
      detail::raise<std::logic_error>("clip_global_norm: parameter '", p->name(), "' has no value yet");
    if (p->devices() != params[0]->devices())
      detail::raise("clip_global_norm: parameter '", p->name(), "' lives on ", detail::device_list(p->devices()),
                    " but '", params[0]->name(), "' on ", detail::device_list(params[0]->devices()));
  }
  detail_clip::check_max_norm(double(max_norm));
  autograd::pause no_recording;
  const std::vector<Device>& devices = params[0]->devices();
  const auto grads_on = [&](Device d) {
    std::vector<Tensor<float>> grads;
    for (Parameter* p : params) grads.push_back(p->grad(d));
    return grads;
  };
  const bool one_kind = detail::one_device_kind(devices);
  Tensor<float> first_norm, first_scale;
  for (const Device d : devices) {
    std::vector<Tensor<float>> grads = grads_on(d);
    if (!first_norm || one_kind) {
      auto [norm, scale] = detail_clip::clipping_scale(grads, max_norm);
      detail_clip::scale_by(grads, scale);
      if (!first_norm) first_norm = std::move(norm), first_scale = std::move(scale);
    } else {
      detail_clip::scale_by(grads, first_scale);
    }
  }
  return first_norm;
}
#endif

}  // namespace deft::nn
