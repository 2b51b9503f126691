// The engine of nn::TrainStep (train_step.hpp) without its loss's type:
// the plain, traced and replayed steps, the traces' validity checks and
// the state the traces own. See train_step.hpp for what a TrainStep does.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../autograd/meta.hpp"
#include "block.hpp"
#include "clip.hpp"
#include "trainer.hpp"

namespace deft::nn {

/// What a TrainStep computed: the loss per sample, and the scores the network
/// gave `x` before its update (for accuracy). A replay copies the scores
/// out inside the task that computed them, unless nobody holds them then.
struct TrainStepOutput {
  Tensor<float> loss;    ///< the loss per sample
  Tensor<float> scores;  ///< the network's output for `x`, before the update
};

namespace detail_step {
/// TrainStep without its loss's type: the call of the loss is reached
/// through a pointer, so that this code is compiled once per label type
/// (float, int64), and in the compiled mode once per program
/// (deft/nn_src.hpp), not once per loss in every unit.
template <class Label>
class Core {
 public:
  using Output = TrainStepOutput;
  /// The calling TrainStep's loss, for the length of one call.
  struct LossRef {
    const void* loss;
    Tensor<float> (*call)(const void* loss, const Tensor<float>& scores, const Tensor<Label>& labels);
    Tensor<float> operator()(const Tensor<float>& scores, const Tensor<Label>& labels) const {
      return call(loss, scores, labels);
    }
  };

  Core(Block& net, Trainer& trainer, HybridizeOptions options);
  /// TrainStep's data-parallel call, with its loss.
  std::vector<Output> step(const LossRef& loss, const std::vector<Tensor<float>>& xs,
                           const std::vector<Tensor<Label>>& ys, std::int64_t batch_size);
  void set_max_grad_norm(float max_norm);
  float max_grad_norm() const { return max_grad_norm_; }
  const Tensor<float>& grad_norm() const { return grad_norm_; }
  std::int64_t traces() const { return traces_; }
  std::int64_t replays() const { return replays_; }
  int cuda_graphs() const;

 private:
  // One part of a traced batch: its placeholders (x, y: each replay refills
  // them), what the traced run returned, and which of the replay's copy-outs
  // hand out its loss and scores (none: a copy of the traced value).
  struct Part {
    Tensor<float> x, loss, scores;
    Tensor<Label> y;
    std::size_t loss_copy = deft::detail::Trace::none, scores_copy = deft::detail::Trace::none;
  };
  // The step traced for one batch shape (per part).
  struct Traced {
    deft::detail::Trace trace;
    std::vector<Part> parts;
    std::size_t loss_step = deft::detail::Trace::none;  // part 0's loss step, given a new buffer per replay
    Tensor<float> grad_norm;  // the traced clipping's norm (empty: no clipping)
    std::size_t grad_norm_copy = deft::detail::Trace::none;
    std::vector<long> holds;  // the references to each state buffer (state_'s order) the trace keeps
    // Whether replays give part i's loss step a new buffer (else the loss is copied out).
    bool loss_made(std::size_t i) const { return i == 0 && loss_step != deft::detail::Trace::none; }
    std::int64_t rows = 0;  // the batch size its update divides by
    bool fits(const std::vector<Tensor<float>>& xs, const std::vector<Tensor<Label>>& ys, std::int64_t batch) const {
      if (xs.size() != parts.size() || batch != rows) return false;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const Part& p = parts[i];
        if (!(xs[i].shape() == p.x.shape()) || !(ys[i].shape() == p.y.shape()) || !(xs[i].device() == p.x.device()) ||
            !(ys[i].device() == p.y.device()))
          return false;
      }
      return true;
    }
  };

  // The rows step(rows) divides by: `batch_size`, or the parts' rows.
  std::int64_t batch_rows(const std::vector<Tensor<float>>& xs, std::int64_t batch_size) const;

  // The step as the user would write it.
  std::vector<Output> run(const LossRef& loss, const std::vector<Tensor<float>>& xs,
                          const std::vector<Tensor<Label>>& ys, std::int64_t rows);

  // The references a state buffer has at rest: its tensor's, state_'s and
  // the traces' (1 while nothing is traced).
  long at_rest(std::size_t i) const { return state_.empty() ? 1 : state_[i].second; }

  // Tracing needs every state buffer computed, unfailed and held by its
  // tensor and the other traces alone (else its first write would copy it,
  // not update it).
  bool traceable();

  std::vector<Output> trace(const LossRef& loss, const std::vector<Tensor<float>>& xs,
                            const std::vector<Tensor<Label>>& ys, std::int64_t rows);

  // Whether the traces still hold: the same learning rate and state storage,
  // and no failed replay (its error stays on the state, as a failed step()
  // would leave it).
  bool still_valid();

  // Whether nothing but the traces reads the state now. A reader recorded
  // since the last step (a pending `w * 1`, an evaluation forward) must see
  // the value before this step. A running writer counts for a moment too
  // (WriterHold takes its reference before it is counted as a hold): once
  // the last replay finished, a surplus is a reader. Buffers do not know
  // their readers, so the replay cannot wait for just them: all recorded
  // work runs. A reference left after that (a view of a parameter's storage
  // inside an unfinished trace, say) makes the plain step run, whose
  // copy-on-write leaves it its value.
  bool unread();

  std::vector<Output> replay(Traced& t, const std::vector<Tensor<float>>& xs, const std::vector<Tensor<Label>>& ys);

  // Before a new shape is traced: the least recently used trace goes when
  // all options_.shapes are taken, and no replay may be in flight (its plan
  // holds the state, which would look read elsewhere).
  void make_room();

  // Drops every trace, after their replays in flight (which hold the state
  // through their plans) ran.
  void drop_traces();

  Block& net_;
  Trainer& trainer_;
  HybridizeOptions options_;
  std::vector<std::unique_ptr<Traced>> traced_;  // one per batch shape, the most recently used last
  // While anything is traced: the trainer's state buffers in visit order
  // (the storage the traces own), each with its references at rest, and
  // the learning rate the traces baked in.
  std::vector<std::pair<std::shared_ptr<deft::detail::Buffer>, long>> state_;
  float learning_rate_ = 0;
  float max_grad_norm_ = 0;
  Tensor<float> grad_norm_;  // the last call's (grad_norm())
  std::int64_t calls_ = 0, traces_ = 0, replays_ = 0;
};

template <class Label>
Core<Label>::Core(Block& net, Trainer& trainer, HybridizeOptions options)
    : net_(net), trainer_(trainer), options_(options) {
  if (options.shapes == 0)
    deft::detail::raise<std::invalid_argument>("TrainStep: HybridizeOptions::shapes is 0; keep at least one traced shape");
}

template <class Label>
std::vector<TrainStepOutput> Core<Label>::step(const LossRef& loss, const std::vector<Tensor<float>>& xs,
                                               const std::vector<Tensor<Label>>& ys, std::int64_t batch_size) {
  if (xs.empty() || xs.size() != ys.size())
    deft::detail::raise("TrainStep: ", xs.size(), " input parts and ", ys.size(),
                        " label parts; give one label part per input part, at least one");
  const std::int64_t rows = batch_rows(xs, batch_size);
  if (net_.hybridized())
    deft::detail::raise<std::logic_error>("TrainStep: '", net_.name(),
                                          "' is hybridized; TrainStep traces the whole step, call it on a network "
                                          "that is not hybridized");
  ++calls_;
  if (!traced_.empty() && !still_valid()) drop_traces();
  const auto it = std::ranges::find_if(traced_, [&](const auto& t) { return t->fits(xs, ys, rows); });
  if (it != traced_.end()) {
    if (unread()) return replay(**it, xs, ys);
    drop_traces();  // the plain step's copy-on-write gives the state new storage
    return run(loss, xs, ys, rows);
  }
  if (calls_ > 1) {
    make_room();
    if (traceable()) return trace(loss, xs, ys, rows);
  }
  drop_traces();
  return run(loss, xs, ys, rows);
}

template <class Label>
void Core<Label>::set_max_grad_norm(float max_norm) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm))
    deft::detail::raise("TrainStep::set_max_grad_norm: needs a finite norm >= 0 (0: no clipping), got ", max_norm);
  if (max_norm != max_grad_norm_) drop_traces();
  max_grad_norm_ = max_norm;
}

template <class Label>
int Core<Label>::cuda_graphs() const {
  return int(std::ranges::count_if(traced_, [](const auto& t) { return t->trace.recorded_program(); }));
}

template <class Label>
std::int64_t Core<Label>::batch_rows(const std::vector<Tensor<float>>& xs, std::int64_t batch_size) const {
  std::int64_t mine = 0;
  for (const auto& x : xs) mine += x.rank() ? x.shape()[0] : 0;
  const auto& comm = trainer_.communicator();
  if (batch_size == 0 && comm && comm->size() > 1)
    deft::detail::raise("TrainStep: the trainer trains across ", comm->size(),
                        " ranks, so the update divides by the global batch; pass every rank's rows "
                        "together (the sharded loader's Batch::rows) as step(x, y, batch_size)");
  if (batch_size == 0) return mine;
  if (batch_size < mine)
    deft::detail::raise("TrainStep: batch_size ", batch_size, " is less than the ", mine,
                        " rows of this call's input; give the rows of the whole batch");
  return batch_size;
}

template <class Label>
std::vector<TrainStepOutput> Core<Label>::run(const LossRef& loss, const std::vector<Tensor<float>>& xs,
                                              const std::vector<Tensor<Label>>& ys, std::int64_t rows) {
  std::vector<Output> out(xs.size());
  {
    autograd::record recording;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      out[i].scores = net_(xs[i]);
      out[i].loss = loss(out[i].scores, ys[i]);
      out[i].loss.backward();
    }
  }
  if (max_grad_norm_ > 0) {
    trainer_.allreduce_grads();
    grad_norm_ = nn::clip_global_norm(trainer_.params_, max_grad_norm_);
    trainer_.update(rows);
  } else {
    grad_norm_ = {};
    trainer_.step(rows);
  }
  for (auto& o : out) o = {o.loss.detach(), o.scores.detach()};
  return out;
}

template <class Label>
bool Core<Label>::traceable() {
  if (trainer_.steps() == 0) return false;
  std::vector<std::shared_ptr<deft::detail::Buffer>> state;  // (a gradient's visit holds a temporary tensor)
  trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) { state.push_back(b); });
  auto read_elsewhere = [&] {
    for (std::size_t i = 0; i < state.size(); ++i)
      if (deft::detail::Buffer::references(state[i]) - 1 > at_rest(i)) return true;  // 1: this vector's
    return false;
  };
  for (const auto& b : state)
    if (const auto& p = b->producer; p && !p->finished()) deft::detail::Engine::get().wait(p, b);
  if (read_elsewhere()) deft::detail::Engine::get().quiesce();  // pending readers (see unread)
  for (const auto& b : state)
    if (b->error) return false;
  return !read_elsewhere();
}

template <class Label>
std::vector<TrainStepOutput> Core<Label>::trace(const LossRef& loss, const std::vector<Tensor<float>>& xs,
                                                const std::vector<Tensor<Label>>& ys, std::int64_t rows) {
  auto t = std::make_unique<Traced>();
  t->rows = rows;
  t->trace.programs_allowed = options_.cuda_graph;
  t->parts.resize(xs.size());
  std::vector<Tensor<float>> x_parts;  // the placeholders, to run on
  std::vector<Tensor<Label>> y_parts;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    x_parts.push_back(t->parts[i].x = xs[i].clone());
    y_parts.push_back(t->parts[i].y = ys[i].clone());
  }
  if (state_.empty()) {
    learning_rate_ = trainer_.learning_rate();
    trainer_.for_each_state_buffer([&](const std::shared_ptr<deft::detail::Buffer>& b) { state_.emplace_back(b, 2); });
  }
  for (const auto& [b, rest] : state_) t->trace.own(b);
  {
    deft::detail::TraceScope scope(t->trace);
    auto out = run(loss, x_parts, y_parts, rows);
    for (std::size_t i = 0; i < out.size(); ++i) {
      t->parts[i].loss = std::move(out[i].loss);
      t->parts[i].scores = std::move(out[i].scores);
    }
    t->grad_norm = grad_norm_;
  }
  ++traces_;
  // Wait for the traced run: then only the tensors, state_ and the traces
  // hold the state, and this trace's share of each count is known.
  bool failed = false;
  for (const auto& task : t->trace.last_replay()) {
    deft::detail::Engine::get().wait(task);
    failed = failed || task->error;
  }
  std::vector<Output> out;
  for (const Part& p : t->parts) out.push_back({p.loss, p.scores});
  if (failed) {  // the caller reads the error; the next calls run (and fail) plainly
    drop_traces();
    return out;
  }
  for (auto& [b, rest] : state_) {
    const long now = deft::detail::Buffer::references(b);
    t->holds.push_back(now - rest);
    rest = now;
  }
  // Replays give part 0's loss step a new buffer (the traced one is the
  // caller's then). Later steps read the scores, so replays copy them out
  // inside their chain, and so the other parts' losses.
  t->loss_step = t->trace.sole_unread_writer(t->parts[0].loss.storage());
  std::size_t copies = 0;
  auto copy_out = [&](const Tensor<float>& value, std::size_t& index, const char* name) {
    auto copy = deft::detail::copy_task(name, deft::detail::bytes_for<float>(value.shape()), value);
    if (t->trace.copy_out(value.storage(), std::move(copy))) index = copies++;
  };
  for (std::size_t i = 0; i < t->parts.size(); ++i) {
    Part& p = t->parts[i];
    if (!t->loss_made(i)) copy_out(p.loss, p.loss_copy, "train step loss");
    copy_out(p.scores, p.scores_copy, "train step scores");
  }
  if (t->grad_norm) copy_out(t->grad_norm, t->grad_norm_copy, "train step gradient norm");
  // The traced run's values, for the caller: those replays overwrite are copied.
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!t->loss_made(i)) out[i].loss = deft::detail::traced_result(t->trace, nullptr, out[i].loss);
    out[i].scores = deft::detail::traced_result(t->trace, nullptr, out[i].scores);
  }
  if (t->grad_norm) grad_norm_ = deft::detail::traced_result(t->trace, nullptr, t->grad_norm);
  traced_.push_back(std::move(t));
  return out;
}

template <class Label>
bool Core<Label>::still_valid() {
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

template <class Label>
bool Core<Label>::unread() {
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

template <class Label>
std::vector<TrainStepOutput> Core<Label>::replay(Traced& t, const std::vector<Tensor<float>>& xs,
                                                 const std::vector<Tensor<Label>>& ys) {
  // Another shape's replay ran last: this one writes the same state after it.
  if (Traced& latest = *traced_.back(); &latest != &t) {
    for (auto& task : latest.trace.last_replay())
      if (!task->finished()) t.trace.last_replay().push_back(std::move(task));
    latest.trace.last_replay().clear();
    const auto it = std::ranges::find_if(traced_, [&](const auto& p) { return p.get() == &t; });
    std::rotate(it, it + 1, traced_.end());  // the most recently used last
  }
  // Part 0's input refill goes last: it may run inside the first chain's task.
  std::vector<deft::detail::Refill> refills;
  for (std::size_t i = t.parts.size(); i-- > 0;) {
    const Part& p = t.parts[i];
    refills.push_back({deft::detail::copy_task("train step labels", p.y.leaf().buffer->bytes, ys[i]), p.y.leaf().buffer});
    refills.push_back({deft::detail::copy_task("train step input", p.x.leaf().buffer->bytes, xs[i]), p.x.leaf().buffer});
  }
  deft::detail::Replayed replayed = deft::detail::replay(t.trace, std::move(refills), t.loss_step);
  auto& copies = replayed.copies;  // (a reference, not a binding: clang 15's lambdas cannot capture those)
  trainer_.count_replayed_step();
  ++replays_;
  // A device program's replay (one GPU) makes no copies: the values are copied after it.
  auto handed_out = [&](const Tensor<float>& traced, std::size_t copy) {
    if (copy < copies.size()) return deft::detail::tensor_from_buffer<float>(std::move(copies[copy]), traced.shape());
    return deft::detail::traced_result(t.trace, nullptr, traced);
  };
  std::vector<Output> out;
  for (std::size_t i = 0; i < t.parts.size(); ++i) {
    const Part& p = t.parts[i];
    out.push_back({i == 0 && replayed.output ? deft::detail::traced_result(t.trace, std::move(replayed.output), p.loss)
                                  : handed_out(p.loss, p.loss_copy),
                   handed_out(p.scores, p.scores_copy)});
  }
  grad_norm_ = t.grad_norm ? handed_out(t.grad_norm, t.grad_norm_copy) : Tensor<float>();
  return out;
}

template <class Label>
void Core<Label>::make_room() {
  if (traced_.empty()) return;
  for (const auto& task : traced_.back()->trace.last_replay()) deft::detail::Engine::get().wait(task);
  if (traced_.size() < options_.shapes) return;
  const Traced& gone = *traced_.front();
  for (std::size_t i = 0; i < state_.size(); ++i) state_[i].second -= gone.holds[i];
  traced_.erase(traced_.begin());
  if (traced_.empty()) state_.clear();
}

template <class Label>
void Core<Label>::drop_traces() {
  if (traced_.empty()) return;
  for (const auto& task : traced_.back()->trace.last_replay()) deft::detail::Engine::get().wait(task);
  traced_.clear();
  state_.clear();
}

}  // namespace detail_step
}  // namespace deft::nn
