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

#include "../ops/elementwise.hpp"
#include "../ops/reduction.hpp"
#include "graph.hpp"

namespace deft::autograd::detail {

/// The derivative of a BatchNorm whose statistics span several processes
/// (nn implements it with a collective, and only programs that synchronize
/// compile it).
template <class T>
struct BatchNormAcrossProcesses {
  virtual ~BatchNormAcrossProcesses() = default;
  /// dx = scale·(g - Σg/N - x̂·Σg·x̂/N), x̂ = (x - mean)·inv_std, for g and x
  /// of shape (n, c, s): Σ g and Σ g·x̂ (each (c), this process's) summed
  /// over the processes, inverse_count 1/N in each of the c elements.
  virtual Tensor<T> input_gradient(const Tensor<T>& g, const Tensor<T>& x, const Tensor<T>& mean,
                                   const Tensor<T>& inv_std, const Tensor<T>& scale, const Tensor<T>& sum_g,
                                   const Tensor<T>& sum_g_x_hat, const Tensor<T>& inverse_count) const = 0;
};

/// Holds the batch statistics the forward took, each of shape (c), and
/// scale = γ·inv_std. For synchronized statistics, `across` and
/// inverse_count, 1/N over all processes in each of the c elements.
template <class T>
struct BatchNormNode final : Node {
  deft::detail::Leaf<T> x, gamma, beta;
  Tensor<T> mean, inv_std, scale;
  std::shared_ptr<const BatchNormAcrossProcesses<T>> across;
  Tensor<T> inverse_count;
  BatchNormNode(deft::detail::Leaf<T> in, deft::detail::Leaf<T> g, deft::detail::Leaf<T> b, Tensor<T> m,
                Tensor<T> is, Tensor<T> sc, std::shared_ptr<const BatchNormAcrossProcesses<T>> processes,
                Tensor<T> inv_count)
      : Node("batch_norm"), x(std::move(in)), gamma(std::move(g)), beta(std::move(b)), mean(std::move(m)),
        inv_std(std::move(is)), scale(std::move(sc)), across(std::move(processes)),
        inverse_count(std::move(inv_count)) {
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
    if (across) {
      accumulate<T>(*x.grad, across->input_gradient(g, tensor_of(x), mean, inv_std, scale, sum_g, sum_g_x_hat,
                                                    inverse_count));
      return;
    }
    const T inv_n = T(1) / T(s[0] * s[2]);
    accumulate<T>(*x.grad, eval_untracked(per_row(scale) * (g - per_row(sum_g) * inv_n -
                                                            x_hat * per_row(sum_g_x_hat) * inv_n)));
  }
};

/// Makes y, the normalized x of shape (n, c, s), differentiable in x, γ and β
/// through one BatchNormNode; `across` and inverse_count as the node's.
template <class T>
void track_batch_norm(Tensor<T>& y, deft::detail::Leaf<T> x, deft::detail::Leaf<T> gamma,
                      deft::detail::Leaf<T> beta, Tensor<T> mean, Tensor<T> inv_std, Tensor<T> scale,
                      std::type_identity_t<std::shared_ptr<const BatchNormAcrossProcesses<T>>> across = nullptr,
                      Tensor<T> inverse_count = {}) {
  y.set_grad_meta(new_meta<T>(y.shape(), std::make_shared<BatchNormNode<T>>(
                                             std::move(x), std::move(gamma), std::move(beta), std::move(mean),
                                             std::move(inv_std), std::move(scale), std::move(across),
                                             std::move(inverse_count))));
}

}  // namespace deft::autograd::detail
