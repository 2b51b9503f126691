// GPU evaluators ("how" on the device). Each is a Thrust algorithm whose
// functor is built from an expression's kernel view, so one fused tree is one
// kernel. They take a Thrust execution policy: the GPU executor passes a CUDA
// stream's policy, and deft's CPU-only tests pass thrust::cpp::par, which
// runs the same functors on the host (index arithmetic, broadcasting, the
// reduction order) on machines without a GPU.
//
// Reductions write their result into device memory (no copy back, nothing
// waits): a pass of one thread per output, or passes over partials where
// outputs are few and long (a full reduction is one output), whose reads
// are coalesced and whose order is fixed (the same bits on every run).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform.h>

#include "../../core/config.hpp"
#include "../../core/shape.hpp"
#include "../../expr/kernel_views.hpp"
#include "../../expr/ops.hpp"
#include "../random_draw.hpp"

namespace deft::detail::gpu {

/// Element i (row-major) of an expression whose view was collapsed to `s`.
/// `view`'s leaves may be repointed (for_each_leaf) before use.
///
/// Rank is the collapsed rank when it is 1 or 2 (nearly every tree once
/// collapsed), 0 for any rank. The fixed ranks index with compile-time
/// loops, so the view stays in registers; the run-time loop puts a copy of
/// the whole view on every thread's stack (864 bytes for a*b + c*2 - a,
/// which then ran at 4% of an H100's bandwidth).
template <class View, int Rank = 0>
struct ElementAt {
  using value_type = typename View::value_type;
  View view;
  std::int64_t ext[max_rank] = {};
  int rank = 0;

  ElementAt(const View& v, const Shape& s) : view(v), rank(s.rank()) {
    for (int d = 0; d < rank; ++d) ext[d] = s[d];
    if constexpr (Rank == 1) view.set_row(nullptr, 0);  // one row: positioned once, here
  }
  DEFT_HD value_type operator()(std::int64_t i) const {
    if constexpr (Rank == 1) {
      return view.at(i);
    } else if constexpr (Rank == 2) {
      View w = view;
      const std::int64_t r = i / ext[1];
      w.set_row(&r, 1);
      return w.at(i - r * ext[1]);
    } else {
      View w = view;
      if (rank <= 1) {
        w.set_row(nullptr, 0);
        return w.at(i);
      }
      std::int64_t idx[max_rank] = {};
      std::int64_t r = i / ext[rank - 1];
      const std::int64_t j = i % ext[rank - 1];
      for (int d = rank - 2; d >= 0; --d) {
        idx[d] = r % ext[d];
        r /= ext[d];
      }
      w.set_row(idx, rank - 1);
      return w.at(j);
    }
  }
};

template <class Expr>
using ViewOf = decltype(std::declval<const Expr&>().view(Shape{}));

/// The element functor of e for any rank (the tests repoint its leaves).
template <class Expr>
ElementAt<ViewOf<Expr>> element_at(const Expr& e) {
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());
  return {v, s};
}

/// f(element functor of e), with the functor specialised for e's collapsed rank.
template <class Expr, class F>
void with_element_at(const Expr& e, F&& f) {
  auto v = e.view(e.shape());
  const Shape s = collapse(v, e.shape());
  if (s.rank() <= 1) f(ElementAt<ViewOf<Expr>, 1>(v, s));
  else if (s.rank() == 2) f(ElementAt<ViewOf<Expr>, 2>(v, s));
  else f(ElementAt<ViewOf<Expr>>(v, s));
}

/// A functor that crosses to the device carries everything by value: a
/// reference member would point into the recording thread's stack.
template <class F>
inline constexpr bool device_safe_functor = std::is_trivially_copyable_v<F> && std::is_copy_assignable_v<F>;

template <class Policy, class F, class Out>
void for_each_output(const Policy& policy, std::int64_t n, const F& f, Out* out) {
  static_assert(device_safe_functor<F>, "deft: a GPU functor must hold its views by value");
  if (n <= 0) return;
  thrust::transform(policy, thrust::counting_iterator<std::int64_t>(0), thrust::counting_iterator<std::int64_t>(n),
                    out, f);
}

/// out (contiguous, e's shape) = e: one kernel for the whole tree.
template <class Policy, class Expr, class T>
void evaluate(const Policy& policy, const Expr& e, T* out) {
  with_element_at(e, [&](const auto& el) { for_each_output(policy, e.shape().size(), el, out); });
}

// --- reductions ----------------------------------------------------------------
//
// A reducer R has identity(), step(acc, x), merge(a, b) and finish(acc, n)
// (expr/reducers.hpp); argmax's (ArgmaxReducer below) steps with the
// element's index too. Every pass is R over a run of elements, so the sums,
// the means, the norms, max, min and argmax share one code path, full or
// along an axis.

/// acc after stepping R over x, element j of its run (j: the index along the
/// reduced axis, or in the whole input).
template <class R, class Acc, class X>
DEFT_HD Acc step_at(const Acc& acc, const X& x, std::int64_t j) {
  if constexpr (requires { R::step(acc, x, j); })
    return R::step(acc, x, j);
  else
    return R::step(acc, x);
}

/// R over elem(base + j * inner) for j = first, first + stride, ... below
/// end, in four accumulators merged at the end. A single chain compiles to
/// one load per loop turn (nvcc does not unroll it: the trip count and
/// stride are run-time values), so each thread has one load in flight
/// (65536 threads of one chain each keep about 256 KB in flight, where an
/// H100 needs MBs for its 3 TB/s). Four chains keep four loads in flight;
/// the order of the steps is fixed, so the bits are too.
template <class R, class Acc, class Elem>
DEFT_HD Acc reduce_run(const Elem& elem, std::int64_t base, std::int64_t inner, std::int64_t first, std::int64_t end,
                       std::int64_t stride) {
  Acc a0 = R::identity(), a1 = a0, a2 = a0, a3 = a0;
  std::int64_t j = first;
  for (; j + 3 * stride < end; j += 4 * stride) {
    // All four reads first: a step that branches on its element (argmax,
    // max with NaN) would otherwise put each read behind the previous
    // step's branches, one load in flight again (seen in the PTX).
    const auto x0 = elem(base + j * inner), x1 = elem(base + (j + stride) * inner),
               x2 = elem(base + (j + 2 * stride) * inner), x3 = elem(base + (j + 3 * stride) * inner);
    a0 = step_at<R>(a0, x0, j);
    a1 = step_at<R>(a1, x1, j + stride);
    a2 = step_at<R>(a2, x2, j + 2 * stride);
    a3 = step_at<R>(a3, x3, j + 3 * stride);
  }
  for (; j < end; j += stride) a0 = step_at<R>(a0, elem(base + j * inner), j);
  return R::merge(R::merge(a0, a1), R::merge(a2, a3));
}

/// R's partials as the elements of a further pass: their steps are
/// R::merge, and the last pass finishes as R would. MergeOf<MergeOf<R>> is
/// MergeOf<R> (merge_of_t), so a pass over partials of partials is the same
/// kernel and the recursion of reduce_axis_elements ends.
template <class R>
struct MergeOf {
  DEFT_HD static auto identity() { return R::identity(); }
  template <class A>
  DEFT_HD static A step(const A& acc, const A& x) { return R::merge(acc, x); }
  template <class A>
  DEFT_HD static A merge(const A& a, const A& b) { return R::merge(a, b); }
  template <class A>
  DEFT_HD static auto finish(const A& acc, std::int64_t n) { return R::finish(acc, n); }
};
template <class R>
struct MergeOfTrait {
  using type = MergeOf<R>;
};
template <class R>
struct MergeOfTrait<MergeOf<R>> {
  using type = MergeOf<R>;
};
template <class R>
using merge_of_t = typename MergeOfTrait<R>::type;

/// An earlier pass's partials, read as elements.
template <class T>
struct Partials {
  const T* in;
  DEFT_HD T operator()(std::int64_t i) const { return in[i]; }
};

/// The elements one thread of an AxisPlan visits: positions base + j * inner
/// for j = first, first + stride, ... below end.
struct AxisRun {
  std::int64_t base, inner, first, end, stride;
};

/// How a reduction along the middle axis of [outer, len, inner] is cut.
/// One thread per output runs `len` steps alone; with few outputs and long
/// ones (a bias gradient is a sum over the batch) most of the GPU would
/// idle, so each output is cut into `chunks` parts of at least min_chunk
/// elements. The partials are then reduced the same way (merge_split(), a
/// plan of its own), so no thread merges thousands of them one by one.
/// With fewer threads and longer parts (65536 threads, parts of 128 or more
/// merged in one pass) 16 threads would merge 4096 partials each, one by
/// one, on a 1048576x16 sum along axis 0; these figures (2^18 threads,
/// parts of 32 or more) keep that within a few percent of cuBLAS's gemv
/// (docs/gpu.md has the measured table).
struct AxisPlan {
  static constexpr std::int64_t enough_threads = std::int64_t(1) << 18, min_chunk = 32;
  std::int64_t outputs, len, inner, chunks = 1;
  explicit AxisPlan(const AxisSplit& g) : outputs(g.outer * g.inner), len(g.len), inner(g.inner) {
    if (outputs > 0 && outputs < enough_threads && len >= 4 * min_chunk) {
      chunks = std::min((enough_threads + outputs - 1) / outputs, len / min_chunk);
      chunks = (len + step() - 1) / step();  // no empty part
    }
  }
  /// Elements of each part (the last may have fewer).
  DEFT_HD std::int64_t step() const { return (len + chunks - 1) / chunks; }
  /// The partials as an axis to reduce in turn, in the order of the threads
  /// that wrote them (run()): [chunks, outputs] along an inner axis,
  /// [outputs, chunks] along the last one. Its outputs come out in this
  /// plan's order.
  AxisSplit merge_split() const { return inner == 1 ? AxisSplit(outputs, chunks, 1) : AxisSplit(1, chunks, outputs); }
  /// Scratch elements the partials need, the merge's own included (0: one pass, no scratch).
  std::int64_t scratch() const { return chunks > 1 ? outputs * chunks + AxisPlan(merge_split()).scratch() : 0; }
  /// The elements of thread t, which computes part c of output s.
  /// Neighbouring threads read neighbouring elements: along an inner axis
  /// the parts c of neighbouring outputs (t = c * outputs + s), along the
  /// last axis interleaved parts of one output (t = s * chunks + c; part c
  /// takes its elements c, c + chunks, ...). With one part, t = s.
  DEFT_HD AxisRun run(std::int64_t t) const {
    const std::int64_t s = inner == 1 ? t / chunks : t % outputs, c = inner == 1 ? t % chunks : t / outputs;
    const std::int64_t base = (s / inner) * len * inner + s % inner;
    if (inner == 1) return {base, 1, c, len, chunks};
    const std::int64_t end = (c + 1) * step() < len ? (c + 1) * step() : len;
    return {base, inner, c * step(), end, 1};
  }
};

/// Thread t of an AxisPlan: R over its run. Finish: one part per output,
/// so the result is R::finish with the count of the whole axis.
template <class R, class Elem, class Acc, bool Finish>
struct AxisPartial {
  Elem elem;
  AxisPlan plan;
  std::int64_t count;
  DEFT_HD auto operator()(std::int64_t t) const {
    const AxisRun r = plan.run(t);
    const Acc acc = reduce_run<R, Acc>(elem, r.base, r.inner, r.first, r.end, r.stride);
    if constexpr (Finish)
      return R::finish(acc, count);
    else
      return acc;
  }
};

/// out[o * inner + i] = R over j of elem(o, j, i) for g = [outer, len,
/// inner], finished with `count` elements per output (the original axis's
/// length, where elem are an earlier pass's partials). `scratch` holds
/// AxisPlan(g).scratch() accumulators (none when that is 0): the partials,
/// then what their own pass (merge_split()) needs.
template <class R, class Policy, class Elem, class Out, class Acc>
void reduce_axis_elements(const Policy& policy, const Elem& elem, const AxisSplit& g, std::int64_t count, Out* out,
                          Acc* scratch) {
  const AxisPlan plan(g);
  if (plan.chunks == 1) return for_each_output(policy, plan.outputs, AxisPartial<R, Elem, Acc, true>{elem, plan, count}, out);
  for_each_output(policy, plan.outputs * plan.chunks, AxisPartial<R, Elem, Acc, false>{elem, plan, count}, scratch);
  reduce_axis_elements<merge_of_t<R>>(policy, Partials<Acc>{scratch}, plan.merge_split(), count, out,
                                      scratch + plan.outputs * plan.chunks);
}
template <class R, class Policy, class Elem, class Out, class Acc>
void reduce_axis_elements(const Policy& policy, const Elem& elem, const AxisSplit& g, Out* out, Acc* scratch) {
  reduce_axis_elements<R>(policy, elem, g, g.len, out, scratch);
}
template <class R, class Policy, class Expr, class T>
void reduce_axis(const Policy& policy, const Expr& e, int axis, T* out, T* scratch) {
  with_element_at(e, [&](const auto& el) { reduce_axis_elements<R>(policy, el, AxisSplit(e.shape(), axis), out, scratch); });
}

/// A full reduction is one along the single axis of [1, n, 1]: 2^18
/// threads, each over interleaved elements (neighbours read neighbours),
/// then the partials' own passes. Three fixed passes (65536 threads, then
/// 256, then 1) would keep a quarter of the loads in flight and have 256
/// threads walk 256 partials each.
inline AxisSplit whole(std::int64_t n) { return AxisSplit(1, n, 1); }
/// Scratch accumulators a full reduction of n elements needs (0: none).
inline std::int64_t reduce_scratch(std::int64_t n) { return AxisPlan(whole(n)).scratch(); }

/// out[0] = R over elem(0 .. n-1); `scratch` holds reduce_scratch(n) accumulators.
template <class R, class Policy, class Elem, class Out, class Acc>
void reduce_elements(const Policy& policy, const Elem& elem, std::int64_t n, Out* out, Acc* scratch) {
  reduce_axis_elements<R>(policy, elem, whole(n), out, scratch);
}
/// out[0] = R over every element of e; `scratch` holds reduce_scratch(e's size) values.
template <class R, class Policy, class Expr, class T>
void reduce_all(const Policy& policy, const Expr& e, T* out, T* scratch) {
  with_element_at(e, [&](const auto& el) { reduce_elements<R>(policy, el, e.shape().size(), out, scratch); });
}

// --- argmax: index of the first largest value (the first NaN wins, as numpy) ---

template <class T>
struct ArgBest {
  T value;
  std::int64_t index;  // -1: nothing seen yet
};

/// Commutative and associative, so partials may merge in any grouping:
/// NaN beats numbers, a larger value beats a smaller, and ties go to the
/// lower index.
template <class T>
DEFT_HD ArgBest<T> better(const ArgBest<T>& a, const ArgBest<T>& b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  const bool na = is_nan(a.value), nb = is_nan(b.value);
  if (na != nb) return na ? a : b;
  if (!na && a.value != b.value) return a.value > b.value ? a : b;
  return a.index < b.index ? a : b;
}

/// argmax as a reducer: the accumulator is the best (value, index) so far,
/// and the result its index.
template <class T>
struct ArgmaxReducer {
  DEFT_HD static ArgBest<T> identity() { return {T(0), -1}; }
  DEFT_HD static ArgBest<T> step(const ArgBest<T>& acc, T x, std::int64_t j) { return better(acc, ArgBest<T>{x, j}); }
  DEFT_HD static ArgBest<T> merge(const ArgBest<T>& a, const ArgBest<T>& b) { return better(a, b); }
  DEFT_HD static std::int64_t finish(const ArgBest<T>& a, std::int64_t) { return a.index; }
};

/// out[0] = index of the first largest of elem(0 .. n-1); `scratch` holds
/// reduce_scratch(n) values.
template <class Policy, class Elem, class T = typename Elem::value_type>
void argmax_elements(const Policy& policy, const Elem& elem, std::int64_t n, std::int64_t* out, ArgBest<T>* scratch) {
  reduce_elements<ArgmaxReducer<T>>(policy, elem, n, out, scratch);
}
template <class Policy, class Expr, class T = value_t<Expr>>
void argmax_all(const Policy& policy, const Expr& e, std::int64_t* out, ArgBest<T>* scratch) {
  with_element_at(e, [&](const auto& el) { argmax_elements(policy, el, e.shape().size(), out, scratch); });
}

/// out[o * inner + i] = index along the axis of the first largest e[o, :, i];
/// `scratch` holds AxisPlan(g).scratch() values (none when that is 0).
template <class Policy, class Elem, class T = typename Elem::value_type>
void argmax_axis_elements(const Policy& policy, const Elem& elem, const AxisSplit& g, std::int64_t* out,
                          ArgBest<T>* scratch) {
  reduce_axis_elements<ArgmaxReducer<T>>(policy, elem, g, out, scratch);
}
template <class Policy, class Expr, class T = value_t<Expr>>
void argmax_axis(const Policy& policy, const Expr& e, int axis, std::int64_t* out, ArgBest<T>* scratch) {
  with_element_at(e, [&](const auto& el) { argmax_axis_elements(policy, el, AxisSplit(e.shape(), axis), out, scratch); });
}

// --- data movement and integer products ------------------------------------------

/// out[i] = in at the permuted position (out's dimension d is in's axes[d]).
template <class T>
struct PermuteAt {
  const T* in;
  int rank;
  std::int64_t out_ext[max_rank];
  std::int64_t src_stride[max_rank];
  DEFT_HD T operator()(std::int64_t i) const {
    std::int64_t src = 0;
    for (int d = rank - 1; d >= 0; --d) {
      src += (i % out_ext[d]) * src_stride[d];
      i /= out_ext[d];
    }
    return in[src];
  }
};

template <class Policy, class T>
void permute(const Policy& policy, const T* in, const Shape& in_shape, const std::array<int, max_rank>& axes, T* out) {
  PermuteAt<T> f{in, in_shape.rank(), {}, {}};
  const auto st = contiguous_strides(in_shape);
  std::int64_t total = 1;
  for (int d = 0; d < f.rank; ++d) {
    f.out_ext[d] = in_shape[axes[d]];
    f.src_stride[d] = st[axes[d]];
    total *= f.out_ext[d];
  }
  for_each_output(policy, total, f, out);
}

/// c[i, j] = sum over p of op(a)[i, p] * op(b)[p, j], one thread per element
/// (integer products, which cuBLAS has no routine for; wrapping arithmetic).
template <class T>
struct NaiveProduct {
  const T *a, *b;
  std::int64_t n, k;
  std::int64_t a_row, a_col, b_row, b_col;  // strides of op(a) and op(b)
  DEFT_HD T operator()(std::int64_t e) const {
    const std::int64_t i = e / n, j = e % n;
    T sum = T(0);
    for (std::int64_t p = 0; p < k; ++p) sum = Add{}(sum, Mul{}(a[i * a_row + p * a_col], b[p * b_row + j * b_col]));
    return sum;
  }
};

template <class Policy, class T>
void naive_gemm(const Policy& policy, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c,
                bool trans_a, bool trans_b) {
  NaiveProduct<T> f{a, b, n, k, trans_a ? 1 : k, trans_a ? m : 1, trans_b ? 1 : n, trans_b ? k : 1};
  for_each_output(policy, m * n, f, c);
}

// --- random numbers --------------------------------------------------------------

/// Writes the element pair q of one deft::random call (see store_pair).
template <class T, Distribution D>
struct RandomPairs {
  T* out;
  std::int64_t n;
  std::uint64_t key, stream;
  double a, b;
  DEFT_HD void operator()(std::int64_t q) const { store_pair<T, D>(out, n, q, key, stream, a, b); }
};

/// out[0, n) = the numbers of the deft::random call (key, stream), the same
/// the CPU draws (the CPU's fill is detail::fill_random in ops/random.hpp).
template <class T, Distribution D, class Policy>
void fill_random(const Policy& policy, T* out, std::int64_t n, std::uint64_t key, std::uint64_t stream, double a,
                 double b) {
  if (n <= 0) return;
  thrust::for_each(policy, thrust::counting_iterator<std::int64_t>(0),
                   thrust::counting_iterator<std::int64_t>((n + 1) / 2), RandomPairs<T, D>{out, n, key, stream, a, b});
}

}  // namespace deft::detail::gpu
