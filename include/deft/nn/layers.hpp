// Layers without convolution: Dense, Activation, Flatten, Dropout.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "../ops/elementwise.hpp"
#include "../ops/linalg.hpp"
#include "../ops/random.hpp"
#include "block.hpp"

namespace deft::nn {

/// Activation functions a layer can apply to its output.
enum class Act { none, relu, sigmoid, tanh, softrelu };

/// Calls use(act(x)) with act(x) as an expression (each activation is its
/// own expression type, so `use` is instantiated once per activation).
template <class X, class Use>
decltype(auto) with_activation(Act act, X&& x, Use&& use) {
  switch (act) {
    case Act::relu: return use(relu(std::forward<X>(x)));
    case Act::sigmoid: return use(sigmoid(std::forward<X>(x)));
    case Act::tanh: return use(tanh(std::forward<X>(x)));
    case Act::softrelu: {
      // log(1 + e^x), which is x in float beyond 20: there e^x alone would
      // overflow at 89 (inf, and a NaN gradient). The clamp at 30 keeps the
      // branch not taken finite for the gradient, and away from x's own values.
      auto e = as_expr(std::forward<X>(x));
      return use(where(e > 20.0f, e, log(exp(minimum(e, 30.0f)) + 1.0f)));
    }
    case Act::none: break;
  }
  return use(std::forward<X>(x));
}

/// act(x), evaluated (one fused task with whatever x's expression is).
template <class X>
Tensor<float> activate(Act act, X&& x) {
  return with_activation(act, std::forward<X>(x), [](auto&& e) { return Tensor<float>(std::forward<decltype(e)>(e)); });
}

/// y = act(x W + b) for x of shape (batch, in) (higher ranks are flattened
/// to (batch, -1)); W has shape (in, units), inferred at the first call.
class Dense : public Block {
 public:
  ~Dense() override;
  /// `units` outputs (at least 1), then `act`; std::invalid_argument for units < 1.
  explicit Dense(std::int64_t units, Act act = Act::none, bool use_bias = true)
      : Block(auto_name("dense")), units_(units), act_(act), use_bias_(use_bias),
        weight_(add_parameter("weight", {inferred_extent, units})),
        bias_(use_bias ? &add_parameter("bias", {units}) : nullptr) {
    if (units < 1) detail::raise("Dense: units must be at least 1, got ", units);
  }
  Tensor<float> forward(const Tensor<float>& x) override;
  /// The number of outputs.
  std::int64_t units() const { return units_; }
  /// W, of shape (in, units).
  Parameter& weight() { return weight_; }
  /// b, of shape (units,); only when made with use_bias.
  Parameter& bias() { return *bias_; }

 private:
  /// act(y + b) evaluated in place over a product's output y, inside the
  /// product's task (record_product's epilogue): a Dense layer outside
  /// autograd then costs one task instead of two (a batch-1 forward is mostly
  /// per-task cost). The bias is optional (use_bias = false).
  struct BiasActivation {
    std::optional<detail::Leaf<float>> bias;
    Act act;

    template <class Ex>
    void apply(Ex ex, detail::Buffer& out, const Shape& shape) const {
      // Leaves that own nothing: the task keeps both buffers alive while it
      // runs, and a reference taken per call costs atomics for nothing.
      detail::Leaf<float> y;  // reads the output it overwrites, element by element
      y.source = &out;
      y.extent = shape;
      auto write = [&](auto&& e) { ex.evaluate(e, out.as<float>()); };
      if (bias) {
        detail::Leaf<float> b;
        b.source = bias->source;
        b.offset = bias->offset;
        b.extent = bias->extent;
        with_activation(act, y + b, write);
      } else if (act != Act::none) {
        with_activation(act, y, write);
      }
    }
    void add_inputs(detail::Task& t) const {
      if (bias) t.add_input(bias->buffer);
    }

  };

  std::int64_t units_;
  Act act_;
  bool use_bias_;
  Parameter& weight_;
  Parameter* bias_;
};

/// An activation function as a layer.
class Activation : public Block {
 public:
  ~Activation() override;
  /// A layer applying `act`.
  explicit Activation(Act act) : Block(auto_name("activation")), act_(act) {}
  Tensor<float> forward(const Tensor<float>& x) override;

 private:
  Act act_;
};

/// (batch, d1, d2, ...) -> (batch, d1 * d2 * ...), a view.
class Flatten : public Block {
 public:
  ~Flatten() override;
  /// A layer with no parameters.
  Flatten() : Block(auto_name("flatten")) {}
  Tensor<float> forward(const Tensor<float>& x) override;
};

/// Zeroes each element with probability `rate` and scales the others by
/// 1 / (1 - rate) in training mode (autograd::is_training(): inside
/// autograd::record by default), as Gluon's Dropout does; in prediction mode
/// it is the identity. The mask comes
/// from deft::random, so it follows random::seed; a hybridized block or an
/// nn::TrainStep draws a new mask on every call, the one the plain code
/// would have drawn.
class Dropout : public Block {
 public:
  ~Dropout() override;
  /// std::invalid_argument unless 0 <= rate < 1.
  explicit Dropout(float rate) : Block(auto_name("dropout")), rate_(rate) {
    if (!(rate >= 0.0f && rate < 1.0f)) detail::raise("Dropout: the rate must be in [0, 1), got ", rate);
  }
  /// x masked and scaled in training mode, else x.
  Tensor<float> forward(const Tensor<float>& x) override;
  /// The probability of dropping an element.
  float rate() const { return rate_; }

 private:
  float rate_;
};

#if DEFT_DEFINE_NN
DEFT_DECL Dense::~Dense() = default;
DEFT_DECL Activation::~Activation() = default;
DEFT_DECL Flatten::~Flatten() = default;
DEFT_DECL Dropout::~Dropout() = default;

DEFT_DECL Tensor<float> Dense::forward(const Tensor<float>& x) {
  if (x.rank() < 2) detail::raise(name(), ": needs an input of shape (batch, features...), got ", x.shape().to_string());
  const Tensor<float> x2 = x.rank() == 2 ? x : x.reshape({x.shape()[0], -1});
  const std::int64_t in = x2.shape()[1];
  if (weight_.initialized() && weight_.shape()[0] != in)
    detail::raise(name(), ": was built for ", weight_.shape()[0], " input features but got an input of shape ",
                  x.shape().to_string());
  weight_.materialize(Shape{in, units_});
  if (use_bias_) bias_->materialize(Shape{units_});
  const Tensor<float>& w = weight_.data(x.device());
  if (!autograd::is_recording()) {  // one task: the product, then bias and activation on its output
    BiasActivation epilogue{std::nullopt, act_};
    if (use_bias_) epilogue.bias = bias_->data(x.device()).leaf();
    return detail::record_product(x2.leaf(), false, w.leaf(), false, "dense", std::move(epilogue));
  }
  if (!use_bias_) return activate(act_, dot(x2, w));
  const Tensor<float> xw = dot(x2, w);
  return activate(act_, xw + bias_->data(x.device()));
}

DEFT_DECL Tensor<float> Activation::forward(const Tensor<float>& x) { return activate(act_, x); }

DEFT_DECL Tensor<float> Flatten::forward(const Tensor<float>& x) {
  if (x.rank() < 1) detail::raise(name(), ": cannot flatten a scalar");
  return x.reshape({x.shape()[0], -1});
}

DEFT_DECL Tensor<float> Dropout::forward(const Tensor<float>& x) {
  if (!autograd::is_training() || rate_ == 0.0f) return x;
  const Tensor<float> keep = detail::eval_untracked(
      cast<float>(random::uniform<float>(0.0, 1.0, x.shape(), x.device()) >= rate_) * (1.0f / (1.0f - rate_)));
  return x * keep;
}
#endif

}  // namespace deft::nn
