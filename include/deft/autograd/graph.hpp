// The recorded graph and the backward pass. Inside autograd::record every
// operation reading a variable (attach_grad) or a value computed from one
// gives its result a Meta whose grad_fn is a Node holding what the
// derivative needs: the expression itself (its leaves keep the versions of
// the inputs they read alive, so later in-place writes cannot change them).
// backward() walks the nodes in reverse topological order; every gradient is
// an ordinary deferred task, so independent ones run in parallel.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../expr/nodes.hpp"
#include "../expr/program.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/creation.hpp"
#include "../ops/linalg.hpp"
#include "../ops/reduction.hpp"
#include "../tensor.hpp"
#include "backprop.hpp"
#include "gathering.hpp"
#include "meta.hpp"
#include "programs.hpp"

namespace deft::autograd::detail {

// --- nodes -------------------------------------------------------------------

template <class E>
struct ElementwiseNode final : Node {
  E e;
  explicit ElementwiseNode(E x) : Node("elementwise"), e(std::move(x)) { add_leaf_metas(*this, e); }
  void backward(MetaBase& out) override {
    AccumulateLeaf visit;
    backprop(e, gathered<value_t<E>>(out), visit);
  }
  void check_differentiable() const override { detail::check_differentiable(e); }
};

template <class Reducer, class E>
struct ReduceNode final : Node {
  using T = value_t<E>;
  E e;
  Tensor<T> result;  // the forward value (max, min, norm need it)
  int axis;
  bool all;
  bool keepdims;

  ReduceNode(E x, Tensor<T> y, int ax, bool over_all, bool keep)
      : Node("reduce"), e(std::move(x)), result(std::move(y)), axis(ax), all(over_all), keepdims(keep) {
    add_leaf_metas(*this, e);
  }

  // v (the reduced shape) seen with the reduced axis kept as 1, so that it
  // broadcasts against the input.
  Tensor<T> kept(const Tensor<T>& v) const {
    if (all || keepdims) return v;
    const Shape in = e.shape();  // by value for some nodes: one copy for begin and end
    std::vector<std::int64_t> dims(in.begin(), in.end());
    dims[axis] = 1;
    return v.reshape(dims);
  }

  void check_differentiable() const override { detail::check_differentiable(e); }
  void backward(MetaBase& out) override {
    namespace d = deft::detail;
    const Shape in = e.shape();
    const auto g = d::BroadcastTo(kept(gathered<T>(out)).leaf(), in);
    AccumulateLeaf visit;
    if constexpr (std::is_same_v<Reducer, d::MeanReducer<T>>) {
      backprop(e, g / T(all ? in.size() : in[axis]), visit);
    } else if constexpr (std::is_same_v<Reducer, d::SumReducer<T>>) {
      backprop(e, g, visit);
    } else if constexpr (std::is_same_v<Reducer, d::MaxReducer<T>> || std::is_same_v<Reducer, d::MinReducer<T>>) {
      // Tied extremes share the gradient evenly, so that it sums to the
      // upstream one (a valid subgradient; PyTorch's rule for a whole-tensor max).
      const Tensor<T> hit = e == kept(result);
      const Tensor<T> ties = all ? Tensor<T>(sum(hit)) : Tensor<T>(sum(hit, axis, true));
      backprop(e, g * hit / maximum(d::BroadcastTo(ties.leaf(), in), T(1)), visit);
    } else if constexpr (std::is_same_v<Reducer, d::NormReducer<T>>) {
      const auto y = kept(result);
      backprop(e, where(y == T(0), T(0), g * e / y), visit);
    } else {
      static_assert(sizeof(Reducer) == 0, "deft autograd: no derivative for this reduction");
    }
  }
};

template <class T>
struct DotNode final : Node {
  deft::detail::Leaf<T> a, b;
  DotNode(deft::detail::Leaf<T> x, deft::detail::Leaf<T> y) : Node("dot"), a(std::move(x)), b(std::move(y)) {
    if (a.grad) inputs.push_back(a.grad);
    if (b.grad) inputs.push_back(b.grad);
  }
  void backward(MetaBase& out) override {
    const Tensor<T>& g = gathered<T>(out);
    const Tensor<T> ta = tensor_of(a), tb = tensor_of(b);
    const int ra = a.extent.rank(), rb = b.extent.rank();
    auto give = [](const deft::detail::Leaf<T>& l, auto&& v) {
      if (l.grad) accumulate_to<T>(*l.grad, l.extent, std::forward<decltype(v)>(v));
    };
    auto row = [](const Tensor<T>& v) { return v.reshape({1, -1}); };
    auto col = [](const Tensor<T>& v) { return v.reshape({-1, 1}); };
    // op(x) · op(y), op swapping the last two axes where asked: the GEMM
    // reads a transposed operand in place, no transposed copy is recorded.
    auto product = [](const Tensor<T>& x, bool tx, const Tensor<T>& y, bool ty) {
      return record_product(x.leaf(), tx, y.leaf(), ty, "dot");
    };
    if (ra == 1 && rb == 1) {  // () = (k)(k)
      give(a, g * tb);
      give(b, g * ta);
    } else if (ra == 2 && rb == 1) {  // (m) = (m,k)(k)
      give(a, col(g) * row(tb));
      give(b, product(ta, true, g, false));
    } else if (ra == 1 && rb == 2) {  // (n) = (k)(k,n)
      give(a, dot(tb, g));
      give(b, col(ta) * row(g));
    } else if (ra == 3 && rb == 1) {  // (B,m) = (B,m,k)(k): the (m,k)(k) case over B*m rows
      const std::int64_t k = a.extent[2];
      if (a.grad) give(a, Tensor<T>(col(g) * row(tb)).reshape({a.extent[0], a.extent[1], k}));
      if (b.grad) give(b, product(ta.reshape({-1, k}), true, g.reshape({-1}), false));
    } else if (ra == 3 && rb == 2) {  // (B,m,n) = (B,m,k)(k,n): rows of all batches share b
      if (a.grad) give(a, product(g, false, tb, true));
      if (b.grad) give(b, product(ta.reshape({-1, a.extent[2]}), true, g.reshape({-1, g.shape()[2]}), false));
    } else {  // (m,n) = (m,k)(k,n), and (B,m,n) = (B,m,k)(B,k,n) batch by batch
      if (a.grad) give(a, product(g, false, tb, true));
      if (b.grad) give(b, product(ta, true, g, false));
    }
  }
};

template <class T>
struct TransposeNode final : Node {
  deft::detail::Leaf<T> in;
  std::vector<int> inverse;
  TransposeNode(deft::detail::Leaf<T> x, const std::vector<int>& perm) : Node("transpose"), in(std::move(x)) {
    inverse.resize(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = int(i);
    inputs.push_back(in.grad);
  }
  void backward(MetaBase& out) override {
    accumulate_to<T>(*in.grad, in.extent, transpose(gathered<T>(out), inverse));
  }
};

/// A view (reshape, or rows [begin, end) of a source of shape `source`).
template <class T>
struct ViewNode final : Node {
  Shape source;
  std::int64_t begin, end;  // rows; begin < 0 for a reshape
  ViewNode(std::shared_ptr<MetaBase> src, const Shape& s, std::int64_t b, std::int64_t e)
      : Node(b < 0 ? "reshape" : "rows"), source(s), begin(b), end(e) {
    inputs.push_back(std::move(src));
  }
  void backward(MetaBase& out) override {
    const Tensor<T>& g = gathered<T>(out);
    const std::vector<std::int64_t> dims(source.begin(), source.end());
    if (begin < 0) return accumulate<T>(*inputs[0], g.reshape(dims));
    Tensor<T> full = zeros<T>(source, g.device());
    full.rows(begin, end).assign(g);
    accumulate<T>(*inputs[0], full);
  }
};

/// A copy to another device: the gradient goes back to the source's device.
template <class T>
struct CopyNode final : Node {
  Device from;
  explicit CopyNode(const deft::detail::Leaf<T>& x) : Node("to"), from(x.device()) { inputs.push_back(x.grad); }
  void backward(MetaBase& out) override { accumulate<T>(*inputs[0], gathered<T>(out).to(from)); }
};

// --- the hooks the operations call -----------------------------------------

// Integer results carry no record: gradients stop at them, as at comparisons.
// `e` is consumed (an rvalue: E is not a reference).
template <class T, class E>
void track_elementwise(Tensor<T>& out, E&& e) {
  static_assert(!std::is_reference_v<E>, "track_elementwise consumes its expression");
  if constexpr (std::is_floating_point_v<T>) {
    std::shared_ptr<Node> node;
    if constexpr (deft::detail::has_program<E>) node = std::make_shared<ProgramNode<T>>(deft::detail::program_of(std::move(e)));
    else node = std::make_shared<ElementwiseNode<E>>(std::move(e));
    out.set_grad_meta(new_meta<T>(out.shape(), std::move(node)));
  }
}

template <class Reducer, class T, class E>
void track_reduce(Tensor<T>& out, const E& in, int axis, bool all, bool keepdims) {
  if constexpr (std::is_floating_point_v<T>)
    out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<ReduceNode<Reducer, E>>(in, out, axis, all, keepdims)));
}

template <class T>
void track_dot(Tensor<T>& out, const deft::detail::Leaf<T>& a, const deft::detail::Leaf<T>& b) {
  if constexpr (std::is_floating_point_v<T>)
    out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<DotNode<T>>(a, b)));
}

template <class T>
void track_transpose(Tensor<T>& out, const deft::detail::Leaf<T>& in, const std::vector<int>& perm) {
  if constexpr (std::is_floating_point_v<T>)
    out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<TransposeNode<T>>(in, perm)));
}

template <class T>
void track_view(Tensor<T>& view, const Tensor<T>& source, std::int64_t row_begin, std::int64_t row_end) {
  view.set_grad_meta(new_meta<T>(view.shape(), std::make_shared<ViewNode<T>>(source.grad_meta(), source.shape(),
                                                                           row_begin, row_end)));
}

template <class T>
void track_copy(Tensor<T>& out, const deft::detail::Leaf<T>& in) {
  if constexpr (std::is_floating_point_v<T>)
    out.set_grad_meta(new_meta<T>(out.shape(), std::make_shared<CopyNode<T>>(in)));
}

// --- Tensor's entry points ----------------------------------------------------

template <class T>
void attach_grad(Tensor<T>& x, GradReq req) {
  auto m = std::make_shared<Meta<T>>(x.shape());
  m->attached = true;
  m->req = req;
  m->grad = zeros<T>(x.shape(), x.device());
  x.set_grad_meta(std::move(m));
}

template <class T>
Tensor<T> grad_of(const Tensor<T>& x) {
  const auto& m = x.grad_meta();
  if (!m || !m->attached)
    deft::detail::raise<std::logic_error>("grad(): this tensor (shape ", x.shape().to_string(),
                                          ") has no gradient; call attach_grad() on it before recording");
  return meta_of<T>(*m).grad;
}

/// Whether backward() wrote x's gradient since the last forget_fresh_grad(x).
template <class T>
bool grad_is_fresh(const Tensor<T>& x) {
  const auto& m = x.grad_meta();
  return m && m->attached && m->fresh_grad;
}
template <class T>
void forget_fresh_grad(const Tensor<T>& x) {
  if (const auto& m = x.grad_meta()) m->fresh_grad = false;
}

/// The metas reachable from `root`, each after every meta that reads it.
inline std::vector<MetaBase*> reverse_topological(MetaBase* root) {
  std::vector<MetaBase*> post;
  std::unordered_set<MetaBase*> seen{root};
  std::vector<std::pair<MetaBase*, std::size_t>> stack{{root, 0}};
  while (!stack.empty()) {
    MetaBase* m = stack.back().first;
    const Node* fn = m->grad_fn.get();
    if (fn && stack.back().second < fn->inputs.size()) {
      MetaBase* child = fn->inputs[stack.back().second++].get();
      if (seen.insert(child).second) stack.emplace_back(child, 0);
      continue;
    }
    post.push_back(m);
    stack.pop_back();
  }
  std::reverse(post.begin(), post.end());  // the root first, inputs after all their readers
  return post;
}

/// Fills the gathering tables of both floating-point types (a cast joins
/// them in one graph), once per program; a template, so that only the
/// translation units calling backward() instantiate it.
template <int = 0>
void install_gathering() {
  static const bool installed = [] {
    gathering<float> = {&add_gathered<float>, &add_gathered_summed<float>, &deliver_gathered<float>,
                        &program_backward<float>};
    gathering<double> = {&add_gathered<double>, &add_gathered_summed<double>, &deliver_gathered<double>,
                         &program_backward<double>};
    return true;
  }();
  (void)installed;
}

template <class T>
void backward(const Tensor<T>& y, const Tensor<T>* head, bool retain_graph) {
  static_assert(std::is_floating_point_v<T>, "deft: backward needs a float or double value");
  const auto root = y.grad_meta();
  const auto freed = [] {
    deft::detail::raise<std::logic_error>(
        "backward(): the graph behind this value was freed by an earlier backward(); pass retain_graph = true to "
        "that call to run backward() through the graph again");
  };
  if (root && root->graph_freed) freed();
  if (!root || (!root->grad_fn && !root->attached))
    deft::detail::raise<std::logic_error>(
        "backward(): this value (shape ", y.shape().to_string(),
        ") was not computed inside autograd::record from a tensor with attach_grad(), so it has no graph");
  if (head && !(head->shape() == y.shape()))
    deft::detail::raise("backward(): the head gradient has shape ", head->shape().to_string(), " but the value has shape ",
                        y.shape().to_string());
  if (head && !(head->device() == y.device()))
    deft::detail::raise("backward(): the head gradient is on ", head->device(), " but the value is on ", y.device());
  install_gathering();
  pause no_recording;  // gradients are plain deferred work, not recorded again
  const auto order = reverse_topological(root.get());
  // Checked before any gradient moves: the values that lost their graph
  // would silently pass nothing on to their inputs, and a node without a
  // derivative (a deft::map) would leave some x.grad() updated, some not.
  if (std::ranges::any_of(order, &MetaBase::graph_freed)) freed();
  for (auto* m : order)
    if (m->grad_fn) m->grad_fn->check_differentiable();
  for (auto* m : order) m->clear_pending();
  meta_of<T>(*root).pending = head ? *head : ones<T>(y.shape(), y.device());
  for (auto* m : order) {
    if (!m->has_pending()) continue;
    if (m->grad_fn) m->grad_fn->backward(*m);
    if (m->attached) m->deliver();
    m->clear_pending();
  }
  if (!retain_graph) {
    // Free the saved values. Nodes own the metas of their inputs, so they are
    // all detached first and destroyed together, after the last use of `order`.
    std::vector<std::shared_ptr<Node>> nodes;
    for (auto* m : order)
      if (m->grad_fn) {
        nodes.push_back(std::move(m->grad_fn));
        m->graph_freed = true;
      }
  }
}

}  // namespace deft::autograd::detail
