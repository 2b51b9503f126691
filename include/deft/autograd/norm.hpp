// The derivative of a training-mode BatchNorm (nn/norm_layers.hpp records
// its forward tasks), one fused formula for x, γ and β instead of the chain
// of the normalization's parts. Over x of shape (n, c, s), with
// x̂ = (x - mean) * inv_std, Σ over the n and s axes and N = n·s:
//   dβ = Σ g,   dγ = Σ g·x̂,   dx = γ·inv_std * (g - Σ g / N - x̂ * Σ g·x̂ / N)
// Two reading passes and one writing pass. A BatchNorm whose statistics
// span several processes (synchronized) sums Σ g and Σ g·x̂ over them for
// dx, with N the count over all of them; dγ and dβ stay this process's
// share, as every other parameter's gradient, for the Trainer to sum.
#pragma once
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "../ops/elementwise.hpp"
#include "../ops/reduction.hpp"
#include "graph.hpp"

namespace deft::autograd::detail {

/// Sums tensors over the processes that share a synchronized BatchNorm's
/// statistics, in place (nn implements it with a collective).
template <class T>
struct SumAcrossProcesses {
  virtual ~SumAcrossProcesses() = default;
  virtual void sum(std::vector<Tensor<T>>& t) const = 0;
};

/// Holds the batch statistics the forward took, each of shape (c),
/// scale = γ·inv_std and inverse_count, 1/N in each of the c elements; for
/// synchronized statistics N counts the values of every process, and
/// `across` sums over them.
template <class T>
struct BatchNormNode final : Node {
  deft::detail::Leaf<T> x, gamma, beta;
  Tensor<T> mean, inv_std, scale, inverse_count;
  std::shared_ptr<const SumAcrossProcesses<T>> across;
  BatchNormNode(deft::detail::Leaf<T> in, deft::detail::Leaf<T> g, deft::detail::Leaf<T> b, Tensor<T> m,
                Tensor<T> is, Tensor<T> sc, Tensor<T> inv_count, std::shared_ptr<const SumAcrossProcesses<T>> sum)
      : Node("batch_norm"), x(std::move(in)), gamma(std::move(g)), beta(std::move(b)), mean(std::move(m)),
        inv_std(std::move(is)), scale(std::move(sc)), inverse_count(std::move(inv_count)), across(std::move(sum)) {
    for (const auto* l : {&x, &gamma, &beta})
      if (l->grad) inputs.push_back(l->grad);
  }
  void backward(MetaBase& out) override {
    const Shape& s = x.extent;
    const auto per_row = [&](const Tensor<T>& t) { return t.reshape({1, s[1], 1}); };
    const Tensor<T> g = gathered<T>(out).reshape({s[0], s[1], s[2]});
    const auto x_hat = (tensor_of(x) - per_row(mean)) * per_row(inv_std);
    const Tensor<T> sum_g = sum_untracked(sum_untracked(g, 2), 0);
    const Tensor<T> sum_g_x_hat = sum_untracked(sum_untracked(g * x_hat, 2), 0);
    if (beta.grad) accumulate<T>(*beta.grad, sum_g);
    if (gamma.grad) accumulate<T>(*gamma.grad, sum_g_x_hat);
    if (!x.grad) return;
    // The means over N, in new storage: a synchronized layer sums them over
    // the processes in place, and dβ and dγ, this process's own, keep theirs.
    std::vector<Tensor<T>> means{eval_untracked(sum_g * inverse_count), eval_untracked(sum_g_x_hat * inverse_count)};
    if (across) across->sum(means);
    accumulate<T>(*x.grad, eval_untracked(per_row(scale) * (g - per_row(means[0]) - x_hat * per_row(means[1]))));
  }
};

/// Makes y, the normalized x of shape (n, c, s), differentiable in x, γ and β
/// through one BatchNormNode; inverse_count and `across` as the node's.
template <class T>
void track_batch_norm(Tensor<T>& y, deft::detail::Leaf<T> x, deft::detail::Leaf<T> gamma,
                      deft::detail::Leaf<T> beta, Tensor<T> mean, Tensor<T> inv_std, Tensor<T> scale,
                      Tensor<T> inverse_count,
                      std::type_identity_t<std::shared_ptr<const SumAcrossProcesses<T>>> across = nullptr) {
  y.set_grad_meta(new_meta<T>(y.shape(), std::make_shared<BatchNormNode<T>>(
                                             std::move(x), std::move(gamma), std::move(beta), std::move(mean),
                                             std::move(inv_std), std::move(scale), std::move(inverse_count),
                                             std::move(across))));
}

}  // namespace deft::autograd::detail
