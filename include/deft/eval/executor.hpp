// Executors ("where"): one per device type, each offering the same kernels.
// Tasks call on_device(dev, f), which hands f the executor of dev; a new
// backend adds an Executor specialisation and a case here, nothing else.
#pragma once
#include <array>
#include <cstdint>
#include <utility>

#include "../core/device.hpp"
#include "../core/error.hpp"
#include "cpu/elementwise.hpp"
#include "cpu/gemm.hpp"
#include "cpu/permute.hpp"
#include "cpu/reduce.hpp"

namespace deft::detail {

template <DeviceType D>
struct Executor;

template <>
struct Executor<DeviceType::cpu> {
  template <class E, class T>
  static void evaluate(const E& e, T* out) { cpu::evaluate(e, out); }
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
  template <class Body>
  static void parallel_range(std::int64_t total, std::int64_t cost, std::int64_t align, Body&& body) {
    cpu::parallel_range(total, cost, align, std::forward<Body>(body));
  }
};

/// Whether deft was built with a backend for devices of this type.
inline bool has_backend(DeviceType t) { return t == DeviceType::cpu; }

/// Raises std::invalid_argument, at the call that creates the work, for a
/// device this build cannot run.
inline void require_backend(Device d, const char* op) {
  if (!has_backend(d.type))
    raise(op, ": tensors on ", d, " need deft's CUDA backend, which this build does not include");
}

/// Calls f(executor) with the executor of device d.
template <class F>
decltype(auto) on_device(Device d, F&& f) {
  switch (d.type) {
    case DeviceType::cpu: return std::forward<F>(f)(Executor<DeviceType::cpu>{});
    default: break;
  }
  raise("no backend for device ", d);
}

}  // namespace deft::detail
