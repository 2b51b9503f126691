// Trace's definitions and the tasks a replay records (engine/replay.hpp):
// compiled where hybridize is used, or once in the compiled mode
// (deft/src.hpp). trace.hpp includes this file, at its end.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../device/backend.hpp"
#include "../core/thresholds.hpp"
#include "task.hpp"

namespace deft::detail {

DEFT_DECL void Trace::capture(const std::shared_ptr<Task>& t) {
  Step s;
  s.prototype = t->clone();
  s.output = t->output.lock();
  for (const auto& d : t->deps) {
    const auto it = index_.find(d.get());
    if (it != index_.end()) s.inner.push_back(it->second);
    else s.outer.push_back(d);
  }
  if (order_owned_write_) {
    order_owned_write_(*this, t, s);
    originals_.push_back(t);
  }
  if (t->draws_random()) plan_->random_steps.push_back(plan_->steps.size());
  if (t->sequenced()) plan_->sequenced_steps.push_back(plan_->steps.size());
  index_.emplace(t.get(), plan_->steps.size());
  plan_->steps.push_back(std::move(s));
}

DEFT_DECL void Trace::own(std::shared_ptr<Buffer> b) {
  const Buffer* key = b.get();
  owned_.emplace(key, std::move(b));
  // Header-only, order_owned_write is compiled only where buffers are owned (train steps).
  order_owned_write_ = [](Trace& trace, const std::shared_ptr<Task>& t, Step& s) { trace.order_owned_write(t, s); };
}

DEFT_DECL std::size_t Trace::sole_unread_writer(const Buffer* b) const {
  const auto& steps = plan_->steps;
  std::size_t found = none;
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (steps[i].output.get() == b) {
      if (found != none) return none;
      found = i;
    }
  // A sequenced step writes the buffer its sequence's next element waits for.
  if (found != none && steps[found].prototype->sequenced()) return none;
  for (const auto& s : steps)
    for (std::size_t j : s.inner)
      if (j == found) return none;
  // A later step may have joined its chain (plan_chains).
  for (const auto& c : plan_->chains)
    if (c.steps.back() == found) return found;
  return none;
}

DEFT_DECL bool Trace::copy_out(const Buffer* b, std::shared_ptr<Task> copy) {
  for (std::size_t i = plan_->steps.size(); i-- > 0;)
    if (plan_->steps[i].output.get() == b) {
      if (plan_->chain_of[i] == none) return false;
      plan_->copy_outs.push_back({i, std::move(copy)});
      return true;
    }
  return false;
}

DEFT_DECL void Trace::seal() {
  index_.clear();
  readers_.clear();
  declared_.clear();
  // The first replay overwrites owned buffers: it waits for the traced run.
  for (auto& t : originals_) last_.push_back(std::move(t));
  originals_.clear();
  plan_chains();
  find_program_device();
  shared_ = plan_;
}

DEFT_DECL void Trace::order_owned_write(const std::shared_ptr<Task>& t, Step& s) {
  std::vector<const Buffer*> reads;
  std::size_t kept = 0;
  for (const TracedRead& r : declared_)
    if (r.task != t.get()) declared_[kept++] = r;
    else if (owns(r.buffer)) reads.push_back(r.buffer);
  while (declared_.size() > kept) declared_.pop_back();
  const Buffer* written = s.output && owns(s.output.get()) ? s.output.get() : nullptr;
  if (written) {
    // The readers of this buffer are done with once this write waits for
    // them: later writes wait for this one.
    std::size_t left = 0;
    for (Reader& r : readers_) {
      if (!r.buffer || r.buffer == written) {
        if (std::ranges::find(s.after_readers, r.step) == s.after_readers.end()) s.after_readers.push_back(r.step);
        if (!r.task->finished() && std::ranges::find(t->deps, r.task) == t->deps.end()) t->deps.push_back(r.task);
      }
      if (r.buffer == written) continue;
      if (&readers_[left] != &r) readers_[left] = std::move(r);
      ++left;
    }
    while (readers_.size() > left) readers_.pop_back();
  }
  const std::size_t index = plan_->steps.size();
  if (!t->declares_reads()) readers_.push_back({nullptr, index, t});
  else
    for (const Buffer* b : reads)
      if (b != written) readers_.push_back({b, index, t});  // its own read comes before its write
}

DEFT_DECL void Trace::plan_chains() {
  auto& steps = plan_->steps;
  auto& chains = plan_->chains;
  auto& chain_of = plan_->chain_of;
  chain_of.assign(steps.size(), none);
  std::vector<std::size_t> readers(steps.size(), 0);
  std::vector<std::vector<bool>> waits;  // waits[c][a], a < c: chain c waits for chain a, directly or not
  for (const auto& s : steps)
    if (s.output)
      for (std::size_t j : s.inner) ++readers[j];
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (!s.output) continue;
    const bool handed_off = s.prototype->hand_off;
    bool extend = !handed_off && !chains.empty() && !chains.back().hand_off;
    if (extend) {
      const std::size_t latest = chains.size() - 1, last = chains.back().steps.back();
      const auto& w = waits[latest];
      const auto waited = [&](std::size_t j) { return !steps[j].output || chain_of[j] == latest || w[chain_of[j]]; };
      extend = std::ranges::all_of(s.inner, waited) && std::ranges::all_of(s.after_readers, waited) &&
               ((readers[last] == 1 && std::ranges::find(s.inner, last) != s.inner.end()) ||
                (!owned_.empty() && s.prototype->work < thresholds::inline_task_work));
    }
    if (!extend) chains.emplace_back();
    Chain& c = chains.back();
    const std::size_t ci = chains.size() - 1;
    c.steps.push_back(i);
    c.bytes += s.prototype->bytes;
    c.work += s.prototype->work;
    c.hand_off = handed_off;
    chain_of[i] = ci;
    for (const auto* waited : {&s.inner, &s.after_readers})
      for (std::size_t j : *waited)
        if (steps[j].output && chain_of[j] != ci && std::ranges::find(c.after, chain_of[j]) == c.after.end())
          c.after.push_back(chain_of[j]);
    if (!extend) {  // an extension reads only what its chain waits for already
      std::vector<bool> w(ci, false);
      for (std::size_t a : c.after) {
        w[a] = true;
        for (std::size_t k = 0; k < a; ++k) w[k] = w[k] || waits[a][k];
      }
      waits.push_back(std::move(w));
    }
  }
  // Every chain waits for the first one, directly or not: the input's
  // refill can then run in the first chain's task without delaying a branch.
  std::vector<bool> reaches(chains.size(), false);
  plan_->rooted = !chains.empty();
  for (std::size_t ci = 1; ci < chains.size(); ++ci) {
    for (std::size_t a : chains[ci].after) reaches[ci] = reaches[ci] || a == 0 || reaches[a];
    plan_->rooted = plan_->rooted && reaches[ci];
  }
}

DEFT_DECL void Trace::find_program_device() {
  // A device program would replay the numbers it was recorded with, and the collectives' places.
  if (!plan_->random_steps.empty() || !plan_->sequenced_steps.empty()) return;
  int device = -1, live = 0;
  for (std::size_t i = 0; i < plan_->steps.size(); ++i) {
    const auto& out = plan_->steps[i].output;
    if (!out) continue;
    if (out->device.type != DeviceType::gpu || (live && out->device.index != device)) return;
    device = out->device.index;
    plan_->last_live = i;
    ++live;
  }
  if (live >= 2) plan_->program_device = device;
}

/// What differs between replays of a chain (beyond the buffers' contents).
struct ChainReplay {
  // The chain's steps that run a kernel of this replay's own: the random
  // steps redrawn (this replay's numbers; Plan::random_steps), the
  // sequenced ones at their new places (Plan::sequenced_steps).
  std::vector<std::pair<std::size_t, std::shared_ptr<Task>>> kernels;
  // Buffers whose producers the chain's task waits for besides the plan's
  // dependencies: the sequence's elements recorded before its sequenced step.
  std::vector<std::shared_ptr<Buffer>> after;
  // The chain's copy-outs (index into Plan::copy_outs) and this replay's
  // buffers for them; weak: a value nobody holds any more is not copied.
  std::vector<std::pair<std::size_t, std::weak_ptr<Buffer>>> copies;
};

/// One chain of a replay as one engine task: the kernels of the chain's
/// steps, in order, each on its step's buffer; the last writes the task's
/// output. The first chain may also refill the traced input (`refill`).
class ChainTask final : public Task {
 public:
  ChainTask(std::shared_ptr<const Trace::Plan> plan, std::size_t chain, std::shared_ptr<Task> refill,
            std::shared_ptr<Buffer> input, ChainReplay replay = {})
      : Task("hybridized", plan->chains[chain].bytes), plan_(std::move(plan)), chain_(chain), refill_(std::move(refill)),
        input_(std::move(input)), replay_(std::move(replay)) {
    const auto& c = plan_->chains[chain_];
    work = c.work + (refill_ ? refill_->work : 0);
    hand_off = c.hand_off || (refill_ && refill_->hand_off);
    gpu_inputs = plan_->steps[c.steps.front()].prototype->gpu_inputs;
  }
  void execute(Buffer& out) override {
    if (refill_) {
      input_->allocate();
      refill_->execute(*input_);
    }
    const auto& steps = plan_->chains[chain_].steps;
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const auto& s = plan_->steps[steps[k]];
      Buffer& b = k + 1 == steps.size() ? out : *s.output;
      b.allocate();
      Task* kernel = s.prototype.get();
      for (const auto& [step, own] : replay_.kernels)
        if (step == steps[k]) kernel = own.get();
      kernel->execute(b);
      for (const auto& [j, copy] : replay_.copies)
        if (plan_->copy_outs[j].step == steps[k])
          if (auto to = copy.lock()) {
            to->allocate();
            plan_->copy_outs[j].copy->execute(*to);
          }
    }
  }
  void for_each_other_output(const std::function<void(Buffer&)>& f) const override {
    if (!plan_) return;
    if (refill_) f(*input_);
    const auto& steps = plan_->chains[chain_].steps;
    for (std::size_t k = 0; k + 1 < steps.size(); ++k) f(*plan_->steps[steps[k]].output);
    for (const auto& [j, copy] : replay_.copies)
      if (auto to = copy.lock()) f(*to);
  }
  void release_closure() noexcept override {
    plan_.reset();
    refill_.reset();
    input_.reset();
    replay_ = {};
  }
  // (A replay traced in turn, a hybridized block inside a traced step,
  // replays this replay's numbers.)
  std::shared_ptr<Task> clone() const override {
    return std::make_shared<ChainTask>(plan_, chain_, refill_ ? refill_->clone() : nullptr, input_, replay_);
  }
  bool declares_reads() const noexcept override { return false; }
  // A chain holding a sequenced step (a chain of one: it is handed off)
  // is sequenced in turn, when a trace captures this replay.
  bool sequenced() const noexcept override {
    if (!plan_) return false;
    const auto& steps = plan_->chains[chain_].steps;
    return steps.size() == 1 && plan_->steps[steps.front()].prototype->sequenced();
  }
  std::shared_ptr<Task> resequenced(const std::shared_ptr<Buffer>& output,
                                    std::shared_ptr<Buffer>& previous) const override {
    if (!sequenced()) return nullptr;
    const std::size_t step = plan_->chains[chain_].steps.front();
    ChainReplay r = replay_;
    std::erase_if(r.kernels, [&](const auto& k) { return k.first == step; });
    r.kernels.emplace_back(step, plan_->steps[step].prototype->resequenced(output, previous));
    return std::make_shared<ChainTask>(plan_, chain_, refill_ ? refill_->clone() : nullptr, input_, std::move(r));
  }

 private:
  std::shared_ptr<const Trace::Plan> plan_;
  std::size_t chain_;
  std::shared_ptr<Task> refill_;
  std::shared_ptr<Buffer> input_;
  ChainReplay replay_;
};

/// A replay of a plan whose live steps all write one GPU (Plan::program_device),
/// as one task writing every step's buffer: the first run records the
/// steps' kernels into a device program (DeviceBackend::record; on CUDA a
/// graph) and later runs launch it, one launch instead of one per kernel.
/// The buffers are the plan's, allocated at the first run, so every launch
/// finds the memory the program was recorded with. Where recording fails
/// (the backend records no programs, or a step does what a program cannot
/// repeat, such as a copy from the host), the steps run one by one, and so
/// do the plan's later replays (ProgramSlot::refused).
class ProgramTask final : public Task {
 public:
  ProgramTask(std::shared_ptr<const Trace::Plan> plan, std::shared_ptr<Trace::ProgramSlot> slot,
              const std::shared_ptr<Buffer>& input)
      : Task("hybridized program", 0), plan_(std::move(plan)), slot_(std::move(slot)) {
    for (const auto& c : plan_->chains) bytes += c.bytes, work += c.work;
    hand_off = true;
    gpu_inputs = {input.get(), nullptr};  // goes on on the refill's lane
  }
  void execute(Buffer&) override {
    Trace::ProgramSlot& slot = *slot_;
    if (slot.program) return slot.program->launch();
    if (!slot.refused.load(std::memory_order_relaxed)) {
      try {
        slot.program = backend_of(deft::gpu(plan_->program_device))
                           .record(plan_->program_device, [plan = plan_] { run_steps(*plan); });
        if (slot.program) {
          slot.recorded.store(true, std::memory_order_release);
          return;
        }
        slot.refused.store(true, std::memory_order_relaxed);  // the backend records no programs
      } catch (const NotRecordable&) {  // a step a program cannot repeat (a copy from the host)
        slot.refused.store(true, std::memory_order_relaxed);
      } catch (...) {  // out of memory during the capture, say: a later replay tries again, twice at most
        if (++slot.failures >= 3) slot.refused.store(true, std::memory_order_relaxed);
      }  // the steps below raise any error that is not the recording's
    }
    run_steps(*plan_);
  }
  void for_each_other_output(const std::function<void(Buffer&)>& f) const override {
    if (!plan_) return;
    for (const auto& s : plan_->steps)
      if (s.output && !same_owner(output, s.output)) f(*s.output);
  }
  void release_closure() noexcept override {
    plan_.reset();
    slot_.reset();
  }
  std::shared_ptr<Task> clone() const override {
    raise<std::logic_error>("a hybridized program's task is never traced");
  }

 private:
  static void run_steps(const Trace::Plan& plan) {
    for (const auto& s : plan.steps)
      if (s.output) {
        s.output->allocate();
        s.prototype->execute(*s.output);
      }
  }
  std::shared_ptr<const Trace::Plan> plan_;
  std::shared_ptr<Trace::ProgramSlot> slot_;
};

}  // namespace deft::detail
