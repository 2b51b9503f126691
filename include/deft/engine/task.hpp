// Task: one unit of deferred work writing one output buffer. Tasks form a
// graph through `deps`; the graph is owned from the user's side (tensor ->
// buffer -> producer task -> inputs), so work nobody can read is freed, and
// counted as discarded, before it ever runs.
#pragma once
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "buffer.hpp"
#include "stats.hpp"
#include "task_list.hpp"
#include "task_memory.hpp"

namespace deft::detail {

class Task;

/// What the engine and the tensors see of a hybridize trace (Trace,
/// engine/trace.hpp): the engine hands it every task recorded while it is
/// active, and in-place writes ask it which buffers it owns. Only programs
/// that hybridize include the trace itself.
class TraceRecorder {
 public:
  /// Called by Engine::record for every task recorded while this trace is active.
  virtual void capture(const std::shared_ptr<Task>& t) = 0;
  /// Whether `b` is a buffer the traced program writes again on every run (Trace::own).
  virtual bool owns(const Buffer* b) const = 0;

 protected:
  ~TraceRecorder() = default;
};

/// The trace the calling thread is recording into, if any (TraceScope).
inline TraceRecorder*& active_trace() {
  thread_local TraceRecorder* trace = nullptr;
  return trace;
}

/// Sync points are refused while a trace records: the traced graph could not
/// replay what the program did with the value.
inline void refuse_sync_in_trace(const char* what) {
  if (active_trace()) [[unlikely]]
    raise<std::logic_error>(what, " inside a hybridized forward: a traced graph cannot read values (to_vector, item, "
                                  "wait_to_read, printing, wait_all, branching on data); read them outside the block");
}

/// A read a task declared (Task::add_input) while a trace recorded.
struct TracedRead {
  const Task* task;
  const Buffer* buffer;
};
/// Where add_input notes reads while this thread's trace owns buffers (null
/// otherwise): the trace takes a task's entries when it captures the task,
/// to order in-place writes of the buffers it owns after their readers.
inline std::vector<TracedRead>*& traced_reads() {
  thread_local std::vector<TracedRead>* reads = nullptr;
  return reads;
}

/// Whether a weak and a shared reference name the same object (its control
/// block), without locking the weak one.
template <class A, class B>
bool same_owner(const std::weak_ptr<A>& w, const std::shared_ptr<B>& s) noexcept {
  return !w.owner_before(s) && !s.owner_before(w);
}

class Task {
 public:
  enum class State : std::uint8_t { recorded, submitted, done, cancelled };

  Task(const char* task_name, std::size_t out_bytes, const void* kernel_kind = nullptr)
      : name(task_name), bytes(out_bytes), work(out_bytes), kind(kernel_kind) {}
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  // DEFT_DECL here too: an out-of-line virtual declared without `inline` in
  // the class would be its key function, and every translation unit would
  // emit the vtable and every virtual function.
  DEFT_DECL virtual ~Task();

  /// Runs the kernel, writing into `out` (the output, known to be alive).
  virtual void execute(Buffer& out) = 0;
  /// Calls f(Buffer&) for each buffer execute() writes besides `out` (a
  /// replay's chain writes its steps' buffers): on a GPU, the engine gives
  /// them the mark it sets on `out`, so that their sync points wait for
  /// this run, not for an earlier writer.
  virtual void for_each_other_output(const std::function<void(Buffer&)>& /*f*/) const {}
  /// Drops the kernel's closure and with it the inputs it kept alive.
  virtual void release_closure() noexcept = 0;
  /// A new, unrecorded task with a copy of this one's kernel (no deps, no output).
  virtual std::shared_ptr<Task> clone() const = 0;
  /// Whether its kernel draws random numbers (deft::random's call `stream`
  /// of seed `key`); redrawn() is then a clone drawing another call.
  virtual bool draws_random() const noexcept { return false; }
  virtual std::shared_ptr<Task> redrawn(std::uint64_t /*key*/, std::uint64_t /*stream*/) const { return nullptr; }
  /// Whether it holds a place in a sequence shared with tasks recorded
  /// outside any trace (a communicator's collectives): a replay must give
  /// it the sequence's next place. resequenced() is then a clone in that
  /// place, writing `output`; `previous` receives the output of the
  /// sequence's element before it, which the clone must run after.
  virtual bool sequenced() const noexcept { return false; }
  virtual std::shared_ptr<Task> resequenced(const std::shared_ptr<Buffer>& /*output*/,
                                            std::shared_ptr<Buffer>& /*previous*/) const {
    return nullptr;
  }

  /// Whether every buffer its kernel reads went through add_input (a
  /// replay's chain task reads its steps' inputs without declaring them).
  virtual bool declares_reads() const noexcept { return true; }

  bool finished() const {
    const State s = state.load(std::memory_order_acquire);
    return s == State::done || s == State::cancelled;
  }

  /// Reads `b`: orders this task after b's producer, or inherits its failure.
  void add_input(const std::shared_ptr<Buffer>& b);

  /// For Engine::record_again, which reuses a finished task: the task as if
  /// just built (its kernel is set apart, then its reads declared).
  void reset_for_reuse(const char* task_name, std::size_t allocated_bytes, std::size_t written_bytes) {
    name = task_name;
    bytes = allocated_bytes;
    work = written_bytes;
    hand_off = false;
    gpu_inputs = {};
    inherited_error = nullptr;
    awaited = counted = false;
    if (!deps.empty()) [[unlikely]] {  // empty after a run; not after a reuse whose declaring threw midway
      for (auto& d : deps) bury(std::move(d));
      deps.clear();
    }
  }

  const char* name;
  // The storage it allocates (its output's size; 0 when it writes existing
  // storage in place): what the engine's bounds count as held by deferral.
  std::size_t bytes;
  std::size_t work;  // bytes written and read: the engine's estimate of its cost (see thresholds::inline_task_work)
  const void* kind;  // identifies the kernel's type (kernel_ops<K>): what a reuse may put in it
  // Always run on a worker, never on a recording thread: GPU work (a copy
  // may block), and a user's map() function (it may wait for that thread).
  bool hand_off = false;
  // Its first GPU inputs (kept alive by the kernel's closure): the lanes they
  // were written on are where the engine runs it (Engine::lane_for).
  std::array<Buffer*, 2> gpu_inputs{};
  std::weak_ptr<Buffer> output;
  TaskList<3> deps;
  std::exception_ptr inherited_error;  // an input had already failed when this was recorded
  std::exception_ptr error;            // own failure, or the one propagated from an input
  std::atomic<State> state{State::recorded};

  // Scheduler bookkeeping, guarded by the engine's mutex.
  int pending = 0;
  bool awaited = false;  // a thread sleeps until this task finishes: wake it then
  bool counted = false;  // Engine::record counted it (a task freed before that was never counted)
  // It has an entry in the engine's list of recorded tasks. A task recorded
  // again (Engine::record_again) may still have one from its last time: a
  // second would stay as long as the task is recorded whenever the list is
  // compacted, and the list would grow by one per loop.
  bool listed = false;
  TaskList<2> successors;

 private:
  void forget_unsubmitted() { counters().count_dropped(bytes); }
};

class KernelTask;

/// What a KernelTask does with its kernel: one table per kernel type, so
/// that the task, its control block and its bookkeeping are one type, and
/// each kernel type adds only these few functions.
struct KernelOps {
  void (*execute)(const void* kernel, Buffer& out);
  void (*destroy)(void* kernel) noexcept;
  std::shared_ptr<KernelTask> (*clone)(const KernelTask& from);
  // Null unless the kernel draws random numbers (Task::draws_random).
  std::shared_ptr<KernelTask> (*redrawn)(const KernelTask& from, std::uint64_t key, std::uint64_t stream);
  // Null unless the kernel holds a place in a sequence (Task::sequenced).
  std::shared_ptr<KernelTask> (*resequenced)(const KernelTask& from, const std::shared_ptr<Buffer>& output,
                                             std::shared_ptr<Buffer>& previous);
};

/// A task running a kernel object, `kernel(Buffer& out) const`, stored
/// after the task in the block std::allocate_shared gave both (emplace_task).
class KernelTask final : public Task {
 public:
  /// The largest alignment a kernel may have.
  static constexpr std::size_t kernel_alignment = __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  /// Bytes a kernel of `size` bytes needs after the control block.
  static constexpr std::size_t storage_bytes(std::size_t size) { return size + kernel_alignment - 1; }

  KernelTask(const char* task_name, std::size_t out_bytes, const KernelOps* ops) : Task(task_name, out_bytes, ops) {}
  ~KernelTask() override { release_closure(); }

  // Const: a trace's prototype runs in every replay in flight (ChainTask).
  void execute(Buffer& out) override { ops().execute(kernel_, out); }
  void release_closure() noexcept override {
    if (void* k = std::exchange(kernel_, nullptr)) ops().destroy(k);
  }
  std::shared_ptr<Task> clone() const override { return ops().clone(*this); }
  bool draws_random() const noexcept override { return ops().redrawn != nullptr; }
  std::shared_ptr<Task> redrawn(std::uint64_t key, std::uint64_t stream) const override {
    return ops().redrawn ? ops().redrawn(*this, key, stream) : nullptr;
  }
  bool sequenced() const noexcept override { return ops().resequenced != nullptr; }
  std::shared_ptr<Task> resequenced(const std::shared_ptr<Buffer>& output,
                                    std::shared_ptr<Buffer>& previous) const override {
    return ops().resequenced ? ops().resequenced(*this, output, previous) : nullptr;
  }

  /// The kernel, of type K (Task::kind is kernel_ops<K>), for declaring
  /// its reads while recording, before it runs.
  template <class K>
  const K& kernel() const noexcept {
    return *static_cast<const K*>(kernel_);
  }
  /// Builds the kernel, a K, in the storage after the task: once after
  /// emplace_task allocated it, and again for a finished task being reused
  /// (Engine::record_again), whose kind is K.
  template <class K, class... Args>
  void build(Args&&... args) {
    release_closure();
    kernel_ = ::new (storage()) K(std::forward<Args>(args)...);
  }
  /// A clone's settings besides its kernel: what it costs, where it runs.
  void copy_settings(const Task& from) noexcept {
    work = from.work;
    hand_off = from.hand_off;
    gpu_inputs = from.gpu_inputs;  // the copy of the closure holds the same buffers
  }

 private:
  // The kernel's storage: after this object, inside the block that
  // TaskAllocator extended by storage_bytes (the control block ends at or
  // after this object's end).
  void* storage() noexcept {
    const auto end = reinterpret_cast<std::uintptr_t>(this) + sizeof(KernelTask);
    return reinterpret_cast<void*>((end + kernel_alignment - 1) / kernel_alignment * kernel_alignment);
  }

  // The kernel type's table, which Task::kind holds.
  const KernelOps& ops() const noexcept { return *static_cast<const KernelOps*>(kind); }

  void* kernel_ = nullptr;  // null once released
};

template <class K, class... Args>
std::shared_ptr<KernelTask> emplace_task(const char* name, std::size_t bytes, Args&&... args);

/// The table of kernel type K.
template <class K>
struct KernelOpsOf {
  static constexpr bool redrawable = requires(const K& k) {
    { k.redrawn(std::uint64_t{}, std::uint64_t{}) } -> std::same_as<K>;
  };
  static constexpr bool sequenced = requires(const K& k, std::shared_ptr<Buffer>& previous) {
    { k.resequenced(std::shared_ptr<Buffer>{}, previous) } -> std::same_as<K>;
  };
  static void execute(const void* k, Buffer& out) { (*static_cast<const K*>(k))(out); }
  static void destroy(void* k) noexcept { static_cast<K*>(k)->~K(); }
  static std::shared_ptr<KernelTask> clone_with(const KernelTask& from, const K& kernel) {
    auto t = emplace_task<K>(from.name, from.bytes, kernel);
    t->copy_settings(from);
    return t;
  }
  static std::shared_ptr<KernelTask> clone(const KernelTask& from) { return clone_with(from, from.kernel<K>()); }
  static std::shared_ptr<KernelTask> redrawn(const KernelTask& from, std::uint64_t key, std::uint64_t stream)
    requires redrawable
  {
    return clone_with(from, from.kernel<K>().redrawn(key, stream));
  }
  static std::shared_ptr<KernelTask> resequenced(const KernelTask& from, const std::shared_ptr<Buffer>& output,
                                                 std::shared_ptr<Buffer>& previous)
    requires sequenced
  {
    return clone_with(from, from.kernel<K>().resequenced(output, previous));
  }
  // Only a kernel that draws random numbers compiles a redrawn(), and only
  // one holding a place in a sequence a resequenced().
  static constexpr auto redraw_op() -> decltype(KernelOps::redrawn) {
    if constexpr (redrawable) return &redrawn;
    else return nullptr;
  }
  static constexpr auto resequence_op() -> decltype(KernelOps::resequenced) {
    if constexpr (sequenced) return &resequenced;
    else return nullptr;
  }
  static constexpr KernelOps ops{&execute, &destroy, &clone, redraw_op(), resequence_op()};
};
/// The table of K: the Task::kind of every task running a K.
template <class K>
inline constexpr const KernelOps* kernel_ops = &KernelOpsOf<K>::ops;

/// Drops a task reference. The last reference to a task frees its closure,
/// whose buffers free their producers, and so on up a chain that may be as
/// long as the program made it; done recursively that overflows the stack.
/// The outermost call on a thread frees the chain one task at a time.
inline void bury(std::shared_ptr<Task>&& t) noexcept {
  if (!t) return;
  thread_local std::vector<std::shared_ptr<Task>>* pending = nullptr;  // trivially destructible
  if (pending) {
    pending->push_back(std::move(t));
    return;
  }
  std::vector<std::shared_ptr<Task>> stack;
  stack.push_back(std::move(t));
  pending = &stack;
  while (!stack.empty()) {
    auto next = std::move(stack.back());
    stack.pop_back();
    next.reset();  // may push more onto `stack`
  }
  pending = nullptr;
}

/// A task whose kernel (of kernel_bytes, its table `ops`) is not built yet.
/// One function for every kernel type.
DEFT_NOINLINE inline std::shared_ptr<KernelTask> new_kernel_task(const char* name, std::size_t bytes, const KernelOps* ops,
                                                                  std::size_t kernel_bytes) {
  return std::allocate_shared<KernelTask>(TaskAllocator<KernelTask>(KernelTask::storage_bytes(kernel_bytes)), name, bytes,
                                          ops);
}

/// A task running a K, constructed in place from `args`, that writes
/// `bytes` bytes of output. The kernel is built straight into the task's
/// block: an elementwise kernel holds the whole expression tree, and each
/// extra move of it (each leaf's handle and shape) costs a statement.
template <class K, class... Args>
std::shared_ptr<KernelTask> emplace_task(const char* name, std::size_t bytes, Args&&... args) {
  static_assert(alignof(K) <= KernelTask::kernel_alignment, "deft: a kernel type needs more than operator new's alignment");
  auto t = new_kernel_task(name, bytes, kernel_ops<K>, sizeof(K));
  t->template build<K>(std::forward<Args>(args)...);
  return t;
}

template <class K>
std::shared_ptr<KernelTask> make_task(const char* name, std::size_t bytes, K&& kernel) {
  return emplace_task<std::decay_t<K>>(name, bytes, std::forward<K>(kernel));
}

#if DEFT_DEFINE_RUNTIME
DEFT_DECL Task::~Task() {
  if (state.load(std::memory_order_relaxed) == State::recorded && counted) forget_unsubmitted();
  for (auto& d : deps) bury(std::move(d));
}

DEFT_DECL void Task::add_input(const std::shared_ptr<Buffer>& b) {
  work += b->bytes;
  if (auto* reads = traced_reads()) reads->push_back({this, b.get()});
  if (b->device.type != DeviceType::cpu) {
    hand_off = true;
    for (Buffer*& slot : gpu_inputs)
      if (!slot || slot == b.get()) {
        slot = b.get();
        break;
      }
  }
  const auto& p = b->producer;
  const bool pending = p && p.get() != this && !p->finished();
  // While a trace records, a finished producer (synchronous mode, or a
  // bound that ran the work meanwhile) stays a dependency too: the trace
  // links its steps through deps, and a replay must run this step after
  // the one making its input, which runs again. The engine skips it.
  if (pending || (p && p.get() != this && active_trace())) {
    for (const auto& d : deps)
      if (d == p) return;
    deps.push_back(p);
  }
  // A task writing several buffers (a replay's chain) marks only its
  // output failed: a read of another one inherits the task's failure.
  // Assigned only when set: an exception_ptr temporary per read costs
  // more than the test.
  if (!pending && !inherited_error) {
    if (b->error) [[unlikely]]
      inherited_error = b->error;
    else if (p && p.get() != this && p->error) [[unlikely]]
      inherited_error = p->error;
  }
}
#endif

}  // namespace deft::detail
