// Normalization layers: BatchNorm, with statistics of this process's batch
// or synchronized across processes (synchronize_batch_norm).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
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

namespace detail_norm {

/// Links a BatchNorm to the other processes whose batches its training
/// statistics span: combines the statistics in the forward, and the sums
/// that the input gradient needs in the backward.
template <class T>
class BatchStatisticsAcrossProcesses : public autograd::detail::BatchNormAcrossProcesses<T> {
 public:
  /// Per-channel statistics of the global batch, each of shape (c):
  /// inverse_count is 1/N, N the values per channel over all processes.
  struct Moments {
    Tensor<T> mean, var, inverse_count;
  };
  /// The global batch's statistics from this process's mean and biased
  /// variance over `count` values per channel.
  virtual Moments combine(const Tensor<T>& mean, const Tensor<T>& var, std::int64_t count) const = 0;
  virtual std::shared_ptr<dist::Communicator> communicator() const = 0;
};

/// The processes of a communicator. A class template, instantiated only by
/// programs that synchronize, so that the others do not compile its
/// collectives.
template <class T>
class SynchronizedBatchStatistics final : public BatchStatisticsAcrossProcesses<T> {
 public:
  explicit SynchronizedBatchStatistics(std::shared_ptr<dist::Communicator> comm) : comm_(std::move(comm)) {}

  // Every process's mean, variance and count, gathered in one collective
  // and combined in rank order (Chan et al.'s update):
  // var = Σ n_r (var_r + (mean_r - mean)²) / N. Every process computes the
  // same bits, and nothing cancels however far the mean lies from 0.
  typename BatchStatisticsAcrossProcesses<T>::Moments combine(const Tensor<T>& mean, const Tensor<T>& var,
                                                              std::int64_t count) const override {
    using deft::detail::eval_untracked;
    using deft::detail::sum_untracked;
    const std::int64_t c = mean.size(), ranks = comm_->size();
    const Tensor<T> mine[] = {mean, var, full<T>(Shape{c}, T(count), mean.device())};
    const Tensor<T> all = dist::allgather(concat(std::span<const Tensor<T>>(mine)), comm_).reshape({ranks, 3, c});
    const auto part = [&](std::int64_t k) { return slice(all, 1, k, k + 1).reshape({ranks, c}); };
    const Tensor<T> means = part(0), vars = part(1), counts = part(2);
    Tensor<T> inverse_count = eval_untracked(T(1) / sum_untracked(counts, 0));
    Tensor<T> global_mean = eval_untracked(sum_untracked(means * counts, 0) * inverse_count);
    const Tensor<T> apart = global_mean.reshape({1, c});
    Tensor<T> global_var =
        eval_untracked(sum_untracked(counts * (vars + (means - apart) * (means - apart)), 0) * inverse_count);
    return {std::move(global_mean), std::move(global_var), std::move(inverse_count)};
  }
  // Σ g / N and Σ g·x̂ / N over the processes: one collective for both.
  Tensor<T> input_gradient(const Tensor<T>& g, const Tensor<T>& x, const Tensor<T>& mean, const Tensor<T>& inv_std,
                           const Tensor<T>& scale, const Tensor<T>& sum_g, const Tensor<T>& sum_g_x_hat,
                           const Tensor<T>& inverse_count) const override {
    using deft::detail::eval_untracked;
    const std::int64_t c = mean.size();
    const auto per_row = [c](const Tensor<T>& t) { return t.reshape({1, c, 1}); };
    // New storage: the collective sums in place, and dβ and dγ, this
    // process's own, keep sum_g's and sum_g_x_hat's.
    std::vector<Tensor<T>> means{eval_untracked(sum_g * inverse_count), eval_untracked(sum_g_x_hat * inverse_count)};
    dist::allreduce(means, dist::ReduceOp::sum, thresholds::allreduce_bucket_bytes, comm_);
    const auto x_hat = (x - per_row(mean)) * per_row(inv_std);
    return eval_untracked(per_row(scale) * (g - per_row(means[0]) - x_hat * per_row(means[1])));
  }
  std::shared_ptr<dist::Communicator> communicator() const override { return comm_; }

 private:
  std::shared_ptr<dist::Communicator> comm_;
};

}  // namespace detail_norm

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
/// gathers each rank's per-channel mean, variance and value count
/// (one allgather) and combines them, and its backward sums Σ g and Σ g·x̂
/// across the ranks (one allreduce),
/// so that N ranks compute what one process would at the global batch, and
/// every rank's running statistics are the same. The ranks may hold
/// different numbers of rows. The layer must then be on one device per
/// process; a TrainStep traces its collectives with the rest of the step.
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
  /// A template only so that programs that never call it do not compile
  /// the collectives.
  template <class T = float>
  void set_communicator(std::shared_ptr<dist::Communicator> comm) {
    static_assert(std::is_same_v<T, float>, "BatchNorm's parameters are float");
    across_ = comm ? std::make_shared<const detail_norm::SynchronizedBatchStatistics<T>>(std::move(comm)) : nullptr;
  }
  /// The communicator the statistics are synchronized over (null: none).
  std::shared_ptr<dist::Communicator> communicator() const { return across_ ? across_->communicator() : nullptr; }

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
  float momentum_, epsilon_;
  std::shared_ptr<const detail_norm::BatchStatisticsAcrossProcesses<float>> across_;
  Parameter& gamma_;
  Parameter& beta_;
  Parameter& running_mean_;
  Parameter& running_var_;
};

/// Gives every BatchNorm in `net` (itself and its children, at any depth)
/// the communicator `comm` (null: each process's batch alone again), so
/// that their training statistics span the ranks; returns how many layers
/// it set, each once however often the network holds it. Set the same on
/// every rank: each synchronized layer runs collectives. A template as
/// BatchNorm::set_communicator is.
template <class T = float>
std::size_t synchronize_batch_norm(Block& net, const std::shared_ptr<dist::Communicator>& comm) {
  std::vector<BatchNorm*> set;
  net.apply([&](Block& b) {
    auto* bn = dynamic_cast<BatchNorm*>(&b);
    if (bn && std::ranges::find(set, bn) == set.end()) {
      bn->template set_communicator<T>(comm);
      set.push_back(bn);
    }
  });
  return set.size();
}

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
  if (training && across_ && gamma_.initialized() && gamma_.list_data().size() > 1)
    detail::raise<std::logic_error>(name(), ": synchronized statistics need the layer on one device per process; "
                                    "it is on ", gamma_.list_data().size(), " devices");
  if (training && !across_ && per_channel < 2)
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
  const float inv_n = 1.0f / float(std::max<std::int64_t>(per_channel, 1));  // a rank without rows adds nothing
  Tensor<float> mean_c = eval_untracked(sum_per_channel(xr) * inv_n);
  Tensor<float> var_c = eval_untracked(sum_per_channel((xr - per_row(mean_c)) * (xr - per_row(mean_c))) * inv_n);
  Tensor<float> inverse_count;
  if (across_) {
    auto global = across_->combine(mean_c, var_c, per_channel);
    mean_c = std::move(global.mean);
    var_c = std::move(global.var);
    inverse_count = std::move(global.inverse_count);
  }
  const Tensor<float> mean_b = per_row(mean_c);
  const Tensor<float> inv_std = eval_untracked(1.0f / sqrt(var_c + epsilon_));
  const Tensor<float> scale = eval_untracked(gamma * inv_std);
  // The normalization and the affine part: one elementwise pass over x.
  Tensor<float> y = eval_untracked((xr - mean_b) * per_row(scale) + per_row(beta));
  if (autograd::is_recording() && (xr.grad_meta() || gamma.grad_meta() || beta.grad_meta()))
    autograd::detail::track_batch_norm(y, xr.leaf(), gamma.leaf(), beta.leaf(), mean_c, inv_std, scale, across_,
                                       inverse_count);
  y = y.reshape(extents);
  {
    autograd::pause untracked;  // in place: a TrainStep's replays update the same storage
    running_mean.assign(running_mean * momentum_ + mean_c * (1.0f - momentum_));
    running_var.assign(running_var * momentum_ + var_c * (1.0f - momentum_));
  }
  return y;
}

#endif

}  // namespace deft::nn
