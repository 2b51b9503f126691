// The CUDA backend of deft's engine: GPU buffers from each device's caching
// pool, copies between the host and GPUs on the devices' lanes (through
// pinned blocks, staging.hpp, except into page-locked host memory, which
// the DMA reaches itself), the lanes' ordering (lanes.hpp), device programs
// as CUDA graphs (program.hpp), sums across GPUs and collectives between
// processes through NCCL (collective.hpp), and waits that raise the CUDA
// error text. Plain C++ over the CUDA runtime (g++ and nvcc both compile
// it); including it registers the backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include <cuda_runtime_api.h>

#include "../backend.hpp"
#include "collective.hpp"
#include "program.hpp"
#include "runtime.hpp"
#include "staging.hpp"

namespace deft::detail::gpu {

/// One of a GPU's streams as StagingArea's queues see it: DMAs queued on
/// it, marked by the context's events.
struct StreamQueue {
  using Mark = std::shared_ptr<void>;
  DeviceContext& ctx;
  cudaStream_t stream;

  Mark mark() { return ctx.mark(stream); }
  static cudaEvent_t event(const Mark& m) { return static_cast<cudaEvent_t>(m.get()); }
};

/// A GPU's side of a staged copy to it (StagingArea's Queue).
struct UploadQueue : StreamQueue {
  void copy(void* to, const void* staged, std::size_t n) {
    check(cudaMemcpyAsync(to, staged, n, cudaMemcpyHostToDevice, stream), "a copy to the device", ctx.device);
  }
  static bool finished(const Mark& m) {
    const cudaError_t status = cudaEventQuery(event(m));
    // "Not ready" is kept as the thread's last error too. A failure belongs
    // to a kernel, whose sync point reports it; the DMA will not run any
    // more, so its block may be reused.
    discard(status);
    return status != cudaErrorNotReady;
  }
  static void wait(const Mark& m) { discard(cudaEventSynchronize(event(m))); }
};

/// A GPU's side of a staged copy into pageable host memory (StagingArea's
/// download), on one of the device's copy streams; a wait raises the CUDA
/// error text.
struct DownloadQueue : StreamQueue {
  void fetch(void* staged, const void* from, std::size_t n) {
    check(cudaMemcpyAsync(staged, from, n, cudaMemcpyDeviceToHost, stream), "a copy to the host", ctx.device);
  }
  void wait(const Mark& m) { check(cudaEventSynchronize(event(m)), "a copy to the host", ctx.device); }
  void copy_unstaged(void* to, const void* from, std::size_t n) {
    check(cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToHost, stream), "a copy to the host", ctx.device);
    check(cudaStreamSynchronize(stream), "a copy to the host", ctx.device);
  }
};

/// Whether a DMA reaches the host memory at p without staging: page-locked
/// (cudaHostAlloc'd or cudaHostRegister'ed) or managed. A copy asks once,
/// of its first byte.
inline bool page_locked(const void* p) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  discard(status);
  return status == cudaSuccess && attributes.type != cudaMemoryTypeUnregistered;
}

/// The process's staging area for copies between the host and GPUs (over pinned_pool()).
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
    const int k = current_lane(index);
    if (k >= DeviceContext::tracked_lanes) return ctx.mark(ctx.stream(k));  // a capture's: no lane's work
    // Kept by the lanes' record: a later wait for this work waits for this
    // event, not for everything the lane queued by then.
    return lane_tracker().mark(ctx.global_lane(k), [&] { return ctx.mark(ctx.stream(k)); });
  }
  void wait_for(int index, const void* mark) override {
    if (!mark) return synchronize(index);
    {
      DeviceGuard on(index);  // a wait needs a context: this GPU's, not whichever is current
      check(cudaEventSynchronize(event_of(mark)), "a kernel", index);
    }
    lane_tracker().finished_mark(mark, context(index).global_lane(0), DeviceContext::tracked_lanes);
  }
  void synchronize_all() override {
    for (DeviceContext* ctx : live_contexts()) ctx->synchronize();
  }
  int lanes() override { return thresholds::gpu_lanes; }
  void before_work(int index, int lane, const MemoryUses& uses) override {
    lane_tracker().before(context(index).global_lane(lane), uses);
  }
  void after_work(int index, int lane, const MemoryUses& uses) override {
    lane_tracker().after(context(index).global_lane(lane), uses);
  }
  std::unique_ptr<DeviceProgram> record(int index, const std::function<void()>& work) override {
    return record_program(*this, index, work);
  }
  bool sums_across(const std::vector<int>& devices) override { return nccl_sums_across(devices); }
  void sum_across(const std::vector<SumPart>& parts, std::size_t count, DType dtype) override {
    nccl_sum(*this, parts, count, dtype);
  }
  bool groups_processes() override { return nccl_groups_processes(); }
  std::vector<std::byte> new_process_group_id() override { return nccl_new_group_id(); }
  std::unique_ptr<ProcessGroup> join_process_group(const std::vector<std::byte>& id, int ranks, int rank,
                                                   int device) override {
    return nccl_join_group(*this, id, ranks, rank, device);
  }

  void copy(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes) override {
    if (bytes == 0) return;
    // copy_bytes handles host to host; here at least one side is a GPU.
    const bool to_host = to_device.type == DeviceType::cpu, from_host = from_device.type == DeviceType::cpu;
    if (from_host) {  // on the calling thread's lane of the destination
      DeviceContext& dst = context(to_device.index);
      DeviceGuard on(dst.device);
      LaneAccess access(*this, dst.device, {{}, {to}});
      UploadQueue queue{{dst, dst.stream(access.lane())}};
      staging().upload(to, from, bytes, queue);  // returns once the source was read
      return;
    }
    DeviceContext& src = context(from_device.index);
    if (to_host) {  // on the copy lane of the source's writer, after it; done on return
      DeviceGuard on(src.device);
      const int k = DeviceContext::layout.copy_after(lane_tracker().writer_lane(from));
      {
        // The lanes' record orders the copy after the source's writer (after
        // the writer's ready mark, when that is still kept), not after work
        // queued since on the writer's lane.
        LaneScope copy_lane(src.device, k);
        LaneAccess access(*this, src.device, {{from}, {}});
        if (page_locked(to)) {
          check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, src.stream(k)), "a copy to the host",
                src.device);
        } else {
          DownloadQueue queue{{src, src.stream(k)}};
          staging().download(to, from, bytes, queue);  // returns once every chunk arrived
        }
      }
      // Once done, the work the copy lane waited for needs no waits either.
      lane_tracker().host_waits(src.global_lane(k), [&] {
        check(cudaStreamSynchronize(src.stream(k)), "a copy to the host", src.device);
      });
      return;
    }
    // Between GPUs or on one: on the calling thread's lane of the destination
    // (the record is process-wide: the source's lanes may be another GPU's).
    DeviceContext& dst = context(to_device.index);
    if (src.device != dst.device) (void)peer_access(dst.device, src.device);  // a direct DMA where the GPUs allow it
    DeviceGuard on(dst.device);
    cudaError_t status;
    {
      LaneAccess access(*this, dst.device, {{from}, {to}});
      const cudaStream_t stream = dst.stream(access.lane());
      status = src.device == dst.device
                   ? cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream)
                   : cudaMemcpyPeerAsync(to, dst.device, from, src.device, bytes, stream);
    }
    check(status, src.device == dst.device ? "a copy on the device" : "a copy between GPUs", dst.device);
  }
};

inline CudaBackend& cuda_backend() {
  static auto* backend = new CudaBackend();  // leaked: buffers may be freed during static destruction
  return *backend;
}

/// Registers the CUDA backend in every program that includes this header.
inline const bool cuda_backend_registered = register_gpu_backend(&cuda_backend());

}  // namespace deft::detail::gpu
