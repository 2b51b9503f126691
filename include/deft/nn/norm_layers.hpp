// Normalization layers: BatchNorm, with statistics of this process's batch
// or synchronized across processes (synchronize_batch_norm).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "../autograd/norm.hpp"
#include "../dist/collectives.hpp"
#include "../ops/creation.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/indexing.hpp"
#include "../ops/reduction.hpp"
#include "block.hpp"

namespace deft::nn {

/// Batch normalization (Ioffe & Szegedy) over the channels of NCHW input, or
/// the features of (batch, features) input:
/// y = (x - mean) / sqrt(var + epsilon) * gamma + beta, per channel.
///
/// In training mode (autograd::is_training(): inside autograd::record by
/// default) mean and var are the batch's, over the batch and spatial axes
/// (the biased variance), and the gradient flows through them. Each such
/// forward also updates the running statistics as Gluon does:
/// running = momentum * running + (1 - momentum) * batch, the running
/// variance from the biased batch variance (PyTorch's momentum m is Gluon's
/// 1 - m, and PyTorch keeps the unbiased variance). In prediction mode the
/// running statistics normalize.
///
/// The running statistics are parameters that are not trainable: parameter
/// files keep them, a Trainer leaves them to the layer, and a TrainStep
/// updates them inside its traced step. A network on several devices keeps
/// one copy per device, each updated from that device's part of the batch
/// (Gluon's and PyTorch DataParallel's default); save_parameters writes the
/// first device's.
///
/// With a communicator (set_communicator, or synchronize_batch_norm for a
/// whole network) the batch statistics are those of the global batch, all
/// ranks' parts together (PyTorch's SyncBatchNorm): a training forward
/// gathers each rank's per-channel mean, squared deviations and row count
/// (one allgather) and combines them, and its backward sums Σ g and Σ g·x̂
/// across the ranks (one allreduce),
/// so that N ranks compute what one process would at the global batch, and
/// every rank's running statistics are the same. The ranks may hold
/// different numbers of rows. The layer must then be on one device per
/// process, and a step that holds it cannot be traced (collectives are not).
class BatchNorm : public Block {
 public:
  ~BatchNorm() override;
  /// std::invalid_argument unless 0 <= momentum <= 1 and epsilon > 0.
  explicit BatchNorm(float momentum = 0.9f, float epsilon = 1e-5f)
      : Block(auto_name("batchnorm")), momentum_(momentum), epsilon_(epsilon),
        gamma_(add_parameter("gamma", {inferred_extent})), beta_(add_parameter("beta", {inferred_extent})),
        running_mean_(add_parameter("running_mean", {inferred_extent}, false)),
        running_var_(add_parameter("running_var", {inferred_extent}, false)) {
    if (!(momentum >= 0.0f && momentum <= 1.0f))
      detail::raise("BatchNorm: the momentum must be in [0, 1], got ", momentum);
    if (!(epsilon > 0.0f)) detail::raise("BatchNorm: epsilon must be positive, got ", epsilon);
  }

  Tensor<float> forward(const Tensor<float>& x) override;

  /// gamma (the scale), of shape (channels,).
  Parameter& gamma() { return gamma_; }
  /// beta (the shift), of shape (channels,).
  Parameter& beta() { return beta_; }
  /// The running mean, of shape (channels,); not trainable.
  Parameter& running_mean() { return running_mean_; }
  /// The running (biased) variance, of shape (channels,); not trainable.
  Parameter& running_var() { return running_var_; }
  /// The weight of the old running statistics in each update.
  float momentum() const { return momentum_; }
  /// Added to the variance before its square root.
  float epsilon() const { return epsilon_; }
  /// Takes the batch statistics of training forwards across the ranks of
  /// `comm` (see the class); null goes back to this process's batch alone.
  void set_communicator(std::shared_ptr<dist::Communicator> comm) { comm_ = std::move(comm); }
  /// The communicator the statistics are synchronized over (null: none).
  const std::shared_ptr<dist::Communicator>& communicator() const { return comm_; }

 protected:
  /// gamma and the running variance start at one, beta and the running mean
  /// at zero, whatever the network's weight initializer.
  void apply_initializer(const Initializer&) override {
    gamma_.set_initializer(init::constant(1.0f));
    beta_.set_initializer(init::zeros());
    running_mean_.set_initializer(init::zeros());
    running_var_.set_initializer(init::constant(1.0f));
  }

 private:
  // Sums each tensor across the ranks of `comm` in one collective.
  static void sum_across(std::vector<Tensor<float>>& t, const std::shared_ptr<dist::Communicator>& comm) {
    dist::allreduce(t, dist::ReduceOp::sum, thresholds::allreduce_bucket_bytes, comm);
  }

  float momentum_, epsilon_;
  std::shared_ptr<dist::Communicator> comm_;
  Parameter& gamma_;
  Parameter& beta_;
  Parameter& running_mean_;
  Parameter& running_var_;
};

/// Gives every BatchNorm in `net` (itself and its children, at any depth)
/// the communicator `comm` (null: each process's batch alone again), so
/// that their training statistics span the ranks; returns how many it set.
/// Set the same on every rank: each synchronized layer runs collectives.
DEFT_DECL std::size_t synchronize_batch_norm(Block& net, const std::shared_ptr<dist::Communicator>& comm);

#if DEFT_DEFINE_NN
DEFT_DECL BatchNorm::~BatchNorm() = default;

DEFT_DECL Tensor<float> BatchNorm::forward(const Tensor<float>& x) {
  if (x.rank() != 2 && x.rank() != 4)
    detail::raise(name(), ": needs an input of shape (batch, features) or (batch, channels, height, width), got ",
                  x.shape().to_string());
  const std::int64_t n = x.shape()[0], c = x.shape()[1];
  const std::int64_t per_channel = x.size() / (c == 0 ? 1 : c);  // values each channel's statistics cover
  if (gamma_.initialized() && gamma_.shape()[0] != c)
    detail::raise(name(), ": was built for ", gamma_.shape()[0], " channels but got an input of shape ",
                  x.shape().to_string());
  const bool training = autograd::is_training();
  if (training && comm_ && gamma_.initialized() && gamma_.list_data().size() > 1)
    detail::raise<std::logic_error>(name(), ": synchronized statistics need the layer on one device per process; "
                                    "it is on ", gamma_.list_data().size(), " devices");
  if (training && !comm_ && per_channel < 2)
    detail::raise(name(), ": training needs more than one value per channel to take batch statistics, got an "
                  "input of shape ", x.shape().to_string());
  for (Parameter* p : {&gamma_, &beta_, &running_mean_, &running_var_}) p->materialize(Shape{c});
  const Device device = x.device();
  const std::vector<std::int64_t> extents(x.shape().begin(), x.shape().end());
  const Tensor<float> xr = x.reshape({n, c, per_channel / (n == 0 ? 1 : n)});
  const auto per_row = [c](const Tensor<float>& t) { return t.reshape({1, c, 1}); };  // broadcast over (n, c, hw)
  const Tensor<float>& gamma = gamma_.data(device);
  const Tensor<float>& beta = beta_.data(device);
  Tensor<float>& running_mean = running_mean_.data(device);
  Tensor<float>& running_var = running_var_.data(device);
  if (!training) {
    const Tensor<float> scale = gamma / sqrt(running_var + epsilon_);
    return Tensor<float>((xr - per_row(running_mean)) * per_row(scale) + per_row(beta)).reshape(extents);
  }
  using detail::eval_untracked;
  using detail::sum_untracked;
  const auto sum_per_channel = [](const auto& e) { return sum_untracked(sum_untracked(e, 2), 0); };
  Tensor<float> mean_c, var_c, inverse_count;
  if (!comm_) {
    const float inv_n = 1.0f / float(per_channel);
    mean_c = eval_untracked(sum_per_channel(xr) * inv_n);
    var_c = eval_untracked(sum_per_channel((xr - per_row(mean_c)) * (xr - per_row(mean_c))) * inv_n);
  } else {
    // This rank's mean and squared deviations (two passes, as alone) and
    // row count, gathered from every rank in one collective and combined
    // in rank order (Chan et al.'s update): M2 = Σ M2_r + Σ n_r (mean_r -
    // mean)². Every rank computes the same bits, and nothing cancels
    // however far the mean lies from 0.
    const float inv_n = 1.0f / float(std::max<std::int64_t>(per_channel, 1));  // a rank without rows adds nothing
    const Tensor<float> local_mean = eval_untracked(sum_per_channel(xr) * inv_n);
    const Tensor<float> mine[] = {local_mean,
                                  sum_per_channel((xr - per_row(local_mean)) * (xr - per_row(local_mean))),
                                  full<float>(Shape{c}, float(per_channel), device)};
    const std::int64_t ranks = comm_->size();
    const Tensor<float> all =
        dist::allgather(concat(std::span<const Tensor<float>>(mine)), comm_).reshape({ranks, 3, c});
    const auto part = [&](std::int64_t k) { return slice(all, 1, k, k + 1).reshape({ranks, c}); };
    const Tensor<float> means = part(0), counts = part(2);
    inverse_count = eval_untracked(1.0f / sum_untracked(counts, 0));  // 1/N in every channel
    mean_c = eval_untracked(sum_untracked(means * counts, 0) * inverse_count);
    const Tensor<float> apart = mean_c.reshape({1, c});
    var_c = eval_untracked(
        (sum_untracked(part(1), 0) + sum_untracked(counts * (means - apart) * (means - apart), 0)) * inverse_count);
  }
  const Tensor<float> mean_b = per_row(mean_c);
  const Tensor<float> inv_std = eval_untracked(1.0f / sqrt(var_c + epsilon_));
  const Tensor<float> scale = eval_untracked(gamma * inv_std);
  // The normalization and the affine part: one elementwise pass over x.
  Tensor<float> y = eval_untracked((xr - mean_b) * per_row(scale) + per_row(beta));
  if (autograd::is_recording() && (xr.grad_meta() || gamma.grad_meta() || beta.grad_meta()))
    autograd::detail::track_batch_norm(y, xr.leaf(), gamma.leaf(), beta.leaf(), mean_c, inv_std, scale,
                                       comm_ ? autograd::detail::SumAcrossProcesses<float>(
                                                   [comm = comm_](std::vector<Tensor<float>>& t) { sum_across(t, comm); })
                                             : nullptr,
                                       inverse_count);
  y = y.reshape(extents);
  {
    autograd::pause untracked;  // in place: a TrainStep's replays update the same storage
    running_mean.assign(running_mean * momentum_ + mean_c * (1.0f - momentum_));
    running_var.assign(running_var * momentum_ + var_c * (1.0f - momentum_));
  }
  return y;
}

DEFT_DECL std::size_t synchronize_batch_norm(Block& net, const std::shared_ptr<dist::Communicator>& comm) {
  std::size_t set = 0;
  net.apply([&](Block& b) {
    if (auto* bn = dynamic_cast<BatchNorm*>(&b)) {
      bn->set_communicator(comm);
      ++set;
    }
  });
  return set;
}
#endif

}  // namespace deft::nn
