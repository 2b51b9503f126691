// GPU reductions and argmax (eval/cpu/reduce.hpp is the CPU's). They write
// their result into device memory (no copy back, nothing waits): a pass of
// one thread per output, or passes over partials where outputs are few and
// long (a full reduction is one output), whose reads are coalesced and whose
// order is fixed (the same bits on every run).
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "../../core/config.hpp"
#include "../../core/shape.hpp"
#include "../../expr/reducers.hpp"
#include "elementwise.hpp"

namespace deft::detail::gpu {

// --- reductions ----------------------------------------------------------------
//
// A reducer R has identity(), step(acc, x), merge(a, b) and finish(acc, n)
// (expr/reducers.hpp); argmax's (ArgmaxReducer, there too) steps with the
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

// --- argmax: ArgmaxReducer (expr/reducers.hpp) over the elements ---------------

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

}  // namespace deft::detail::gpu
