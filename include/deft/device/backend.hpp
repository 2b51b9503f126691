// Devices other than the host: what buffers and tensors need from them. A
// backend registers itself when its header is included (device/cuda/backend.hpp
// for CUDA; tests/gpu/emulation, host memory posing as two GPUs, for the
// tests CI can run). Without one, work on a GPU is refused where it is made.
// Plain C++: the engine itself knows nothing of CUDA.
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "../core/collective.hpp"
#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "allocator.hpp"
#include "program.hpp"

namespace deft::detail {

/// The lane (stream) of its device that the calling thread queues GPU work
/// on: set by the engine around a GPU task (LaneScope), lane 0 elsewhere.
struct LaneSlot {
  int device = -1;
  int lane = 0;
};
inline LaneSlot& current_lane_slot() {
  thread_local LaneSlot slot;
  return slot;
}
inline int current_lane(int device) {
  const LaneSlot& s = current_lane_slot();
  return s.device == device ? s.lane : 0;
}
/// Makes the calling thread queue its work for `device` on `lane` while it lives.
class LaneScope {
 public:
  LaneScope(int device, int lane) : previous_(current_lane_slot()) { current_lane_slot() = {device, lane}; }
  ~LaneScope() { current_lane_slot() = previous_; }
  LaneScope(const LaneScope&) = delete;
  LaneScope& operator=(const LaneScope&) = delete;

 private:
  LaneSlot previous_;
};

/// One device's share of a sum across devices (DeviceBackend::sum_across).
struct SumPart {
  int device;
  const void* from;  ///< the part's elements, on `device`
  void* to;          ///< receives the sum of every part's `from`, on `device`
};

/// This process's GPU in a group of processes that run collectives between
/// their GPUs (an NCCL communicator across processes), made by
/// DeviceBackend::join_process_group on every rank. Its collectives run one
/// at a time, in the same order on every rank (dist::Communicator's order).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  /// Whether every rank joined and the group is ready for collectives:
  /// joining may go on after join_process_group returned (NCCL's
  /// non-blocking communicators), so that a rank that never joins is found
  /// by the caller's timeout instead of a wait without end. Raises the
  /// collective library's error text when joining failed.
  virtual bool joined() { return true; }
  /// Queues collective `kind` on the GPU's collective lane, after the
  /// earlier conflicting work there, and returns true once it is queued:
  /// `in` holds this rank's `count` elements, `out` the result (allgather:
  /// ranks * count, reduce_scatter: count / ranks), both on the group's GPU.
  /// Returns false when the collective library had not taken the call by
  /// `deadline`; the group must then be aborted.
  virtual bool queue(dist::CollectiveKind kind, dist::ReduceOp op, DType dtype, std::size_t count, int root,
                     const void* in, void* out, std::chrono::steady_clock::time_point deadline) = 0;
  /// Whether the last queued collective finished; raises the GPU's failure.
  virtual bool finished() = 0;
  /// Ends the group at once (after a timeout): its queued collectives may
  /// never finish, and it takes no more.
  virtual void abort() noexcept = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// "CUDA", or what stands in for it (messages name it).
  virtual const char* name() const = 0;
  /// How many devices of this type the machine has.
  virtual int device_count() = 0;
  /// The pool that buffers on device `index` are allocated from.
  virtual std::shared_ptr<engine::HostAllocator> memory(int index) = 0;
  /// Page-locked host memory, which the devices copy to and from by DMA (a
  /// host tensor copied from a GPU is allocated there); null where the
  /// backend has none.
  virtual std::shared_ptr<engine::HostAllocator> pinned_memory() { return nullptr; }
  /// A mark of the work queued on device `index` so far, which copies and
  /// waits can be ordered after (the engine marks every GPU buffer after its
  /// writer ran); null where the backend has no such marks, and then they
  /// order after everything queued.
  virtual std::shared_ptr<void> mark(int /*index*/) { return nullptr; }
  /// Copies `bytes` between two places, either of which may be the host,
  /// after the earlier work that writes the source or uses the destination
  /// (for a GPU: the waits of LaneAccess, which order a copy to the host
  /// after its source's writer only, so work queued later keeps running
  /// while the copy does). A host destination holds the bytes on return; a
  /// host source may be reused on return (the copy may still be running
  /// from a staged copy of it). A failure of earlier queued work on the
  /// source device is raised here, with the device's error text.
  virtual void copy(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes) = 0;
  /// Blocks until the work queued on device `index` finished; raises its failure.
  virtual void synchronize(int index) = 0;
  /// Blocks until the marked work on device `index` finished (all of it
  /// without a mark); raises its failure.
  virtual void wait_for(int index, const void* mark) {
    (void)mark;
    synchronize(index);
  }
  /// synchronize() for every device that was used.
  virtual void synchronize_all() = 0;

  /// How many compute lanes (streams) each device has; work on one lane
  /// runs in order, work on different lanes may overlap.
  virtual int lanes() { return 1; }
  /// Before work with `uses` is queued on `lane` of device `index`: makes
  /// the lane wait for earlier conflicting work on the device's other lanes
  /// (see LaneAccess)...
  virtual void before_work(int /*index*/, int /*lane*/, const MemoryUses&) {}
  /// ...and once it is queued, records its uses.
  virtual void after_work(int /*index*/, int /*lane*/, const MemoryUses&) {}

  /// Runs `work` (GPU work for device `index`, queued on the calling
  /// thread's lane) recorded as a device program, and returns the program
  /// for later launches; null where the backend records none (`work` did not
  /// run). When recording fails (NotRecordable, or the device's error),
  /// `work` may have run in part: the caller runs it again as it is.
  virtual std::unique_ptr<DeviceProgram> record(int /*index*/, const std::function<void()>& /*work*/) {
    return nullptr;
  }

  /// Whether sum_across can sum parts on these devices (distinct; allreduce
  /// asks for two or more): false where the backend has no collective
  /// library for them; the caller then sums through copies.
  virtual bool sums_across(const std::vector<int>& /*devices*/) { return false; }
  /// Sums `count` elements of type `dtype` over every part's `from`, element
  /// by element, and writes the same sum into every part's `to` (NCCL's
  /// allreduce), queued on each device's collective lane after the earlier
  /// conflicting work there; returns once it is queued.
  virtual void sum_across(const std::vector<SumPart>& /*parts*/, std::size_t /*count*/, DType /*dtype*/) {
    raise<std::logic_error>("the ", name(), " backend cannot sum across devices");
  }

  /// Whether join_process_group can make groups of processes (NCCL loads).
  virtual bool groups_processes() { return false; }
  /// The id of a new process group (ncclGetUniqueId's bytes): one rank
  /// makes it and sends it to the others.
  virtual std::vector<std::byte> new_process_group_id() {
    raise<std::logic_error>("the ", name(), " backend cannot run collectives between processes");
  }
  /// Joins the group named `id` of `ranks` processes as `rank`, with GPU
  /// `device` (ncclCommInitRank): every rank calls it. It may return before
  /// all did; ProcessGroup::joined tells when the group is ready. Raises the
  /// collective library's error text.
  virtual std::unique_ptr<ProcessGroup> join_process_group(const std::vector<std::byte>& id, int ranks, int rank,
                                                           int device) {
    (void)id, (void)ranks, (void)rank, (void)device;
    raise<std::logic_error>("the ", name(), " backend cannot run collectives between processes");
  }
};

inline std::atomic<DeviceBackend*>& gpu_backend_slot() {
  static std::atomic<DeviceBackend*> slot{nullptr};
  return slot;
}
/// The GPU backend of this program, or null when none was included.
inline DeviceBackend* gpu_backend() { return gpu_backend_slot().load(std::memory_order_acquire); }
/// Installs `b` (called by a backend header's registration); returns true.
inline bool register_gpu_backend(DeviceBackend* b) {
  gpu_backend_slot().store(b, std::memory_order_release);
  return true;
}

/// The backend of device d (not the host); raises when this program has none.
inline DeviceBackend& backend_of(Device d) {
  DeviceBackend* b = gpu_backend();
  if (!b) raise<std::logic_error>("tensors on ", d, " need deft's CUDA backend, which this program does not include");
  return *b;
}

/// Copies bytes from one place to another, either of which may be on a GPU
/// (see DeviceBackend::copy); host to host is a plain memcpy. While a
/// program records, only copies within one GPU can be part of it: a launch
/// would reread or rewrite the same host memory, and staging through pinned
/// blocks is host work.
inline void copy_bytes(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes) {
  const bool from_host = from_device.type == DeviceType::cpu, to_host = to_device.type == DeviceType::cpu;
  if (from_host || to_host || from_device.index != to_device.index)
    ProgramCapture::refuse(from_host ? "a copy from the host" : to_host ? "a copy to the host" : "a copy between GPUs");
  if (to_host && from_host) {
    if (bytes) std::memcpy(to, from, bytes);
    return;
  }
  backend_of(to_host ? from_device : to_device)
      .copy(to, to_device, from, from_device, bytes);
}

/// Declares the memory uses of the GPU work queued while it lives, on the
/// calling thread's lane of `device`: constructed before the work is queued
/// (ordering the lane after conflicting work on other lanes), destroyed once
/// it is. While a program records, the uses go to the program instead,
/// which declares them all at each launch.
class LaneAccess {
 public:
  LaneAccess(DeviceBackend& b, int device, MemoryUses uses)
      : LaneAccess(b, device, current_lane(device), std::move(uses)) {}
  /// On `lane` of `device`, whatever the calling thread's lane is.
  LaneAccess(DeviceBackend& b, int device, int lane, MemoryUses uses)
      : backend_(b), device_(device), lane_(lane), uses_(std::move(uses)) {
    if (ProgramCapture* c = ProgramCapture::active()) {
      c->use(device_, uses_);
      captured_ = true;
      return;
    }
    backend_.before_work(device_, lane_, uses_);
  }
  ~LaneAccess() {
    if (!captured_) backend_.after_work(device_, lane_, uses_);
  }
  LaneAccess(const LaneAccess&) = delete;
  LaneAccess& operator=(const LaneAccess&) = delete;
  int lane() const { return lane_; }

 private:
  DeviceBackend& backend_;
  int device_, lane_;
  MemoryUses uses_;
  bool captured_ = false;
};

/// Declares the uses of a sum across devices, each part's on `lane` of its
/// own device, while the result lives: a backend queues the sum meanwhile.
inline std::vector<std::unique_ptr<LaneAccess>> declare_sum(DeviceBackend& b, const std::vector<SumPart>& parts,
                                                            int lane) {
  std::vector<std::unique_ptr<LaneAccess>> uses;
  uses.reserve(parts.size());
  for (const SumPart& p : parts) uses.push_back(std::make_unique<LaneAccess>(b, p.device, lane, MemoryUses{{p.from}, {p.to}}));
  return uses;
}

/// Blocks until the work on device d that `mark` marks finished (all queued
/// work without one; nothing to do for the host, whose tasks are done when
/// the engine says so); raises its failure.
inline void synchronize_device(Device d, const void* mark = nullptr) {
  if (d.type != DeviceType::cpu) backend_of(d).wait_for(d.index, mark);
}

}  // namespace deft::detail

namespace deft {

/// How many GPUs this program can put tensors on: 0 without a GPU backend
/// (deft::cuda) or without a CUDA device. Devices are gpu(0) .. gpu(n - 1).
inline int num_gpus() {
  detail::DeviceBackend* b = detail::gpu_backend();
  return b ? b->device_count() : 0;
}

}  // namespace deft
