// GPU kernel for the backward of an ElementwiseProgram (expr/program.hpp;
// eval/cpu/program.hpp is the CPU's): one thread per element runs the
// program's steps forward and its gradients backward in registers and
// writes the gradients of the recorded leaves. One kernel per element type
// serves every expression.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

#include "../../core/config.hpp"
#include "../../core/shape.hpp"
#include "../../expr/kernel_views.hpp"
#include "../../expr/program.hpp"
#include "divider.hpp"
#include "elementwise.hpp"

namespace deft::detail::gpu {

/// The program's steps, constants and leaf views (the upstream gradient
/// last) by value, for a thread per element of the collapsed output.
template <class T>
struct ProgramBackwardAt {
  std::array<ProgramStep, program_max_steps> steps;
  std::array<T, program_max_steps> constants;
  std::array<LeafView<T>, program_max_leaves + 1> leaves;
  Divider row_strides[max_rank - 1];
  int rank = 0, n_steps = 0, n_leaves = 0;
  std::int64_t total = 0;
  T* out = nullptr;

  DEFT_HD void operator()(std::int64_t i) const {
    const std::int64_t linear = i;
    const int outer = rank > 0 ? rank - 1 : 0;
    std::int64_t idx[max_rank] = {};
    DEFT_UNROLL
    for (int d = 0; d < max_rank - 1; ++d)
      if (d < outer) i = row_strides[d].split(i, idx[d]);
    const auto leaf_at = [&](int l) {
      LeafView<T> v = leaves[l];
      v.set_row(idx, outer);
      return v.at(i);
    };
    T val[program_max_steps], grad[program_max_steps];
    for (int s = 0; s < n_steps; ++s) {
      const ProgramStep& st = steps[s];
      if (st.op == ProgramOp::leaf) val[s] = leaf_at(st.index);
      else if (st.op == ProgramOp::constant) val[s] = constants[st.index];
      else val[s] = program_forward(st.op, val[st.a], val[st.b], val[st.c]);
    }
    grad[n_steps - 1] = leaf_at(n_leaves);
    bool written[program_max_leaves] = {};
    for (int s = n_steps - 1; s >= 0; --s) {
      const ProgramStep& st = steps[s];
      if (!st.grad || st.op == ProgramOp::constant) continue;
      if (st.op == ProgramOp::leaf) {
        if (st.output < 0) continue;  // passed on as the upstream gradient
        T& o = out[st.output * total + linear];
        o = written[st.output] ? o + grad[s] : grad[s];
        written[st.output] = true;
        continue;
      }
      const bool select = st.op == ProgramOp::select;
      const int ta = select ? st.b : st.a, tb = select ? st.c : st.b;
      T ga = T(0), gb = T(0);
      program_adjoint(st.op, val[st.a], val[st.b], val[s], grad[s], ga, gb);
      grad[ta] = ga;
      if (select || st.op >= ProgramOp::add) grad[tb] = gb;
    }
  }
};

/// Writes the gradients of p's recorded leaves given the gradient `up` of
/// its value: output k at out + k * p.shape.size().
template <class Policy, class T>
void program_backward(const Policy& policy, const ElementwiseProgram<T>& p, const Leaf<T>& up, T* out) {
  const std::int64_t total = p.shape.size();
  if (total == 0 || p.n_outputs == 0) return;
  ProgramBackwardAt<T> f;
  f.steps = p.steps;
  f.constants = p.constants;
  f.n_steps = p.n_steps;
  f.n_leaves = p.n_leaves;
  f.total = total;
  f.out = out;
  const Shape s = program_views(p, up, f.leaves);
  f.rank = s.rank();
  std::int64_t stride = 1;
  for (int d = f.rank - 1; d > 0; --d) {
    stride *= s[d];
    f.row_strides[d - 1] = Divider(stride, std::max<std::int64_t>(total - 1, 0));
  }
  for_each_index(policy, total, f);
}

}  // namespace deft::detail::gpu
