// Convolution and pooling layers (LeNet's and ResNet's pieces), NCHW, over ops/conv.hpp.
#pragma once
#include <cstdint>
#include <optional>

#include "../ops/conv.hpp"
#include "../ops/reduction.hpp"
#include "block.hpp"
#include "layers.hpp"

namespace deft::nn {

/// act(conv2d(x, W, b)) with `channels` output channels; W has shape
/// (channels, in_channels, kh, kw), in_channels inferred at the first call.
/// Without `use_bias` there is no b (a BatchNorm after it has its own shift).
class Conv2D : public Block {
 public:
  ~Conv2D() override;
  /// `channels` output channels, a kernel of kh x kw; std::invalid_argument for extents below 1.
  Conv2D(std::int64_t channels, Size2d kernel, Size2d stride = 1, Size2d padding = 0, Act act = Act::none,
         bool use_bias = true)
      : Block(auto_name("conv")), channels_(channels), kernel_(kernel), stride_(stride), padding_(padding), act_(act),
        weight_(add_parameter("weight", {channels, inferred_extent, kernel.h, kernel.w})),
        bias_(use_bias ? &add_parameter("bias", {channels}) : nullptr) {
    if (channels < 1 || kernel.h < 1 || kernel.w < 1)
      detail::raise("Conv2D: channels and kernel extents must be at least 1, got ", channels, " and ", kernel.to_string());
    if (stride.h < 1 || stride.w < 1 || padding.h < 0 || padding.w < 0)
      detail::raise("Conv2D: the stride must be at least 1 and the padding at least 0, got stride ", stride.to_string(),
                    " and padding ", padding.to_string());
  }
  Tensor<float> forward(const Tensor<float>& x) override;
  /// W, of shape (channels, in_channels, kh, kw).
  Parameter& weight() { return weight_; }
  /// b, of shape (channels,); std::logic_error for a layer made without use_bias.
  Parameter& bias() {
    if (!bias_) detail::raise<std::logic_error>(name(), " was made without a bias (use_bias = false)");
    return *bias_;
  }

 private:
  std::int64_t channels_;
  Size2d kernel_, stride_, padding_;
  Act act_;
  Parameter& weight_;
  Parameter* bias_;
};

/// Pooling as a layer: the maximum (MaxPool2D) or mean (AvgPool2D) of each
/// window; the stride defaults to the window.
template <bool Max>
class Pool2D : public Block {
 public:
  /// Windows of `pool`, moved by `stride` (the window by default).
  explicit Pool2D(Size2d pool, std::optional<Size2d> stride = std::nullopt)
      : Block(auto_name(Max ? "maxpool" : "avgpool")), pool_(pool), stride_(stride.value_or(pool)) {}
  Tensor<float> forward(const Tensor<float>& x) override;

 private:
  Size2d pool_, stride_;
};
using MaxPool2D = Pool2D<true>;   ///< the maximum of each window
using AvgPool2D = Pool2D<false>;  ///< the mean of each window

/// Pooling over each channel's whole plane: (N, C, H, W) -> (N, C, 1, 1),
/// the maximum (GlobalMaxPool2D; a tie's gradient is split evenly) or the
/// mean (GlobalAvgPool2D), for any H and W.
template <bool Max>
class GlobalPool2D : public Block {
 public:
  /// A layer with no parameters.
  GlobalPool2D() : Block(auto_name(Max ? "globalmaxpool" : "globalavgpool")) {}
  Tensor<float> forward(const Tensor<float>& x) override;
};
using GlobalMaxPool2D = GlobalPool2D<true>;   ///< the maximum of each channel
using GlobalAvgPool2D = GlobalPool2D<false>;  ///< the mean of each channel

#if DEFT_DEFINE_NN
DEFT_DECL Conv2D::~Conv2D() = default;

DEFT_DECL Tensor<float> Conv2D::forward(const Tensor<float>& x) {
  if (x.rank() != 4) detail::raise(name(), ": needs an input of shape (batch, channels, height, width), got ", x.shape().to_string());
  const Shape w{channels_, x.shape()[1], kernel_.h, kernel_.w}, b{channels_};
  if (weight_.initialized() && !(weight_.shape() == w))
    detail::raise(name(), ": was built for ", weight_.shape()[1], " input channels but got an input of shape ",
                  x.shape().to_string());
  // The whole call is checked before the weight is drawn: a first call
  // with a bad input (NHWC for NCHW) must not fix its channel count.
  (void)detail::plan_conv2d(x.shape(), w, bias_ ? &b : nullptr, stride_, padding_);
  weight_.materialize(w);
  if (!bias_) return activate(act_, conv2d(x, weight_.data(x.device()), stride_, padding_));
  bias_->materialize(b);
  return activate(act_, conv2d(x, weight_.data(x.device()), bias_->data(x.device()), stride_, padding_));
}

template <bool Max>
Tensor<float> Pool2D<Max>::forward(const Tensor<float>& x) {
  if constexpr (Max) return max_pool2d(x, pool_, stride_);
  else return avg_pool2d(x, pool_, stride_);
}

template <bool Max>
Tensor<float> GlobalPool2D<Max>::forward(const Tensor<float>& x) {
  if (x.rank() != 4 || x.shape()[2] * x.shape()[3] == 0)
    detail::raise(name(), ": needs an input of shape (batch, channels, height, width) with a nonempty plane, got ",
                  x.shape().to_string());
  const std::int64_t n = x.shape()[0], c = x.shape()[1];
  const Tensor<float> planes = x.reshape({n, c, x.shape()[2] * x.shape()[3]});
  if constexpr (Max) return Tensor<float>(max(planes, 2)).reshape({n, c, 1, 1});
  else return Tensor<float>(mean(planes, 2)).reshape({n, c, 1, 1});
}
#endif

// Compiled once in the compiled mode, like the classes' key functions above.
#if defined(DEFT_SEPARATE_COMPILATION)
#if DEFT_DEFINE_NN
#define DEFT_NN_INSTANCE template
#else
#define DEFT_NN_INSTANCE extern template
#endif
DEFT_NN_INSTANCE class Pool2D<true>;
DEFT_NN_INSTANCE class Pool2D<false>;
DEFT_NN_INSTANCE class GlobalPool2D<true>;
DEFT_NN_INSTANCE class GlobalPool2D<false>;
#undef DEFT_NN_INSTANCE
#endif

}  // namespace deft::nn
