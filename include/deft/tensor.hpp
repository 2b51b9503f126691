// Tensor<T>: a cheap shared handle to possibly-deferred storage.
//
// Handles share a Var (the storage identity); the Var points at the current
// Buffer version. `t = expr` rebinds this handle (other handles keep the old
// value, as in libtorch) and reuses the storage in place when nobody else can
// see it; `t += x` and writes through views change the shared storage.
// Readers of a version hold that Buffer, so a later write to a Var that still
// has readers goes to a fresh buffer (copy-on-write) instead of waiting.
#pragma once
#include <concepts>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/meta.hpp"
#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/shape.hpp"
#include "engine/engine.hpp"
#include "core/spin_lock.hpp"
#include "eval/executor.hpp"
#include "eval/record.hpp"
#include "expr/nodes.hpp"

namespace deft {

namespace detail {

struct Var {
  explicit Var(std::shared_ptr<Buffer> b) : device(b->device), bytes(b->bytes), current(std::move(b)) {}
  // Every version has the storage's device and size, so these are read
  // without the lock (another thread may be replacing `current`).
  const Device device;
  const std::size_t bytes;
  SpinLock m;  // taken for every read of the tensor (each leaf of each expression)
  std::shared_ptr<Buffer> current;
};

template <Element T, class E>
Tensor<T>& assign_untracked(Tensor<T>& t, E&& e);

/// An operand other than a Tensor<T> itself (those are copied as handles).
template <class E, class T>
concept foreign_operand = Operand<E> && !std::is_same_v<std::remove_cvref_t<E>, Tensor<T>>;
}  // namespace detail

template <Element T = float>
class Tensor {
 public:
  using value_type = T;

  /// An empty handle; using it throws std::logic_error.
  Tensor() = default;

  /// A tensor holding `values` (row-major) with `shape`; ready at once.
  Tensor(std::vector<T> values, Shape shape, Device device = cpu()) : shape_(shape) {
    detail::require_backend(device, "Tensor(values, shape)");
    if (std::int64_t(values.size()) != shape.size())
      detail::raise("Tensor(values, shape): ", values.size(), " values cannot fill shape ", shape.to_string(), " (",
                    shape.size(), " elements)");
    auto buf = std::make_shared<detail::Buffer>(values.size() * sizeof(T), device);
    buf->allocate();
    detail::copy_bytes(buf->data, device, values.data(), cpu(), buf->bytes);
    var_ = std::make_shared<detail::Var>(std::move(buf));
  }
  Tensor(std::initializer_list<T> values, Shape shape, Device device = cpu())
      : Tensor(std::vector<T>(values), shape, device) {}

  /// Records the evaluation of `e` (nothing runs yet).
  template <class E>
    requires detail::foreign_operand<E, T>
  Tensor(E&& e) {  // NOLINT: implicit on purpose, `Tensor c = a * b + 2;`
    static_assert(std::is_same_v<detail::value_t<decltype(as_expr(std::forward<E>(e)))>, T>,
                  "deft: the expression's element type differs from the tensor's; use deft::cast<U>(expr)");
    *this = detail::record_expression(as_expr(std::forward<E>(e)));
  }

  Tensor(const Tensor&) = default;
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(const Tensor&) = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  /// Rebinds this handle to the value of `e`. The storage is reused in place
  /// when this handle is its only owner and the shape is unchanged.
  template <class E>
    requires detail::foreign_operand<E, T>
  Tensor& operator=(E&& e) {
    static_assert(std::is_same_v<detail::value_t<detail::expr_t<E>>, T>,
                  "deft: the expression's element type differs from the tensor's; use deft::cast<U>(expr)");
    if constexpr (std::is_lvalue_reference_v<decltype(as_expr(std::forward<E>(e)))>)
      return assign_expression(detail::expr_t<E>(e));  // a copy: the caller keeps its expression
    else
      return assign_expression(as_expr(std::forward<E>(e)));
  }

  // In-place updates: visible through every handle and view of this storage.
  // The tensor's current value is read under its lock, so concurrent updates
  // from several threads each see the previous one.
  template <class X>
  Tensor& operator+=(X&& x) { return update<detail::Add>(std::forward<X>(x), "+="); }
  template <class X>
  Tensor& operator-=(X&& x) { return update<detail::Sub>(std::forward<X>(x), "-="); }
  template <class X>
  Tensor& operator*=(X&& x) { return update<detail::Mul>(std::forward<X>(x), "*="); }
  template <class X>
  Tensor& operator/=(X&& x) { return update<detail::Div>(std::forward<X>(x), "/="); }
  /// Writes `x` (broadcast to this shape) into this tensor's storage.
  template <class X>
    requires Operand<X>
  Tensor& assign(X&& x) {
    static_assert(std::is_same_v<detail::value_t<decltype(as_expr(std::forward<X>(x)))>, T>,
                  "deft: the expression's element type differs from the tensor's; use deft::cast<U>(expr)");
    var();  // an empty handle is the first thing wrong
    auto e = detail::BroadcastTo(as_expr(std::forward<X>(x)), shape_);
    write([&](const detail::Leaf<T>&) { return std::move(e); }, "assign");
    return *this;
  }

  // --- metadata -------------------------------------------------------------
  const Shape& shape() const { return shape_; }
  std::int64_t size() const { return shape_.size(); }
  int rank() const { return shape_.rank(); }
  Device device() const { return var().device; }
  static constexpr DType dtype() { return dtype_of<T>; }
  /// False for a default-constructed handle.
  explicit operator bool() const { return static_cast<bool>(var_); }
  /// Whether the storage is page-locked host memory, which GPUs copy to and
  /// from by DMA (where to(cpu()) puts a GPU tensor's value, when the CUDA
  /// backend can pin it). Waits for the value.
  bool is_pinned() const {
    auto b = buffer();
    wait(b);
    return b->page_locked();
  }
  /// True when the value is computed (or failed); never blocks.
  bool is_ready() const {
    auto b = buffer();
    return !b->producer || b->producer->finished();
  }

  // --- views and copies -----------------------------------------------------
  /// Rows [begin, end) along the first axis: a view sharing this storage.
  Tensor rows(std::int64_t begin, std::int64_t end) const {
    var();  // an empty handle is the first thing wrong
    if (rank() == 0) detail::raise("rows(", begin, ", ", end, "): a scalar tensor has no rows");
    if (begin < 0 || end < begin || end > shape_[0])
      detail::raise("rows(", begin, ", ", end, "): out of range for shape ", shape_.to_string());
    Tensor v = *this;
    v.offset_ += begin * (shape_[0] ? size() / shape_[0] : 0);
    v.shape_[0] = end - begin;
    if (grad_meta_) autograd::detail::track_view(v, *this, begin, end);  // gradients flow back to this tensor
    return v;
  }
  /// The same storage seen with another shape (one extent may be -1).
  Tensor reshape(std::initializer_list<std::int64_t> dims) const { return reshape(std::vector<std::int64_t>(dims)); }
  Tensor reshape(std::vector<std::int64_t> dims) const {
    var();  // an empty handle is the first thing wrong
    std::int64_t known = 1;
    int infer = -1;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] == -1 && infer < 0) infer = int(i);
      else if (dims[i] < 0) detail::raise("reshape: invalid extent ", dims[i], " for shape ", shape_.to_string());
      else if (__builtin_mul_overflow(known, dims[i], &known))
        detail::raise<std::length_error>("reshape: the extents given for shape ", shape_.to_string(),
                                         " have more elements than fit in 64 bits");
    }
    if (infer >= 0) {
      if (known == 0 || size() % known != 0)
        detail::raise("reshape: cannot infer the -1 extent when viewing shape ", shape_.to_string(), " (", size(),
                      " elements) with ", known, " elements in the other extents");
      dims[infer] = size() / known;
    }
    const Shape s(dims);
    if (s.size() != size())
      detail::raise("reshape: cannot view shape ", shape_.to_string(), " (", size(), " elements) as ", s.to_string());
    Tensor v = *this;
    v.shape_ = s;
    if (grad_meta_) autograd::detail::track_view(v, *this, -1, -1);  // gradients flow back to this tensor
    return v;
  }
  /// A deep copy (recorded like any other task).
  Tensor clone() const { return Tensor(leaf()); }
  /// This value on `device` (MXNet's as_in_context): a copy recorded like
  /// any task, which runs once the value is computed and only if the copy is
  /// needed; this same tensor when it already lives there. Gradients flow
  /// back to this device. A copy from a GPU to the host lands in page-locked
  /// memory (see is_pinned), written by DMA; one to a GPU is staged through
  /// page-locked blocks and returns before its DMA is done.
  Tensor to(Device device) const {
    var();  // an empty handle is the first thing wrong
    if (device == this->device()) return *this;
    const detail::Leaf<T> from = leaf();
    // Page-locked only where a DMA from a GPU writes it: pinned memory is
    // scarce, and a copy between the CPU's logical devices is a memcpy.
    const bool pinned = device.type == DeviceType::cpu && this->device().type != DeviceType::cpu;
    Tensor out = detail::record_new<T>("to", shape_, detail::Placement(device, pinned), detail::CopyAcross<T>{from},
                                       [](detail::KernelTask& t) { t.add_input(t.kernel<detail::CopyAcross<T>>().from.buffer); });
    if (from.grad) autograd::detail::track_copy(out, from);
    return out;
  }
  /// The same value without its autograd record: gradients stop here.
  Tensor detach() const {
    Tensor v = *this;
    v.grad_meta_ = nullptr;
    return v;
  }

  // --- sync points ----------------------------------------------------------
  /// Blocks until the value is computed (on a GPU: until the device has run
  /// the kernels that write it, not the work queued after them); rethrows a
  /// failure of the work behind it.
  void wait_to_read() const {
    auto b = buffer();
    wait(b);
    detail::synchronize_device(b->device, b->ready_mark.get());
  }
  /// Copies the values out (MXNet's asnumpy).
  std::vector<T> to_vector() const {
    auto b = buffer();
    wait(b);
    std::vector<T> values(static_cast<std::size_t>(size()));
    detail::copy_bytes(values.data(), cpu(), b->template as<const T>() + offset_, b->device, values.size() * sizeof(T));
    return values;
  }
  /// The single value of a one-element tensor (MXNet's asscalar).
  T item() const {
    var();  // an empty handle is the first thing wrong
    if (size() != 1) detail::raise("item(): needs a tensor with one element, got shape ", shape_.to_string());
    auto b = buffer();
    wait(b);
    T value{};
    detail::copy_bytes(&value, cpu(), b->template as<const T>() + offset_, b->device, sizeof(T));
    return value;
  }

  // --- autograd (see autograd/graph.hpp) -------------------------------------
  /// Makes this a variable whose gradient backward() computes into grad().
  Tensor& attach_grad(autograd::GradReq req = autograd::GradReq::write) {
    static_assert(std::is_floating_point_v<T>, "deft: attach_grad needs a float or double tensor");
    autograd::detail::attach_grad(*this, req);
    return *this;
  }
  /// The gradient of an attached variable (shares storage with later backward passes).
  Tensor grad() const { return autograd::detail::grad_of(*this); }
  /// Back-propagates from this value (recorded in autograd::record) to every
  /// attached variable it depends on; the head gradient defaults to ones.
  void backward(bool retain_graph = false) const { autograd::detail::backward<T>(*this, nullptr, retain_graph); }
  void backward(const Tensor& head, bool retain_graph = false) const {
    autograd::detail::backward<T>(*this, &head, retain_graph);
  }

  // --- internal -------------------------------------------------------------
  /// A snapshot of the current version, as an expression leaf.
  detail::Leaf<T> leaf() const {
    return detail::Leaf<T>(buffer(), offset_, shape_, autograd::is_recording() ? grad_meta_ : nullptr);
  }
  /// The storage of the current version, for identity checks only (a
  /// hybridized block's cache): no reference is taken.
  const detail::Buffer* storage() const {
    auto& v = var();
    std::lock_guard lk(v.m);
    return v.current.get();
  }
  const std::shared_ptr<autograd::detail::MetaBase>& grad_meta() const { return grad_meta_; }
  void set_grad_meta(std::shared_ptr<autograd::detail::MetaBase> m) { grad_meta_ = std::move(m); }

 private:
  template <Element U>
  friend Tensor<U> detail::tensor_from_buffer(std::shared_ptr<detail::Buffer>, const Shape&, std::int64_t);
  template <Element U>
  friend std::shared_ptr<detail::Buffer> detail::whole_storage(const Tensor<U>&);
  template <Element U>
  friend void detail::replace_storage(const Tensor<U>&, std::shared_ptr<detail::Buffer>);
  template <Element U, class Build>
  friend void detail::record_whole_in_place(const Tensor<U>&, Build&&);
  template <Element U, class E>
  friend Tensor<U>& detail::assign_untracked(Tensor<U>&, E&&);

  detail::Var& var() const {
    if (!var_) detail::raise<std::logic_error>("use of an empty Tensor handle (default-constructed or moved from)");
    return *var_;
  }
  std::shared_ptr<detail::Buffer> buffer() const {
    auto& v = var();
    std::lock_guard lk(v.m);
    return v.current;
  }
  bool covers_storage() const { return std::size_t(size()) * sizeof(T) == var().bytes; }

  static void wait(const std::shared_ptr<detail::Buffer>& b) {
    detail::refuse_sync_in_trace("reading a tensor");
    if (b->producer && !b->producer->finished()) detail::Engine::get().wait(b->producer, b);
    if (b->error) std::rethrow_exception(b->error);
    // A task writing several buffers (a replay's chain, with its copy-outs)
    // marks only its output failed.
    if (b->producer && b->producer->error) std::rethrow_exception(b->producer->error);
  }

  // operator=, given an expression it may consume. Track = false for the
  // library's statements that autograd never records (assign_untracked).
  template <bool Track = true, class X>
  Tensor& assign_expression(X&& x) {
    if constexpr (Track) {
      if (autograd::is_recording()) {  // the handle takes the result's autograd record (or none)
        if (grad_meta_ || detail::tracked(x)) return *this = detail::record_expression(std::move(x));
      }
    }
    // Outside recording an attached variable stays attached (`w = w - lr * g`).
    auto meta = (grad_meta_ && grad_meta_->attached && x.shape() == shape_) ? grad_meta_ : nullptr;
    if (var_ && var_.use_count() == 1 && x.shape() == shape_ && offset_ == 0 && covers_storage() && x.device() == device())
      write([&](const detail::Leaf<T>&) -> X&& { return std::move(x); }, "assign");
    else
      *this = detail::record_expression<Track>(std::move(x));
    grad_meta_ = std::move(meta);
    return *this;
  }

  template <class Op, class X>
    requires Operand<X> || Scalar<X>
  Tensor& update(X&& x, const char* op) {
    auto rhs = detail::operand<T>(std::forward<X>(x));
    // rhs is read before write() locks this storage: `y += y` reads y too.
    write([&](detail::Leaf<T> self) {
      return detail::Binary<Op, detail::Leaf<T>, decltype(rhs)>(std::type_identity<T>{}, std::move(self), std::move(rhs));
    }, op);
    return *this;
  }

  // Writes build(current value as a leaf), an expression of this shape, into
  // this handle's storage region.
  template <class Build>
  void write(Build&& build, const char* op) {
    auto& v = var();
    std::lock_guard lk(v.m);
    const std::shared_ptr<detail::Buffer>& cur = v.current;
    // The leaf of the current value owns nothing: the task's own reads of
    // `cur` never do (see Leaf), it is ordered after cur's producer and keeps
    // cur alive itself.
    auto&& e = build(detail::Leaf<T>(cur.get(), offset_, shape_));  // a node, or a reference to one we may consume
    detail::check_write(op, e.shape(), shape_, e.device(), cur->device,
                        autograd::is_recording() && (grad_meta_ || detail::tracked(e)));
    // Other leaves reading `cur` (the caller's snapshots) stop owning it too,
    // so that they do not count as foreign readers of the next version.
    bool reads_cur = false, overlaps = false;
    e.for_each_leaf([&](auto& l) {
      if (l.source != cur.get()) return;
      reads_cur = true;
      if (l.offset != offset_ || !(l.extent == shape_)) overlaps = true;
      l.buffer.reset();
    });
    const bool whole = offset_ == 0 && covers_storage();
    // A trace's owned buffers (TrainStep's state) stay in place although the
    // trace holds them: replays must update the storage the next one reads.
    const detail::TraceRecorder* trace = detail::active_trace();
    const bool unshared = detail::Buffer::unshared(cur);
    const bool in_place = !overlaps && (unshared || (trace && trace->owns(cur.get())));
    using E = std::remove_cvref_t<decltype(e)>;
    using Kernel = detail::EvaluateInto<E>;
    // In place when nobody but its running writer can see this version.
    // use_count() is a relaxed read and does not order the write of
    // cur->producer below after the reads of it by the tasks that held
    // `cur` until now (TSan saw that race); those reads preceded their
    // Engine::record, so recording this task (under the engine's lock)
    // first orders them. An overwrite cancels the still-recorded writer
    // before it, whose value nobody else holds; an owned buffer may have
    // readers of it. Otherwise copy-on-write: pending readers keep the old
    // version; a task still reading it (or copying the part it does not
    // write) keeps it alive.
    const bool cancels = in_place && !reads_cur && whole && unshared;
    const bool keeps_cur = !in_place && (reads_cur || !whole);
    // The task reads `cur`: in place, to be ordered after the writer before it.
    const std::shared_ptr<detail::Buffer>* reads = (in_place ? !cancels : keeps_cur) ? &cur : nullptr;
    const std::size_t bytes = in_place ? std::size_t(size()) * sizeof(T) : cur->bytes;
    const bool hand_off = in_place && cur->device.type != DeviceType::cpu;
    if (in_place) {
      // A loop body writes its tensor with the same kind of expression each
      // time: the task of the time before, finished, takes the new kernel.
      const auto& p = cur->producer;
      if (p && p->kind == detail::kernel_ops<Kernel> && detail::same_owner(p->output, cur) &&
          detail::Engine::get().record_again(p, [&](detail::Task& task) {
            auto& t = static_cast<detail::KernelTask&>(task);
            t.reset_for_reuse(op, 0, bytes);  // allocates nothing: its storage is its previous run's output
            detail::build_write<E>(t, std::move(e), offset_, reads, nullptr, false, hand_off);
          }))
        return;
    }
    auto t = detail::new_kernel_task(op, bytes, detail::kernel_ops<Kernel>, sizeof(Kernel));
    detail::build_write<E>(*t, std::move(e), offset_, reads, keeps_cur ? cur : nullptr, !in_place && !whole, hand_off);
    if (in_place) detail::record_in_place(std::move(t), cur, cancels);
    else detail::record_copy_on_write(std::move(t), v.current);  // `cur` now refers to the new version
  }

  std::shared_ptr<detail::Var> var_;
  std::int64_t offset_ = 0;
  Shape shape_;
  std::shared_ptr<autograd::detail::MetaBase> grad_meta_;  // autograd: attached or recorded (see autograd/)
};

namespace detail {
template <Element T>
Tensor<T> tensor_from_buffer(std::shared_ptr<Buffer> b, const Shape& s, std::int64_t offset) {
  Tensor<T> t;
  t.var_ = std::make_shared<Var>(std::move(b));
  t.shape_ = s;
  t.offset_ = offset;
  return t;
}
/// The current version of t's storage when t covers all of it (null for a
/// part of a larger tensor), for work that replaces the storage's version
/// as a whole (replace_storage).
template <Element T>
std::shared_ptr<Buffer> whole_storage(const Tensor<T>& t) {
  return t.offset_ == 0 && t.covers_storage() ? t.buffer() : nullptr;
}
/// Makes `next` (same device and size, written by a task recorded already)
/// the current version of t's storage, as a copy-on-write does: every handle
/// of the storage reads it from now on; pending readers keep the old one.
template <Element T>
void replace_storage(const Tensor<T>& t, std::shared_ptr<Buffer> next) {
  auto& v = t.var();
  if (!(next->device == v.device) || next->bytes != v.bytes)
    raise<std::logic_error>("replace_storage: a version of ", next->bytes, " bytes on ", next->device,
                            " cannot replace storage of ", v.bytes, " bytes on ", v.device);
  std::lock_guard lk(v.m);
  v.current = std::move(next);
}
/// Records the task `build(cur)` makes (its reads declared) as the writer of
/// t's storage in place, cur being the storage's current version, which t
/// covers whole: for work that is not an expression, such as a collective
/// writing a training step's gradient where its replays read it. Under the
/// storage's lock, as Tensor::write records.
template <Element T, class Build>
void record_whole_in_place(const Tensor<T>& t, Build&& build) {
  auto& v = t.var();
  std::lock_guard lk(v.m);
  if (!(t.offset_ == 0 && t.covers_storage()))
    raise<std::logic_error>("record_whole_in_place: shape ", t.shape_.to_string(), " at offset ", t.offset_,
                            " is part of a larger storage");
  record_in_place(build(std::as_const(v.current)), v.current, false);
}
}  // namespace detail

/// `Tensor c = a * b + 2;` deduces the element type of the expression.
template <Expression E>
Tensor(E&&) -> Tensor<detail::value_t<E>>;

/// The expression form of an operand: a leaf for a tensor, the node itself otherwise.
template <Element T>
detail::Leaf<T> as_expr(const Tensor<T>& t) { return t.leaf(); }
template <Expression E>
E&& as_expr(E&& e) { return std::forward<E>(e); }

/// Evaluates an expression into a new tensor (deferred like any assignment).
template <Operand E>
auto eval(E&& e) {
  return Tensor<detail::value_t<decltype(as_expr(std::forward<E>(e)))>>(std::forward<E>(e));
}

namespace detail {
// The library's own statements that autograd never records (optimizer
// updates, masks, checks of indices, gradients' own arithmetic) use these
// forms: an ordinary statement compiles its expression's derivatives too, in
// case it is recorded, and here they would be code no program runs.

/// Evaluates `e` into a new tensor, never recorded by autograd.
template <class E>
auto eval_untracked(E&& e) {
  return record_expression<false>(as_expr(std::forward<E>(e)));
}
/// `t = e` (the same write) under autograd::pause.
template <Element T, class E>
Tensor<T>& assign_untracked(Tensor<T>& t, E&& e) {
  static_assert(std::is_same_v<value_t<expr_t<E>>, T>, "deft: assign_untracked: the element types differ");
  autograd::pause untracked;
  return t.template assign_expression<false>(expr_t<E>(as_expr(std::forward<E>(e))));
}
}  // namespace detail

}  // namespace deft
