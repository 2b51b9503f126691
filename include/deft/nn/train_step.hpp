// TrainStep: hybridize for training. A whole step (forward, loss, backward,
// optimizer update) is traced once and replayed on later batches of the
// same shape: the front end (building expressions, shape checks, the
// autograd tape, the optimizer's loops) runs once, and each replay records
// a few chain tasks instead of one task per operation.
//
// The parameters, their gradients and the optimizer's state are "owned" by
// the trace (Trace::own): the traced run writes them in place, so every
// replay updates the storage the next one reads. A replay gives way to an
// ordinary step whenever replaying could differ from it: a reference to the
// state the replay would overwrite that is left once all recorded work ran
// (copy-on-write must keep its value),
// a failed earlier step (errors stay sticky), or anything that changed since
// the trace (shapes, devices, storage, learning rate), which traces again.
#pragma once
#include <cstdint>
#include <memory>
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
/// inputs of the same shapes replay the trace. Random operations (dropout)
/// draw new numbers in each replay, those the plain step would draw.
/// Single device: parameters held on several devices are refused.
template <class Loss>
class TrainStep {
 public:
  /// The labels' element type, from the loss (float for L2Loss, int64 for SoftmaxCrossEntropyLoss).
  using Label = typename deft::detail::loss_label<decltype(&Loss::operator())>::type;

  /// Keeps references to `net` and `trainer`: both must outlive the step.
  TrainStep(Block& net, Loss loss, Trainer& trainer) : net_(net), loss_(std::move(loss)), trainer_(trainer) {}

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
    if (traced_) {
      if (replayable(x, y)) return replay(x, y);
      // Its replays in flight hold the state through the plan: let them
      // finish, so that the state can be traced again now.
      for (const auto& task : traced_->trace.last_replay()) deft::detail::Engine::get().wait(task);
      traced_.reset();
    }
    if (calls_ > 1 && traceable()) return trace(x, y);
    return run(x, y);
  }

  /// How many times the step was traced (a changed shape, device, learning
  /// rate or parameter storage traces again).
  std::int64_t traces() const { return traces_; }
  /// How many calls replayed a trace.
  std::int64_t replays() const { return replays_; }

 private:
  struct Traced {
    deft::detail::Trace trace;
    Tensor<float> x, loss, scores;
    Tensor<Label> y;  // x and y: placeholders each replay refills
    std::size_t loss_step = deft::detail::Trace::none;
    float learning_rate = 0;
    std::vector<const deft::detail::Buffer*> state;                     // the trainer's state buffers when traced
    // Each owned buffer (its entry in trace.owned()) and its references between steps.
    std::vector<std::pair<const std::shared_ptr<deft::detail::Buffer>*, long>> at_rest;
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

  // Tracing needs every state buffer computed, unfailed and held by its
  // tensor alone (else its first write would copy it, not update it).
  bool traceable() {
    for (Parameter* p : net_.collect_params())
      if (p->list_data().size() > 1)
        deft::detail::raise<std::logic_error>("TrainStep: parameter '", p->name(),
                                              "' is held on several devices; TrainStep replays one device's step");
    if (trainer_.steps() == 0) return false;
    std::vector<std::shared_ptr<deft::detail::Buffer>> state;  // (a gradient's visit holds a temporary tensor)
    trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) { state.push_back(b); });
    auto read_elsewhere = [&] {
      for (const auto& b : state)
        if (b.use_count() > 2) return true;  // 2: the tensor's and this vector's
      return false;
    };
    for (const auto& b : state)
      if (const auto& p = b->producer; p && !p->finished()) deft::detail::Engine::get().wait(p, b.get());
    if (read_elsewhere()) deft::detail::Engine::get().quiesce();  // pending readers (see replayable)
    for (const auto& b : state)
      if (b->error) return false;
    return !read_elsewhere();
  }

  Output trace(const Tensor<float>& x, const Tensor<Label>& y) {
    auto t = std::make_unique<Traced>();
    t->x = x.clone();
    t->y = y.clone();
    trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) {
      t->state.push_back(b.get());
      t->trace.own(b);
    });
    {
      deft::detail::TraceScope scope(t->trace);
      auto [loss, scores] = run(t->x, t->y);
      t->loss = std::move(loss);
      t->scores = std::move(scores);
    }
    ++traces_;
    // Wait for the traced run: then only the tensors, the trace and its steps
    // hold the state, and each buffer's count at rest is known.
    bool failed = false;
    for (const auto& task : t->trace.last_replay()) {
      deft::detail::Engine::get().wait(task);
      failed = failed || task->error;
    }
    if (failed) return {t->loss, t->scores};  // the caller reads the error; the next calls run (and fail) plainly
    t->loss_step = t->trace.sole_unread_writer(t->loss.storage());
    t->learning_rate = trainer_.learning_rate();
    for (const auto& [key, b] : t->trace.owned()) t->at_rest.emplace_back(&b, b.use_count());
    // Later steps read the scores, so replays copy them out inside their chain.
    const std::size_t score_bytes = deft::detail::bytes_for<float>(t->scores.shape());
    t->trace.copy_out(t->scores.storage(), deft::detail::copy_task("train step scores", score_bytes, t->scores));
    // Replays give the loss's step new buffers (the traced one is the
    // caller's then), or else overwrite it, as they overwrite the scores.
    Output out{t->loss_step != deft::detail::Trace::none ? t->loss : deft::detail::traced_result(t->trace, nullptr, t->loss),
               deft::detail::traced_result(t->trace, nullptr, t->scores)};
    traced_ = std::move(t);
    return out;
  }

  bool replayable(const Tensor<float>& x, const Tensor<Label>& y) {
    Traced& t = *traced_;
    if (!(x.shape() == t.x.shape()) || !(y.shape() == t.y.shape()) || !(x.device() == t.x.device()) ||
        !(y.device() == t.y.device()) || trainer_.learning_rate() != t.learning_rate)
      return false;
    std::size_t i = 0;
    bool same = true;
    trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) {
      same = same && i < t.state.size() && b.get() == t.state[i];
      ++i;
    });
    if (!same || i != t.state.size()) return false;
    // A failed replay: its error stays on the state, as a failed step() would leave it.
    auto& last = t.trace.last_replay();
    for (const auto& task : last)
      if (task->finished() && task->error) {
        for (const auto& l : last) deft::detail::Engine::get().wait(l);
        for (const auto& [key, b] : t.trace.owned())
          if (!b->error) b->error = task->error;
        return false;
      }
    // A reader recorded since (a pending `w * 1`, an evaluation forward)
    // must see the value before this step. A running writer counts for a
    // moment too (WriterHold takes its reference before it is counted as a
    // hold): once the last replay finished, a surplus is a reader. Buffers
    // do not know their readers, so the replay cannot wait for just them:
    // all recorded work runs. A reference left after that (a view of a
    // parameter's storage inside an unfinished trace, say) makes the plain
    // step run, whose copy-on-write leaves it its value.
    auto read_elsewhere = [&] {
      for (const auto& [b, refs] : t.at_rest)
        if (deft::detail::Buffer::references(*b) > refs) return true;
      return false;
    };
    if (!read_elsewhere()) return true;
    for (const auto& task : last) deft::detail::Engine::get().wait(task);
    if (!read_elsewhere()) return true;
    deft::detail::Engine::get().quiesce();
    return !read_elsewhere();
  }

  Output replay(const Tensor<float>& x, const Tensor<Label>& y) {
    Traced& t = *traced_;
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

  Block& net_;
  Loss loss_;
  Trainer& trainer_;
  std::unique_ptr<Traced> traced_;
  std::int64_t calls_ = 0, traces_ = 0, replays_ = 0;
};

}  // namespace deft::nn
