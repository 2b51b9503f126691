// Executor<gpu>: the GPU's kernels behind the interface the CPU's executor
// offers, so tasks reach both through on_device (eval/executor.hpp). Each
// call declares the device memory it reads and writes, queues work on the
// calling thread's lane of the device and returns: the lanes' waits
// (lanes.hpp) keep a buffer's writer before its readers, and the engine
// counts the task finished once it is queued. Host sync points wait on the device
// (see Tensor::wait_to_read, to_vector), where kernel failures surface.
//
// `Launch` (launch.hpp with CUDA, tests/gpu/emulation for the host-run tests)
// supplies the Thrust policy, device memory for scratch, and products.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "../../core/device.hpp"
#include "../../core/shape.hpp"
#include "../../device/backend.hpp"
#include "../../core/thresholds.hpp"
#include "../random_draw.hpp"
#include "conv.hpp"
#include "elementwise.hpp"
#include "gemm.hpp"
#include "permute.hpp"
#include "program.hpp"
#include "random.hpp"
#include "reduce.hpp"
#include "../../device/cuda/scratch.hpp"

#if defined(DEFT_GPU_EMULATION)
#include <gpu_emulation.hpp>  // tests/gpu/emulation: the emulated GPUs of deft's host-run tests
#else
#include "launch.hpp"
#endif

namespace deft::detail {


template <DeviceType D>
struct Executor;

namespace gpu {
/// What a kernel evaluating `e` into `out` uses: every leaf's buffer, read;
/// `out`, written.
template <class E>
MemoryUses uses_of(const E& e, const void* out) {
  MemoryUses u;
  e.for_each_leaf([&](const auto& leaf) { u.reads.push_back(leaf.source->data); });
  u.writes.push_back(out);
  return u;
}
}  // namespace gpu

template <>
struct Executor<DeviceType::gpu> {
  int device;

  template <class E, class T>
  void evaluate(const E& e, T* out) const {
    gpu::Launch on(device, gpu::uses_of(e, out));
    gpu::evaluate(on.policy(), e, out);
  }
  template <class T>
  void program_backward(const ElementwiseProgram<T>& p, const Leaf<T>& up, T* out) const {
    MemoryUses uses;
    for (int l = 0; l < p.n_leaves; ++l) uses.reads.push_back(p.leaves[l].source->data);
    uses.reads.push_back(up.source->data);
    uses.writes.push_back(out);
    gpu::Launch on(device, std::move(uses));
    gpu::program_backward(on.policy(), p, up, out);
  }
  template <class R, class E, class T>
  void reduce_all(const E& e, T* out) const {
    gpu::Launch on(device, gpu::uses_of(e, out));
    gpu::Scratch<T> scratch(device, gpu::reduce_scratch(e.shape().size()));  // none for short inputs
    gpu::reduce_all<R>(on.policy(), e, out, scratch.get());
  }
  template <class R, class E, class T>
  void reduce_axis(const E& e, int axis, T* out) const {
    gpu::Launch on(device, gpu::uses_of(e, out));
    const gpu::AxisPlan plan(AxisSplit(e.shape(), axis));
    gpu::Scratch<T> scratch(device, plan.scratch());  // none unless the axis is split
    gpu::reduce_axis<R>(on.policy(), e, axis, out, scratch.get());
  }
  template <class E>
  void argmax_all(const E& e, std::int64_t* out) const {
    gpu::Launch on(device, gpu::uses_of(e, out));
    gpu::Scratch<ArgBest<value_t<E>>> scratch(device, gpu::reduce_scratch(e.shape().size()));
    gpu::argmax_all(on.policy(), e, out, scratch.get());
  }
  template <class E>
  void argmax_axis(const E& e, int axis, std::int64_t* out) const {
    gpu::Launch on(device, gpu::uses_of(e, out));
    const gpu::AxisPlan plan(AxisSplit(e.shape(), axis));
    gpu::Scratch<ArgBest<value_t<E>>> scratch(device, plan.scratch());  // none unless the axis is split
    gpu::argmax_axis(on.policy(), e, axis, out, scratch.get());
  }
  template <class T>
  void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool trans_a = false,
            bool trans_b = false) const {
    gpu::Launch on(device, {{a, b}, {c}});
    on.gemm(m, n, k, a, b, c, trans_a, trans_b);
  }
  template <class T>
  void permute(const T* in, const Shape& in_shape, const std::array<int, max_rank>& axes, T* out) const {
    gpu::Launch on(device, {{in}, {out}});
    gpu::permute(on.policy(), in, in_shape, axes, out);
  }
  template <class T>
  void copy_rows(std::int64_t rows, std::int64_t width, const T* src, std::int64_t src_pitch, T* dst,
                 std::int64_t dst_pitch) const {
    gpu::Launch on(device, {{src}, {dst}});
    gpu::copy_rows(on.policy(), rows, width, src, src_pitch, dst, dst_pitch);
  }
  template <class T, Distribution D>
  void fill_random(T* out, std::int64_t n, std::uint64_t key, std::uint64_t stream, double a, double b) const {
    gpu::Launch on(device, {{}, {out}});
    gpu::fill_random<T, D>(on.policy(), out, n, key, stream, a, b);
  }
  template <class T>
  void conv2d_forward(const ConvGeom& g, const T* x, const T* w, const T* bias, T* y) const {
    gpu::conv2d_forward(gpu::Launch(device, {{x, w, bias}, {y}}), device, g, x, w, bias, y);
  }
  template <class T>
  void conv2d_backward_input(const ConvGeom& g, const T* dy, const T* w, T* dx) const {
    gpu::conv2d_backward_input(gpu::Launch(device, {{dy, w}, {dx}}), device, g, dy, w, dx);
  }
  template <class T>
  void conv2d_backward_weight(const ConvGeom& g, const T* dy, const T* x, T* dw) const {
    gpu::conv2d_backward_weight(gpu::Launch(device, {{dy, x}, {dw}}), device, g, dy, x, dw);
  }
  template <class T>
  void conv2d_backward_bias(const ConvGeom& g, const T* dy, T* db) const {
    gpu::conv2d_backward_bias(gpu::Launch(device, {{dy}, {db}}), device, g, dy, db);
  }
  template <PoolKind Kind, class T>
  void pool2d_forward(const PoolGeom& g, const T* x, T* y) const {
    gpu::pool2d_forward<Kind>(gpu::Launch(device, {{x}, {y}}), g, x, y);
  }
  template <PoolKind Kind, class T>
  void pool2d_backward(const PoolGeom& g, const T* dy, const T* x, T* dx) const {
    gpu::pool2d_backward<Kind>(gpu::Launch(device, {{dy, x}, {dx}}), g, dy, x, dx);
  }
  /// out[i] = f(i) for i in [0, n); f must be callable on the device (DEFT_HD)
  /// and read no device memory (its uses would go undeclared).
  template <class T, class F>
  void generate(std::int64_t n, const F& f, T* out) const {
    gpu::Launch on(device, {{}, {out}});
    gpu::for_each_output(on.policy(), n, f, out);
  }
};

}  // namespace deft::detail
