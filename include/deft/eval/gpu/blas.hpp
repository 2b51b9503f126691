// Matrix products on a GPU through cuBLAS: deft's row-major products mapped
// onto the column-major library, queued on one of the device's lanes (nothing
// waits), with cuBLAS failures raised as exceptions carrying its status text.
// Plain C++ over cuBLAS's C API; link CUDA::cublas (deft::cuda does).
#pragma once
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include <cublas_v2.h>

#include "runtime.hpp"

namespace deft::detail::gpu {

/// Throws std::runtime_error("deft: <what> on gpu(i): <status name> (<text>)").
inline void check_blas(cublasStatus_t status, const char* what, int device) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  raise<std::runtime_error>(what, " on ", deft::gpu(device), ": ", cublasGetStatusName(status), " (",
                            cublasGetStatusString(status), ")");
}

/// A cuBLAS handle bound to one lane's stream of one GPU (a handle's stream
/// is its state, so each lane has its own). cuBLAS asks that threads do not
/// use one handle at the same time, so calls take `mutex` (each call only
/// queues work: the lock is held for microseconds).
struct BlasHandle {
  cublasHandle_t handle = nullptr;
  std::mutex mutex;
  int device;

  BlasHandle(DeviceContext& ctx, int lane) : device(ctx.device) {
    DeviceGuard on(device);
    {
      std::lock_guard no_group(collective_launches());  // it allocates its workspace (see collective_launches)
      check_blas(cublasCreate(&handle), "cublasCreate", device);
    }
    // Full float32 products (no TF32): the same accuracy contract as the CPU's kernel.
    check_blas(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode", device);
    check_blas(cublasSetStream(handle, ctx.stream(lane)), "cublasSetStream", device);
  }
  // Never destroyed (blas_handle leaks them, like DeviceContext's streams):
  // work still queued at exit runs after static destructors.
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
};

/// The handle of lane `lane` (any of DeviceContext's, capture_lane too) of
/// the GPU `ctx` belongs to, created on first use.
inline BlasHandle& blas_handle(DeviceContext& ctx, int lane) {
  // Leaked: the engine's exit handler, registered before these would be
  // built, runs after their destructors, and its last tasks may multiply.
  static auto& m = *new std::mutex;
  static auto& handles = *new std::vector<std::unique_ptr<BlasHandle>>;
  std::lock_guard lk(m);
  const std::size_t i = std::size_t(ctx.device * (DeviceContext::capture_lane + 1) + lane);
  if (handles.size() <= i) handles.resize(i + 1);
  auto& h = handles[i];
  if (!h) h = std::make_unique<BlasHandle>(ctx, lane);
  return *h;
}

/// c (m x n) = op(a) · op(b), all row-major in device memory, where op(a) is
/// m x k (a stored k x m when trans_a) and op(b) is k x n (b stored n x k
/// when trans_b). Queued on lane `lane` of ctx's GPU. float and double.
///
/// Row-major X is column-major Xᵀ, so cuBLAS computes cᵀ = op(b)ᵀ · op(a)ᵀ:
/// the operands swap places and keep their transposition flags.
template <class T>
void gemm(DeviceContext& ctx, int lane, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c,
          bool trans_a = false, bool trans_b = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "cuBLAS products are float32 or float64");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum (cuBLAS would refuse the leading dimension 0)
    DeviceGuard on(ctx.device);
    check(cudaMemsetAsync(c, 0, std::size_t(m * n) * sizeof(T), ctx.stream(lane)), "cudaMemsetAsync", ctx.device);
    return;
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
    raise("matmul on ", deft::gpu(ctx.device), ": a dimension (", m, ", ", n, ", ", k,
          ") exceeds cuBLAS's 32-bit sizes");
  const int mi = int(m), ni = int(n), ki = int(k);
  const int lda = trans_a ? mi : ki, ldb = trans_b ? ki : ni;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const T one = 1, zero = 0;
  BlasHandle& h = blas_handle(ctx, lane);
  std::lock_guard lk(h.mutex);
  DeviceGuard on(ctx.device);
  if constexpr (std::is_same_v<T, float>)
    check_blas(cublasSgemm(h.handle, op_b, op_a, ni, mi, ki, &one, b, ldb, a, lda, &zero, c, ni), "cublasSgemm",
               ctx.device);
  else
    check_blas(cublasDgemm(h.handle, op_b, op_a, ni, mi, ki, &one, b, ldb, a, lda, &zero, c, ni), "cublasDgemm",
               ctx.device);
}

}  // namespace deft::detail::gpu
