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

#include "../../device/cuda/blas_handle.hpp"

namespace deft::detail::gpu {

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
