// The derivatives of conv2d and pooling (ops/conv.hpp records their tasks):
// dx = col2im(Wᵀ·dY), dW = dY·colsᵀ, db = Σ dY; a pooling window's gradient
// goes to its first maximum, or spreads evenly. Each backward() records its
// own untracked tasks.
#pragma once
#include <memory>
#include <utility>

#include "../eval/conv_geometry.hpp"
#include "../ops/conv.hpp"
#include "graph.hpp"
#include "meta.hpp"

namespace deft::autograd::detail {

/// conv2d's derivative: dx = col2im(Wᵀ·dY), dW = dY·colsᵀ, db = Σ dY.
template <class T>
struct Conv2dNode final : Node {
  deft::detail::Leaf<T> x, w, b;
  bool has_bias;
  deft::detail::ConvGeom geom;

  Conv2dNode(deft::detail::Leaf<T> in, deft::detail::Leaf<T> weight, const deft::detail::Leaf<T>* bias,
             const deft::detail::ConvGeom& g)
      : Node("conv2d"), x(std::move(in)), w(std::move(weight)), has_bias(bias != nullptr), geom(g) {
    if (bias) b = *bias;
    if (x.grad) inputs.push_back(x.grad);
    if (w.grad) inputs.push_back(w.grad);
    if (has_bias && b.grad) inputs.push_back(b.grad);
  }
  void backward(MetaBase& out) override {
    const auto dy = gathered<T>(out).leaf();  // recording is paused: a plain leaf
    if (x.grad) accumulate<T>(*x.grad, deft::detail::conv2d_grad_input(dy, w, geom));
    if (w.grad) accumulate<T>(*w.grad, deft::detail::conv2d_grad_weight(dy, x, geom));
    if (has_bias && b.grad) accumulate<T>(*b.grad, deft::detail::conv2d_grad_bias(dy, geom));
  }
};

/// Pooling's derivative: to each window's first maximum, or spread evenly.
template <deft::detail::PoolKind Kind, class T>
struct Pool2dNode final : Node {
  deft::detail::Leaf<T> x;
  deft::detail::PoolGeom geom;
  Pool2dNode(deft::detail::Leaf<T> in, const deft::detail::PoolGeom& g)
      : Node(Kind == deft::detail::PoolKind::max ? "max_pool2d" : "avg_pool2d"), x(std::move(in)), geom(g) {
    inputs.push_back(x.grad);
  }
  void backward(MetaBase& out) override {
    const auto dy = gathered<T>(out).leaf();
    accumulate<T>(*x.grad, deft::detail::pool2d_grad<Kind>(dy, x, geom));
  }
};

template <class T>
void track_conv2d(Tensor<T>& out, const deft::detail::Leaf<T>& x, const deft::detail::Leaf<T>& w,
                  const deft::detail::Leaf<T>* b, const deft::detail::ConvGeom& g) {
  out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<Conv2dNode<T>>(x, w, b, g)));
}

template <deft::detail::PoolKind Kind, class T>
void track_pool2d(Tensor<T>& out, const deft::detail::Leaf<T>& x, const deft::detail::PoolGeom& g) {
  out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<Pool2dNode<Kind, T>>(x, g)));
}

}  // namespace deft::autograd::detail
