// Collectives on tensors across the ranks of a Communicator: allreduce,
// broadcast, allgather, reduce_scatter and barrier. Each is recorded as a
// deferred task like any op: the call returns at once, the task runs when
// its input is ready, and computation recorded before or after it overlaps
// the communication. A communicator's collectives run one at a time in the
// order they were recorded (each task reads the previous one's output), so
// that every rank issues them in the same order whatever its workers do.
// Tensors on a GPU stay there where the communicator runs collectives on it
// (NCCL), and are staged through host memory otherwise. A trace (hybridize,
// TrainStep) keeps them: each replay gives them the communicator's next
// places, after whatever was recorded on it since the last one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../ops/devices.hpp"
#include "communicator.hpp"

namespace deft::dist {

/// The communicator collectives use when none is given (set by dist::init).
inline std::shared_ptr<Communicator>& default_communicator() {
  static std::shared_ptr<Communicator> c;
  return c;
}

namespace detail {
using deft::detail::Buffer;
using deft::detail::Leaf;

inline const std::shared_ptr<Communicator>& communicator_or_default(const std::shared_ptr<Communicator>& c,
                                                                    const char* op) {
  if (c) return c;
  if (!default_communicator())
    deft::detail::raise<std::logic_error>("dist::", op, ": no communicator; call deft::dist::init() first");
  return default_communicator();
}

/// The kernel of a collective's task: runs it on this rank's input (a
/// contiguous range of host memory) into the task's output.
template <class T>
struct RunCollective {
  Leaf<T> in;
  std::shared_ptr<Buffer> previous;  // the communicator's last collective's output: this one runs after it
  std::shared_ptr<Communicator> comm;
  Collective c;
  void operator()(Buffer& out) const {
    const T* data = in.source ? in.source->template as<const T>() + in.offset : nullptr;
    comm->run(c, data, out.data);
    if (out.device.type != DeviceType::cpu) deft::detail::read_after_sum(out);  // written on the collective lane
    comm->ran(&out);
  }
  /// The same collective at the communicator's next place, writing
  /// `output` (a replay's step); `after` receives the output it must run after.
  RunCollective resequenced(const std::shared_ptr<Buffer>& output, std::shared_ptr<Buffer>& after) const {
    RunCollective next{in, nullptr, comm, c};
    comm->record_next([&](std::uint64_t sequence, const std::shared_ptr<Buffer>& prior) {
      next.c.sequence = sequence;
      after = prior;
      return output;
    });
    return next;
  }
};

/// Records collective `c` over `t`, writing a new tensor of shape
/// `out_shape` where the communicator runs it (t's GPU, or the host, to
/// which t is then copied), as the communicator's next collective.
template <Element T>
Tensor<T> record_collective(const Tensor<T>& t, Collective c, const Shape& out_shape,
                            const std::shared_ptr<Communicator>& comm) {
  using namespace deft::detail;
  autograd::pause no_recording;  // collectives are not differentiated
  c.device = comm->runs_on(t.device());
  const Tensor<T> in = t.to(c.device);  // itself when already there
  c.dtype = dtype_of<T>;
  c.count = in.size();
  c.shape = in.shape();
  std::shared_ptr<Buffer> output;
  comm->record_next([&](std::uint64_t sequence, const std::shared_ptr<Buffer>& previous) {
    c.sequence = sequence;
    auto task = emplace_task<RunCollective<T>>(kind_name(c.kind), bytes_for<T>(out_shape),
                                               RunCollective<T>{as_expr(in), previous, comm, c});
    if (const auto& leaf = task->template kernel<RunCollective<T>>().in; leaf.buffer) task->add_input(leaf.buffer);
    if (previous) task->add_input(previous);
    task->hand_off = true;  // it blocks until the other ranks join: never on the recording thread
    output = record_with_new_output(std::move(task), c.device);
    return output;
  });
  return tensor_from_buffer<T>(std::move(output), out_shape);
}

/// Records collective `c` (allreduce or broadcast) writing t's storage in
/// place, where the communicator runs it: for storage the recording trace
/// owns (a training step's gradients), which each replay must update, and
/// which would otherwise take a copy of the result on the step's critical path.
template <Element T>
void record_collective_in_place(Tensor<T>& t, Collective c, const std::shared_ptr<Communicator>& comm) {
  using namespace deft::detail;
  autograd::pause no_recording;
  c.device = t.device();
  c.dtype = dtype_of<T>;
  c.count = t.size();
  c.shape = t.shape();
  comm->record_next([&](std::uint64_t sequence, const std::shared_ptr<Buffer>& previous) {
    c.sequence = sequence;
    std::shared_ptr<Buffer> output;
    record_whole_in_place(t, [&](const std::shared_ptr<Buffer>& cur) {
      // The input leaf does not own `cur`: a task's reads of what it writes never do (see Leaf).
      auto task = emplace_task<RunCollective<T>>(kind_name(c.kind), bytes_for<T>(c.shape),
                                                 RunCollective<T>{Leaf<T>(cur.get(), 0, c.shape), previous, comm, c});
      task->add_input(cur);  // after the gradient's writer
      if (previous) task->add_input(previous);
      task->hand_off = true;
      output = cur;
      return task;
    });
    return output;
  });
}

/// Makes the result of collective `c` (of t's shape) t's value: written in
/// place into storage the recording trace owns, else a new version of t's
/// storage when t covers a whole storage on the device where the
/// collective ran (no copy), else a copy into t.
template <Element T>
void collective_into(Tensor<T>& t, const Collective& c, const std::shared_ptr<Communicator>& comm) {
  using namespace deft::detail;
  const TraceRecorder* trace = active_trace();
  const auto whole = whole_storage(t);
  const bool owned = whole && trace && trace->owns(whole.get());
  if (owned && comm->runs_on(t.device()) == t.device()) return record_collective_in_place(t, c, comm);
  const Tensor<T> result = record_collective(t, c, t.shape(), comm);
  if (t.device() == result.device() && whole && !owned) replace_storage(t, whole_storage(result));
  else t.assign(result.to(t.device()));
}

}  // namespace detail

/// Combines `t` across the ranks (elementwise sum, mean, max or min) and
/// writes the result into t on every rank. Every rank passes a tensor of
/// the same shape and element type; a rank that differs is named in the
/// Error raised at the sync point. Not differentiated.
template <Element T>
void allreduce(Tensor<T>& t, ReduceOp op = ReduceOp::sum, std::shared_ptr<Communicator> comm = nullptr) {
  const auto& c = detail::communicator_or_default(comm, "allreduce");
  Collective d;
  d.kind = CollectiveKind::allreduce;
  d.op = op;
  detail::collective_into(t, d, c);
}

/// Writes rank `root`'s value of `t` into t on every rank (same shape and
/// element type everywhere).
template <Element T>
void broadcast(Tensor<T>& t, int root = 0, std::shared_ptr<Communicator> comm = nullptr) {
  const auto& c = detail::communicator_or_default(comm, "broadcast");
  if (root < 0 || root >= c->size())
    deft::detail::raise("dist::broadcast: root rank ", root, " out of range for ", c->size(), " ranks");
  Collective d;
  d.kind = CollectiveKind::broadcast;
  d.root = root;
  detail::collective_into(t, d, c);
}

/// Every rank's `t` (same shape everywhere), concatenated along axis 0 in
/// rank order: shape (size * rows, ...); a scalar gives shape (size,). On
/// t's device.
template <Element T>
Tensor<T> allgather(const Tensor<T>& t, std::shared_ptr<Communicator> comm = nullptr) {
  const auto& c = detail::communicator_or_default(comm, "allgather");
  Shape out = t.shape();
  if (out.rank() == 0) out = Shape{std::int64_t(c->size())};
  else out[0] *= c->size();
  Collective d;
  d.kind = CollectiveKind::allgather;
  return detail::record_collective(t, d, out, c).to(t.device());
}

/// `t` combined across the ranks, of which this rank keeps its share of
/// axis 0: rows [rank * n / size, (rank + 1) * n / size). Axis 0 must split
/// evenly over the ranks.
template <Element T>
Tensor<T> reduce_scatter(const Tensor<T>& t, ReduceOp op = ReduceOp::sum, std::shared_ptr<Communicator> comm = nullptr) {
  const auto& c = detail::communicator_or_default(comm, "reduce_scatter");
  if (t.rank() == 0 || t.shape()[0] % c->size() != 0)
    deft::detail::raise("dist::reduce_scatter: axis 0 of shape ", t.shape().to_string(), " does not split evenly over ",
                        c->size(), " ranks");
  Shape out = t.shape();
  out[0] /= c->size();
  Collective d;
  d.kind = CollectiveKind::reduce_scatter;
  d.op = op;
  return detail::record_collective(t, d, out, c).to(t.device());
}

/// Sync point: returns when every rank reached its barrier, after this
/// rank's collectives recorded before it ran. Throws what they threw.
inline void barrier(std::shared_ptr<Communicator> comm = nullptr) {
  const auto& c = detail::communicator_or_default(comm, "barrier");
  Collective d;
  d.kind = CollectiveKind::barrier;
  detail::record_collective(Tensor<float>(std::vector<float>{}, Shape{0}), d, Shape{0}, c).wait_to_read();
}

/// allreduce of many tensors at once (a model's gradients): consecutive
/// tensors on one device are packed into buckets of at most `bucket_bytes`,
/// from the last tensor back (a backward writes the last layers' gradients
/// first, so the first bucket is ready while the rest is computed), one
/// collective per bucket. A tensor larger than `bucket_bytes`, or any with
/// 0, goes alone. Each tensor gets what allreduce(tensors[i]) gives it.
template <Element T>
void allreduce(std::vector<Tensor<T>>& tensors, ReduceOp op = ReduceOp::sum,
               std::size_t bucket_bytes = thresholds::allreduce_bucket_bytes,
               std::shared_ptr<Communicator> comm = nullptr) {
  const auto& c = detail::communicator_or_default(comm, "allreduce");
  for (const auto& t : tensors) (void)t.device();  // an empty handle raises here, before anything is recorded
  autograd::pause no_recording;
  const auto bytes_of = [&](std::size_t i) { return std::size_t(tensors[i].size()) * sizeof(T); };
  const auto joins = [&](std::size_t a, std::size_t b) { return tensors[a].device() == tensors[b].device(); };
  deft::detail::for_each_bucket(tensors.size(), bucket_bytes, bytes_of, joins, [&](std::size_t begin, std::size_t end) {
    if (end - begin == 1) return allreduce(tensors[begin], op, c);
    std::vector<Tensor<T>*> parts;
    for (std::size_t i = begin; i < end; ++i) parts.push_back(&tensors[i]);
    // Packed where the collective runs: on the GPU with NCCL, else on the host.
    Tensor<T> packed = deft::detail::pack(parts, c->runs_on(tensors[begin].device()));
    allreduce(packed, op, c);
    deft::detail::unpack(packed, parts);
  });
}

}  // namespace deft::dist
