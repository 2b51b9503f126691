// Trace: the tasks one thread records while a trace is active, kept as
// prototypes that can run again (hybridize). The steps are grouped into
// chains, runs of steps each reading the one before; a replay records one
// task per chain, running its steps' kernels on the same buffers, so
// intermediate storage is allocated once, the front end (building
// expressions, checking shapes, autograd) is skipped, and the engine's
// per-task cost is paid per chain, not per step. Steps on different chains
// (independent branches) still run in parallel.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../device/backend.hpp"
#include "../core/thresholds.hpp"
#include "task.hpp"

namespace deft::detail {

class Trace final : public TraceRecorder {
 public:
  struct Step {
    std::shared_ptr<Task> prototype;  // never recorded: its kernel runs in each replay's chain task
    std::shared_ptr<Buffer> output;   // null: nobody could read it when traced (dead work, not replayed)
    std::vector<std::size_t> inner;          // traced tasks it waits for
    std::vector<std::weak_ptr<Task>> outer;  // tasks recorded before the trace
    // Writes an owned buffer in place: the earlier steps that read its
    // value, which it must not overwrite under them (it reads nothing of theirs).
    std::vector<std::size_t> after_readers;
  };
  /// Steps one replay task runs in order. Each step after the first reads
  /// only what the chain waits for, and reads the step before it as that
  /// step's only reader or (in a training step) is too small for a task of
  /// its own, so running them on one thread loses little parallelism.
  /// Steps that must run on a worker (hand_off: GPU work, a user's map
  /// function) are chains of one.
  struct Chain {
    std::vector<std::size_t> steps;
    std::vector<std::size_t> after;  // the chains it reads from
    std::size_t bytes = 0, work = 0;
    bool hand_off = false;
  };
  /// What a replay task reads: shared, so a trace dropped (re-traced) while
  /// a replay is in flight stays alive until that replay ran.
  struct Plan {
    std::vector<Step> steps;
    std::vector<Chain> chains;
    bool rooted = false;  // every chain waits, directly or not, for the first
    // The GPU every live step writes on, if there is one and at least two
    // live steps (-1 otherwise): the plan can replay as a device program.
    int program_device = -1;
    std::size_t last_live = 0;  // the last step with an output
    std::vector<std::size_t> chain_of;  // each step's chain (Trace::none: dead, not replayed)
    // The steps that draw random numbers (Task::draws_random), live or not,
    // in the order the traced program drew them: a replay redraws them with
    // as many new call numbers, taken in this order.
    std::vector<std::size_t> random_steps;
    // The steps holding a place in a sequence shared with work outside the
    // trace (Task::sequenced: collectives), in the order they were
    // recorded: a replay gives them the sequence's next places in this order.
    std::vector<std::size_t> sequenced_steps;
    // Values a replay also hands out in new buffers (Trace::copy_out).
    struct CopyOut {
      std::size_t step;            // the step writing the value
      std::shared_ptr<Task> copy;  // reads the step's buffer, writes its own output
    };
    std::vector<CopyOut> copy_outs;
  };
  /// The device program of a plan (ProgramTask), shared by its replays,
  /// which run one after another (each waits for the one before).
  struct ProgramSlot {
    std::unique_ptr<DeviceProgram> program;
    std::atomic<bool> refused{false};   // recording failed: replays run the steps one by one
    std::atomic<bool> recorded{false};  // `program` was recorded (readable from any thread)
    int failures = 0;                   // recordings that failed for another reason (replays run in turn)
  };

  DEFT_DECL void capture(const std::shared_ptr<Task>& t) override;

  /// Declares `b` a buffer the traced program reads and writes again on
  /// every run (a training step's parameters, gradients and optimizer
  /// state), before the trace records (TraceScope). Tensor::write keeps
  /// writes to it in place while tracing, so each replay updates the
  /// storage the next one reads.
  DEFT_DECL void own(std::shared_ptr<Buffer> b);
  bool owns(const Buffer* b) const override { return owned_.contains(b); }
  const std::unordered_map<const Buffer*, std::shared_ptr<Buffer>>& owned() const { return owned_; }

  const std::shared_ptr<const Plan>& plan() const { return shared_; }
  static constexpr std::size_t none = std::size_t(-1);
  /// The step writing `b` if it is the only one and no step after it reads
  /// `b` and ends its chain, else `none`. A replay may give that step a new
  /// buffer each time: a block's output then reaches the caller without a copy.
  DEFT_DECL std::size_t sole_unread_writer(const Buffer* b) const;
  /// Makes every replay (but a device program's) also copy the value the
  /// last step writing `b` wrote into a new buffer, right after that step,
  /// in its chain's task: a value later steps read (so its step cannot
  /// write a new buffer, sole_unread_writer) handed out without a task of
  /// its own. `copy` is an unrecorded task reading `b` and writing its
  /// output. Called after seal(), before the first replay; false when no
  /// live step writes `b`.
  DEFT_DECL bool copy_out(const Buffer* b, std::shared_ptr<Task> copy);
  /// Whether replays may run as a device program (Plan::program_device):
  /// hybridize()'s cuda_graph option.
  bool programs_allowed = true;
  /// Whether a replay runs as one device program (ProgramTask).
  bool replays_as_program() const {
    return programs_allowed && shared_->program_device >= 0 && !program_slot_->refused.load(std::memory_order_relaxed);
  }
  const std::shared_ptr<ProgramSlot>& program_slot() const { return program_slot_; }
  /// Whether a replay recorded the plan as a device program.
  bool recorded_program() const { return program_slot_->recorded.load(std::memory_order_acquire); }
  /// The tasks of the latest replay: the next one must not overwrite a buffer they still read.
  std::vector<std::shared_ptr<Task>>& last_replay() { return last_; }
  /// Ends the capture: forgets the tracing run's task identities and groups the steps into chains.
  DEFT_DECL void seal();

 private:
  friend class TraceScope;  // points traced_reads at declared_
  // A step that read an owned buffer since that buffer's last write
  // (`buffer` null: every owned buffer, for a step that declares no reads).
  struct Reader {
    const Buffer* buffer;
    std::size_t step;
    std::shared_ptr<Task> task;  // the tracing run's, which the write waits for too
  };
  // An in-place write of an owned buffer waits for the steps that read the
  // value it overwrites: in the tracing run and in every replay, where
  // other chains may still be reading it. Steps declare their reads through
  // Task::add_input (traced_reads); a nested replay's chain task does not
  // (Task::declares_reads), so it counts as reading every owned buffer.
  DEFT_DECL void order_owned_write(const std::shared_ptr<Task>& t, Step& s);

  // A step extends the latest chain when everything it waits for in other
  // chains is done before that chain's task starts (the chain waits for
  // them, directly or not), and it could not have run beside the chain
  // anyway: it reads the chain's last step and is that step's only reader
  // (a value read twice ends its chain, so its readers can run in
  // parallel). In a training step (owned buffers) a step too small to be
  // worth a task of its own (thresholds::inline_task_work) joins too: a
  // backward pass reads most values several times, which would end nearly
  // every chain. (Forwards keep their branches apart; tests/nn pins that.)
  DEFT_DECL void plan_chains();

  DEFT_DECL void find_program_device();

  std::shared_ptr<Plan> plan_ = std::make_shared<Plan>();
  std::shared_ptr<const Plan> shared_;  // set by seal()
  std::shared_ptr<ProgramSlot> program_slot_ = std::make_shared<ProgramSlot>();
  std::unordered_map<const Task*, std::size_t> index_;
  std::vector<std::shared_ptr<Task>> last_;
  std::unordered_map<const Buffer*, std::shared_ptr<Buffer>> owned_;
  std::vector<std::shared_ptr<Task>> originals_;  // the tracing run's tasks, while owned_ is not empty
  std::vector<Reader> readers_;
  std::vector<TracedRead> declared_;  // reads not yet captured (traced_reads)
  void (*order_owned_write_)(Trace&, const std::shared_ptr<Task>&, Step&) = nullptr;  // set by own()
};

/// Makes the calling thread record into `t` for the scope's lifetime.
class TraceScope {
 public:
  explicit TraceScope(Trace& t) : trace_(t), previous_(active_trace()), previous_reads_(traced_reads()) {
    active_trace() = &t;
    traced_reads() = t.owned().empty() ? nullptr : &t.declared_;
  }
  ~TraceScope() {
    trace_.seal();
    active_trace() = previous_;
    traced_reads() = previous_reads_;
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace& trace_;
  TraceRecorder* previous_;
  std::vector<TracedRead>* previous_reads_;
};

}  // namespace deft::detail

#if DEFT_DEFINE_RUNTIME
#include "trace_impl.hpp"
#endif
