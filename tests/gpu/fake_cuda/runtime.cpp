// The stand-in's CUDA runtime (the toolkit's own header declares it): GPUs
// whose memory is host memory and whose streams are host threads. Each stream runs its work in order on a thread
// of its own, so work on different streams overlaps as on a GPU, and a
// missing wait between streams is a real data race (ThreadSanitizer sees
// it) or a read of freed memory (AddressSanitizer sees it). What deft's
// backend may do is checked as CUDA checks it: see README.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "fake_cuda.hpp"

namespace {

using Work = std::function<void()>;

/// Work that fails with a CUDA error of its own (a copy of freed memory).
struct Fault : std::runtime_error {
  cudaError_t status;
  Fault(cudaError_t s, const std::string& what) : std::runtime_error(what), status(s) {}
};

}  // namespace

struct CUgraph_st {
  int device;
  std::uint64_t capture;    // the capture that recorded it
  std::vector<Work> work;   // in stream order
};

/// A graph's launches run one after another, in the order they were queued
/// (CUDA orders each launch after the exec's earlier ones, on any stream).
struct LaunchOrder {
  std::uint64_t queued = 0, finished = 0;
};

struct CUgraphExec_st {
  int device;
  std::shared_ptr<const std::vector<Work>> work;  // shared: a launch may outlive the exec
  std::shared_ptr<LaunchOrder> order = std::make_shared<LaunchOrder>();
};

struct CUstream_st {
  int device;
  std::deque<Work> queue;
  std::uint64_t queued = 0, done = 0;
  CUgraph_st* capture = nullptr;     // while capturing, where its work goes
  bool capture_invalid = false;      // an illegal call during the capture
};

struct CUevent_st {
  int device;
  CUstream_st* stream = nullptr;      // of the last record
  std::uint64_t recorded = 0;         // the last record's number (0: never recorded)
  std::set<std::uint64_t> pending;    // records their stream has not reached yet
  std::uint64_t capture = 0;          // the capture it was last recorded in (0: none)
};

namespace {

struct Block {
  std::size_t bytes;
  int device;               // -1 for host memory
  bool registered = false;  // cudaHostRegister'ed (not the stand-in's to free)
  std::uint64_t serial = 0;  // which allocation: a block freed and another at its address differ
};

struct State {
  std::mutex m;
  std::condition_variable changed;  // any stream's work finished or was queued
  int devices = 2;
  std::size_t memory_limit = std::size_t(8) << 30;  // per device
  std::vector<std::size_t> in_use;
  std::map<std::uintptr_t, Block> blocks;  // device and page-locked host memory, by address
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events, destroyed_events;  // destroyed: kept, a wait may still name them
  std::set<std::pair<int, int>> peers;              // (device, peer) with access enabled
  std::uint64_t captures = 0, allocations = 0;
  int open_groups = 0;  // NCCL groups being queued (fake_cuda::collective_group)
  // A device's first fault (work that failed on one of its streams): like a
  // GPU's sticky error, every later call for the device returns it. The
  // stand-in's streams still run what they are given (nothing waits
  // forever), but no call for the device succeeds any more.
  std::vector<cudaError_t> faults;
  // Which devices' primary contexts exist: CUDA makes one on the first call
  // that needs it on a thread where the device is current (cudaSetDevice
  // included, since CUDA 12), and it holds hundreds of MiB of the GPU.
  std::unique_ptr<std::atomic<bool>[]> contexts;
  std::map<std::string, unsigned long long> calls;  // see fake_cuda::calls
  std::map<std::string, fake_cuda::Fault> injected;  // see fake_cuda::inject
  std::map<std::uint64_t, int> queued_uses;  // by allocation: copies and memsets queued on it, not run yet
  unsigned jitter_us = 50;  // work waits up to this long before it runs (see run_stream)

  State() {
    if (const char* n = std::getenv("DEFT_FAKE_CUDA_DEVICES")) devices = std::max(0, std::atoi(n));
    if (const char* b = std::getenv("DEFT_FAKE_CUDA_MEMORY")) memory_limit = std::strtoull(b, nullptr, 10);
    if (const char* j = std::getenv("DEFT_FAKE_CUDA_JITTER_US")) jitter_us = unsigned(std::max(0, std::atoi(j)));
    in_use.assign(std::size_t(std::max(devices, 1)), 0);
    faults.assign(std::size_t(std::max(devices, 1)), cudaSuccess);
    contexts.reset(new std::atomic<bool>[std::size_t(std::max(devices, 1))]{});
  }
  cudaError_t fault(int device) const { return device >= 0 ? faults[std::size_t(device)] : cudaSuccess; }
  void fail(int device, cudaError_t status) {  // the first fault stays
    if (!faults[std::size_t(device)]) faults[std::size_t(device)] = status;
  }

  /// The block holding [p, p + bytes), or null.
  const Block* find(const void* p, std::size_t bytes = 1) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return nullptr;
    --it;
    return a + std::max<std::size_t>(bytes, 1) <= it->first + it->second.bytes ? &it->second : nullptr;
  }
  /// Whether [p, p + bytes) still lies in the allocation `serial`.
  bool live(const void* p, std::size_t bytes, std::uint64_t serial) const {
    const Block* b = find(p, bytes);
    return b && b->serial == serial;
  }
  void add_block(const void* p, Block b) {
    b.serial = ++allocations;
    blocks[reinterpret_cast<std::uintptr_t>(p)] = b;
  }
  const Block* device_block(const void* p, std::size_t bytes) const {
    const Block* b = find(p, bytes);
    return b && b->device >= 0 ? b : nullptr;
  }

  /// Queues work on s (the lock held), or records it into s's capture;
  /// after an illegal call the capture takes nothing more (CUDA's
  /// cudaErrorStreamCaptureInvalidated).
  cudaError_t enqueue(CUstream_st* s, Work w, const char* what) {
    ++calls[what];
    if (s->capture) {
      if (s->capture_invalid) return cudaErrorStreamCaptureInvalidated;
      s->capture->work.push_back(std::move(w));
      return cudaSuccess;
    }
    s->queue.push_back(std::move(w));
    ++s->queued;
    changed.notify_all();
    return cudaSuccess;
  }
  /// Invalidates the captures on `device`'s streams (-1: every device's) and
  /// says whether there were any: a call that conflicts with them fails.
  bool break_captures(int device) {
    bool any = false;
    for (CUstream_st* s : streams)
      if (s->capture && (device < 0 || s->device == device)) s->capture_invalid = any = true;
    return any;
  }
  void break_capture(std::uint64_t id) {
    for (CUstream_st* s : streams)
      if (s->capture && s->capture->capture == id) s->capture_invalid = true;
  }
  /// Waits (the lock held) until s has run everything queued so far.
  void drain(std::unique_lock<std::mutex>& lk, CUstream_st* s) {
    const std::uint64_t target = s->queued;
    changed.wait(lk, [&] { return s->done >= target; });
  }
};

State& state() {
  static auto* s = new State;  // leaked: streams run until the process ends
  return *s;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local int my_groups = 0;  // NCCL groups this thread is queueing

cudaError_t result(cudaError_t status) {
  if (status != cudaSuccess) last_error = status;
  return status;
}
cudaError_t refuse(cudaError_t status, const std::string& why);
/// Calls that change page tables (allocations, frees, peer mappings) while
/// another thread queues an NCCL group: on GPUs such a call may wait for a
/// kernel whose partners are not launched yet, and hang.
cudaError_t beside_a_group(const char* call);
cudaError_t refuse(cudaError_t status, const std::string& why) {
  fake_cuda::explain(why.c_str());
  return result(status);
}

// Each piece of work waits a random while (up to jitter_us) before it
// runs: work on other streams that is not ordered before it then often
// runs after it, and a missing wait shows as a wrong value, not only to
// ThreadSanitizer.
cudaError_t beside_a_group(const char* call) {  // the lock held
  if (state().open_groups > my_groups)
    return refuse(cudaErrorNotPermitted,
                  std::string(call) + " while another thread queues an NCCL group (on GPUs this may hang)");
  return cudaSuccess;
}

void run_stream(CUstream_st* s) {
  State& st = state();
  std::minstd_rand jitter(unsigned(reinterpret_cast<std::uintptr_t>(s) >> 4));
  std::unique_lock lk(st.m);
  for (;;) {
    st.changed.wait(lk, [&] { return !s->queue.empty(); });
    Work w = std::move(s->queue.front());
    s->queue.pop_front();
    const unsigned wait_us = st.jitter_us ? unsigned(jitter() % (st.jitter_us + 1)) : 0;
    lk.unlock();
    if (wait_us) std::this_thread::sleep_for(std::chrono::microseconds(wait_us));
    cudaError_t failure = cudaSuccess;
    try {
      w();
    } catch (const Fault& f) {
      fake_cuda::explain(f.what());
      failure = f.status;
    } catch (const std::exception& e) {
      fake_cuda::explain((std::string("a kernel on gpu(") + std::to_string(s->device) + ") failed: " + e.what()).c_str());
      failure = cudaErrorLaunchFailure;
    } catch (...) {
      fake_cuda::explain((std::string("a kernel on gpu(") + std::to_string(s->device) + ") failed").c_str());
      failure = cudaErrorLaunchFailure;
    }
    lk.lock();
    if (failure != cudaSuccess) st.fail(s->device, failure);
    ++s->done;
    st.changed.notify_all();
  }
}

bool valid_device(int d) { return d >= 0 && d < state().devices; }

/// A call that needs the current device's primary context makes it.
void uses_context() {
  if (valid_device(current_device)) state().contexts[std::size_t(current_device)].store(true);
}

/// The driver's cuDevicePrimaryCtxGetState (a CUdevice is its ordinal).
CUresult primary_context_state(CUdevice device, unsigned int* flags, int* active) {
  if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = state().contexts[std::size_t(device)].load() ? 1 : 0;
  return CUDA_SUCCESS;
}

CUstream_st* stream_of(cudaStream_t s) {
  return state().streams.count(s) ? s : nullptr;  // the lock held
}
CUevent_st* event_of(cudaEvent_t e) {
  return state().events.count(e) ? e : nullptr;
}

/// A copy as work: checks, when it runs, that the device and page-locked
/// memory it touches is still allocated (a free before the copy ran is the
/// caller's bug: on a GPU the DMA would read or write reused memory).
/// Counts work queued on allocations (the lock held): freeing one before
/// such work ran faults the device at once (cudaFree), and so does the work
/// itself when it runs (copy_work). Captured work is not counted: a graph
/// may run it any number of times.
void count_use(std::uint64_t serial, int step) {
  if (!serial) return;
  auto& uses = state().queued_uses;
  if ((uses[serial] += step) == 0) uses.erase(serial);
}

/// A null block is pageable memory, which is not checked.
Work copy_work(void* to, const void* from, std::size_t bytes, const Block* to_block, const Block* from_block, int device,
               bool counted) {
  const std::uint64_t to_serial = to_block ? to_block->serial : 0, from_serial = from_block ? from_block->serial : 0;
  if (counted) count_use(to_serial, 1), count_use(from_serial, 1);
  return [=] {
    {
      State& st = state();
      std::lock_guard lk(st.m);
      if (counted) count_use(to_serial, -1), count_use(from_serial, -1);
      if ((to_serial && !st.live(to, bytes, to_serial)) || (from_serial && !st.live(from, bytes, from_serial)))
        throw Fault(cudaErrorIllegalAddress, "a copy on gpu(" + std::to_string(device) + ") of " + std::to_string(bytes) +
                                                 " bytes ran after its device or page-locked memory was freed");
    }
    std::memcpy(to, from, bytes);
  };
}

void* allocate(std::size_t bytes, std::size_t alignment) {
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (p) std::memset(p, 0xff, rounded);  // uninitialised memory reads as NaN, not as zeros
  return p;
}

}  // namespace

namespace fake_cuda {

void explain(const char* message) { std::fprintf(stderr, "fake CUDA: %s\n", message); }

bool has_context(int device) { return valid_device(device) && state().contexts[std::size_t(device)].load(); }

void make_context(int device) {
  if (valid_device(device)) state().contexts[std::size_t(device)].store(true);
}

int device_of(cudaStream_t stream) {
  State& st = state();
  std::lock_guard lk(st.m);
  const CUstream_st* s = stream_of(stream);
  return s ? s->device : -1;
}

cudaError_t launch(cudaStream_t stream, std::function<void()> work, const char* what) {
  State& st = state();
  std::lock_guard lk(st.m);
  CUstream_st* s = stream_of(stream);
  if (!s) return refuse(cudaErrorInvalidResourceHandle, std::string(what) + ": not a stream (the legacy default stream is not modelled)");
  if (const cudaError_t f = st.fault(s->device)) return result(f);
  uses_context();
  if (s->device != current_device)
    return refuse(cudaErrorInvalidResourceHandle, std::string(what) + " launched on a stream of gpu(" +
                                                      std::to_string(s->device) + ") while gpu(" +
                                                      std::to_string(current_device) + ") is current");
  return result(st.enqueue(s, std::move(work), what));
}

void collective_group(bool open) {
  State& st = state();
  std::lock_guard lk(st.m);
  const int step = open ? 1 : -1;
  st.open_groups += step;
  my_groups += step;
}

int device_memory_of(const void* p, std::size_t bytes) {
  State& st = state();
  std::lock_guard lk(st.m);
  const Block* b = st.device_block(p, bytes);
  return b ? b->device : -1;
}

void inject(const char* call, Fault fault) {
  State& st = state();
  std::lock_guard lk(st.m);
  st.injected[call] = fault;
}

Fault take_fault(const char* call) {
  State& st = state();
  std::lock_guard lk(st.m);
  const auto it = st.injected.find(call);
  if (it == st.injected.end()) return Fault::none;
  const Fault f = it->second;
  st.injected.erase(it);
  return f;
}

unsigned long long calls(const char* what) {
  State& st = state();
  std::lock_guard lk(st.m);
  const auto it = st.calls.find(what);
  return it == st.calls.end() ? 0 : it->second;
}

}  // namespace fake_cuda

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = state().devices;
  return *count > 0 ? cudaSuccess : result(cudaErrorNoDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return result(cudaErrorInvalidDevice);
  current_device = device;
  uses_context();
  return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* found) {
  const bool known = std::strcmp(symbol, "cuDevicePrimaryCtxGetState") == 0;
  *function = known ? reinterpret_cast<void*>(&primary_context_state) : nullptr;
  if (found) *found = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return std::exchange(last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
    default: break;
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorNotPermitted: return "operation not permitted";
    default: break;
  }
  return "unknown error";
}

// Memory ---------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  uses_context();
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  State& st = state();
  {
    std::lock_guard lk(st.m);
    if (const cudaError_t f = st.fault(current_device)) return result(f);
    if (const cudaError_t status = beside_a_group("cudaMalloc")) return status;
    std::size_t& used = st.in_use[std::size_t(current_device)];
    if (bytes > st.memory_limit - used) return result(cudaErrorMemoryAllocation);
    used += bytes;  // reserved while the memory is filled, outside the lock
  }
  void* p = allocate(bytes, 256);
  std::lock_guard lk(st.m);
  if (!p) {
    st.in_use[std::size_t(current_device)] -= bytes;
    return result(cudaErrorMemoryAllocation);
  }
  st.add_block(p, Block{bytes, current_device});
  *ptr = p;
  return cudaSuccess;
}

// cudaFree is not made to wait for the device: CUDA says it may, not that it
// must, and deft's backend waits itself (DeviceMemory::release). That it may
// makes it conflict with a capture on the device (deft parks such frees).
cudaError_t cudaFree(void* ptr) {
  uses_context();
  if (!ptr) return cudaSuccess;
  State& st = state();
  std::lock_guard lk(st.m);
  const auto it = st.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == st.blocks.end() || it->second.device < 0) return refuse(cudaErrorInvalidValue, "cudaFree of memory cudaMalloc did not return");
  if (const cudaError_t f = st.fault(it->second.device)) return result(f);  // the memory stays lost, as on a failed GPU
  if (const cudaError_t status = beside_a_group("cudaFree")) return status;
  if (st.break_captures(it->second.device))
    return refuse(cudaErrorStreamCaptureUnsupported, "cudaFree while gpu(" + std::to_string(it->second.device) + ") captures");
  if (st.queued_uses.count(it->second.serial)) {  // on a GPU the queued work would touch reused memory
    fake_cuda::explain(("cudaFree of a block of gpu(" + std::to_string(it->second.device) +
                        ") that a queued copy or memset has not used yet")
                           .c_str());
    st.fail(it->second.device, cudaErrorIllegalAddress);
  }
  st.in_use[std::size_t(it->second.device)] -= it->second.bytes;
  st.blocks.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  uses_context();
  *ptr = nullptr;
  State& st = state();
  {
    std::lock_guard lk(st.m);
    if (const cudaError_t f = st.fault(current_device)) return result(f);
    if (const cudaError_t status = beside_a_group("cudaHostAlloc")) return status;
  }
  void* p = allocate(std::max<std::size_t>(bytes, 1), 4096);
  if (!p) return result(cudaErrorMemoryAllocation);
  std::lock_guard lk(st.m);
  st.add_block(p, Block{std::max<std::size_t>(bytes, 1), -1});
  *ptr = p;
  return cudaSuccess;
}

// cudaFreeHost waits for every stream first, as CUDA's does in practice
// (deft's PinnedMemory relies on it), so it conflicts with any capture.
cudaError_t cudaFreeHost(void* ptr) {
  uses_context();
  if (!ptr) return cudaSuccess;
  State& st = state();
  std::unique_lock lk(st.m);
  const auto it = st.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == st.blocks.end() || it->second.device >= 0 || it->second.registered)
    return refuse(cudaErrorInvalidValue, "cudaFreeHost of memory cudaHostAlloc did not return");
  if (const cudaError_t f = st.fault(current_device)) return result(f);
  if (const cudaError_t status = beside_a_group("cudaFreeHost")) return status;
  if (st.break_captures(-1)) return refuse(cudaErrorStreamCaptureUnsupported, "cudaFreeHost during a capture");
  for (CUstream_st* s : st.streams) st.drain(lk, s);
  st.blocks.erase(reinterpret_cast<std::uintptr_t>(ptr));
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  const auto a = reinterpret_cast<std::uintptr_t>(ptr);
  if (!ptr || bytes == 0) return result(cudaErrorInvalidValue);
  if (const cudaError_t f = st.fault(current_device)) return result(f);
  auto next = st.blocks.lower_bound(a);
  if (st.find(ptr) || (next != st.blocks.end() && next->first < a + bytes)) return result(cudaErrorHostMemoryAlreadyRegistered);
  st.add_block(ptr, Block{bytes, -1, true});
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* ptr) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  const auto it = st.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == st.blocks.end() || !it->second.registered) return result(cudaErrorHostMemoryNotRegistered);
  st.blocks.erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  *attributes = cudaPointerAttributes{};
  attributes->type = cudaMemoryTypeUnregistered;
  attributes->device = -2;
  if (const Block* b = st.find(ptr)) {
    const bool device = b->device >= 0;
    attributes->type = device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attributes->device = device ? b->device : current_device;
    attributes->devicePointer = const_cast<void*>(ptr);
    attributes->hostPointer = device ? nullptr : const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

// Streams and events -----------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  uses_context();
  if (flags != cudaStreamNonBlocking)
    return refuse(cudaErrorInvalidValue, "only non-blocking streams are modelled (no legacy default stream)");
  auto* s = new CUstream_st{};
  s->device = current_device;
  {
    State& st = state();
    std::lock_guard lk(st.m);
    st.streams.insert(s);
  }
  std::thread(run_stream, s).detach();
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  uses_context();
  State& st = state();
  std::unique_lock lk(st.m);
  CUstream_st* s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    s->capture_invalid = true;
    return refuse(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize of a capturing stream");
  }
  st.drain(lk, s);
  return result(st.fault(s->device));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  uses_context();
  auto* e = new CUevent_st{};
  e->device = current_device;
  State& st = state();
  std::lock_guard lk(st.m);
  st.events.insert(e);
  *event = e;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

// CUDA lets an event be destroyed while work is queued to reach it: it is
// released then. Here it is kept (a queued wait still reads it).
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  if (!event_of(event)) return result(cudaErrorInvalidResourceHandle);
  st.events.erase(event);
  st.destroyed_events.insert(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  CUevent_st* e = event_of(event);
  CUstream_st* s = stream_of(stream);
  if (!e || !s) return result(cudaErrorInvalidResourceHandle);
  if (const cudaError_t f = st.fault(s->device)) return result(f);
  if (e->device != s->device)
    return refuse(cudaErrorInvalidResourceHandle, "cudaEventRecord of an event of gpu(" + std::to_string(e->device) +
                                                      ") on a stream of gpu(" + std::to_string(s->device) + ")");
  e->stream = s;
  if (s->capture) {  // a capture's event orders the capture's own streams; no node of its own
    if (s->capture_invalid) return result(cudaErrorStreamCaptureInvalidated);
    e->capture = s->capture->capture;
    return cudaSuccess;
  }
  e->capture = 0;
  const std::uint64_t n = ++e->recorded;
  e->pending.insert(n);
  return result(st.enqueue(s, [e, n] {
    State& st = state();
    std::lock_guard lk(st.m);
    e->pending.erase(n);
    st.changed.notify_all();
  }, "cudaEventRecord"));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  CUevent_st* e = event_of(event);
  if (!e) return result(cudaErrorInvalidResourceHandle);
  if (e->capture) {
    st.break_capture(e->capture);
    return refuse(cudaErrorCapturedEvent, "cudaEventQuery of an event recorded in a capture");
  }
  if (const cudaError_t f = st.fault(e->device)) return result(f);
  if (e->pending.count(e->recorded)) return result(cudaErrorNotReady);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  uses_context();
  State& st = state();
  std::unique_lock lk(st.m);
  CUevent_st* e = event_of(event);
  if (!e) return result(cudaErrorInvalidResourceHandle);
  if (e->capture) {
    st.break_capture(e->capture);
    return refuse(cudaErrorCapturedEvent, "cudaEventSynchronize of an event recorded in a capture");
  }
  const std::uint64_t n = e->recorded;
  st.changed.wait(lk, [&] { return !e->pending.count(n); });
  return result(st.fault(e->device));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  CUstream_st* s = stream_of(stream);
  CUevent_st* e = event_of(event);
  if (!e || !s) return result(cudaErrorInvalidResourceHandle);
  if (const cudaError_t f = st.fault(s->device)) return result(f);
  if (flags != 0) return refuse(cudaErrorInvalidValue, "cudaStreamWaitEvent flags are not modelled");
  if (s->capture) {
    if (s->capture_invalid) return result(cudaErrorStreamCaptureInvalidated);
    if (e->capture == s->capture->capture) return cudaSuccess;  // in the same capture: ordered within it
    if (e->recorded == 0 && !e->capture) return cudaSuccess;    // never recorded: an empty set of work
    s->capture_invalid = true;
    return refuse(cudaErrorStreamCaptureIsolation, "a capturing stream made to wait for work outside its capture");
  }
  if (e->capture)
    return refuse(cudaErrorStreamCaptureUnsupported,
                  "a stream made to wait for an event recorded in a capture (that joins it to the capture: not modelled)");
  if (e->recorded == 0) return cudaSuccess;
  const std::uint64_t n = e->recorded;
  return result(st.enqueue(s, [e, n] {
    State& st = state();
    std::unique_lock lk(st.m);
    st.changed.wait(lk, [&] { return !e->pending.count(n); });
  }, "cudaStreamWaitEvent"));
}

// Copies ---------------------------------------------------------------------

namespace {

/// Whether a copy's kind matches where its ends are (cudaMemcpyDefault: anywhere).
bool kind_matches(cudaMemcpyKind kind, bool to_device, bool from_device) {
  switch (kind) {
    case cudaMemcpyDefault: return true;
    case cudaMemcpyHostToDevice: return to_device && !from_device;
    case cudaMemcpyDeviceToHost: return from_device && !to_device;
    case cudaMemcpyDeviceToDevice: return to_device && from_device;
    case cudaMemcpyHostToHost: return !to_device && !from_device;
  }
  return false;
}

/// Checks a copy's pointers against its kind and queues it on s (the lock
/// held): from pageable memory the source is read before the call returns;
/// into pageable memory the call returns once the copy ran, as CUDA's do.
cudaError_t queue_copy(std::unique_lock<std::mutex>& lk, void* to, const void* from, std::size_t bytes,
                       cudaMemcpyKind kind, CUstream_st* s, const char* what) {
  State& st = state();
  if (const cudaError_t f = st.fault(s->device)) return result(f);
  const Block* to_block = st.find(to, bytes);
  const Block* from_block = st.find(from, bytes);
  const bool to_device = to_block && to_block->device >= 0, from_device = from_block && from_block->device >= 0;
  if (!kind_matches(kind, to_device, from_device))
    return refuse(cudaErrorInvalidValue, "cudaMemcpyAsync of kind " + std::to_string(int(kind)) +
                                             " between memory that is not of that kind (or a range past its allocation)");
  const bool pageable_from = !from_block, pageable_to = !to_block;
  if ((pageable_from || pageable_to) && s->capture) {
    s->capture_invalid = true;
    return refuse(cudaErrorStreamCaptureUnsupported, "a copy with pageable host memory in a capture");
  }
  if (pageable_from) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(from),
                                                                static_cast<const unsigned char*>(from) + bytes);
    Work copy = copy_work(to, staged->data(), bytes, to_block, nullptr, s->device, !s->capture);
    return result(st.enqueue(s, [staged, copy] { copy(); }, what));
  }
  if (const cudaError_t status =
          st.enqueue(s, copy_work(to, from, bytes, to_block, from_block, s->device, !s->capture), what))
    return result(status);
  if (pageable_to) {
    st.drain(lk, s);
    return result(st.fault(s->device));
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
  uses_context();
  State& st = state();
  std::unique_lock lk(st.m);
  CUstream_st* s = stream_of(stream);
  if (!s) return refuse(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: not a stream (the legacy default stream is not modelled)");
  if (bytes == 0) return cudaSuccess;
  return queue_copy(lk, to, from, bytes, kind, s, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpyPeerAsync(void* to, int to_device, const void* from, int from_device, size_t bytes,
                                cudaStream_t stream) {
  uses_context();
  State& st = state();
  std::unique_lock lk(st.m);
  CUstream_st* s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  const Block* t = st.device_block(to, bytes);
  const Block* f = st.device_block(from, bytes);
  if (!t || !f || t->device != to_device || f->device != from_device)
    return refuse(cudaErrorInvalidValue, "cudaMemcpyPeerAsync: a pointer is not memory of the device named with it");
  return queue_copy(lk, to, from, bytes, cudaMemcpyDeviceToDevice, s, "cudaMemcpyPeerAsync");
}

// On CUDA's legacy stream, which deft's non-blocking streams do not wait
// for: the copy happens now, whatever they have queued.
cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, enum cudaMemcpyKind kind) {
  uses_context();
  if (bytes == 0) return cudaSuccess;
  {
    State& st = state();
    std::lock_guard lk(st.m);
    const bool to_device = st.device_block(to, bytes), from_device = st.device_block(from, bytes);
    if (!kind_matches(kind, to_device, from_device)) return refuse(cudaErrorInvalidValue, "cudaMemcpy between memory that is not of its kind");
  }
  std::memcpy(to, from, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  CUstream_st* s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t f = st.fault(s->device)) return result(f);
  const Block* block = st.device_block(ptr, bytes);
  if (!block) return refuse(cudaErrorInvalidValue, "cudaMemsetAsync of memory that is not a device's");
  const int device = s->device;
  const std::uint64_t serial = block->serial;
  const bool counted = !s->capture;
  if (counted) count_use(serial, 1);
  return result(st.enqueue(s, [=] {
    {
      State& st = state();
      std::lock_guard lk(st.m);
      if (counted) count_use(serial, -1);
      if (!st.live(ptr, bytes, serial))
        throw Fault(cudaErrorIllegalAddress, "a memset on gpu(" + std::to_string(device) + ") ran after its memory was freed");
    }
    std::memset(ptr, value, bytes);
  }, "cudaMemsetAsync"));
}

// Peers ------------------------------------------------------------------------

cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (!valid_device(device) || !valid_device(peer)) return result(cudaErrorInvalidDevice);
  *can = device != peer;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  uses_context();
  if (!valid_device(peer) || peer == current_device) return result(cudaErrorInvalidDevice);
  if (flags != 0) return result(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard lk(st.m);
  if (const cudaError_t status = beside_a_group("cudaDeviceEnablePeerAccess")) return status;
  if (!st.peers.insert({current_device, peer}).second) return result(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}

// Graphs: a capture records the stream's work in order; a launch queues it as one. ----

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  CUstream_st* s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (const cudaError_t f = st.fault(s->device)) return result(f);
  if (mode != cudaStreamCaptureModeRelaxed) return refuse(cudaErrorInvalidValue, "only relaxed captures are modelled");
  if (s->capture) return refuse(cudaErrorInvalidValue, "cudaStreamBeginCapture of a stream already capturing");
  s->capture = new CUgraph_st{s->device, ++st.captures, {}};
  ++st.calls["cudaStreamBeginCapture"];
  s->capture_invalid = false;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  *graph = nullptr;
  CUstream_st* s = stream_of(stream);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (!s->capture) return refuse(cudaErrorInvalidValue, "cudaStreamEndCapture of a stream not capturing");
  CUgraph_st* g = std::exchange(s->capture, nullptr);
  if (std::exchange(s->capture_invalid, false)) {
    delete g;
    return result(cudaErrorStreamCaptureInvalidated);
  }
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  uses_context();
  if (!graph) return result(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->device, std::make_shared<const std::vector<Work>>(graph->work)};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  uses_context();
  State& st = state();
  std::lock_guard lk(st.m);
  CUstream_st* s = stream_of(stream);
  if (!exec || !s) return result(cudaErrorInvalidResourceHandle);
  if (const cudaError_t f = st.fault(s->device)) return result(f);
  if (s->capture) return refuse(cudaErrorStreamCaptureUnsupported, "a graph launched into a capture is not modelled");
  if (exec->device != s->device)
    return refuse(cudaErrorInvalidValue, "a graph of gpu(" + std::to_string(exec->device) + ") launched on a stream of gpu(" +
                                             std::to_string(s->device) + ")");
  const std::uint64_t n = ++exec->order->queued;
  return result(st.enqueue(s, [work = exec->work, order = exec->order, n] {
    State& st = state();
    {
      std::unique_lock lk(st.m);
      st.changed.wait(lk, [&] { return order->finished == n - 1; });
    }
    struct Finish {  // also when the graph's work fails
      LaunchOrder& order;
      std::uint64_t n;
      ~Finish() {
        State& st = state();
        std::lock_guard lk(st.m);
        order.finished = n;
        st.changed.notify_all();
      }
    } finish{*order, n};
    for (const Work& w : *work) w();
  }, "cudaGraphLaunch"));
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  uses_context();
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  uses_context();
  delete exec;
  return cudaSuccess;
}

}  // extern "C"
