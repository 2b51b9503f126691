// cuBLAS handles, one per lane of each GPU, and cuBLAS errors as exceptions.
// The products themselves are kernels (eval/gpu/blas.hpp).
#pragma once
#include <memory>
#include <mutex>
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

}  // namespace deft::detail::gpu
