// Executors ("where"): one per device type, each offering the same kernels.
// Tasks call on_device(dev, f), which hands f the executor of dev; a new
// backend adds an Executor specialisation and a case here, nothing else.
//
// The GPU's executor exists only where its kernels can be compiled: in
// translation units nvcc compiles with DEFT_CUDA_BACKEND (deft::cuda sets
// it), or with DEFT_GPU_EMULATION or DEFT_FAKE_CUDA (tests: the latter is
// the real backend over tests/gpu/fake_cuda's stand-in for CUDA, compiled
// by a host compiler). Elsewhere on_device raises for a
// GPU, so work recorded there fails at its sync point; it never computes.
#pragma once
#include <array>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../device/backend.hpp"
#include "../expr/nodes.hpp"
#include "../expr/reducers.hpp"
#include "conv_geometry.hpp"
#include "cpu/conv.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/gemm.hpp"
#include "cpu/permute.hpp"
#include "cpu/program.hpp"
#include "cpu/random.hpp"
#include "cpu/reduce.hpp"
#include "cpu/softmax.hpp"
#include "random_draw.hpp"

#if defined(DEFT_GPU_EMULATION) || (defined(DEFT_CUDA_BACKEND) && (defined(__CUDACC__) || defined(DEFT_FAKE_CUDA)))
#include <thrust/system_error.h>

#include "gpu/executor.hpp"
#define DEFT_HAS_GPU_EXECUTOR 1
#elif defined(DEFT_CUDA_BACKEND)
#include "../device/cuda/backend.hpp"  // GPU tensors can be made and copied here; GPU expressions cannot
#endif

namespace deft::detail {

template <DeviceType D>
struct Executor;

template <>
struct Executor<DeviceType::cpu> {
  template <class E, class T>
  static void evaluate(const E& e, T* out) { cpu::evaluate(e, out); }
  template <class T>
  static void program_backward(const ElementwiseProgram<T>& p, const Leaf<T>& up, T* out) {
    cpu::program_backward(p, up, out);
  }
  template <class R, class E, class T>
  static void reduce_all(const E& e, T* out) { cpu::reduce_all<R>(e, out); }
  template <class R, class E, class T>
  static void reduce_axis(const E& e, int axis, T* out) { cpu::reduce_axis<R>(e, axis, out); }
  template <class E>
  static void argmax_all(const E& e, std::int64_t* out) { cpu::argmax_all(e, out); }
  template <class E>
  static void argmax_axis(const E& e, int axis, std::int64_t* out) { cpu::argmax_axis(e, axis, out); }
  template <class T>
  static void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool trans_a = false,
                   bool trans_b = false) {
    cpu::gemm(m, n, k, a, b, c, trans_a, trans_b);
  }
  template <class T>
  static void permute(const T* in, const Shape& in_shape, const std::array<int, max_rank>& axes, T* out) {
    cpu::permute(in, in_shape, axes, out);
  }
  template <class T>
  static void copy_rows(std::int64_t rows, std::int64_t width, const T* src, std::int64_t src_pitch, T* dst,
                        std::int64_t dst_pitch) {
    cpu::copy_rows(rows, width, src, src_pitch, dst, dst_pitch);
  }
  template <class Body>
  static void parallel_range(std::int64_t total, std::int64_t cost, std::int64_t align, Body&& body) {
    cpu::parallel_range(total, cost, align, std::forward<Body>(body));
  }
  template <class T>
  static void conv2d_forward(const ConvGeom& g, const T* x, const T* w, const T* bias, T* y) {
    cpu::conv2d_forward(g, x, w, bias, y);
  }
  template <class T>
  static void conv2d_backward_input(const ConvGeom& g, const T* dy, const T* w, T* dx) {
    cpu::conv2d_backward_input(g, dy, w, dx);
  }
  template <class T>
  static void conv2d_backward_weight(const ConvGeom& g, const T* dy, const T* x, T* dw) {
    cpu::conv2d_backward_weight(g, dy, x, dw);
  }
  template <class T>
  static void conv2d_backward_bias(const ConvGeom& g, const T* dy, T* db) { cpu::conv2d_backward_bias(g, dy, db); }
  template <PoolKind Kind, class T>
  static void pool2d_forward(const PoolGeom& g, const T* x, T* y) { cpu::pool2d_forward<Kind>(g, x, y); }
  template <PoolKind Kind, class T>
  static void pool2d_backward(const PoolGeom& g, const T* dy, const T* x, T* dx) {
    cpu::pool2d_backward<Kind>(g, dy, x, dx);
  }
  /// softmax (log_softmax with Log) of `rows` contiguous rows of `cols`
  /// elements, one task for all steps (see has_row_softmax).
  template <bool Log, class T>
  static void softmax_rows(std::int64_t rows, std::int64_t cols, const T* x, T* out) {
    cpu::softmax_rows<Log>(rows, cols, x, out);
  }
  /// The numbers of one deft::random call (the GPU's draws the same ones).
  template <class T, Distribution D>
  static void fill_random(T* out, std::int64_t n, std::uint64_t key, std::uint64_t stream, double a, double b) {
    cpu::fill_random<T, D>(out, n, key, stream, a, b);
  }
  /// out[i] = f(i) for i in [0, n).
  template <class T, class F>
  static void generate(std::int64_t n, const F& f, T* out) {
    cpu::parallel_range(n, 1, 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) out[i] = f(i);
    });
  }
};

/// The kernels every executor offers, checked below for each one compiled
/// here: a new backend implements all of them, and a new kind of kernel goes
/// into each (eval/cpu/ and eval/gpu/ hold them under the same file names).
template <class Ex>
concept KernelSet = requires(const Ex ex, const Leaf<float>& e, float* out, std::int64_t* index, const float* in,
                             const Shape& s, const std::array<int, max_rank>& axes, const ConvGeom& cg,
                             const PoolGeom& pg, std::int64_t n, std::uint64_t key) {
  ex.evaluate(e, out);
  ex.template reduce_all<SumReducer<float>>(e, out);
  ex.template reduce_axis<SumReducer<float>>(e, 0, out);
  ex.argmax_all(e, index);
  ex.argmax_axis(e, 0, index);
  ex.gemm(n, n, n, in, in, out, false, false);
  ex.permute(in, s, axes, out);
  ex.copy_rows(n, n, in, n, out, n);
  ex.template fill_random<float, Distribution::uniform>(out, n, key, key, 0.0, 1.0);
  ex.conv2d_forward(cg, in, in, in, out);
  ex.conv2d_backward_input(cg, in, in, out);
  ex.conv2d_backward_weight(cg, in, in, out);
  ex.conv2d_backward_bias(cg, in, out);
  ex.template pool2d_forward<PoolKind::max>(pg, in, out);
  ex.template pool2d_backward<PoolKind::max>(pg, in, in, out);
};
static_assert(KernelSet<Executor<DeviceType::cpu>>, "Executor<cpu> lacks a kernel of KernelSet");
#ifdef DEFT_HAS_GPU_EXECUTOR
static_assert(KernelSet<Executor<DeviceType::gpu>>, "Executor<gpu> lacks a kernel of KernelSet");
#endif

/// Whether the executor of device d has softmax_rows. The GPU's has not:
/// there softmax records its steps as separate reductions and elementwise
/// passes, each of them a kernel of KernelSet.
inline bool has_row_softmax(Device d) { return d.type == DeviceType::cpu; }

/// Whether this program has a backend for devices of this type.
inline bool has_backend(DeviceType t) { return t == DeviceType::cpu || gpu_backend() != nullptr; }

/// Raises std::invalid_argument, at the call that creates the work, for a
/// device this program cannot run or that does not exist.
inline void require_backend(Device d, const char* op) {
  if (d.type == DeviceType::cpu) return;
  DeviceBackend* b = gpu_backend();
  if (!b) raise(op, ": tensors on ", d, " need deft's CUDA backend, which this build does not include");
  const int n = b->device_count();
  if (d.index < 0 || d.index >= n) raise(op, ": no device ", d, ": this machine has ", n, " ", b->name(), " GPU(s)");
}

/// Calls f(executor) with the executor of device d.
template <class F>
decltype(auto) on_device(Device d, F&& f) {
  switch (d.type) {
    case DeviceType::cpu: return std::forward<F>(f)(Executor<DeviceType::cpu>{});
#ifdef DEFT_HAS_GPU_EXECUTOR
    case DeviceType::gpu:
      try {
        return std::forward<F>(f)(Executor<DeviceType::gpu>{d.index});
      } catch (const thrust::system_error& e) {  // a launch failed (Thrust's text names neither deft nor the GPU)
        raise<std::runtime_error>("a kernel on ", d, ": ", e.what());
      }
#endif
    default: break;
  }
  raise<std::logic_error>("no kernels for ", d, " here: work on a GPU must be recorded from code that nvcc compiles "
                          "with deft::cuda (DEFT_CUDA_BACKEND)");
}

}  // namespace deft::detail
