// The derivatives of softmax, log_softmax and the softmax cross-entropy
// (ops/softmax.hpp and nn/loss.hpp record their forward tasks), each one
// fused formula instead of the chain of its parts' derivatives. Along the
// axis, with Σ a sum that keeps it:
//   y = softmax(x):      dx = y * (g - Σ g·y)
//   z = log_softmax(x):  dx = g - exp(z) * Σ g
//   the cross-entropy of each row's scores x against its label (a one-hot
//   row t), with m the row's maximum and s = log Σ exp(x - m):
//                        dx = (exp(x - m - s) - t) * g
#pragma once
#include <memory>
#include <utility>

#include "../ops/elementwise.hpp"
#include "../ops/reduction.hpp"
#include "graph.hpp"
#include "meta.hpp"

namespace deft::autograd::detail {

/// softmax or log_softmax along `axis`; holds the forward value.
template <class T>
struct SoftmaxNode final : Node {
  deft::detail::Leaf<T> y;  // without the output's autograd record: that record holds this node
  int axis;
  bool log;
  SoftmaxNode(std::shared_ptr<MetaBase> x, const Tensor<T>& out, int a, bool l)
      : Node(l ? "log_softmax" : "softmax"), axis(a), log(l) {
    const auto leaf = out.leaf();
    y = deft::detail::Leaf<T>(leaf.buffer, leaf.offset, leaf.extent);
    inputs.push_back(std::move(x));
  }
  void backward(MetaBase& out) override {
    const Tensor<T>& g = gathered<T>(out);
    const Tensor<T> v = tensor_of(y);
    if (log) accumulate<T>(*inputs[0], eval_untracked(g - exp(v) * sum_untracked(g, axis, true)));
    else accumulate<T>(*inputs[0], eval_untracked(v * (g - sum_untracked(g * v, axis, true))));
  }
};

/// The cross-entropy of rows of scores against one-hot labels.
template <class T>
struct SoftmaxCrossEntropyNode final : Node {
  deft::detail::Leaf<T> x;
  Tensor<T> max, log_sum, onehot;  // (n, 1), (n, 1), (n, classes)
  SoftmaxCrossEntropyNode(deft::detail::Leaf<T> scores, Tensor<T> m, Tensor<T> s, Tensor<T> t)
      : Node("softmax_cross_entropy"), x(std::move(scores)), max(std::move(m)), log_sum(std::move(s)),
        onehot(std::move(t)) {
    inputs.push_back(x.grad);
  }
  void backward(MetaBase& out) override {
    const Tensor<T>& g = gathered<T>(out);
    accumulate<T>(*x.grad,
                  eval_untracked((exp(tensor_of(x) - max - log_sum) - onehot) * g.reshape({g.shape()[0], 1})));
  }
};

template <class T>
void track_softmax(Tensor<T>& out, std::shared_ptr<MetaBase> in, int axis, bool log) {
  out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<SoftmaxNode<T>>(std::move(in), out, axis, log)));
}

template <class T>
void track_softmax_cross_entropy(Tensor<T>& loss, const deft::detail::Leaf<T>& scores, Tensor<T> max,
                                 Tensor<T> log_sum, Tensor<T> onehot) {
  loss.set_grad_meta(new_meta<T>(
      loss.shape(), std::make_shared<SoftmaxCrossEntropyNode<T>>(scores, std::move(max), std::move(log_sum),
                                                                  std::move(onehot))));
}

}  // namespace deft::autograd::detail
