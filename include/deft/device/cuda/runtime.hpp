// The CUDA runtime as deft uses it: errors become exceptions that carry the
// CUDA error text, and each GPU has one caching memory pool, a few compute
// streams (lanes, ordered by lanes.hpp), a stream for copies to the host and
// one for collectives (NCCL, collective.hpp).
// Plain C++ (the CUDA runtime API is a C library): g++ and nvcc both compile
// it; link CUDA::cudart (deft::cuda does).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <stdexcept>
#include <vector>

#include <cuda.h>  // the driver's types only: deft links cudart alone
#include <cuda_runtime_api.h>

#include "../../core/device.hpp"
#include "../../core/error.hpp"
#include "../allocator.hpp"
#include "../../core/thresholds.hpp"
#include "free_gate.hpp"
#include "lanes.hpp"

namespace deft::detail::gpu {

/// The lanes' waits as CUDA does them (LaneTracker's Queue): an event
/// recorded on the earlier lane's stream, waited for by the later one's
/// (either may be on another GPU). Lane numbers are
/// DeviceContext::global_lane's.
struct CudaLaneQueue {
  void order(int from, int to) const;  // defined below, with the contexts
  void order_at(int from, std::uint64_t count, const std::shared_ptr<void>& mark, int to) const;
  static void marked(int, std::uint64_t) {}
  static void finished_at(int, std::uint64_t) {}
  static void queued(int, const MemoryUses&) {}
};
/// The process's record of which lanes of which GPUs used each device block.
inline LaneTracker<CudaLaneQueue>& lane_tracker();

/// Throws std::runtime_error("deft: <what> on gpu(i): <CUDA's text>") for a
/// failed call. Clears the error first when it is not sticky, so that the
/// next call on the device works again (out of memory, a bad argument).
inline void check(cudaError_t status, const char* what, int device) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  raise<std::runtime_error>(what, " on ", deft::gpu(device), ": ", cudaGetErrorName(status), " (",
                            cudaGetErrorString(status), ")");
}

/// For a call whose failure nobody can act on (a free, a query answering
/// "not yet"): clears the thread's last error, which the next Thrust launch
/// would otherwise read (CUB checks cudaPeekAtLastError) as its own failure.
inline void discard(cudaError_t status) noexcept {
  if (status != cudaSuccess) (void)cudaGetLastError();
}

/// Whether GPU `device`'s primary context exists (the driver's
/// cuDevicePrimaryCtxGetState, reached through the runtime, which deft links
/// alone). Making a device current creates its context, hundreds of MiB of
/// that GPU: a thread that never chose a device reads 0 as its current one,
/// and setting it back would create GPU 0's context in a program that uses
/// only others. True where the driver cannot tell (deft then restores as
/// CUDA's own guards do).
inline bool has_primary_context(int device) noexcept {
  // The driver's own signature: a call through any other function type is
  // undefined (UBSan's -fsanitize=function reports it).
  using GetState = CUresult(CUDAAPI*)(CUdevice device, unsigned int* flags, int* active);
  static const GetState get_state = []() noexcept -> GetState {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &f, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t status = cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &f, cudaEnableDefault, &found);
#endif
    discard(status);
    return status == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<GetState>(f) : nullptr;
  }();
  unsigned int flags = 0;
  int active = 0;
  return !get_state || get_state(device, &flags, &active) != CUDA_SUCCESS || active != 0;
}

/// Makes `device` current for the calling thread while it lives; then
/// makes the earlier device current again, unless its context does not
/// exist (has_primary_context): the thread then stays on `device`, as
/// PyTorch's guards leave it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice", device);
    changed_ = previous_ != device;
  }
  /// The same where nothing may throw (a free): a failure is cleared, and
  /// the calls made under the guard then fail on their own.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    cudaError_t status = cudaGetDevice(&previous_);
    if (status == cudaSuccess && previous_ != device) {
      status = cudaSetDevice(device);
      changed_ = status == cudaSuccess;
    }
    discard(status);
  }
  ~DeviceGuard() {
    if (changed_ && has_primary_context(previous_)) discard(cudaSetDevice(previous_));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

/// How many GPUs the CUDA runtime sees (0 without a driver or a device).
/// (Asked once: the count cannot change while a process runs.)
inline int device_count() {
  static const int n = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return count;
  }();
  return n;
}

/// Held while NCCL queues a sum's kernels on several GPUs (collective.hpp)
/// and while memory is allocated, freed or mapped for a peer: these change
/// the device's page tables and may wait for its kernels, and one of them
/// between the launches of a sum could wait for a kernel whose partners on
/// the other GPUs are not queued yet (Gloo takes one mutex around all of
/// them for this; XLA traced such a hang to a cudaMalloc next to a copy
/// into pageable memory, which deft stages through pinned blocks instead).
inline std::mutex& collective_launches() {
  static auto* m = new std::mutex;  // leaked, see DeviceContext
  return *m;
}

/// cudaMalloc / cudaFree on one device: the upstream of its cache. Its
/// frees wait for the device's recordings (FreeGate).
class DeviceMemory final : public engine::HostAllocator, public FreeGate {
 public:
  explicit DeviceMemory(int device) : device_(device) {}
  void* allocate(std::size_t bytes, std::size_t) override {
    DeviceGuard on(device_);
    void* p = nullptr;
    cudaError_t status;
    {
      std::lock_guard no_group(collective_launches());
      status = cudaMalloc(&p, bytes);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      raise<std::runtime_error>("out of memory on ", deft::gpu(device_), ": cudaMalloc of ", bytes, " bytes failed");
    }
    check(status, "cudaMalloc", device_);
    lane_tracker().add_block(p, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    free_or_park(p, bytes, alignment);
  }
  void reissue(void* p, std::size_t bytes) override { lane_tracker().reissue(p, bytes); }

 private:
  void release(void* p, std::size_t bytes, std::size_t) noexcept override;  // defined below, with the contexts
  int device_;
};

/// Whether kernels and copies on `device` reach `peer`'s memory directly
/// (NVLink or PCIe peer to peer), enabled on first ask for each pair.
/// Without it cudaMemcpyPeerAsync still works, staged through the host.
/// A pair that cannot, or whose enabling fails, is not asked again. Asked
/// on every copy between GPUs: once a pair is known, one atomic load.
inline bool peer_access(int device, int peer) {
  enum : signed char { unknown, enabled, unavailable };
  static const int n = device_count();
  static auto* known = new std::atomic<signed char>[std::size_t(n) * std::size_t(n)]{};  // leaked, see DeviceContext
  static auto& m = *new std::mutex;  // held while a pair is enabled (leaked, see DeviceContext)
  std::atomic<signed char>& state = known[std::size_t(device) * std::size_t(n) + std::size_t(peer)];
  if (const signed char s = state.load(std::memory_order_acquire); s != unknown) return s == enabled;
  std::lock_guard lk(m);
  if (const signed char s = state.load(std::memory_order_acquire); s != unknown) return s == enabled;
  int can = 0;
  cudaError_t status = cudaDeviceCanAccessPeer(&can, device, peer);
  bool on = false;
  if (status == cudaSuccess && can) {
    DeviceGuard guard(device);  // throws, and asks again next time, if the device cannot be made current
    std::lock_guard no_group(collective_launches());  // maps every allocation of `peer` for `device`
    status = cudaDeviceEnablePeerAccess(peer, 0);
    on = status == cudaSuccess || status == cudaErrorPeerAccessAlreadyEnabled;
  }
  discard(status);
  state.store(on ? enabled : unavailable, std::memory_order_release);
  return on;
}

/// cudaHostAlloc / cudaFreeHost: page-locked host memory that every GPU can
/// copy to and from by DMA (cudaHostAllocPortable). cudaFreeHost waits for
/// every device, so its frees wait for the recordings on any device.
class PinnedMemory final : public engine::HostAllocator, public FreeGate {
 public:
  void* allocate(std::size_t bytes, std::size_t) override;  // defined below, with the contexts
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    free_or_park(p, bytes, alignment);
  }

 private:
  void release(void* p, std::size_t, std::size_t) noexcept override;
};

/// One GPU's resources, created on first use: its memory cache, the compute
/// streams deft's kernels for it run on (its lanes: work on one runs in
/// order, work on different ones may overlap, lanes.hpp orders what must
/// not), `copy_streams` for copies to the host, one per lane (LaneLayout),
/// each copy ordered after the event that marks its source's writer (the
/// kernels queued after that writer go on computing while the copy runs),
/// `collective_stream` for sums across
/// GPUs (collective.hpp: NCCL's kernels on several GPUs wait for each
/// other, so nothing else may queue between them), and `capture_stream`,
/// which only records programs (program.hpp), one at a time: no other
/// thread's work can slip into a capture there.
struct DeviceContext {
  int device;
  std::shared_ptr<DeviceMemory> upstream;                // memory's
  std::shared_ptr<engine::CachingHostAllocator> memory;  // shared: buffers keep it alive
  std::vector<cudaStream_t> lanes, copy_streams;
  cudaStream_t collective_stream = nullptr, capture_stream = nullptr;
  std::mutex capture_mutex;  // held while a program records on capture_stream

  explicit DeviceContext(int d)
      : device(d),
        upstream(std::make_shared<DeviceMemory>(d)),
        memory(std::make_shared<engine::CachingHostAllocator>(upstream, thresholds::gpu_cache_max_bytes,
                                                              thresholds::gpu_cache_min_bytes, engine::BlockReuse::split)),
        lanes(std::size_t(thresholds::gpu_lanes), nullptr),
        copy_streams(std::size_t(thresholds::gpu_lanes), nullptr) {
    DeviceGuard on(d);
    for (auto* streams : {&lanes, &copy_streams})
      for (cudaStream_t& s : *streams) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", d);
    check(cudaStreamCreateWithFlags(&collective_stream, cudaStreamNonBlocking), "cudaStreamCreate", d);
    check(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking), "cudaStreamCreate", d);
  }
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  // Never destroyed (Contexts leaks them): marks may return their events
  // during static destruction.

  /// The lane numbers k of the streams (LaneLayout), and of the capture
  /// stream (the lanes' record never sees work there: a program declares
  /// its uses at launch); `tracked_lanes` have a record.
  static constexpr LaneLayout layout{thresholds::gpu_lanes};
  static constexpr int collective_lane = layout.collective(), tracked_lanes = layout.tracked(),
                       capture_lane = tracked_lanes;
  /// The stream of lane k (a compute or copy lane, or one of the two above).
  cudaStream_t stream(int k) const {
    if (k >= 0 && k < layout.compute) return lanes[std::size_t(k)];
    if (layout.is_copy(k)) return copy_streams[std::size_t(k - layout.compute)];
    return k == collective_lane ? collective_stream : capture_stream;
  }
  /// The tracker's number for lane k of this device (not capture_lane).
  int global_lane(int k) const { return device * tracked_lanes + k; }

  /// Waits for every kernel queued on the device's streams; rethrows their
  /// failure. (The tracker then needs no waits for that work.)
  void synchronize() {
    DeviceGuard on(device);  // a wait needs a context: this GPU's, not whichever is current
    for (int k = 0; k < tracked_lanes; ++k)
      lane_tracker().host_waits(global_lane(k), [&] { check(cudaStreamSynchronize(stream(k)), "a kernel", device); });
  }

  /// An event recorded on `on` (one of this device's streams) now, returned
  /// to this context's free list when the last holder of the mark lets go
  /// (events are reused: one is made only when every earlier one is still
  /// held).
  std::shared_ptr<void> mark(cudaStream_t on) {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard lk(events_m_);
      if (!free_events_.empty()) e = free_events_.back(), free_events_.pop_back();
    }
    if (!e) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", device);
    if (const cudaError_t status = cudaEventRecord(e, on); status != cudaSuccess) {
      give_back(e);
      check(status, "cudaEventRecord", device);
    }
    return {static_cast<void*>(e), [this](void* p) { give_back(static_cast<cudaEvent_t>(p)); }};
  }

 private:
  void give_back(cudaEvent_t e) noexcept {
    std::lock_guard lk(events_m_);
    try {
      free_events_.push_back(e);
    } catch (...) {
      discard(cudaEventDestroy(e));
    }
  }
  std::mutex events_m_;
  std::vector<cudaEvent_t> free_events_;
};

/// The process's page-locked host memory: the upstream, whose frees wait
/// for recordings, and its pool, cached at every size (pinning maps and
/// locks every page, and CUDA lets no two streams overlap across a
/// page-locked allocation): staging blocks and host tensors copied from a
/// GPU, down to a loss copied back each step.
inline const std::shared_ptr<PinnedMemory>& pinned_upstream() {
  static auto* upstream = new std::shared_ptr<PinnedMemory>(std::make_shared<PinnedMemory>());  // leaked, see DeviceContext
  return *upstream;
}
inline const std::shared_ptr<engine::CachingHostAllocator>& pinned_pool() {
  static auto* pool = new std::shared_ptr<engine::CachingHostAllocator>(  // leaked, see DeviceContext
      std::make_shared<engine::CachingHostAllocator>(pinned_upstream(), thresholds::pinned_cache_max_bytes, 0));
  return *pool;
}

/// Every GPU's context, made on first use. A context is looked up at every
/// kernel launch and copy, from any worker: the lookup is one acquire load;
/// the lock is taken only to make a context.
struct Contexts {
  std::mutex m;  // held while a context is made
  const int count = device_count();
  const std::unique_ptr<std::atomic<DeviceContext*>[]> list{new std::atomic<DeviceContext*>[std::size_t(count)]{}};
  static Contexts& get() {
    static auto* contexts = new Contexts;  // leaked, see DeviceContext
    return *contexts;
  }
};

/// The context of GPU `index`; raises std::invalid_argument for a GPU that
/// does not exist (naming how many there are).
inline DeviceContext& context(int index) {
  auto& c = Contexts::get();
  if (index < 0 || index >= c.count) raise("no device ", deft::gpu(index), ": this machine has ", c.count, " CUDA GPU(s)");
  auto& slot = c.list[std::size_t(index)];
  if (DeviceContext* ctx = slot.load(std::memory_order_acquire)) return *ctx;
  std::lock_guard lk(c.m);
  DeviceContext* ctx = slot.load(std::memory_order_relaxed);  // another thread may have made it meanwhile
  if (!ctx) {
    ctx = new DeviceContext(index);  // leaked, see DeviceContext
    slot.store(ctx, std::memory_order_release);
  }
  return *ctx;
}

/// The contexts made so far (those of GPUs this process used).
inline std::vector<DeviceContext*> live_contexts() {
  auto& c = Contexts::get();
  std::vector<DeviceContext*> live;
  for (int i = 0; i < c.count; ++i)
    if (DeviceContext* ctx = c.list[std::size_t(i)].load(std::memory_order_acquire)) live.push_back(ctx);
  return live;
}

/// A GPU whose context exists, for calls that need a context but no
/// particular GPU (page-locked host memory): the current one if its context
/// exists, else the first GPU deft used, so that none is made for GPU 0 in a
/// program that uses only others.
inline int device_with_context() noexcept {
  int current = 0;
  discard(cudaGetDevice(&current));
  if (has_primary_context(current)) return current;
  auto& c = Contexts::get();
  for (int i = 0; i < c.count; ++i)
    if (c.list[std::size_t(i)].load(std::memory_order_acquire)) return i;
  return current;
}

inline void* PinnedMemory::allocate(std::size_t bytes, std::size_t) {
  DeviceGuard on(device_with_context());
  void* p = nullptr;
  cudaError_t status;
  {
    std::lock_guard no_group(collective_launches());
    status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    raise<std::runtime_error>("cudaHostAlloc of ", bytes, " bytes of page-locked host memory failed: ",
                              cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
  }
  return p;
}

inline void PinnedMemory::release(void* p, std::size_t, std::size_t) noexcept {
  DeviceGuard on(device_with_context(), std::nothrow);
  std::lock_guard no_group(collective_launches());
  discard(cudaFreeHost(p));
}

inline void CudaLaneQueue::order(int from, int to) const {
  constexpr int per_device = DeviceContext::tracked_lanes;
  DeviceContext& src = context(from / per_device);
  DeviceContext& dst = context(to / per_device);
  DeviceGuard on(src.device);
  const auto m = src.mark(src.stream(from % per_device));
  check(cudaStreamWaitEvent(dst.stream(to % per_device), static_cast<cudaEvent_t>(m.get()), 0),
        "cudaStreamWaitEvent", dst.device);
}

inline void CudaLaneQueue::order_at(int /*from*/, std::uint64_t /*count*/, const std::shared_ptr<void>& mark,
                                    int to) const {
  DeviceContext& dst = context(to / DeviceContext::tracked_lanes);
  DeviceGuard on(dst.device);
  check(cudaStreamWaitEvent(dst.stream(to % DeviceContext::tracked_lanes), static_cast<cudaEvent_t>(mark.get()), 0),
        "cudaStreamWaitEvent", dst.device);
}

inline void DeviceMemory::release(void* p, std::size_t bytes, std::size_t) noexcept {
  // cudaFree of cudaMalloc's memory "may" wait for the device (CUDA 12's
  // documentation), not must, and a copy on a peer GPU's lane reads its
  // source there: every GPU's queued work is waited for first. (Outside
  // collective_launches: a stream's wait does not stop another thread's
  // launches.)
  try {
    for (const DeviceContext* ctx : live_contexts()) {
      DeviceGuard on(ctx->device, std::nothrow);
      for (int k = 0; k < DeviceContext::tracked_lanes; ++k) discard(cudaStreamSynchronize(ctx->stream(k)));
    }
  } catch (...) {  // no memory for the list of contexts: cudaFree's own wait is all there is
  }
  lane_tracker().remove_block(p, bytes);  // before the free: then cudaMalloc may hand the address out again
  DeviceGuard on(device_, std::nothrow);
  std::lock_guard no_group(collective_launches());
  discard(cudaFree(p));  // a failure leaves the block unusable: the device has failed
}

inline LaneTracker<CudaLaneQueue>& lane_tracker() {
  static auto* tracker =  // leaked, see DeviceContext
      new LaneTracker<CudaLaneQueue>(std::max(device_count(), 1) * DeviceContext::tracked_lanes, CudaLaneQueue{});
  return *tracker;
}

}  // namespace deft::detail::gpu
