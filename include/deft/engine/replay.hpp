// Replaying a hybridized trace (engine/trace.hpp): the recorded steps of a
// traced forward are recorded again as a few chain tasks (or one GPU
// program) after the tasks that refill its inputs, without running the
// forward's C++ again. nn's hybridized blocks and train steps call replay().
#pragma once
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/random_state.hpp"
#include "engine.hpp"
#include "trace.hpp"

namespace deft::detail {

/// A task that writes a traced input (a placeholder) anew before a replay:
/// unrecorded, its reads declared.
struct Refill {
  std::shared_ptr<Task> task;
  std::shared_ptr<Buffer> input;
};

/// Records the steps of `trace` again after `refills`. Each refill waits for
/// every task of the previous replay still running, and the replay for the
/// refills, so nothing overwrites a buffer the previous replay still reads.
/// A plan on one GPU (Trace::replays_as_program) replays as one ProgramTask.
/// Otherwise each chain (Trace::Chain) is a task; on the CPU, when every
/// chain waits for the first (Plan::rooted), the last refill runs inside the
/// first chain's task (the others are tasks of their own): a chain of
/// layers is then one task, and step `new_output`
/// (Trace::sole_unread_writer, or Trace::none) writes a new buffer.
struct Replayed {
  std::shared_ptr<Buffer> output;               // new_output's new buffer; null when none was made
  std::vector<std::shared_ptr<Buffer>> copies;  // Plan::copy_outs' new buffers; empty for a device program
};
DEFT_DECL Replayed replay(Trace& trace, std::vector<Refill> refills, std::size_t new_output = Trace::none);

#if DEFT_DEFINE_RUNTIME
/// The tasks recorded before the trace that the steps of `chain` read and
/// that have not finished: a replay of them waits for these.
inline void add_outer_deps(const Trace::Plan& plan, const Trace::Chain& chain, Task& t) {
  for (std::size_t i : chain.steps)
    for (const auto& w : plan.steps[i].outer)
      if (auto d = w.lock(); d && !d->finished()) t.deps.push_back(std::move(d));
}

/// What one replay's chain tasks do differently, per chain (empty when
/// nothing does): the random steps draw new numbers, as many calls as the
/// traced program made and in its order (dead steps too), so they draw what
/// that program would; the sequenced steps (collectives) take their
/// sequence's next places, in the traced order, after whatever was
/// recorded in it since; the copy-outs write new buffers (put in `copies`).
inline std::vector<ChainReplay> chain_replays(const Trace::Plan& plan, std::size_t new_output,
                                              std::vector<std::shared_ptr<Buffer>>& copies) {
  std::vector<ChainReplay> per_chain;
  if (plan.random_steps.empty() && plan.sequenced_steps.empty() && plan.copy_outs.empty()) return per_chain;
  per_chain.resize(plan.chains.size());
  if (!plan.random_steps.empty()) {
    const auto [key, first] = RandomState::get().take(plan.random_steps.size());
    for (std::size_t r = 0; r < plan.random_steps.size(); ++r)
      if (const std::size_t i = plan.random_steps[r], ci = plan.chain_of[i]; ci != Trace::none)
        per_chain[ci].kernels.emplace_back(i, plan.steps[i].prototype->redrawn(key, first + r));
  }
  for (const std::size_t i : plan.sequenced_steps) {
    // Live: the sequence holds its output (Trace::sole_unread_writer keeps it the plan's).
    const std::size_t ci = plan.chain_of[i];
    if (ci == Trace::none) raise<std::logic_error>("replay: a sequenced step without an output");
    std::shared_ptr<Buffer> previous;
    per_chain[ci].kernels.emplace_back(i, plan.steps[i].prototype->resequenced(plan.steps[i].output, previous));
    if (previous) per_chain[ci].after.push_back(std::move(previous));
  }
  copies.resize(plan.copy_outs.size());
  for (std::size_t j = 0; j < plan.copy_outs.size(); ++j) {
    const std::size_t i = plan.copy_outs[j].step;
    if (i == new_output) raise<std::logic_error>("replay: a copy-out of the step given a new buffer");
    copies[j] = std::make_shared<Buffer>(plan.copy_outs[j].copy->bytes, plan.steps[i].output->device);
    per_chain[plan.chain_of[i]].copies.emplace_back(j, copies[j]);
  }
  return per_chain;
}

DEFT_DECL Replayed replay(Trace& trace, std::vector<Refill> refills, std::size_t new_output) {
  const auto& plan = trace.plan();
  const bool program = trace.replays_as_program();
  Replayed out;
  std::vector<ChainReplay> per_chain;
  if (!program) per_chain = chain_replays(*plan, new_output, out.copies);
  auto& tasks = trace.last_replay();
  for (auto& r : refills) {
    for (const auto& t : tasks)
      if (!t->finished()) r.task->deps.push_back(t);
    if (const auto& p = r.input->producer; p && !p->finished()) r.task->deps.push_back(p);
  }
  tasks.clear();
  const Refill head_refill = std::move(refills.back());
  refills.pop_back();
  const auto& refill = head_refill.task;
  const auto& input = head_refill.input;
  for (auto& r : refills) {
    r.task->output = r.input;
    refill->deps.push_back(r.task);
    tasks.push_back(r.task);
  }
  auto set_refill_producers = [&] {
    for (auto& r : refills) r.input->producer = r.task;
  };
  if (program) {
    refill->output = input;
    auto run = std::make_shared<ProgramTask>(plan, trace.program_slot(), input);
    run->deps.push_back(refill);
    for (const auto& c : plan->chains) add_outer_deps(*plan, c, *run);
    run->output = plan->steps[plan->last_live].output;
    tasks.push_back(refill);
    tasks.push_back(run);
    Engine::get().record_all(tasks);
    set_refill_producers();
    input->producer = refill;
    for (const auto& s : plan->steps)
      if (s.output) s.output->producer = run;
    return {};
  }
  const bool fold = plan->rooted && !refill->hand_off && !plan->chains.front().hand_off;
  std::shared_ptr<Task> head = refill;  // every chain waits for it (directly or through the first chain)
  if (!fold) {
    refill->output = input;
    tasks.push_back(refill);
  }
  const std::size_t first_chain = tasks.size();
  std::shared_ptr<Buffer>& made = out.output;
  for (std::size_t ci = 0; ci < plan->chains.size(); ++ci) {
    const auto& c = plan->chains[ci];
    const bool with_refill = fold && ci == 0;
    std::vector<std::shared_ptr<Buffer>> after;
    if (!per_chain.empty()) after = std::move(per_chain[ci].after);
    auto t = std::make_shared<ChainTask>(plan, ci, with_refill ? refill : nullptr, input,
                                         per_chain.empty() ? ChainReplay{} : std::move(per_chain[ci]));
    if (with_refill) {
      for (auto& d : refill->deps) t->deps.push_back(std::move(d));
      refill->deps.clear();
      t->inherited_error = refill->inherited_error;
      head = t;
    } else {
      t->deps.push_back(head);
    }
    for (std::size_t a : c.after)
      if (tasks[first_chain + a] != head) t->deps.push_back(tasks[first_chain + a]);
    add_outer_deps(*plan, c, *t);
    for (const auto& b : after)
      if (const auto& p = b->producer; p && !p->finished()) t->deps.push_back(p);
    const std::size_t last = c.steps.back();
    if (last == new_output) {
      made = std::make_shared<Buffer>(plan->steps[last].output->bytes, plan->steps[last].output->device);
      t->output = made;
    } else {
      t->output = plan->steps[last].output;
    }
    tasks.push_back(std::move(t));
  }
  Engine::get().record_all(tasks);
  // Producers are set once recorded (see Tensor::write); the buffers are the
  // trace's own, read by no task outside this replay but the next one's.
  set_refill_producers();
  input->producer = fold ? tasks[first_chain] : refill;
  for (std::size_t ci = 0; ci < plan->chains.size(); ++ci)
    for (std::size_t i : plan->chains[ci].steps)
      (i == new_output ? made : plan->steps[i].output)->producer = tasks[first_chain + ci];
  for (std::size_t j = 0; j < out.copies.size(); ++j)
    out.copies[j]->producer = tasks[first_chain + plan->chain_of[plan->copy_outs[j].step]];
  return out;
}

#endif

}  // namespace deft::detail
