// TrainStep: hybridize for training. A whole step (forward, loss, backward,
// optimizer update) is traced once and replayed on later batches of the
// same shape: the front end (building expressions, shape checks, the
// autograd tape, the optimizer's loops) runs once, and each replay records
// a few chain tasks instead of one task per operation.
//
// The parameters, their gradients and the optimizer's state are "owned" by
// the trace (Trace::own): the traced run writes them in place, so every
// replay updates the storage the next one reads. Each batch shape has a
// trace of its own (an epoch's last, shorter batch), all owning the same
// state; a replay of one waits for the replay of another that ran before it.
// A replay gives way to an ordinary step whenever replaying could differ
// from it: a reference to the state the replay would overwrite that is left
// once all recorded work ran (copy-on-write must keep its value), a failed
// earlier step (errors stay sticky), or a change since the traces (devices,
// storage, learning rate), which traces again.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "block.hpp"
#include "train_step_core.hpp"
#include "trainer.hpp"

namespace deft::detail {
// The label's element type of a loss `Tensor<float> operator()(pred, const Tensor<T>& label) const`.
template <class F>
struct loss_label;
template <class L, class T>
struct loss_label<Tensor<float> (L::*)(const Tensor<float>&, const Tensor<T>&) const> {
  using type = T;
};
}  // namespace deft::detail

namespace deft::nn {

/// One training step of `net` with `loss` and `trainer`, hybridized:
/// `auto [l, scores] = step(x, y);` does what
/// `{ autograd::record r; scores = net(x); l = loss(scores, y); l.backward(); } trainer.step(batch);`
/// does, and returns the per-sample loss and the network's scores
/// (deferred, like everything else; detached from autograd).
/// The first call runs that code, the second traces it, later calls with
/// inputs of the same shapes replay the trace; a call with new shapes is
/// traced for them, and both traces are kept (HybridizeOptions::shapes).
/// Random operations (dropout) draw new numbers in each replay, those the
/// plain step would draw. Data parallelism: `step(xs, ys)` takes a batch's
/// parts on the devices the parameters live on (split_and_load) and traces
/// the step Gluon's data-parallel loop writes, the gradients' allreduce
/// included.
template <class Loss>
class TrainStep {
 public:
  /// The labels' element type, from the loss (float for L2Loss, int64 for SoftmaxCrossEntropyLoss).
  using Label = typename deft::detail::loss_label<decltype(&Loss::operator())>::type;
  /// What a step computed (TrainStepOutput).
  using Output = TrainStepOutput;

  /// Keeps references to `net` and `trainer`: both must outlive the step.
  /// `options`: replays on a GPU as a CUDA graph, and how many batch shapes
  /// keep their trace (an epoch's last, shorter batch is a second one).
  TrainStep(Block& net, Loss loss, Trainer& trainer, HybridizeOptions options = {})
      : loss_(std::move(loss)), core_(net, trainer, options) {}

  /// Runs one step on a batch: network input `x`, labels `y`.
  /// `batch_size` is what Trainer::step takes: the rows of the whole batch,
  /// x's rows when 0. A trainer over a communicator of several ranks needs
  /// the global batch, every rank's rows (the sharded loader's Batch::rows):
  /// std::invalid_argument for 0 or fewer than this rank's rows.
  Output operator()(const Tensor<float>& x, const Tensor<Label>& y, std::int64_t batch_size = 0) {
    return std::move((*this)(std::vector<Tensor<float>>{x}, std::vector<Tensor<Label>>{y}, batch_size)[0]);
  }

  /// Runs one data-parallel step: part `i` of the batch is `xs[i]` with
  /// labels `ys[i]`, each on a device the parameters live on (as
  /// split_and_load gives them); each part's forward and backward, then one
  /// Trainer::step over all rows (which sums the gradients across devices),
  /// or over `batch_size` rows when not 0 (the global batch across ranks).
  /// Returns each part's loss and scores, on its device.
  std::vector<Output> operator()(const std::vector<Tensor<float>>& xs, const std::vector<Tensor<Label>>& ys,
                                 std::int64_t batch_size = 0) {
    return core_.step({&loss_, &call_loss}, xs, ys, batch_size);
  }

  /// Clips the summed gradients by their global norm before each update
  /// (clip_global_norm between Trainer::allreduce_grads and update), inside
  /// the traced step: no sync point. 0, the default, does not clip. A new
  /// value traces again. std::invalid_argument for a negative or non-finite one.
  void set_max_grad_norm(float max_norm) { core_.set_max_grad_norm(max_norm); }
  /// The norm the gradients are clipped to; 0: no clipping.
  float max_grad_norm() const { return core_.max_grad_norm(); }
  /// The global norm of the summed gradients the last call clipped, before
  /// clipping (what clip_global_norm returns: a deferred 0-d tensor on the
  /// parameters' first device), for monitoring: a NaN or infinite norm means
  /// the update made the parameters NaN. A replay copies it out inside the
  /// task that computed it. An empty handle while set_max_grad_norm is 0.
  const Tensor<float>& grad_norm() const { return core_.grad_norm(); }

  /// How many times the step was traced: once per batch shape, and again
  /// when the learning rate or the parameters' storage changed.
  std::int64_t traces() const { return core_.traces(); }
  /// How many calls replayed a trace.
  std::int64_t replays() const { return core_.replays(); }
  /// How many of the current traces (one per batch shape) replay as one
  /// CUDA graph: recorded at their first replay on a GPU, unless the step
  /// cannot be recorded (it spans several devices) or HybridizeOptions
  /// says otherwise.
  int cuda_graphs() const { return core_.cuda_graphs(); }

 private:
  static Tensor<float> call_loss(const void* loss, const Tensor<float>& scores, const Tensor<Label>& labels) {
    return (*static_cast<const Loss*>(loss))(scores, labels);
  }

  Loss loss_;
  detail_step::Core<Label> core_;
};

// The two label types' cores are compiled once, with nn, in the compiled mode.
#if defined(DEFT_SEPARATE_COMPILATION)
#if DEFT_DEFINE_NN
template class detail_step::Core<float>;
template class detail_step::Core<std::int64_t>;
#else
extern template class detail_step::Core<float>;
extern template class detail_step::Core<std::int64_t>;
#endif
#endif

}  // namespace deft::nn
