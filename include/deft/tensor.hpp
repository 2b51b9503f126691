// Tensor<T>: a cheap shared handle to possibly-deferred storage.
//
// Handles share a Var (the storage identity); the Var points at the current
// Buffer version. `t = expr` rebinds this handle (other handles keep the old
// value, as in libtorch) and reuses the storage in place when nobody else can
// see it; `t += x` and writes through views change the shared storage.
// Readers of a version hold that Buffer, so a later write to a Var that still
// has readers goes to a fresh buffer (copy-on-write) instead of waiting.
#pragma once
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/shape.hpp"
#include "engine/engine.hpp"
#include "eval/executor.hpp"
#include "expr/nodes.hpp"

namespace deft {

namespace detail {

struct Var {
  explicit Var(std::shared_ptr<Buffer> b) : current(std::move(b)) {}
  std::mutex m;
  std::shared_ptr<Buffer> current;
};

template <Element T>
Tensor<T> tensor_from_buffer(std::shared_ptr<Buffer> b, const Shape& s);

/// Bytes of a T tensor of shape s; std::length_error when that overflows.
template <Element T>
std::size_t bytes_for(const Shape& s) {
  // PTRDIFF_MAX, as std::allocator's max_size: larger objects overflow the
  // allocator's rounding to the alignment and pointer differences.
  if (std::uint64_t(s.size()) > std::uint64_t(std::numeric_limits<std::ptrdiff_t>::max()) / sizeof(T))
    raise<std::length_error>("a ", dtype_name_of<T>, " tensor of shape ", s.to_string(), " needs more bytes than fit in memory");
  return std::size_t(s.size()) * sizeof(T);
}

/// Records a task that writes a new tensor of `shape`: kernel(Buffer&) fills
/// it; add_inputs(Task&) declares what it reads.
template <Element T, class Kernel, class AddInputs>
Tensor<T> record_new(const char* name, const Shape& shape, Device dev, Kernel kernel, AddInputs&& add_inputs) {
  require_backend(dev, name);
  auto buf = std::make_shared<Buffer>(bytes_for<T>(shape), dev);
  auto task = make_task(name, buf->bytes, std::move(kernel));
  add_inputs(*task);
  task->output = buf;
  buf->producer = task;
  Engine::get().record(std::move(task));
  return tensor_from_buffer<T>(std::move(buf), shape);
}

/// An add_inputs callable for record_new: the task reads every leaf of `e`.
template <class E>
auto reads_of(const E& e) {
  return [&e](Task& t) { e.for_each_leaf([&](const auto& leaf) { t.add_input(leaf.buffer); }); };
}

/// Records the evaluation of an elementwise expression into a new tensor.
template <Expression E>
Tensor<value_t<E>> record_expression(const E& e) {
  using T = value_t<E>;
  return record_new<T>(
      "elementwise", e.shape(), e.device(), [e](Buffer& out) { on_device(out.device, [&](auto ex) { ex.evaluate(e, out.as<T>()); }); },
      reads_of(e));
}

}  // namespace detail

namespace detail {
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
    if (!values.empty()) std::memcpy(buf->data, values.data(), buf->bytes);
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
    auto x = as_expr(std::forward<E>(e));
    static_assert(std::is_same_v<detail::value_t<decltype(x)>, T>,
                  "deft: the expression's element type differs from the tensor's; use deft::cast<U>(expr)");
    if (var_ && var_.use_count() == 1 && x.shape() == shape_ && offset_ == 0 && covers_storage() && x.device() == device())
      write([&](const detail::Leaf<T>&) { return std::move(x); }, "assign");
    else
      *this = detail::record_expression(std::move(x));
    return *this;
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
  Device device() const { return var().current->device; }
  static constexpr DType dtype() { return dtype_of<T>; }
  /// False for a default-constructed handle.
  explicit operator bool() const { return static_cast<bool>(var_); }
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
    return v;
  }
  /// A deep copy (recorded like any other task).
  Tensor clone() const { return Tensor(leaf()); }

  // --- sync points ----------------------------------------------------------
  /// Blocks until the value is computed; rethrows a failure of the work behind it.
  void wait_to_read() const { wait(buffer()); }
  /// Copies the values out (MXNet's asnumpy).
  std::vector<T> to_vector() const {
    auto b = buffer();
    wait(b);
    const T* p = b->template as<const T>() + offset_;
    return std::vector<T>(p, p + size());
  }
  /// The single value of a one-element tensor (MXNet's asscalar).
  T item() const {
    var();  // an empty handle is the first thing wrong
    if (size() != 1) detail::raise("item(): needs a tensor with one element, got shape ", shape_.to_string());
    auto b = buffer();
    wait(b);
    return b->template as<const T>()[offset_];
  }

  // --- internal -------------------------------------------------------------
  /// A snapshot of the current version, as an expression leaf.
  detail::Leaf<T> leaf() const { return detail::Leaf<T>(buffer(), offset_, shape_); }

 private:
  template <Element U>
  friend Tensor<U> detail::tensor_from_buffer(std::shared_ptr<detail::Buffer>, const Shape&);

  detail::Var& var() const {
    if (!var_) detail::raise<std::logic_error>("use of an empty Tensor handle (default-constructed or moved from)");
    return *var_;
  }
  std::shared_ptr<detail::Buffer> buffer() const {
    auto& v = var();
    std::lock_guard lk(v.m);
    return v.current;
  }
  bool covers_storage() const { return std::size_t(size()) * sizeof(T) == var().current->bytes; }

  static void wait(const std::shared_ptr<detail::Buffer>& b) {
    if (b->producer && !b->producer->finished()) detail::Engine::get().wait(b->producer);
    if (b->error) std::rethrow_exception(b->error);
  }

  template <class Op, class X>
    requires Operand<X> || Scalar<X>
  Tensor& update(X&& x, const char* op) {
    auto rhs = detail::operand<T>(std::forward<X>(x));
    write([&](detail::Leaf<T> self) { return detail::Binary<Op, detail::Leaf<T>, decltype(rhs)>(std::move(self), std::move(rhs)); },
          op);
    return *this;
  }

  // Writes build(current value as a leaf), an expression of this shape, into
  // this handle's storage region.
  template <class Build>
  void write(Build&& build, const char* op) {
    auto& v = var();
    std::shared_ptr<detail::Task> task;
    {
      std::lock_guard lk(v.m);
      std::shared_ptr<detail::Buffer> cur = v.current;
      auto e = build(detail::Leaf<T>(cur, offset_, shape_));
      if (!(e.shape() == shape_))
        detail::raise(op, ": the result has shape ", e.shape().to_string(), " but the tensor being written has shape ",
                      shape_.to_string());
      detail::require_backend(cur->device, op);
      if (!(e.device() == cur->device))
        detail::raise(op, ": cannot write a value on ", e.device(), " into a tensor on ", cur->device);
      // The task's own reads of `cur` stop owning it (see Leaf); it is
      // ordered after cur's producer and keeps cur alive itself.
      bool reads_cur = false, overlaps = false;
      e.for_each_leaf([&](auto& l) {
        if (l.source != cur.get()) return;
        reads_cur = true;
        if (l.offset != offset_ || !(l.extent == shape_)) overlaps = true;
        l.buffer.reset();
      });
      const bool whole = offset_ == 0 && covers_storage();
      const std::int64_t off = offset_;
      const std::size_t bytes = cur->bytes;
      // use_count: `cur` here and v.current. More means a reader we cannot order.
      if (!overlaps && cur.use_count() == 2) {
        // Nobody else can see this version: write it in place.
        task = detail::make_task(op, std::size_t(size()) * sizeof(T), [e, off](detail::Buffer& out) {
          detail::on_device(out.device, [&](auto ex) { ex.evaluate(e, out.as<T>() + off); });
        });
        if (!reads_cur && whole) detail::Engine::get().supersede(cur->producer, *task);
        else task->add_input(cur);
        task->output = cur;
        cur->producer = task;
      } else {
        // Copy-on-write: pending readers keep the old version.
        auto fresh = std::make_shared<detail::Buffer>(bytes, cur->device);
        auto old = (reads_cur || !whole) ? cur : nullptr;  // still read: the task keeps it alive
        task = detail::make_task(op, bytes, [e, off, whole, old](detail::Buffer& out) {
          if (!whole) std::memcpy(out.data, old->data, old->bytes);
          detail::on_device(out.device, [&](auto ex) { ex.evaluate(e, out.as<T>() + off); });
        });
        if (reads_cur || !whole) task->add_input(cur);
        task->output = fresh;
        fresh->producer = task;
        v.current = std::move(fresh);
      }
      e.for_each_leaf([&](const auto& l) {
        if (l.buffer) task->add_input(l.buffer);
      });
    }
    detail::Engine::get().record(std::move(task));
  }

  std::shared_ptr<detail::Var> var_;
  std::int64_t offset_ = 0;
  Shape shape_;
};

namespace detail {
template <Element T>
Tensor<T> tensor_from_buffer(std::shared_ptr<Buffer> b, const Shape& s) {
  Tensor<T> t;
  t.var_ = std::make_shared<Var>(std::move(b));
  t.shape_ = s;
  return t;
}
}  // namespace detail

/// `Tensor c = a * b + 2;` deduces the element type of the expression.
template <Expression E>
Tensor(E&&) -> Tensor<detail::value_t<E>>;

/// The expression form of an operand: a leaf for a tensor, the node itself otherwise.
template <Element T>
detail::Leaf<T> as_expr(const Tensor<T>& t) { return t.leaf(); }
template <Expression E>
std::remove_cvref_t<E> as_expr(E&& e) { return std::forward<E>(e); }

/// Evaluates an expression into a new tensor (deferred like any assignment).
template <Operand E>
auto eval(E&& e) {
  return Tensor<detail::value_t<decltype(as_expr(std::forward<E>(e)))>>(std::forward<E>(e));
}

}  // namespace deft
