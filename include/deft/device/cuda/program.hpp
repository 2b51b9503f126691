// Device programs on CUDA (device/program.hpp): work captured from a
// device's capture stream into a CUDA graph, launched as one on a lane.
// Plain C++ over the CUDA runtime (g++ and nvcc both compile it).
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include <cuda_runtime_api.h>

#include "../backend.hpp"
#include "blas_handle.hpp"
#include "runtime.hpp"

namespace deft::detail::gpu {

/// An instantiated graph and the memory its kernels were captured with.
class CudaProgram final : public DeviceProgram {
 public:
  CudaProgram(DeviceBackend& backend, DeviceContext& ctx, cudaGraphExec_t exec, ProgramMemory memory)
      : backend_(backend), ctx_(ctx), exec_(exec), memory_(std::move(memory)) {}
  // CUDA frees a graph destroyed while a launch of it runs once that launch
  // is done; its scratch blocks return to the pool, where the lanes' record
  // orders their next user after that launch.
  ~CudaProgram() override {
    DeviceGuard on(ctx_.device, std::nothrow);  // on whichever thread drops the program
    discard(cudaGraphExecDestroy(exec_));
  }
  CudaProgram(const CudaProgram&) = delete;
  CudaProgram& operator=(const CudaProgram&) = delete;

  /// One launch on the calling thread's lane, declared to the lanes as one
  /// piece of work using everything the program uses.
  void launch() override {
    DeviceGuard on(ctx_.device);
    LaneAccess access(backend_, ctx_.device, memory_.uses);
    check(cudaGraphLaunch(exec_, ctx_.stream(access.lane())), "cudaGraphLaunch", ctx_.device);
  }

 private:
  DeviceBackend& backend_;
  DeviceContext& ctx_;
  cudaGraphExec_t exec_;
  ProgramMemory memory_;
};

/// DeviceBackend::record on CUDA: captures `work` from the device's capture
/// stream (relaxed mode: the pool may still call cudaMalloc meanwhile),
/// instantiates the graph and launches it once. Nothing of `work` runs when
/// this throws.
inline std::unique_ptr<DeviceProgram> record_program(DeviceBackend& backend, int device,
                                                     const std::function<void()>& work) {
  DeviceContext& ctx = context(device);
  DeviceGuard on(device);
  std::lock_guard one_capture(ctx.capture_mutex);
  // The cuBLAS handles of the compute lanes and the capture's are made
  // before the capture: cublasCreate allocates and may wait for the
  // device, which would end it.
  for (int k = 0; k < int(ctx.lanes.size()); ++k) (void)blas_handle(ctx, k);
  (void)blas_handle(ctx, DeviceContext::capture_lane);
  ProgramMemory memory;
  cudaGraph_t graph = nullptr;
  {
    FreeGate::Capturing device_frees_wait(*ctx.upstream), pinned_frees_wait(*pinned_upstream());
    ProgramCapture capture(device, memory, ProgramCapture::Mode::record);
    LaneScope lane(device, DeviceContext::capture_lane);
    check(cudaStreamBeginCapture(ctx.capture_stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture", device);
    try {
      work();
    } catch (...) {
      if (cudaStreamEndCapture(ctx.capture_stream, &graph) == cudaSuccess && graph) discard(cudaGraphDestroy(graph));
      (void)cudaGetLastError();
      throw;
    }
    check(cudaStreamEndCapture(ctx.capture_stream, &graph), "cudaStreamEndCapture", device);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  discard(cudaGraphDestroy(graph));
  check(status, "cudaGraphInstantiate", device);
  auto program = std::make_unique<CudaProgram>(backend, ctx, exec, std::move(memory));
  program->launch();
  return program;
}

}  // namespace deft::detail::gpu
