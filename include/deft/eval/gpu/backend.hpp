// The CUDA backend of deft's engine: GPU buffers from each device's caching
// pool, copies between the host and GPUs ordered on the devices' streams
// (to a GPU staged through pinned blocks, staging.hpp),
// and waits that raise the CUDA error text. Plain C++ over the CUDA runtime
// (g++ and nvcc both compile it); including it registers the backend.
#pragma once
#include <cstddef>
#include <memory>

#include <cuda_runtime_api.h>

#include "../../engine/device_backend.hpp"
#include "runtime.hpp"
#include "staging.hpp"

namespace deft::detail::gpu {

/// A CUDA event made for one ordering and destroyed once it was used (the
/// runtime frees it when the work it marks is done).
class OneShotEvent {
 public:
  OneShotEvent(cudaStream_t after, int device) {
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate", device);
    check(cudaEventRecord(event_, after), "cudaEventRecord", device);
  }
  ~OneShotEvent() { cudaEventDestroy(event_); }
  OneShotEvent(const OneShotEvent&) = delete;
  OneShotEvent& operator=(const OneShotEvent&) = delete;
  /// Work queued on `stream` from now on waits for the marked work.
  void order_before(cudaStream_t stream, int device) const {
    check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent", device);
  }

 private:
  cudaEvent_t event_ = nullptr;
};

/// A GPU's side of a staged copy to it (StagingArea's Queue): DMAs on the
/// device's stream, marked by the context's events.
struct UploadQueue {
  using Mark = std::shared_ptr<void>;
  DeviceContext& ctx;

  void copy(void* to, const void* staged, std::size_t n) {
    check(cudaMemcpyAsync(to, staged, n, cudaMemcpyHostToDevice, ctx.stream), "a copy to the device", ctx.device);
  }
  Mark mark() { return ctx.mark(); }
  static bool finished(const Mark& m) {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(m.get()));
    if (status == cudaErrorNotReady) return false;
    // A failure here belongs to a kernel; its sync point reports it. The
    // DMA will not run any more: its block may be reused.
    if (status != cudaSuccess) (void)cudaGetLastError();
    return true;
  }
  static void wait(const Mark& m) {
    if (cudaEventSynchronize(static_cast<cudaEvent_t>(m.get())) != cudaSuccess) (void)cudaGetLastError();
  }
};

/// The process's staging area for copies to GPUs (over pinned_pool()).
inline StagingArea<UploadQueue>& staging() {
  static auto* area = new StagingArea<UploadQueue>(pinned_pool());  // leaked, see DeviceContext
  return *area;
}

class CudaBackend final : public DeviceBackend {
  static cudaEvent_t event_of(const void* mark) { return static_cast<cudaEvent_t>(const_cast<void*>(mark)); }

 public:
  const char* name() const override { return "CUDA"; }
  int device_count() override { return gpu::device_count(); }
  std::shared_ptr<engine::HostAllocator> memory(int index) override { return context(index).memory; }
  std::shared_ptr<engine::HostAllocator> pinned_memory() override { return pinned_pool(); }
  void synchronize(int index) override { context(index).synchronize(); }
  std::shared_ptr<void> mark(int index) override {
    DeviceContext& ctx = context(index);
    DeviceGuard on(ctx.device);
    return ctx.mark();
  }
  void wait_for(int index, const void* mark) override {
    if (!mark) return synchronize(index);
    check(cudaEventSynchronize(event_of(mark)), "a kernel", index);
  }
  void synchronize_all() override {
    for (DeviceContext* ctx : live_contexts()) ctx->synchronize();
  }

  void copy(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes,
            const void* after) override {
    if (bytes == 0) return;
    // copy_bytes handles host to host; here at least one side is a GPU.
    const bool to_host = to_device.type == DeviceType::cpu, from_host = from_device.type == DeviceType::cpu;
    if (from_host) {  // on the destination's stream, after the kernels that last used this block
      DeviceContext& dst = context(to_device.index);
      DeviceGuard on(dst.device);
      UploadQueue queue{dst};
      staging().upload(to, from, bytes, queue);  // returns once the source was read
      return;
    }
    DeviceContext& src = context(from_device.index);
    DeviceGuard on(src.device);
    if (to_host) {  // after the kernels that write the source; done on return
      if (after) {  // on the copy stream: the kernels queued after the writer keep running
        check(cudaStreamWaitEvent(src.copy_stream, event_of(after), 0), "cudaStreamWaitEvent", src.device);
        check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, src.copy_stream), "a copy to the host",
              src.device);
        check(cudaStreamSynchronize(src.copy_stream), "a copy to the host", src.device);
      } else {
        check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, src.stream), "a copy to the host", src.device);
        src.synchronize();
      }
      return;
    }
    if (to_device.index == from_device.index) {
      check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, src.stream), "a copy on the device",
            src.device);
      return;
    }
    // Between GPUs: the copy runs on the source's stream, after the work on
    // the destination that last used the block, and before later work there.
    DeviceContext& dst = context(to_device.index);
    OneShotEvent(dst.stream, dst.device).order_before(src.stream, src.device);
    check(cudaMemcpyPeerAsync(to, dst.device, from, src.device, bytes, src.stream), "a copy between GPUs", src.device);
    OneShotEvent(src.stream, src.device).order_before(dst.stream, dst.device);
  }

};

inline CudaBackend& cuda_backend() {
  static auto* backend = new CudaBackend();  // leaked: buffers may be freed during static destruction
  return *backend;
}

/// Registers the CUDA backend in every program that includes this header.
inline const bool cuda_backend_registered = register_gpu_backend(&cuda_backend());

}  // namespace deft::detail::gpu
