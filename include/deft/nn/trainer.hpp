// The Trainer (Gluon's gluon.Trainer): step(batch_size) applies an optimizer
// (optimizers.hpp) to every parameter, its gradient rescaled by 1 / batch_size.
// Each update is one or a few fused in-place tasks per parameter.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_set>
#include <variant>
#include <vector>

#include "../autograd/graph.hpp"
#include "../dist/collectives.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/creation.hpp"
#include "../ops/devices.hpp"
#include "block.hpp"
#include "optimizers.hpp"
#include "schedule.hpp"

namespace deft::nn {

namespace detail_io {
struct CheckpointAccess;
}
namespace detail_step {
template <class Label>
class Core;
}

/// Updates parameters from their gradients with SGD or Adam (Gluon's Trainer).
class Trainer {
 public:
  /// Trains the trainable ones of `params` (e.g. net.collect_params());
  /// the others (BatchNorm's running statistics) are their blocks' state,
  /// which a TrainStep keeps in place like the parameters. std::invalid_argument
  /// for a learning rate that is not positive and finite, or a parameter listed twice.
  Trainer(std::vector<Parameter*> params, std::variant<SGD, Adam> optimizer) : opt_(optimizer) {
    check_learning_rate(learning_rate());
    if (const auto* sgd = std::get_if<SGD>(&opt_); sgd && sgd->nesterov && !(sgd->momentum > 0.0f))
      detail::raise("Trainer: Nesterov momentum needs a momentum above 0, got ", sgd->momentum);
    std::unordered_set<const Parameter*> seen;
    for (Parameter* p : params) {
      if (!seen.insert(p).second)
        detail::raise("Trainer: parameter '", p->name(), "' is listed twice (it would be updated twice per step)");
      (p->trainable() ? params_ : block_state_).push_back(p);
    }
    state_.resize(params_.size());
    clock_of_.assign(params_.size(), no_clock);
  }

  /// One update of every parameter from its current gradient / batch_size:
  /// allreduce_grads(ignore_stale_grad), then update(batch_size).
  /// Parameters held on several devices first sum their copies' gradients
  /// (batch_size counts the rows of all of them), then update every copy the
  /// same way, so the copies stay equal to the bit: devices of one kind each
  /// update their own copy; where a parameter lives on the CPU and a GPU,
  /// whose kernels round differently (fused multiply-adds), the first copy
  /// is updated and copied to the others. Every refusal (a bad batch_size, a
  /// parameter without a value or a new gradient) comes before anything is
  /// recorded.
  void step(std::int64_t batch_size, bool ignore_stale_grad = false);

  /// The first half of step(), for work on the summed gradients before the
  /// update (clip_global_norm): sums each parameter's copies' gradients into
  /// every copy (allreduce, packed into buckets of allreduce_bucket_bytes()).
  /// Only gradients that backward() wrote since the last step count: a copy
  /// whose device got no rows of this batch adds nothing to the sum. A
  /// parameter without such a gradient on any device (one the loss did not
  /// use, or a step without a backward) is refused, std::logic_error naming
  /// it, unless `ignore_stale_grad`, which leaves it as it is (Gluon's rule).
  void allreduce_grads(bool ignore_stale_grad = false);

  /// The second half of step(): updates the parameters allreduce_grads()
  /// summed, from their gradients / batch_size. std::logic_error unless
  /// allreduce_grads() came first.
  void update(std::int64_t batch_size);

  /// The largest bucket, in bytes, that step() packs gradients of several
  /// parameters into for one sum across devices (thresholds::allreduce_bucket_bytes
  /// by default); 0 sums each parameter's gradients alone.
  std::size_t allreduce_bucket_bytes() const { return bucket_bytes_; }
  /// Changes that bucket size (0: one sum per parameter); the sums' bits do not change.
  void set_allreduce_bucket_bytes(std::size_t bytes) { bucket_bytes_ = bytes; }

  /// Trains data-parallel across the ranks of `comm` (dist::init()'s world,
  /// or any dist::Communicator), as PyTorch's DDP and MXNet's dist_sync do:
  /// every parameter's value, block state included, is broadcast from rank
  /// `root` now, and each allreduce_grads() then sums the gradients across
  /// the ranks after the sum across this rank's devices, in buckets of
  /// allreduce_bucket_bytes() from the last layer back. Both are deferred:
  /// a bucket's collective runs while the backward of earlier layers is
  /// still computing. step(batch_size) then takes the global batch, the rows
  /// of every rank. Every rank must make the same calls. Each rank's block
  /// state (BatchNorm's running statistics) follows its own rows. A
  /// TrainStep over this trainer traces the step, collectives included,
  /// and takes the global batch too. std::logic_error,
  /// with nothing sent, for a parameter without a value (run one forward
  /// pass first); std::invalid_argument for a root out of range. Null: one
  /// process again.
  void set_communicator(std::shared_ptr<dist::Communicator> comm, int root = 0);
  /// The communicator set_communicator() gave (null: this process alone).
  const std::shared_ptr<dist::Communicator>& communicator() const { return comm_; }

  /// The base learning rate (the optimizer's), which the schedule scales.
  float learning_rate() const {
    return std::visit([](const auto& o) { return o.learning_rate; }, opt_);
  }
  /// Changes the base learning rate; std::invalid_argument unless positive
  /// and finite. A TrainStep traces again after a change: for a rate that
  /// changes as training goes, set a schedule instead.
  void set_learning_rate(float lr) {
    check_learning_rate(lr);
    if (lr == learning_rate()) return;
    std::visit([lr](auto& o) { o.learning_rate = lr; }, opt_);
    restart_rates();
  }
  /// Scales the base rate of each update by `s` (schedule::cosine, ...),
  /// counting from update 0. The rate is computed on each device, inside
  /// the step, from a count kept there: a TrainStep replays it as it is.
  void set_schedule(const LRSchedule& s) {
    schedule_ = s;
    restart_rates();
  }
  /// The schedule (schedule::constant() unless set).
  const LRSchedule& schedule() const { return schedule_; }
  /// The rate the next update will use, computed on the host (a device's
  /// may differ in the last bit).
  float scheduled_learning_rate() const { return detail::ScheduledRate{schedule_, double(learning_rate())}(double(steps_)); }
  /// How many steps were made (step() calls and TrainStep's replays).
  std::int64_t steps() const { return steps_; }

 private:
  template <class Label>
  friend class detail_step::Core;  // TrainStep's
  friend struct detail_io::CheckpointAccess;

  struct State {
    Tensor<float> m, v;  // momentum / Adam's moments, created at the first step
  };
  // The learning rate on one device, as the updates read it: a 0-d tensor,
  // so that a scheduled rate is data a replayed step computes, from
  // `update` (the update's index; unused without a schedule).
  struct DeviceRate {
    Device device;
    Tensor<double> update;
    Tensor<float> rate;
  };
  // Adam's update count, shared by the parameters updated equally often
  // (all of them, unless ignore_stale_grad left some out), with the
  // bias-corrected step size it gives. Kept per device as data rather than
  // host numbers, so that a replayed step (TrainStep) advances it like a
  // step() call does; `count` is the host's copy. The powers beta^t grow by
  // one multiplication per step, and the step size takes a square root and
  // a division: operations every device rounds alike (exp and log differ
  // between the CPU's SIMD code and CUDA's in the last bit).
  struct DeviceClock {
    Device device;
    Tensor<double> beta1_t, beta2_t;  // beta1^t, beta2^t
    Tensor<float> step_size;          // lr * sqrt(1 - beta2^t) / (1 - beta1^t)
    Tensor<float> epsilon;            // what the update adds to sqrt(v): epsilon, or epsilon * sqrt(1 - beta2^t)
  };
  struct Clock {
    std::int64_t count = 0;
    std::vector<std::size_t> params;  // indices into params_
    std::vector<DeviceClock> on;
  };
  static constexpr std::size_t no_clock = std::size_t(-1);

  // Whether each copy of parameter i takes the update on its own device
  // (devices of one kind), or the first copy does and is copied to the others.
  bool updates_each_copy(std::size_t i) const { return detail::one_device_kind(params_[i]->devices()); }

  // (k, device) for each copy of updated[k] (values[k]: its copies) that
  // takes the update itself; where the first copy is updated and copied to
  // the others, that copy only.
  using UpdatingCopies = std::vector<std::pair<std::size_t, Device>>;
  UpdatingCopies updating_copies(const std::vector<std::size_t>& updated,
                                 const std::vector<std::vector<Tensor<float>>>& values) const {
    UpdatingCopies copies;
    for (std::size_t k = 0; k < updated.size(); ++k)
      for (std::size_t r = 0; r < (updates_each_copy(updated[k]) ? values[k].size() : 1); ++r)
        copies.emplace_back(k, values[k][r].device());
    return copies;
  }

  // Gives each device that updates a copy this step's rate. A scheduled
  // rate counts the updates on its device; a device that updated no copy
  // this time falls behind and is dropped (made again from steps_ when it
  // next updates one).
  void advance_rates(const UpdatingCopies& updating) {
    std::vector<Device> devices;
    for (const auto& copy : updating)
      if (std::ranges::find(devices, copy.second) == devices.end()) devices.push_back(copy.second);
    const bool scheduled = !schedule_.is_constant();
    if (scheduled) std::erase_if(rates_, [&](const DeviceRate& r) { return std::ranges::find(devices, r.device) == devices.end(); });
    for (const Device device : devices) {
      auto it = std::ranges::find(rates_, device, &DeviceRate::device);
      if (it == rates_.end()) {
        rates_.push_back({device, scheduled ? full<double>(Shape{}, double(steps_ - 1), device) : Tensor<double>(),
                          full<float>(Shape{}, learning_rate(), device)});
        it = std::prev(rates_.end());
      } else if (scheduled) {
        it->update += 1.0;
      }
      if (scheduled)
        detail::assign_untracked(it->rate, map(detail::ScheduledRate{schedule_, double(learning_rate())}, it->update));
    }
  }
  // New rates for the devices that have one, made here rather than inside
  // the next step: a TrainStep traces that step once, on this storage.
  void restart_rates() {
    for (DeviceRate& r : rates_) {
      r.update = schedule_.is_constant() ? Tensor<double>() : full<double>(Shape{}, double(steps_ - 1), r.device);
      r.rate = full<float>(Shape{}, learning_rate(), r.device);
    }
  }
  const Tensor<float>& rate_on(Device device) const {
    if (auto it = std::ranges::find(rates_, device, &DeviceRate::device); it != rates_.end()) return it->rate;
    detail::raise<std::logic_error>("Trainer: no learning rate on ", device);
  }

  // Advances the clocks of the parameters `updated` (updating: their copies that take the update).
  // A clock that counts for some of them and not others first splits: the
  // updated ones take a copy of its count and go on alone. A parameter's
  // first update starts a clock from 0.
  void advance_clocks(const Adam& o, const std::vector<std::size_t>& updated, const UpdatingCopies& updating) {
    std::vector<char> is_updated(params_.size(), 0);
    for (std::size_t i : updated) is_updated[i] = 1;
    for (std::size_t c = 0, n = clocks_.size(); c < n; ++c) {
      auto& counted = clocks_[c].params;
      // (Iterators, not std::ranges: clang 14 cannot use the subrange that returns.)
      const auto moving =
          std::stable_partition(counted.begin(), counted.end(), [&](std::size_t i) { return !is_updated[i]; });
      if (moving == counted.begin() || moving == counted.end()) continue;  // all or none updated
      Clock split{clocks_[c].count, {moving, counted.end()}, {}};
      counted.erase(moving, counted.end());
      for (const DeviceClock& d : clocks_[c].on) split.on.push_back({d.device, d.beta1_t.clone(), d.beta2_t.clone(), {}, {}});
      for (std::size_t i : split.params) clock_of_[i] = clocks_.size();
      clocks_.push_back(std::move(split));
    }
    Clock first;
    for (std::size_t i : updated)
      if (clock_of_[i] == no_clock) first.params.push_back(i), clock_of_[i] = clocks_.size();
    if (!first.params.empty()) clocks_.push_back(std::move(first));
    // Each clock of the updated parameters, on each device that updates a copy.
    std::vector<std::pair<std::size_t, Device>> ticks;
    for (const auto& [k, device] : updating)
      if (std::pair tick{clock_of_[updated[k]], device}; std::ranges::find(ticks, tick) == ticks.end())
        ticks.push_back(tick);
    std::vector<char> advanced(clocks_.size(), 0);
    for (const auto& [c, device] : ticks) join(o, clocks_[c], device);  // all before any tick
    for (const auto& [c, device] : ticks) {
      tick(o, clocks_[c], device, rate_on(device));
      advanced[c] = 1;
    }
    for (std::size_t c = 0; c < clocks_.size(); ++c) {
      if (!advanced[c]) continue;
      ++clocks_[c].count;
      // A device that updated no copy this time (reset_devices() moved them)
      // is a step behind: dropped, a later join copies the current powers.
      std::erase_if(clocks_[c].on, [&](const DeviceClock& d) {
        return std::ranges::find(ticks, std::pair{c, d.device}) == ticks.end();
      });
    }
  }
  // Gives `clock` data on `device` for its count, unless it has some: a
  // copy of another device's powers (bits and all), or beta^count.
  static void join(const Adam& o, Clock& clock, Device device) {
    if (std::ranges::find(clock.on, device, &DeviceClock::device) != clock.on.end()) return;
    const auto power = [&](const Tensor<double> DeviceClock::*of, float beta) {
      return clock.on.empty() ? full<double>(Shape{}, std::pow(double(beta), double(clock.count)), device)
                              : (clock.on.front().*of).to(device);
    };
    clock.on.push_back({device, power(&DeviceClock::beta1_t, o.beta1), power(&DeviceClock::beta2_t, o.beta2), {}, {}});
  }
  // Advances `clock`'s data on `device` (see join) to count + 1.
  static void tick(const Adam& o, Clock& clock, Device device, const Tensor<float>& rate) {
    DeviceClock& d = *std::ranges::find(clock.on, device, &DeviceClock::device);
    d.beta1_t *= double(o.beta1);
    d.beta2_t *= double(o.beta2);
    detail::assign_untracked(d.step_size, cast<float>(sqrt(1.0 - d.beta2_t) * cast<double>(rate) / (1.0 - d.beta1_t)));
    // m_hat / (sqrt(v_hat) + eps) = m * step_size / (sqrt(v) + eps * sqrt(1 - beta2^t)) / lr;
    // one expression for both placements (before: the factor is exactly 1).
    const double after = o.epsilon_at == AdamEpsilon::after_correction ? 1.0 : 0.0;
    detail::assign_untracked(d.epsilon, cast<float>(sqrt(1.0 - d.beta2_t * after) * double(o.epsilon)));
  }
  const DeviceClock& clock_on(std::size_t param, Device device) const {
    const Clock& c = clocks_.at(clock_of_.at(param));
    if (auto it = std::ranges::find(c.on, device, &DeviceClock::device); it != c.on.end()) return *it;
    detail::raise<std::logic_error>("Trainer: no Adam step size for '", params_[param]->name(), "' on ", device);
  }

  // Calls f(const std::shared_ptr<Buffer>&) on every buffer a step reads
  // and then writes (the parameters' values and gradients, the optimizer's
  // state, the blocks' state a training forward updates), in a fixed
  // order, for TrainStep to keep in place.
  template <class F>
  void for_each_state_buffer(F&& f) const {
    auto visit = [&](const auto& t) {
      if (t) f(t.leaf().buffer);
    };
    for (Parameter* p : params_)
      for (const auto& v : p->list_data()) {
        visit(v);
        visit(v.grad());
      }
    for (const auto& per_device : state_)
      for (const State& st : per_device) visit(st.m), visit(st.v);
    for (const Clock& c : clocks_)
      for (const DeviceClock& d : c.on) visit(d.beta1_t), visit(d.beta2_t), visit(d.step_size), visit(d.epsilon);
    for (const DeviceRate& r : rates_) visit(r.update), visit(r.rate);
    for (Parameter* p : block_state_)
      if (p->initialized())
        for (const auto& v : p->list_data()) visit(v);
  }
  // A TrainStep replay made one more step, of every parameter (it refuses
  // stale gradients), so every clock advanced.
  void count_replayed_step() {
    ++steps_;
    for (Clock& c : clocks_) ++c.count;
  }
  static void check_learning_rate(float lr) {
    if (!(lr > 0) || !std::isfinite(lr)) detail::raise("Trainer: the learning rate must be positive and finite, got ", lr);
  }
  static void check_batch_size(std::int64_t batch_size, const char* op) {
    if (batch_size < 1) detail::raise("Trainer::", op, ": batch_size must be at least 1, got ", batch_size);
  }

  // Gives each updated copy of a parameter its optimizer state on the copy's
  // device. reset_devices() may have moved or added copies since the state
  // was made: the copies are equal, and so are their states, so any existing
  // one (momentum, Adam's moments) carries over.
  static void follow_devices(std::vector<State>& state, const std::vector<Tensor<float>>& copies, bool each) {
    const std::size_t updated = each ? copies.size() : 1;
    const auto source = std::ranges::find_if(state, [](const State& st) { return bool(st.m); });
    // A copy without state fits only while no copy has any (the first step
    // makes them all); else it takes a copy of another's.
    const auto fits = [&](std::size_t r) {
      return r < state.size() && (state[r].m ? state[r].m.device() == copies[r].device() : source == state.end());
    };
    bool all_fit = state.size() == copies.size();
    for (std::size_t r = 0; all_fit && r < updated; ++r) all_fit = fits(r);
    if (all_fit) return;
    std::vector<State> next(copies.size());
    for (std::size_t r = 0; r < updated; ++r) {
      if (fits(r)) next[r] = state[r];
      if (next[r].m || source == state.end()) continue;
      const Device d = copies[r].device();
      next[r].m = source->m.to(d);
      if (source->v) next[r].v = source->v.to(d);
    }
    state = std::move(next);
  }

  // One optimizer update of copy w of parameter `param` from its summed gradient g.
  void apply(const SGD& o, std::size_t, Tensor<float>& w, const Tensor<float>& g, float rescale, State& s) {
    const Tensor<float>& lr = rate_on(w.device());
    if (o.momentum == 0.0f) {
      w -= (g * rescale + w * o.weight_decay) * lr;
      return;
    }
    if (!s.m) s.m = zeros<float>(w.shape(), w.device());
    detail::assign_untracked(s.m, s.m * o.momentum - (g * rescale + w * o.weight_decay) * lr);
    if (o.nesterov) w += s.m * o.momentum - (g * rescale + w * o.weight_decay) * lr;
    else w += s.m;
  }
  void apply(const Adam& o, std::size_t param, Tensor<float>& w, const Tensor<float>& g, float rescale, State& s) {
    if (!s.m) {
      s.m = zeros<float>(w.shape(), w.device());
      s.v = zeros<float>(w.shape(), w.device());
    }
    // One expression for Adam and AdamW: the unused decay is a zero factor.
    const float l2 = o.decoupled_weight_decay ? 0.0f : o.weight_decay;
    const float decay = o.decoupled_weight_decay ? o.weight_decay : 0.0f;
    const auto grad = g * rescale + w * l2;
    detail::assign_untracked(s.m, s.m * o.beta1 + grad * (1.0f - o.beta1));
    detail::assign_untracked(s.v, s.v * o.beta2 + grad * grad * (1.0f - o.beta2));
    const DeviceClock& c = clock_on(param, w.device());
    w -= s.m * c.step_size / (sqrt(s.v) + c.epsilon) + w * (rate_on(w.device()) * decay);
  }

  std::vector<Parameter*> params_;       // the trainable ones
  std::vector<Parameter*> block_state_;  // the others
  std::variant<SGD, Adam> opt_;
  std::vector<std::vector<State>> state_;  // per parameter, per device
  std::vector<Clock> clocks_;
  LRSchedule schedule_;
  std::vector<DeviceRate> rates_;
  std::vector<std::size_t> clock_of_;  // per parameter: its clock in clocks_ (no_clock before its first update)
  std::int64_t steps_ = 0;
  std::optional<std::vector<std::size_t>> reduced_;  // the parameters allreduce_grads() summed for update()
  std::size_t bucket_bytes_ = thresholds::allreduce_bucket_bytes;
  std::shared_ptr<dist::Communicator> comm_;
};

// Out of the class: in the compiled mode, compiled once (core/config.hpp).
#if DEFT_DEFINE_NN
DEFT_DECL void Trainer::step(std::int64_t batch_size, bool ignore_stale_grad) {
  check_batch_size(batch_size, "step");
  allreduce_grads(ignore_stale_grad);
  update(batch_size);
}

DEFT_DECL void Trainer::allreduce_grads(bool ignore_stale_grad) {
  if (reduced_)
    detail::raise<std::logic_error>("Trainer::allreduce_grads: the gradients are summed already; call "
                                    "update(batch_size) before the next allreduce_grads()");
  for (const Parameter* p : params_)
    if (!p->initialized())
      detail::raise<std::logic_error>("Trainer: parameter '", p->name(),
                                      "' has no value yet; run a forward and backward pass before step()");
  std::vector<std::vector<Tensor<float>>> copies(params_.size());
  std::vector<std::size_t> fresh;  // the parameters with a new gradient somewhere
  for (std::size_t i = 0; i < params_.size(); ++i) {
    copies[i] = params_[i]->list_data();
    if (std::ranges::any_of(copies[i], [](const auto& v) { return autograd::detail::grad_is_fresh(v); }))
      fresh.push_back(i);
    else if (!ignore_stale_grad)
      detail::raise<std::logic_error>(
          "Trainer: parameter '", params_[i]->name(), "' has no gradient from a backward() since the last step",
          " (on ", detail::device_list(params_[i]->devices()),
          "); call backward() on a loss that uses it, or pass ignore_stale_grad = true to leave such parameters "
          "unchanged");
  }
  autograd::pause no_recording;  // updates are never differentiated
  std::vector<std::vector<Tensor<float>>> grads;
  for (std::size_t i : fresh) {
    grads.emplace_back();
    for (const auto& v : copies[i]) {
      grads.back().push_back(v.grad());
      // A copy whose device had no rows holds the last step's gradient: zero adds nothing.
      if (!autograd::detail::grad_is_fresh(v)) grads.back().back().assign(zeros<float>(v.shape(), v.device()));
    }
  }
  for (const auto& vs : copies)
    for (const auto& v : vs) autograd::detail::forget_fresh_grad(v);
  allreduce(grads, bucket_bytes_);
  if (comm_) {  // then across the ranks: one copy per parameter, given back to the others
    std::vector<Tensor<float>> first;
    for (const auto& g : grads) first.push_back(g[0]);
    dist::allreduce(first, dist::ReduceOp::sum, bucket_bytes_, comm_);
    for (std::size_t k = 0; k < grads.size(); ++k)
      for (std::size_t r = 1; r < grads[k].size(); ++r) grads[k][r].assign(first[k].to(grads[k][r].device()));
  }
  reduced_ = std::move(fresh);
}

DEFT_DECL void Trainer::set_communicator(std::shared_ptr<dist::Communicator> comm, int root) {
  if (comm) {
    if (root < 0 || root >= comm->size())
      detail::raise("Trainer::set_communicator: root rank ", root, " out of range for ", comm->size(), " ranks");
    std::vector<Parameter*> all = params_;
    all.insert(all.end(), block_state_.begin(), block_state_.end());
    for (const Parameter* p : all)
      if (!p->initialized())
        detail::raise<std::logic_error>("Trainer::set_communicator: parameter '", p->name(),
                                        "' has no value yet; run one forward pass first, so that rank ", root,
                                        "'s value can be broadcast");
    autograd::pause no_recording;
    for (Parameter* p : all) {
      std::vector<Tensor<float>> copies = p->list_data();
      Tensor<float> value = copies[0];
      dist::broadcast(value, root, comm);
      for (std::size_t r = 1; r < copies.size(); ++r) copies[r].assign(value.to(copies[r].device()));
    }
  }
  comm_ = std::move(comm);
}

DEFT_DECL void Trainer::update(std::int64_t batch_size) {
  check_batch_size(batch_size, "update");
  if (!reduced_)
    detail::raise<std::logic_error>("Trainer::update: no summed gradients; call allreduce_grads() first (step() "
                                    "does both)");
  const std::vector<std::size_t> params = std::move(*reduced_);
  reduced_.reset();
  const float rescale = 1.0f / float(batch_size);
  autograd::pause no_recording;
  ++steps_;
  std::vector<std::vector<Tensor<float>>> values;
  for (std::size_t i : params) values.push_back(params_[i]->list_data());
  const auto updating = updating_copies(params, values);
  advance_rates(updating);
  if (const auto* adam = std::get_if<Adam>(&opt_)) advance_clocks(*adam, params, updating);
  for (std::size_t k = 0; k < params.size(); ++k) {
    auto& state = state_[params[k]];
    auto& copies = values[k];
    const bool each = updates_each_copy(params[k]);
    follow_devices(state, copies, each);
    for (std::size_t r = 0; r < copies.size(); ++r) {
      if (!each && r > 0) {
        copies[r].assign(copies[0].to(copies[r].device()));  // in place: a TrainStep keeps the storage
        continue;
      }
      std::visit([&](const auto& o) { apply(o, params[k], copies[r], copies[r].grad(), rescale, state[r]); }, opt_);
    }
  }
}
#endif

}  // namespace deft::nn
