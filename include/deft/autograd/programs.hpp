// Elementwise expressions differentiated through their programs
// (expr/program.hpp): a recorded tree keeps its program instead of its
// type, and its backward is one kernel per element type
// (eval/cpu/program.hpp, eval/gpu/program.hpp) for every expression.
#pragma once
#include <cstdint>
#include <utility>

#include "../eval/record.hpp"
#include "../expr/program.hpp"
#include "../tensor.hpp"
#include "gathering.hpp"

namespace deft::autograd::detail {

/// The kernel of a program's backward: its gradient outputs,
/// output k at element k * size of one buffer.
template <class T>
struct ProgramBackward {
  deft::detail::ElementwiseProgram<T> program;
  deft::detail::Leaf<T> up;  // the gradient of the program's value
  ProgramBackward(deft::detail::ElementwiseProgram<T> p, deft::detail::Leaf<T> g) : program(std::move(p)), up(std::move(g)) {}
  void operator()(deft::detail::Buffer& out) const {
    deft::detail::on_device(out.device, [&](auto ex) { ex.program_backward(program, up, out.as<T>()); });
  }
};

/// The recorded leaves' gradients of `program`, given `up`, the gradient of
/// its value. Leaves reached through sums only get `up` as it is; one task
/// computes the others' gradients, output k at k * size of one buffer.
/// Reached through gathering<T>.
template <class T>
void program_backward(const deft::detail::ElementwiseProgram<T>& program, const Tensor<T>& up) {
  namespace d = deft::detail;
  for (int k = 0; k < program.n_passed; ++k) {
    const auto& leaf = program.leaves[program.passed[k]];
    accumulate_to<T>(*leaf.grad, leaf.extent, up);
  }
  if (program.n_outputs == 0) return;
  const std::int64_t size = program.shape.size();
  const auto add_reads = [](d::KernelTask& t) {
    const auto& k = t.kernel<ProgramBackward<T>>();
    for (int l = 0; l < k.program.n_leaves; ++l)
      if (k.program.leaves[l].buffer) t.add_input(k.program.leaves[l].buffer);
    t.add_input(k.up.buffer);
  };
  const Tensor<T> all = d::record_new_emplaced<T, ProgramBackward<T>>(
      "elementwise backward", Shape{program.n_outputs * size}, program.device, add_reads, program, up.leaf());
  const auto storage = all.leaf().buffer;
  for (int k = 0; k < program.n_outputs; ++k) {
    const auto& leaf = program.leaves[program.output_leaf[k]];
    accumulate_to<T>(*leaf.grad, leaf.extent, d::tensor_from_buffer<T>(storage, program.shape, k * size));
  }
}

/// An elementwise expression, differentiated through its program
/// (expr/program.hpp): one kernel per element type for every expression.
template <class T>
struct ProgramNode final : Node {
  deft::detail::ElementwiseProgram<T> program;
  explicit ProgramNode(deft::detail::ElementwiseProgram<T> p) : Node("elementwise"), program(std::move(p)) {
    for (int l = 0; l < program.n_leaves; ++l)
      if (program.leaves[l].grad) inputs.push_back(program.leaves[l].grad);
  }
  void backward(MetaBase& out) override { gathering<T>.program_backward(program, gathered<T>(out)); }
};

}  // namespace deft::autograd::detail
