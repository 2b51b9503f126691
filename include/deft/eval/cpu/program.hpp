// CPU executor for the backward of an ElementwiseProgram (expr/program.hpp):
// one pass over the output that, a chunk of elements at a time, computes
// every step's value forward and every step's gradient backward in scratch
// that stays in L1, then writes the gradients of the recorded leaves. One
// kernel per element type serves every expression. Each step runs as SIMD
// batches over the whole chunk (the last batch padded), so an element's
// result does not depend on where the work was split.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "../../core/config.hpp"
#include "../../expr/kernel_views.hpp"
#include "../../expr/program.hpp"
#include "elementwise.hpp"
#include "simd.hpp"

namespace deft::detail::cpu {

/// Writes the gradients of p's recorded leaves, given the gradient `up` of
/// its value: output k (a tensor of p's shape) at out + k * p.shape.size().
/// (A template, so that a program compiles the kernels of the element
/// types it differentiates; the compiled mode compiles both, once.)
template <class T>
void program_backward(const ElementwiseProgram<T>& p, const Leaf<T>& up, T* out);

#if DEFT_DEFINE_RUNTIME
namespace program_detail {

#if DEFT_CPU_SIMD
template <class T>
using Vec = simd_batch<T>;
template <class T>
DEFT_ALWAYS_INLINE inline Vec<T> load(const T* p) { return Vec<T>::load_unaligned(p); }
template <class T>
DEFT_ALWAYS_INLINE inline void store(const Vec<T>& v, T* p) { v.store_unaligned(p); }
template <class T>
inline constexpr std::int64_t width = Vec<T>::size;
#else
template <class T>
using Vec = T;
template <class T>
DEFT_ALWAYS_INLINE inline T load(const T* p) { return *p; }
template <class T>
DEFT_ALWAYS_INLINE inline void store(T v, T* p) { *p = v; }
template <class T>
inline constexpr std::int64_t width = 1;
#endif

// One loop per operation: op is a constant inside, so its switch folds away.
template <ProgramOp Op, class T>
void forward_loop(const T* a, const T* b, const T* c, T* y, std::int64_t n) {
  for (std::int64_t k = 0; k < n; k += width<T>)
    store(program_forward(Op, load(a + k), load(b + k), load(c + k)), y + k);
}
template <ProgramOp Op, class T>
void adjoint_loop(const T* a, const T* b, const T* y, const T* g, T* ga, T* gb, std::int64_t n) {
  for (std::int64_t k = 0; k < n; k += width<T>) {
    Vec<T> da(0), db(0);
    program_adjoint(Op, load(a + k), load(b + k), load(y + k), load(g + k), da, db);
    if (ga) store(da, ga + k);
    if (gb) store(db, gb + k);
  }
}

template <class T>
using ForwardLoop = void (*)(const T*, const T*, const T*, T*, std::int64_t);
template <class T>
using AdjointLoop = void (*)(const T*, const T*, const T*, const T*, T*, T*, std::int64_t);

template <class T, std::size_t... I>
constexpr auto forward_table(std::index_sequence<I...>) {
  return std::array<ForwardLoop<T>, sizeof...(I)>{&forward_loop<ProgramOp(I), T>...};
}
template <class T, std::size_t... I>
constexpr auto adjoint_table(std::index_sequence<I...>) {
  return std::array<AdjointLoop<T>, sizeof...(I)>{&adjoint_loop<ProgramOp(I), T>...};
}
inline constexpr std::size_t op_count = std::size_t(ProgramOp::none) + 1;

/// Leaf view v's elements [j, j + n) of the current row into dst.
template <class T>
void load_leaf(const LeafView<T>& v, std::int64_t j, std::int64_t n, T* dst) {
  if (v.inner) std::memcpy(dst, v.row + j, std::size_t(n) * sizeof(T));
  else std::fill_n(dst, n, *v.row);
}

/// The leaves' views (the upstream gradient last), positioned row by row.
template <class T>
struct Rows {
  std::array<LeafView<T>, program_max_leaves + 1> leaves;
  int n = 0;
  void set_row(const std::int64_t* idx, int outer) {
    for (int l = 0; l < n; ++l) leaves[l].set_row(idx, outer);
  }
};

template <class T>
void run(const ElementwiseProgram<T>& p, const Leaf<T>& up, T* out) {
  static constexpr auto forward = forward_table<T>(std::make_index_sequence<op_count>{});
  static constexpr auto adjoint = adjoint_table<T>(std::make_index_sequence<op_count>{});
  const std::int64_t total = p.shape.size();
  if (total == 0 || p.n_outputs == 0) return;
  Rows<T> rows;
  rows.n = p.n_leaves + 1;
  const Shape s = program_views(p, up, rows.leaves);

  const int steps = p.n_steps, root = steps - 1;
  // Values and gradients of every step for a chunk of elements: about 16 KiB.
  const std::int64_t chunk =
      std::clamp<std::int64_t>(8192 / (std::int64_t(steps) * std::int64_t(sizeof(T))) / 64 * 64, 64, 1024);
  const std::int64_t cost = 4 * steps;
  parallel_range(total, cost, 64, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<T> scratch(std::size_t(2 * steps * chunk), T(0));
    const auto val = [&](int i) { return scratch.data() + std::int64_t(i) * chunk; };
    const auto grad = [&](int i) { return scratch.data() + std::int64_t(steps + i) * chunk; };
    for (int i = 0; i < steps; ++i)
      if (p.steps[i].op == ProgramOp::constant) std::fill_n(val(i), chunk, p.constants[p.steps[i].index]);
    Rows<T> r = rows;
    for_each_row(r, s, lo, hi, [&](const Rows<T>& row, std::int64_t c0, std::int64_t c1, std::int64_t start) {
      for (std::int64_t j = c0; j < c1; j += chunk) {
        const std::int64_t n = std::min(chunk, c1 - j), padded = (n + width<T> - 1) / width<T> * width<T>;
        for (int i = 0; i < steps; ++i) {
          const ProgramStep& st = p.steps[i];
          if (st.op == ProgramOp::leaf) load_leaf(row.leaves[st.index], j, n, val(i));
          else if (st.op != ProgramOp::constant)
            forward[std::size_t(st.op)](val(st.a), val(st.b), val(st.c), val(i), padded);
        }
        load_leaf(row.leaves[p.n_leaves], j, n, grad(root));
        std::array<bool, program_max_leaves> written{};
        for (int i = root; i >= 0; --i) {
          const ProgramStep& st = p.steps[i];
          if (!st.grad || st.op == ProgramOp::constant) continue;
          if (st.op == ProgramOp::leaf) {
            if (st.output < 0) continue;  // passed on as the upstream gradient
            T* o = out + st.output * total + start + (j - c0);
            if (!written[st.output]) std::memcpy(o, grad(i), std::size_t(n) * sizeof(T));
            else
              for (std::int64_t k = 0; k < n; ++k) o[k] += grad(i)[k];
            written[st.output] = true;
            continue;
          }
          // Select's gradients go to its values (b and c); the others' to a and b.
          const bool select = st.op == ProgramOp::select;
          const std::uint8_t ta = select ? st.b : st.a, tb = select ? st.c : st.b;
          const bool binary = select || st.op >= ProgramOp::add;
          T* ga = p.steps[ta].grad ? grad(ta) : nullptr;
          T* gb = binary && p.steps[tb].grad ? grad(tb) : nullptr;
          adjoint[std::size_t(st.op)](val(st.a), val(st.b), val(i), grad(i), ga, gb, padded);
        }
      }
    });
  });
}

}  // namespace program_detail

template <class T>
void program_backward(const ElementwiseProgram<T>& p, const Leaf<T>& up, T* out) {
  program_detail::run(p, up, out);
}
#if defined(DEFT_BUILDING_RUNTIME)
template void program_backward(const ElementwiseProgram<float>&, const Leaf<float>&, float*);
template void program_backward(const ElementwiseProgram<double>&, const Leaf<double>&, double*);
#endif
#endif

}  // namespace deft::detail::cpu
