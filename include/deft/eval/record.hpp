// Recording the tasks behind Tensor: a task's kernel (EvaluateInto for every
// elementwise expression, CopyAcross between devices), its declared reads,
// and its place as the producer of a new buffer or of a version written in
// place. The parts that do not depend on the kernel's type are functions of
// their own, compiled once (record_with_new_output, record_in_place,
// record_copy_on_write, check_write). Tensor (tensor.hpp) calls these.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "../autograd/meta.hpp"
#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../engine/engine.hpp"
#include "../expr/nodes.hpp"
#include "executor.hpp"

namespace deft::detail {

template <Element T>
Tensor<T> tensor_from_buffer(std::shared_ptr<Buffer> b, const Shape& s, std::int64_t offset = 0);
template <Element T>
std::shared_ptr<Buffer> whole_storage(const Tensor<T>& t);
template <Element T>
void replace_storage(const Tensor<T>& t, std::shared_ptr<Buffer> next);
template <Element T, class Build>
void record_whole_in_place(const Tensor<T>& t, Build&& build);

/// Bytes of a T tensor of shape s; std::length_error when that overflows.
template <Element T>
std::size_t bytes_for(const Shape& s) {
  // PTRDIFF_MAX, as std::allocator's max_size: larger objects overflow the
  // allocator's rounding to the alignment and pointer differences.
  if (std::uint64_t(s.size()) > std::uint64_t(std::numeric_limits<std::ptrdiff_t>::max()) / sizeof(T))
    raise<std::length_error>("a ", dtype_name_of<T>, " tensor of shape ", s.to_string(), " needs more bytes than fit in memory");
  return std::size_t(s.size()) * sizeof(T);
}

/// Where a new tensor's storage goes: its device and, on the host, whether in
/// page-locked memory (Buffer::pinned_host). A Device converts to it.
struct Placement {
  Device device;
  bool pinned_host = false;
  Placement(Device d, bool pinned = false) : device(d), pinned_host(pinned) {}  // NOLINT: implicit on purpose
};

/// A new buffer of task.bytes at `where`, with `task` as its producer (not
/// yet recorded).
inline std::shared_ptr<Buffer> new_output(const std::shared_ptr<Task>& task, Placement where) {
  auto buf = std::make_shared<Buffer>(task->bytes, where.device);
  buf->pinned_host = where.pinned_host;
  if (where.device.type != DeviceType::cpu) task->hand_off = true;
  task->output = buf;
  buf->producer = task;
  return buf;
}

/// Records `task`, whose reads are declared, as the producer of a new
/// buffer at `where`, and returns that buffer. One function for every
/// kernel type: only the task's construction depends on it.
DEFT_NOINLINE inline std::shared_ptr<Buffer> record_with_new_output(std::shared_ptr<Task> task, Placement where) {
  auto buf = new_output(task, where);
  Engine::get().record(std::move(task));
  return buf;
}

/// Records a task that writes a new tensor of `shape`: its kernel, built in
/// place from kernel_args, fills it (kernel(Buffer&)); add_inputs(Task&)
/// declares what it reads. add_inputs is handed the task itself, so it may
/// read the kernel's operands.
template <Element T, class Kernel, class AddInputs, class... KernelArgs>
Tensor<T> record_new_emplaced(const char* name, const Shape& shape, Placement where, AddInputs&& add_inputs,
                              KernelArgs&&... kernel_args) {
  require_backend(where.device, name);
  auto task = emplace_task<Kernel>(name, bytes_for<T>(shape), std::forward<KernelArgs>(kernel_args)...);
  add_inputs(*task);
  return tensor_from_buffer<T>(record_with_new_output(std::move(task), where), shape);
}

/// record_new_emplaced with a kernel object.
template <Element T, class Kernel, class AddInputs>
Tensor<T> record_new(const char* name, const Shape& shape, Placement where, Kernel kernel, AddInputs&& add_inputs) {
  return record_new_emplaced<T, Kernel>(name, shape, where, std::forward<AddInputs>(add_inputs), std::move(kernel));
}

/// An add_inputs callable for record_new: the task reads every leaf of `e`.
template <class E>
auto reads_of(const E& e) {
  return [&e](Task& t) {
    e.for_each_leaf([&](const auto& leaf) { t.add_input(leaf.buffer); });
    if constexpr (E::calls_user_code) t.hand_off = true;
  };
}

/// The kernel of every elementwise task: evaluates `e` into the output from
/// element `offset` on. `base` is a version the task must keep alive; with
/// copy_base its contents are copied first (a partial write to a fresh copy).
template <class E>
struct EvaluateInto {
  E e;
  std::int64_t offset;
  std::shared_ptr<Buffer> base;
  bool copy_base;

  template <class X>
    requires std::constructible_from<E, X&&>
  explicit EvaluateInto(X&& expr, std::int64_t off = 0, std::shared_ptr<Buffer> keep = nullptr, bool copy = false)
      : e(std::forward<X>(expr)), offset(off), base(std::move(keep)), copy_base(copy) {}
  void operator()(Buffer& out) const {
    if (copy_base) copy_bytes(out.data, out.device, base->data, base->device, base->bytes);
    on_device(out.device, [&](auto ex) { ex.evaluate(e, out.as<value_t<E>>() + offset); });
  }
};

/// The kernel of Tensor::to: copies a leaf (a contiguous range of its
/// storage) from its device to the output's.
template <class T>
struct CopyAcross {
  Leaf<T> from;
  void operator()(Buffer& out) const {
    copy_bytes(out.data, out.device, from.source->template as<const T>() + from.offset, from.device(),
               std::size_t(from.shape().size()) * sizeof(T));
  }
};

/// Declares the reads of an EvaluateInto task: every leaf still owning its buffer.
template <class E>
void add_leaf_inputs(KernelTask& t) {
  t.kernel<EvaluateInto<E>>().e.for_each_leaf([&](const auto& leaf) {
    if (leaf.buffer) t.add_input(leaf.buffer);
  });
  if constexpr (E::calls_user_code) t.hand_off = true;
}
/// Builds `e` into `t` as its EvaluateInto kernel (`offset`, `keep` and
/// `copy_base` as there), then declares its reads: `*reads` first unless
/// null, then the leaves'; `hand_off` puts it on a worker. Tensor::write's
/// three ways to record (a finished task reused, a new task in place, a
/// copy on write) share this construction of the tree.
template <class E>
void build_write(KernelTask& t, E&& e, std::int64_t offset, const std::shared_ptr<Buffer>* reads,
                               std::shared_ptr<Buffer> keep, bool copy_base, bool hand_off) {
  static_assert(alignof(EvaluateInto<E>) <= KernelTask::kernel_alignment,
                "deft: a kernel type needs more than operator new's alignment");
  t.build<EvaluateInto<E>>(std::move(e), offset, std::move(keep), copy_base);
  if (reads) t.add_input(*reads);
  add_leaf_inputs<E>(t);
  if (hand_off) t.hand_off = true;
}

/// add_leaf_inputs as an add_inputs argument of record_new_emplaced.
template <class E>
struct DeclareLeafInputs {
  void operator()(KernelTask& t) const { add_leaf_inputs<E>(t); }
};

// The parts of Tensor::write that do not depend on the expression's type,
// called with the storage's lock held.

/// Raises for a write of a value of `shape` on `device` into a tensor of
/// `target` shape on `target_device`, or into a value autograd records.
DEFT_NOINLINE inline void check_write(const char* op, const Shape& shape, const Shape& target, Device device,
                                      Device target_device, bool recorded) {
  if (!(shape == target))
    raise(op, ": the result has shape ", shape.to_string(), " but the tensor being written has shape ", target.to_string());
  require_backend(target_device, op);
  if (recorded)
    raise<std::logic_error>(op, ": in-place update of a value autograd is recording (shape ", target.to_string(),
                            "); write `y = y + x` instead of `y += x` inside autograd::record");
  if (!(device == target_device)) raise(op, ": cannot write a value on ", device, " into a tensor on ", target_device);
}
/// Writing in place: records `t`, whose reads are declared, as the new writer of `cur` itself.
/// With `cancels` it overwrites the whole value and cancels the still-recorded
/// writer before it.
DEFT_NOINLINE inline void record_in_place(std::shared_ptr<Task> t, const std::shared_ptr<Buffer>& cur, bool cancels) {
  const auto& p = cur->producer;
  // The bounds on deferred work count the storage a task allocates
  // (Task::bytes). Writing in place allocates none, unless this overwrite
  // cancels the still-recorded writer `p` that would have allocated it.
  if (!(cancels && p && p->state.load(std::memory_order_relaxed) == Task::State::recorded)) t->bytes = 0;
  t->output = cur;
  // Recorded before the storage's lock is released: once another thread
  // can see it as the producer it must be recorded, or that thread's
  // overwrite could cancel it first and count its bytes out before in.
  if (cancels) Engine::get().record(t, p);
  else Engine::get().record(t);
  cur->producer = std::move(t);
}
/// Copy-on-write: records `t`, whose reads are declared, as the writer of a
/// fresh version of `current`'s storage, which becomes `current`.
DEFT_NOINLINE inline void record_copy_on_write(std::shared_ptr<Task> t, std::shared_ptr<Buffer>& current) {
  current = new_output(t, current->device);
  Engine::get().record(std::move(t));
}

/// record_expression of an expression it consumes (E is not a reference).
template <bool Track, Expression E>
Tensor<value_t<E>> record_expression_consumed(E&& e) {
  using T = value_t<E>;
  const Shape shape = e.shape();
  const Device dev = e.device();
  // Both branches, and Tensor::write, build the task from the same argument
  // types, so each expression compiles one task constructor.
  const auto record = [&](E&& x) {
    return record_new_emplaced<T, EvaluateInto<E>>("elementwise", shape, dev, DeclareLeafInputs<E>{}, std::move(x),
                                                   std::int64_t{0}, std::shared_ptr<Buffer>(), false);
  };
  if constexpr (Track) {
    if (tracked(e)) {  // autograd keeps the expression to differentiate it
      auto out = record(E(e));
      autograd::detail::track_elementwise(out, std::move(e));
      return out;
    }
  }
  return record(std::move(e));
}

/// Records the evaluation of an elementwise expression into a new tensor.
/// Track = false for autograd's own backward work, which is never recorded
/// (and must not instantiate derivatives of derivatives). Taken by
/// reference and moved once, into the task: a tree taken by value costs
/// every expression's code a move and a shell's destruction per leaf.
template <bool Track = true, Expression X>
Tensor<value_t<std::remove_cvref_t<X>>> record_expression(X&& x) {
  if constexpr (std::is_lvalue_reference_v<X>) return record_expression_consumed<Track>(std::remove_cvref_t<X>(x));
  else return record_expression_consumed<Track>(std::move(x));
}

}  // namespace deft::detail
