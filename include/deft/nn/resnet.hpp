// Residual networks (He et al. 2016): the Residual block and the ResNet-18
// that the D2L chapter trains on Fashion-MNIST over several devices.
#pragma once
#include <cstdint>
#include <memory>

#include "block.hpp"
#include "conv_layers.hpp"
#include "layers.hpp"
#include "norm_layers.hpp"

namespace deft::nn {

/// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)): two 3x3
/// convolutions, the first with `stride`, each followed by BatchNorm. The
/// shortcut is x itself, or with `use_1x1conv` a 1x1 convolution with
/// `stride` (needed when the block changes the channels or the size). The
/// 3x3 convolutions have no bias: BatchNorm's beta shifts their output.
class Residual : public Block {
 public:
  ~Residual() override;
  /// std::invalid_argument for fewer than 1 channel or a stride below 1.
  explicit Residual(std::int64_t channels, bool use_1x1conv = false, Size2d stride = 1)
      : Block(auto_name("residual")),
        conv1_(std::make_shared<Conv2D>(channels, 3, stride, 1, Act::none, false)),
        bn1_(std::make_shared<BatchNorm>()),
        conv2_(std::make_shared<Conv2D>(channels, 3, 1, 1, Act::none, false)),
        bn2_(std::make_shared<BatchNorm>()),
        shortcut_(use_1x1conv ? std::make_shared<Conv2D>(channels, 1, stride) : nullptr) {
    add_child(conv1_);
    add_child(bn1_);
    add_child(conv2_);
    add_child(bn2_);
    if (shortcut_) add_child(shortcut_);
  }
  Tensor<float> forward(const Tensor<float>& x) override;

 private:
  std::shared_ptr<Conv2D> conv1_;
  std::shared_ptr<BatchNorm> bn1_;
  std::shared_ptr<Conv2D> conv2_;
  std::shared_ptr<BatchNorm> bn2_;
  std::shared_ptr<Conv2D> shortcut_;
};

/// The ResNet-18 of the D2L chapter's multi-GPU training: a 3x3 stem of
/// `width` channels (stride 1, no max pooling: the inputs are 28x28 or
/// 32x32) with BatchNorm and ReLU; four stages of two Residual blocks with
/// width, 2, 4 and 8 times width channels, the last three halving the size;
/// a global average pool and a Dense layer of `num_classes` outputs.
/// width 64 is the full network (11.2 M parameters); smaller widths scale
/// every stage, for a CPU. std::invalid_argument for num_classes or width below 1.
DEFT_DECL std::shared_ptr<Sequential> resnet18(std::int64_t num_classes, std::int64_t width = 64);

#if DEFT_DEFINE_NN
DEFT_DECL std::shared_ptr<Sequential> resnet18(std::int64_t num_classes, std::int64_t width) {
  if (num_classes < 1 || width < 1)
    detail::raise("resnet18: num_classes and width must be at least 1, got ", num_classes, " and ", width);
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Conv2D>(width, 3, 1, 1), std::make_shared<BatchNorm>(),
           std::make_shared<Activation>(Act::relu));
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t channels = width << stage;
    auto blocks = std::make_shared<Sequential>();
    if (stage == 0) blocks->add(std::make_shared<Residual>(channels));
    else blocks->add(std::make_shared<Residual>(channels, true, 2));
    blocks->add(std::make_shared<Residual>(channels));
    net->add(blocks);
  }
  net->add(std::make_shared<GlobalAvgPool2D>(), std::make_shared<Dense>(num_classes));
  return net;
}

DEFT_DECL Residual::~Residual() = default;

DEFT_DECL Tensor<float> Residual::forward(const Tensor<float>& x) {
  const Tensor<float> h(relu((*bn1_)((*conv1_)(x))));
  const Tensor<float> y = (*bn2_)((*conv2_)(h));
  const Tensor<float> skip = shortcut_ ? (*shortcut_)(x) : x;
  if (!(y.shape() == skip.shape()))
    detail::raise(name(), ": the block's output has shape ", y.shape().to_string(), " but its input ",
                  x.shape().to_string(), " has shape ", skip.shape().to_string(),
                  " on the shortcut; make the block with use_1x1conv when it changes the channels or the stride");
  return Tensor<float>(relu(y + skip));
}
#endif

}  // namespace deft::nn
