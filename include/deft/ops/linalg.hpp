// Matrix products and transposes. Both materialise: each records one task,
// so independent products run in parallel (`dot(a, b) + dot(c, d)`).
#pragma once
#include <array>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "../eval/executor.hpp"
#include "elementwise.hpp"
#include "../tensor.hpp"

namespace deft {
namespace detail {

/// How a product maps onto `batch` GEMMs of (m x k) * (k x n).
struct ProductPlan {
  std::int64_t batch = 1, m = 1, n = 1, k = 1;
  bool shared_rhs = true;  // the right operand is the same matrix for every batch
  Shape out;
};

inline ProductPlan plan_product(const Shape& a, const Shape& b, const char* op) {
  auto fail = [&] {
    raise(op, ": cannot multiply shapes ", a.to_string(), " and ", b.to_string(),
          " (supported: (k)(k), (m,k)(k,n), (m,k)(k), (k)(k,n), (b,m,k)(b,k,n), (b,m,k)(k,n))");
  };
  ProductPlan p;
  const int ra = a.rank(), rb = b.rank();
  if (ra == 0 || rb == 0 || ra > 3 || rb > 3 || (ra < 3 && rb == 3)) fail();
  const std::int64_t ka = a[ra - 1], kb = rb == 1 ? b[0] : b[rb - 2];
  if (ka != kb)
    raise(op, ": inner extents differ: ", a.to_string(), " has ", ka, " columns but ", b.to_string(), " has ", kb,
          " rows");
  p.k = ka;
  p.m = ra >= 2 ? a[ra - 2] : 1;
  p.n = rb >= 2 ? b[rb - 1] : 1;
  if (ra == 3) p.batch = a[0];
  if (rb == 3) {
    if (b[0] != a[0]) raise(op, ": batch extents differ: ", a.to_string(), " and ", b.to_string());
    p.shared_rhs = false;
  }
  std::array<std::int64_t, 3> out{};
  std::size_t r = 0;
  if (ra == 3) out[r++] = p.batch;
  if (ra >= 2) out[r++] = p.m;
  if (rb >= 2) out[r++] = p.n;
  p.out = Shape(std::span<const std::int64_t>(out.data(), r));  // checks the count fits 64 bits: (2^40, 0) x (0, 2^40) does not
  return p;
}

/// A leaf over a contiguous value: tensors as they are, expressions evaluated first.
template <class X>
auto materialized_leaf(X&& x) {
  if constexpr (is_tensor<std::remove_cvref_t<X>>::value) return x.leaf();
  else return eval(std::forward<X>(x)).leaf();
}

/// `s` with its last two axes swapped (unchanged below rank 2).
inline Shape swap_last_axes(Shape s) {
  if (s.rank() >= 2) std::swap(s[s.rank() - 2], s[s.rank() - 1]);
  return s;
}

/// What a product task does to its output after the GEMM: nothing, here. An
/// epilogue (nn::Dense's bias and activation) runs in the same task, on the
/// output while it is still in cache, and saves a task per layer.
struct NoEpilogue {
  template <class Ex>
  void apply(Ex, Buffer&, const Shape&) const {}
  void add_inputs(Task&) const {}
};

/// op(a) · op(b) as one task, where op swaps the last two axes of an operand
/// when asked: the GEMM reads the operand transposed, no copy is made; then
/// epilogue.apply(executor, output, shape).
/// Untracked (dot tracks its result; gradients call this directly).
template <class T, class Epilogue = NoEpilogue>
Tensor<T> record_product(const Leaf<T>& la, bool ta, const Leaf<T>& lb, bool tb, const char* op,
                         Epilogue epilogue = {}) {
  ta = ta && la.shape().rank() >= 2;
  tb = tb && lb.shape().rank() >= 2;
  const auto plan = plan_product(ta ? swap_last_axes(la.shape()) : la.shape(),
                                 tb ? swap_last_axes(lb.shape()) : lb.shape(), op);
  const Device dev = common_device(la, lb, op);
  return record_new<T>(
      op, plan.out, dev,
      [la, lb, plan, ta, tb, epilogue](Buffer& out) {
        const T* pa = la.source->template as<const T>() + la.offset;
        const T* pb = lb.source->template as<const T>() + lb.offset;
        T* pc = out.as<T>();
        on_device(out.device, [&](auto ex) {
          for (std::int64_t i = 0; i < plan.batch; ++i)
            ex.gemm(plan.m, plan.n, plan.k, pa + i * plan.m * plan.k, pb + (plan.shared_rhs ? 0 : i * plan.k * plan.n),
                    pc + i * plan.m * plan.n, ta, tb);
          epilogue.apply(ex, out, plan.out);
        });
      },
      [&](Task& t) {
        t.add_input(la.buffer);
        t.add_input(lb.buffer);
        epilogue.add_inputs(t);
      });
}

}  // namespace detail

/// Matrix product (numpy dot for ranks 1-2, batched for rank 3).
template <Operand A, Operand B>
auto dot(A&& a, B&& b) {
  {  // shapes and devices first: a bad product records nothing (not even its operands' evaluation)
    const auto ea = as_expr(a);
    const auto eb = as_expr(b);
    (void)detail::plan_product(ea.shape(), eb.shape(), "dot");
    (void)detail::common_device(ea, eb, "dot");
  }
  auto la = detail::materialized_leaf(std::forward<A>(a));
  auto lb = detail::materialized_leaf(std::forward<B>(b));
  using T = detail::value_t<decltype(la)>;
  static_assert(std::is_same_v<T, detail::value_t<decltype(lb)>>,
                "deft: dot needs operands of one element type; use deft::cast<U>(x)");
  auto out = detail::record_product(la, false, lb, false, "dot");
  if (autograd::is_recording() && (la.grad || lb.grad)) autograd::detail::track_dot(out, la, lb);
  return out;
}
/// Same as dot.
template <Operand A, Operand B>
auto matmul(A&& a, B&& b) { return dot(std::forward<A>(a), std::forward<B>(b)); }

/// Axes permuted: out.shape[i] = x.shape[axes[i]] (a new tensor).
template <Operand X>
auto transpose(X&& x, const std::vector<int>& axes) {
  const Shape in = as_expr(x).shape();  // axes are checked before an expression operand is evaluated
  if (int(axes.size()) != in.rank())
    detail::raise("transpose: ", axes.size(), " axes given for a tensor of shape ", in.to_string());
  std::array<int, max_rank> perm{};
  std::array<bool, max_rank> seen{};
  Shape out;
  for (int d = 0; d < in.rank(); ++d) {
    const int a = normalize_axis(axes[d], in.rank(), "transpose");
    if (seen[a]) detail::raise("transpose: axis ", axes[d], " repeated for shape ", in.to_string());
    seen[a] = true;
    perm[d] = a;
    out.push_back(in[a]);
  }
  auto l = detail::materialized_leaf(std::forward<X>(x));
  using T = detail::value_t<decltype(l)>;
  auto result = detail::record_new<T>(
      "transpose", out, l.device(),
      [l, perm](detail::Buffer& b) {
        detail::on_device(b.device, [&](auto ex) {
          ex.permute(l.source->template as<const T>() + l.offset, l.shape(), perm, b.as<T>());
        });
      },
      [&](detail::Task& t) { t.add_input(l.buffer); });
  if (autograd::is_recording() && l.grad) autograd::detail::track_transpose(result, l, std::vector<int>(perm.begin(), perm.begin() + in.rank()));
  return result;
}
/// Axes reversed (the usual matrix transpose for rank 2).
template <Operand X>
auto transpose(X&& x) {
  const int r = as_expr(x).shape().rank();
  std::vector<int> axes(r);
  std::iota(axes.rbegin(), axes.rend(), 0);
  return transpose(std::forward<X>(x), axes);
}

}  // namespace deft
