// Losses as Gluon defines them: one value per sample (shape (batch,)), so
// that loss.backward() sums them and Trainer::step(batch) averages.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "../core/config.hpp"
#include "../autograd/softmax.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/creation.hpp"
#include "../ops/indexing.hpp"
#include "../ops/reduction.hpp"
#include "../tensor.hpp"

namespace deft::nn {

/// 0.5 * (pred - label)^2, averaged over all but the first axis. The label
/// is viewed with pred's shape (same number of elements).
class L2Loss {
 public:
  /// The loss per sample, shape (batch,); std::invalid_argument when the sizes differ.
  Tensor<float> operator()(const Tensor<float>& pred, const Tensor<float>& label) const;
};

/// -log softmax(pred)[label] per sample, computed stably: with m the row
/// maximum, log Σ exp(pred - m) - (pred - m)[label]. pred is (batch,
/// classes) of scores; label is (batch,) class indices. An index outside
/// [0, classes) fails the task, so the sync point that reads the loss throws
/// (on a GPU, where a kernel cannot throw, that sample's loss is NaN). The
/// gradient is one fused task, (softmax(pred) - onehot(label)) times the
/// upstream gradient (autograd/softmax.hpp).
class SoftmaxCrossEntropyLoss {
 public:
  /// The loss per sample, shape (batch,), for logits (batch, classes) and class indices (batch,).
  Tensor<float> operator()(const Tensor<float>& pred, const Tensor<std::int64_t>& label) const;
};

/// The fraction of rows whose largest score is at the label (a 0-d tensor).
DEFT_DECL Tensor<float> accuracy(const Tensor<float>& pred, const Tensor<std::int64_t>& label);

#if DEFT_DEFINE_NN
DEFT_DECL Tensor<float> L2Loss::operator()(const Tensor<float>& pred, const Tensor<float>& label) const {
  if (pred.rank() < 1 || label.size() != pred.size())
    detail::raise("L2Loss: prediction of shape ", pred.shape().to_string(), " and label of shape ",
                  label.shape().to_string(), " need the same number of elements");
  const std::vector<std::int64_t> dims(pred.shape().begin(), pred.shape().end());
  const Tensor<float> d = pred - label.reshape(dims);
  Tensor<float> sq = d * d * 0.5f;
  if (pred.rank() == 1) return sq;
  return mean(sq.reshape({pred.shape()[0], -1}), 1);
}

DEFT_DECL Tensor<float> SoftmaxCrossEntropyLoss::operator()(const Tensor<float>& pred,
                                                          const Tensor<std::int64_t>& label) const {
  if (pred.rank() != 2 || label.rank() != 1 || label.shape()[0] != pred.shape()[0])
    detail::raise("SoftmaxCrossEntropyLoss: needs scores (batch, classes) and labels (batch,), got ",
                  pred.shape().to_string(), " and ", label.shape().to_string());
  using detail::eval_untracked;
  const std::int64_t n = pred.shape()[0], classes = pred.shape()[1];
  const Tensor<float> m = detail::reduce<detail::MaxReducer, false>("SoftmaxCrossEntropyLoss", pred, 1, true, true);
  const Tensor<float> log_sum = eval_untracked(log(detail::sum_untracked(exp(pred - m), 1, true)));
  const detail::IndexCheck<float> check{classes, "SoftmaxCrossEntropyLoss: label"};
  const Tensor<float> y = eval_untracked(map(check, label.reshape({n, 1})));
  const Tensor<float> onehot =
      eval_untracked(arange<float>(0.0f, float(classes), 1.0f, pred.device()).reshape({1, classes}) == y);
  // Selected, not multiplied by the one-hot mask: a class scored -inf (a
  // masked class) has log_sum - (pred - m) = inf, and inf * 0 would be NaN.
  // y * 0 is NaN for a bad label on a GPU, and 0 otherwise.
  Tensor<float> loss = detail::sum_untracked(where(onehot, log_sum - (pred - m), 0.0f) + y * 0.0f, 1);
  if (autograd::is_recording() && pred.grad_meta())
    autograd::detail::track_softmax_cross_entropy(loss, pred.leaf(), m, log_sum, onehot);
  return loss;
}

DEFT_DECL Tensor<float> accuracy(const Tensor<float>& pred, const Tensor<std::int64_t>& label) {
  if (pred.rank() != 2 || label.rank() != 1 || label.shape()[0] != pred.shape()[0])
    detail::raise("accuracy: needs scores (batch, classes) and labels (batch,), got ", pred.shape().to_string(), " and ",
                  label.shape().to_string());
  const auto hits = cast<float>(argmax(pred.detach(), 1) == label);
  return detail::mean_untracked(hits);
}
#endif

}  // namespace deft::nn
