// The stand-in's cuBLAS (the toolkit's cublas_v2.h declares it): column-major products as cuBLAS defines them,
// queued on the handle's stream as a kernel, with cuBLAS's argument checks.
#include <algorithm>
#include <string>

#include <cublas_v2.h>

#include "fake_cuda.hpp"

struct cublasContext {
  int device;
  cudaStream_t stream = nullptr;  // cuBLAS's default is the legacy stream, which the stand-in lacks
};

namespace {

template <class T>
cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const T* alpha,
                    const T* A, int lda, const T* B, int ldb, const T* beta, T* C, int ldc) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool a_t = ta != CUBLAS_OP_N, b_t = tb != CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_t ? k : m) || ldb < std::max(1, b_t ? n : k) ||
      ldc < std::max(1, m)) {
    fake_cuda::explain(("cublas gemm: m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k) +
                        ", lda " + std::to_string(lda) + ", ldb " + std::to_string(ldb) + ", ldc " + std::to_string(ldc) +
                        " are not a valid product")
                           .c_str());
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  int current = -1;
  cudaGetDevice(&current);
  if (current != h->device) {
    fake_cuda::explain("a cuBLAS handle used while another device is current");
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Each matrix, from its first element to its last, in the handle's device's memory.
  const auto extent = [](int rows, int cols, int ld) { return (std::size_t(cols - 1) * std::size_t(ld) + std::size_t(rows)) * sizeof(T); };
  if ((k > 0 && (fake_cuda::device_memory_of(A, extent(a_t ? k : m, a_t ? m : k, lda)) != h->device ||
                 fake_cuda::device_memory_of(B, extent(b_t ? n : k, b_t ? k : n, ldb)) != h->device)) ||
      fake_cuda::device_memory_of(C, extent(m, n, ldc)) != h->device) {
    fake_cuda::explain("cublas gemm: a matrix that is not in the handle's device's memory");
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const T a = *alpha, b = *beta;  // host pointer mode: read at the call
  const auto work = [=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        T sum = 0;
        for (int p = 0; p < k; ++p)
          sum += (a_t ? A[p + i * lda] : A[i + p * lda]) * (b_t ? B[j + p * ldb] : B[p + j * ldb]);
        T& c = C[i + j * ldc];
        c = b == T(0) ? a * sum : a * sum + b * c;  // beta 0: C is not read (it may hold NaN)
      }
  };
  return fake_cuda::launch(h->stream, work, "cublas gemm") == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                            : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  int device = 0;
  cudaGetDevice(&device);
  fake_cuda::make_context(device);  // cuBLAS allocates its workspace there
  *handle = new cublasContext{device};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (fake_cuda::device_of(stream) != handle->device) {
    fake_cuda::explain("cublasSetStream: a stream of another device than the handle's");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: break;
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: break;
  }
  return "unknown status";
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                           const double* alpha, const double* A, int lda, const double* B, int ldb, const double* beta,
                           double* C, int ldc) {
  return gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // extern "C"
