// Blocks: the pieces a network is built from (Gluon's Block). A block maps a
// float32 tensor to a float32 tensor, owns named parameters and may contain
// child blocks. Parameters whose shape depends on the input (a Dense layer's
// input size) are created at the first forward call: deferred initialization.
#pragma once
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../tensor.hpp"
#include "init.hpp"

namespace deft::nn {

/// A trainable tensor with a name, an initializer and an attached gradient.
class Parameter {
 public:
  Parameter(std::string name, Initializer init) : name_(std::move(name)), init_(std::move(init)) {}

  const std::string& name() const { return name_; }
  bool initialized() const { return static_cast<bool>(data_); }
  /// The current value; throws until the block has seen its first input.
  Tensor<float>& data() {
    if (!data_)
      detail::raise<std::logic_error>("parameter '", name_,
                                      "' has no value yet: call initialize() on the network and run one forward pass "
                                      "(its shape is inferred from the first input)");
    return data_;
  }
  const Tensor<float>& data() const { return const_cast<Parameter*>(this)->data(); }
  Tensor<float> grad() const { return data().grad(); }
  Shape shape() const { return data().shape(); }

  /// Draws the value for `shape` (once; later calls must agree on the shape).
  void materialize(const Shape& shape) {
    if (data_) {
      if (!(data_.shape() == shape))
        detail::raise("parameter '", name_, "' has shape ", data_.shape().to_string(), " but the input now needs ",
                      shape.to_string());
      return;
    }
    if (!init_)
      detail::raise<std::logic_error>("parameter '", name_, "': the network was not initialized; call net.initialize() first");
    data_ = init_(shape);
    data_.attach_grad();
  }
  /// Replaces the value (loading saved parameters); the shape must match once known.
  void set_data(const Tensor<float>& value) {
    if (data_ && !(data_.shape() == value.shape()))
      detail::raise("parameter '", name_, "' has shape ", data_.shape().to_string(), " but the value given has shape ",
                    value.shape().to_string());
    data_ = value.clone();
    data_.attach_grad();
  }
  void set_initializer(Initializer init) { init_ = std::move(init); }

 private:
  std::string name_;
  Initializer init_;
  Tensor<float> data_;
};

class Block {
 public:
  explicit Block(std::string name) : name_(std::move(name)) {}
  virtual ~Block() = default;
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  /// Runs the block (deferred like any deft expression).
  Tensor<float> operator()(const Tensor<float>& x) { return forward(x); }
  virtual Tensor<float> forward(const Tensor<float>& x) = 0;

  const std::string& name() const { return name_; }

  /// Every parameter of this block and its children, in a stable order.
  std::vector<Parameter*> collect_params() {
    std::vector<Parameter*> out;
    collect(out);
    return out;
  }
  /// Sets how parameters start (default Xavier for weights; biases keep zeros);
  /// values are drawn when each parameter's shape is known.
  void initialize(const Initializer& weights = init::xavier()) { apply_initializer(weights); }

 protected:
  virtual void collect(std::vector<Parameter*>& out) {
    for (auto& p : params_) out.push_back(p.get());
    for (auto& c : children_) c->collect(out);
  }
  virtual void apply_initializer(const Initializer& weights) {
    for (auto& p : params_)
      if (p->name().ends_with(".weight")) p->set_initializer(weights);
      else p->set_initializer(init::zeros());
    for (auto& c : children_) c->apply_initializer(weights);
  }
  Parameter& add_parameter(const std::string& short_name) {
    params_.push_back(std::make_unique<Parameter>(name_ + "." + short_name, nullptr));
    return *params_.back();
  }
  void add_child(std::shared_ptr<Block> child) { children_.push_back(std::move(child)); }
  const std::vector<std::shared_ptr<Block>>& children() const { return children_; }

 private:
  std::string name_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::shared_ptr<Block>> children_;
};

/// A unique default name per block kind: dense0, dense1, ...
inline std::string auto_name(const std::string& kind) {
  static std::mutex m;
  static std::vector<std::pair<std::string, int>> counts;
  std::lock_guard lk(m);
  for (auto& [k, n] : counts)
    if (k == kind) return kind + std::to_string(n++);
  counts.emplace_back(kind, 1);
  return kind + "0";
}

/// Children run one after another (Gluon's Sequential).
class Sequential : public Block {
 public:
  Sequential() : Block(auto_name("sequential")) {}
  template <class... Blocks>
  Sequential& add(std::shared_ptr<Blocks>... blocks) {
    (add_child(std::move(blocks)), ...);
    return *this;
  }
  Tensor<float> forward(const Tensor<float>& x) override {
    if (children().empty()) detail::raise<std::logic_error>(name(), ": no layers were added");
    Tensor<float> h = x;
    for (auto& c : children()) h = (*c)(h);
    return h;
  }
  std::size_t size() const { return children().size(); }
};

}  // namespace deft::nn
