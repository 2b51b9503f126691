// Autograd's values and the gathering of gradients: the Meta a recorded
// tensor carries, and the table through which nodes add a gradient for
// their inputs (summed over broadcast axes) and hand it to x.grad().
#pragma once
#include <memory>
#include <utility>

#include "../expr/nodes.hpp"
#include "../expr/program.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/reduction.hpp"
#include "../tensor.hpp"
#include "meta.hpp"

namespace deft::autograd::detail {

template <class T>
struct Meta final : MetaBase {
  explicit Meta(const Shape& s) : shape(s) {}
  Shape shape;
  Tensor<T> grad;     // attached variables: what x.grad() returns
  Tensor<T> pending;  // during backward: the gradient gathered so far

  bool has_pending() const override { return static_cast<bool>(pending); }
  void clear_pending() override { pending = Tensor<T>(); }
  void deliver() override;
};

template <class T>
Meta<T>& meta_of(MetaBase& m) { return static_cast<Meta<T>&>(m); }

template <class T>
std::shared_ptr<Meta<T>> new_meta(const Shape& s, std::shared_ptr<Node> fn) {
  auto m = std::make_shared<Meta<T>>(s);
  m->grad_fn = std::move(fn);
  return m;
}

// Backward work uses these untracked forms only: a tracked form would make
// every derivative instantiate its own derivative, without end.
using deft::detail::eval_untracked;
using deft::detail::sum_untracked;

// Gathering gradients (adding them up, summing them over broadcast axes,
// handing them to x.grad()) and the backward of elementwise programs
// (programs.hpp) depend on the element type only, yet every recorded
// operation's node refers to them. They are reached through this table,
// which backward() fills: a translation unit that records operations but
// never calls backward() does not compile them (the README's first example
// spent a third of its code in gathering, and the program kernels are 20 KB
// more).
template <class T>
struct Gathering {
  void (*add)(MetaBase& m, Tensor<T> g) = nullptr;
  void (*add_summed)(MetaBase& m, const Shape& target, Tensor<T> g) = nullptr;
  void (*deliver)(Meta<T>& m) = nullptr;
  void (*program_backward)(const deft::detail::ElementwiseProgram<T>& program, const Tensor<T>& up) = nullptr;
};
template <class T>
inline Gathering<T> gathering;

/// Adds g (of m's shape) to the gradient gathered for m.
template <class T>
void add_gathered(MetaBase& m, Tensor<T> g) {
  auto& mt = meta_of<T>(m);
  if (mt.attached && mt.req == GradReq::null) return;
  mt.pending = mt.pending ? eval_untracked(mt.pending + g) : std::move(g);
}

/// Adds g, computed for a broadcast use of a value of shape `target`, after
/// summing it over the broadcast axes (numpy's rule, undone).
template <class T>
void add_gathered_summed(MetaBase& m, const Shape& target, Tensor<T> g) {
  const Shape s = g.shape();
  if (!(s == target)) {
    const int lead = s.rank() - target.rank();
    for (int i = target.rank() - 1; i >= 0; --i)  // trailing axes first: the leading ones keep their numbers
      if (target[i] == 1 && s[lead + i] != 1) g = sum_untracked(g, lead + i, true);
    for (int i = 0; i < lead; ++i) g = sum_untracked(g, 0, false);
  }
  add_gathered<T>(m, std::move(g));
}

template <class T>
void deliver_gathered(Meta<T>& m) {
  if (m.req == GradReq::write) m.grad.assign(m.pending);
  else if (m.req == GradReq::add) m.grad += m.pending;
  m.fresh_grad = true;
}

template <class T>
void Meta<T>::deliver() { gathering<T>.deliver(*this); }

/// Adds g (of m's shape) to the gradient gathered for m.
template <class T>
void accumulate(MetaBase& m, Tensor<T> g) { gathering<T>.add(m, std::move(g)); }

/// Adds g, computed for a broadcast use of a value of shape `target`, after
/// summing it over the broadcast axes. An expression is evaluated once
/// first, so that each derivative costs one kernel.
template <class T>
void accumulate_to(MetaBase& m, const Shape& target, Tensor<T> g) {
  gathering<T>.add_summed(m, target, std::move(g));
}
template <class T, Expression G>
void accumulate_to(MetaBase& m, const Shape& target, G&& g) {
  accumulate_to<T>(m, target, Tensor<T>(eval_untracked(std::forward<G>(g))));
}

/// The visitor backprop() calls for every recorded leaf.
struct AccumulateLeaf {
  template <class T, class G>
  void operator()(const deft::detail::Leaf<T>& leaf, G&& g) const {
    accumulate_to<T>(*leaf.grad, leaf.shape(), std::forward<G>(g));
  }
};

template <class T>
const Tensor<T>& gathered(MetaBase& out) { return meta_of<T>(out).pending; }

/// A tensor reading a leaf's version (for backward formulas needing a Tensor).
template <class T>
Tensor<T> tensor_of(const deft::detail::Leaf<T>& l) {
  return deft::detail::tensor_from_buffer<T>(l.buffer, l.extent, l.offset);
}

template <class E>
void add_leaf_metas(Node& n, const E& e) {
  e.for_each_leaf([&](const auto& leaf) {
    if (leaf.grad) n.inputs.push_back(leaf.grad);
  });
}

}  // namespace deft::autograd::detail
