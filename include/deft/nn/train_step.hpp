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
#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../autograd/meta.hpp"
#include "block.hpp"
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
/// traced for them, and both traces are kept (HybridizeOptions::shapes). Random operations (dropout)
/// draw new numbers in each replay, those the plain step would draw.
/// Single device: parameters held on several devices are refused.
template <class Loss>
class TrainStep {
 public:
  /// The labels' element type, from the loss (float for L2Loss, int64 for SoftmaxCrossEntropyLoss).
  using Label = typename deft::detail::loss_label<decltype(&Loss::operator())>::type;

  /// Keeps references to `net` and `trainer`: both must outlive the step.
  /// `options`: replays on a GPU as a CUDA graph, and how many batch shapes
  /// keep their trace (an epoch's last, shorter batch is a second one).
  TrainStep(Block& net, Loss loss, Trainer& trainer, HybridizeOptions options = {})
      : net_(net), loss_(std::move(loss)), trainer_(trainer), options_(options) {
    if (options.shapes == 0)
      deft::detail::raise<std::invalid_argument>("TrainStep: HybridizeOptions::shapes is 0; keep at least one traced shape");
  }

  /// What a step computed: the loss per sample, and the scores the network
  /// gave `x` before its update (for accuracy). A replay copies the scores
  /// out inside the task that computed them, unless nobody holds them then.
  struct Output {
    Tensor<float> loss;    ///< the loss per sample
    Tensor<float> scores;  ///< the network's output for `x`, before the update
  };

  /// Runs one step on a batch: network input `x`, labels `y`.
  Output operator()(const Tensor<float>& x, const Tensor<Label>& y) {
    if (net_.hybridized())
      deft::detail::raise<std::logic_error>("TrainStep: '", net_.name(),
                                            "' is hybridized; TrainStep traces the whole step, call it on a network "
                                            "that is not hybridized");
    ++calls_;
    if (!traced_.empty() && !still_valid()) drop_traces();
    const auto it = std::ranges::find_if(traced_, [&](const auto& t) { return t->fits(x, y); });
    if (it != traced_.end()) {
      if (unread()) return replay(**it, x, y);
      drop_traces();  // the plain step's copy-on-write gives the state new storage
      return run(x, y);
    }
    if (calls_ > 1) {
      make_room();
      if (traceable()) return trace(x, y);
    }
    drop_traces();
    return run(x, y);
  }

  /// How many times the step was traced: once per batch shape, and again
  /// when the learning rate or the parameters' storage changed.
  std::int64_t traces() const { return traces_; }
  /// How many calls replayed a trace.
  std::int64_t replays() const { return replays_; }

 private:
  // The step traced for one batch shape.
  struct Traced {
    deft::detail::Trace trace;
    Tensor<float> x, loss, scores;
    Tensor<Label> y;  // x and y: placeholders each replay refills
    std::size_t loss_step = deft::detail::Trace::none;
    std::vector<long> holds;  // the references to each state buffer (state_'s order) the trace keeps
    bool fits(const Tensor<float>& xi, const Tensor<Label>& yi) const {
      return xi.shape() == x.shape() && yi.shape() == y.shape() && xi.device() == x.device() && yi.device() == y.device();
    }
  };

  // The step as the user would write it.
  Output run(const Tensor<float>& x, const Tensor<Label>& y) {
    Output out;
    {
      autograd::record recording;
      out.scores = net_(x);
      out.loss = loss_(out.scores, y);
      out.loss.backward();
    }
    trainer_.step(x.shape()[0]);
    return {out.loss.detach(), out.scores.detach()};
  }

  // The references a state buffer has at rest: its tensor's, state_'s and
  // the traces' (1 while nothing is traced).
  long at_rest(std::size_t i) const { return state_.empty() ? 1 : state_[i].second; }

  // Tracing needs every state buffer computed, unfailed and held by its
  // tensor and the other traces alone (else its first write would copy it,
  // not update it).
  bool traceable() {
    for (Parameter* p : net_.collect_params())
      if (p->list_data().size() > 1)
        deft::detail::raise<std::logic_error>("TrainStep: parameter '", p->name(),
                                              "' is held on several devices; TrainStep replays one device's step");
    if (trainer_.steps() == 0) return false;
    std::vector<std::shared_ptr<deft::detail::Buffer>> state;  // (a gradient's visit holds a temporary tensor)
    trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) { state.push_back(b); });
    auto read_elsewhere = [&] {
      for (std::size_t i = 0; i < state.size(); ++i)
        if (deft::detail::Buffer::references(state[i]) - 1 > at_rest(i)) return true;  // 1: this vector's
      return false;
    };
    for (const auto& b : state)
      if (const auto& p = b->producer; p && !p->finished()) deft::detail::Engine::get().wait(p, b.get());
    if (read_elsewhere()) deft::detail::Engine::get().quiesce();  // pending readers (see unread)
    for (const auto& b : state)
      if (b->error) return false;
    if (getenv("DBG")) for (std::size_t i = 0; i < state.size(); ++i) fprintf(stderr, "state %zu refs %ld rest %ld\n", i, deft::detail::Buffer::references(state[i]), at_rest(i));
    return !read_elsewhere();
  }

  Output trace(const Tensor<float>& x, const Tensor<Label>& y) {
    auto t = std::make_unique<Traced>();
    t->trace.programs_allowed = options_.cuda_graph;
    t->x = x.clone();
    t->y = y.clone();
    if (state_.empty()) {
      learning_rate_ = trainer_.learning_rate();
      trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) { state_.emplace_back(b, 2); });
    }
    for (const auto& [b, rest] : state_) t->trace.own(b);
    {
      deft::detail::TraceScope scope(t->trace);
      auto [loss, scores] = run(t->x, t->y);
      t->loss = std::move(loss);
      t->scores = std::move(scores);
    }
    ++traces_;
    // Wait for the traced run: then only the tensors, state_ and the traces
    // hold the state, and this trace's share of each count is known.
    bool failed = false;
    for (const auto& task : t->trace.last_replay()) {
      deft::detail::Engine::get().wait(task);
      failed = failed || task->error;
    }
    if (failed) {  // the caller reads the error; the next calls run (and fail) plainly
      drop_traces();
      return {t->loss, t->scores};
    }
    for (auto& [b, rest] : state_) {
      const long now = deft::detail::Buffer::references(b);
      t->holds.push_back(now - rest);
      rest = now;
    }
    t->loss_step = t->trace.sole_unread_writer(t->loss.storage());
    // Later steps read the scores, so replays copy them out inside their chain.
    const std::size_t score_bytes = deft::detail::bytes_for<float>(t->scores.shape());
    t->trace.copy_out(t->scores.storage(), deft::detail::copy_task("train step scores", score_bytes, t->scores));
    // Replays give the loss's step new buffers (the traced one is the
    // caller's then), or else overwrite it, as they overwrite the scores.
    Output out{t->loss_step != deft::detail::Trace::none ? t->loss : deft::detail::traced_result(t->trace, nullptr, t->loss),
               deft::detail::traced_result(t->trace, nullptr, t->scores)};
    traced_.push_back(std::move(t));
    return out;
  }

  // Whether the traces still hold: the same learning rate and state storage,
  // and no failed replay (its error stays on the state, as a failed step()
  // would leave it).
  bool still_valid() {
    if (trainer_.learning_rate() != learning_rate_) return false;
    std::size_t i = 0;
    bool same = true;
    trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) {
      same = same && i < state_.size() && b.get() == state_[i].first.get();
      ++i;
    });
    if (!same || i != state_.size()) return false;
    auto& last = traced_.back()->trace.last_replay();
    for (const auto& task : last)
      if (task->finished() && task->error) {
        for (const auto& l : last) deft::detail::Engine::get().wait(l);
        for (const auto& [b, rest] : state_)
          if (!b->error) b->error = task->error;
        return false;
      }
    return true;
  }

  // Whether nothing but the traces reads the state now. A reader recorded
  // since the last step (a pending `w * 1`, an evaluation forward) must see
  // the value before this step. A running writer counts for a moment too
  // (WriterHold takes its reference before it is counted as a hold): once
  // the last replay finished, a surplus is a reader. Buffers do not know
  // their readers, so the replay cannot wait for just them: all recorded
  // work runs. A reference left after that (a view of a parameter's storage
  // inside an unfinished trace, say) makes the plain step run, whose
  // copy-on-write leaves it its value.
  bool unread() {
    auto read_elsewhere = [&] {
      for (const auto& [b, rest] : state_)
        if (deft::detail::Buffer::references(b) > rest) return true;
      return false;
    };
    if (!read_elsewhere()) return true;
    for (const auto& task : traced_.back()->trace.last_replay()) deft::detail::Engine::get().wait(task);
    if (!read_elsewhere()) return true;
    deft::detail::Engine::get().quiesce();
    return !read_elsewhere();
  }

  Output replay(Traced& t, const Tensor<float>& x, const Tensor<Label>& y) {
    // Another shape's replay ran last: this one writes the same state after it.
    if (Traced& latest = *traced_.back(); &latest != &t) {
      for (auto& task : latest.trace.last_replay())
        if (!task->finished()) t.trace.last_replay().push_back(std::move(task));
      latest.trace.last_replay().clear();
      const auto it = std::ranges::find_if(traced_, [&](const auto& p) { return p.get() == &t; });
      std::rotate(it, it + 1, traced_.end());  // the most recently used last
    }
    std::vector<deft::detail::Refill> refills;
    refills.push_back({deft::detail::copy_task("train step labels", t.y.leaf().buffer->bytes, y), t.y.leaf().buffer});
    refills.push_back({deft::detail::copy_task("train step input", t.x.leaf().buffer->bytes, x), t.x.leaf().buffer});
    auto [made, copies] = deft::detail::replay(t.trace, std::move(refills), t.loss_step);
    trainer_.count_replayed_step();
    ++replays_;
    return {deft::detail::traced_result(t.trace, std::move(made), t.loss),
            copies.empty() ? deft::detail::traced_result(t.trace, nullptr, t.scores)
                           : deft::detail::tensor_from_buffer<float>(std::move(copies[0]), t.scores.shape())};
  }

  // Before a new shape is traced: the least recently used trace goes when
  // all options_.shapes are taken, and no replay may be in flight (its plan
  // holds the state, which would look read elsewhere).
  void make_room() {
    if (traced_.empty()) return;
    for (const auto& task : traced_.back()->trace.last_replay()) deft::detail::Engine::get().wait(task);
    if (traced_.size() < options_.shapes) return;
    const Traced& gone = *traced_.front();
    for (std::size_t i = 0; i < state_.size(); ++i) state_[i].second -= gone.holds[i];
    traced_.erase(traced_.begin());
    if (traced_.empty()) state_.clear();
  }

  // Drops every trace, after their replays in flight (which hold the state
  // through their plans) ran.
  void drop_traces() {
    if (traced_.empty()) return;
    for (const auto& task : traced_.back()->trace.last_replay()) deft::detail::Engine::get().wait(task);
    traced_.clear();
    state_.clear();
  }

  Block& net_;
  Loss loss_;
  Trainer& trainer_;
  HybridizeOptions options_;
  std::vector<std::unique_ptr<Traced>> traced_;  // one per batch shape, the most recently used last
  // While anything is traced: the trainer's state buffers in visit order
  // (the storage the traces own), each with its references at rest, and
  // the learning rate the traces baked in.
  std::vector<std::pair<std::shared_ptr<deft::detail::Buffer>, long>> state_;
  float learning_rate_ = 0;
  std::int64_t calls_ = 0, traces_ = 0, replays_ = 0;
};

}  // namespace deft::nn
