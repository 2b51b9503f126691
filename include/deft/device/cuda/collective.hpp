// Sums across GPUs (allreduce) through NCCL, for the CUDA backend, and
// NCCL's collectives between processes (ProcessGroup, for deft::dist). NCCL is
// loaded with dlopen when a sum first needs it, not linked: a program that
// never sums across GPUs, or a machine without libnccl, runs without it, and
// allreduce then sums through copies. Its header is needed at compile time
// (the CUDA toolkit's, or NCCL's own); without it this backend has no
// collectives. Plain C++ over the CUDA runtime (g++ and nvcc both compile it).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../core/backoff.hpp"
#include "../../core/device.hpp"
#include "../../core/error.hpp"
#include "../../core/thresholds.hpp"
#include "../backend.hpp"
#include "runtime.hpp"

#if __has_include(<nccl.h>) && __has_include(<dlfcn.h>)
#include <dlfcn.h>
#include <nccl.h>
#define DEFT_HAS_NCCL 1
// Non-blocking communicators (NCCL 2.14 and later): joining a group across
// processes goes on in NCCL's threads, polled against the caller's timeout.
#define DEFT_NCCL_NONBLOCKING (NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0))
#else
#define DEFT_HAS_NCCL 0
#endif

namespace deft::detail::gpu {

#if DEFT_HAS_NCCL

/// The few NCCL functions deft calls, looked up in libnccl once.
struct NcclLibrary {
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  // Across processes:
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
#if DEFT_NCCL_NONBLOCKING
  // Both or neither (an older libnccl lacks them): non-blocking joins.
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
#endif

  /// The library, or null where it cannot be loaded (asked once).
  static const NcclLibrary* get() {
    static const NcclLibrary* library = [] { return load(); }();
    return library;
  }

 private:
  static void* open() {
    for (const char* name : {"libnccl.so.2", "libnccl.so"})
      if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return handle;
    // Next to the CUDA runtime this program loaded: a toolkit's lib64 that
    // is not on the loader's path but was found through an rpath.
    Dl_info runtime{};
    if (!dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &runtime) || !runtime.dli_fname) return nullptr;
    std::string path = runtime.dli_fname;
    path.erase(path.find_last_of('/') + 1);  // npos + 1 == 0: no directory, the name alone
    return dlopen((path + "libnccl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  static const NcclLibrary* load() {
    void* handle = open();
    if (!handle) return nullptr;
    auto* lib = new NcclLibrary;  // leaked with the handle: communicators live as long as the process
    const bool found = find(handle, "ncclCommInitAll", lib->comm_init_all) && find(handle, "ncclAllReduce", lib->all_reduce) &&
                       find(handle, "ncclGroupStart", lib->group_start) && find(handle, "ncclGroupEnd", lib->group_end) &&
                       find(handle, "ncclGetErrorString", lib->error_string) &&
                       find(handle, "ncclGetUniqueId", lib->get_unique_id) &&
                       find(handle, "ncclCommInitRank", lib->comm_init_rank) &&
                       find(handle, "ncclCommAbort", lib->comm_abort) && find(handle, "ncclBroadcast", lib->broadcast) &&
                       find(handle, "ncclAllGather", lib->all_gather) &&
                       find(handle, "ncclReduceScatter", lib->reduce_scatter);
#if DEFT_NCCL_NONBLOCKING
    if (!find(handle, "ncclCommInitRankConfig", lib->comm_init_rank_config) ||
        !find(handle, "ncclCommGetAsyncError", lib->comm_get_async_error))
      lib->comm_init_rank_config = nullptr, lib->comm_get_async_error = nullptr;
#endif
    if (found) return lib;
    delete lib;
    return nullptr;
  }
  template <class F>
  static bool find(void* handle, const char* name, F& f) {
    f = reinterpret_cast<F>(dlsym(handle, name));
    return f != nullptr;
  }
};

inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::float32: return ncclFloat32;
    case DType::float64: return ncclFloat64;
    case DType::int32: return ncclInt32;
    case DType::int64: return ncclInt64;
  }
  return ncclFloat32;
}

inline ncclRedOp_t nccl_op(dist::ReduceOp op) {
  switch (op) {
    case dist::ReduceOp::sum: return ncclSum;
    case dist::ReduceOp::mean: return ncclAvg;
    case dist::ReduceOp::max: return ncclMax;
    case dist::ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

/// NCCL's communicators, one clique per set of GPUs (made on first use, by
/// ncclCommInitAll: rank r is the r-th lowest device of the set), and the
/// lock that makes one thread at a time queue a sum (a communicator is not
/// thread-safe, and every GPU must see the sums in the same order).
class Collectives {
 public:
  static Collectives& get() {
    static auto* c = new Collectives;  // leaked, see DeviceContext
    return *c;
  }

  /// Whether NCCL can sum over these GPUs (distinct): it loads, they exist,
  /// and their communicators could be made (now, on the recording thread,
  /// so that a failure sends allreduce through copies instead of failing
  /// the step; a set that failed is not tried again).
  bool usable(const std::vector<int>& devices) {
    const NcclLibrary* nccl = NcclLibrary::get();
    if (!nccl || devices.empty()) return false;
    if (!std::all_of(devices.begin(), devices.end(), [](int d) { return d >= 0 && d < device_count(); })) return false;
    std::lock_guard lk(m_);
    return clique(*nccl, devices).second.made == ncclSuccess;
  }

  /// Queues an allreduce over `parts` (distinct GPUs) on their collective
  /// streams, after the earlier conflicting work there; raises NCCL's text.
  void sum(DeviceBackend& backend, const std::vector<SumPart>& parts, std::size_t count, DType dtype) {
    const NcclLibrary& nccl = *NcclLibrary::get();
    std::vector<int> devices;
    for (const SumPart& p : parts) devices.push_back(p.device);
    std::lock_guard lk(m_);
    const auto& [ranks, set] = clique(nccl, devices);
    check(nccl, set.made, devices);
    const auto uses = declare_sum(backend, parts, DeviceContext::collective_lane);
    std::lock_guard no_frees(collective_launches());
    check(nccl, nccl.group_start(), devices);
    ncclResult_t queued = ncclSuccess;
    for (const SumPart& p : parts) {
      const auto rank = std::lower_bound(ranks.begin(), ranks.end(), p.device) - ranks.begin();
      queued = nccl.all_reduce(p.from, p.to, count, nccl_type(dtype), ncclSum, set.comms[std::size_t(rank)],
                               context(p.device).collective_stream);
      if (queued != ncclSuccess) break;
    }
    const ncclResult_t ended = nccl.group_end();  // launches the group (or abandons it after a failure)
    check(nccl, queued != ncclSuccess ? queued : ended, devices);
  }

 private:
  struct Communicators {
    ncclResult_t made;              // what ncclCommInitAll answered (a failed set is not tried again)
    std::vector<ncclComm_t> comms;  // by rank: the key's order
  };
  using Cliques = std::map<std::vector<int>, Communicators>;  // key: the GPUs, sorted (rank r is key[r])

  // The communicators of a set of GPUs, made on first use.
  const Cliques::value_type& clique(const NcclLibrary& nccl, std::vector<int> devices) {
    std::sort(devices.begin(), devices.end());
    if (auto it = cliques_.find(devices); it != cliques_.end()) return *it;
    Communicators set{ncclSuccess, std::vector<ncclComm_t>(devices.size(), nullptr)};
    set.made = nccl.comm_init_all(set.comms.data(), int(devices.size()), devices.data());
    return *cliques_.emplace(std::move(devices), std::move(set)).first;
  }
  static void check(const NcclLibrary& nccl, ncclResult_t status, const std::vector<int>& devices) {
    if (status == ncclSuccess) return;
    std::vector<Device> named;
    for (int d : devices) named.push_back(deft::gpu(d));
    raise<std::runtime_error>("NCCL allreduce over ", device_list(named), ": ", nccl.error_string(status));
  }

  std::mutex m_;
  Cliques cliques_;  // never destroyed, see DeviceContext
};

/// This process's GPU in an NCCL communicator across processes
/// (ncclCommInitRank). Its collectives go on the GPU's collective stream;
/// an event after the last one tells when it finished. Where NCCL can, the
/// communicator is non-blocking: joining returns at once and joined()
/// polls it, so that a rank that never joins cannot hold the others in
/// ncclCommInitRank. Never destroyed
/// while the process runs (see DeviceContext): ncclCommDestroy at exit
/// would race the CUDA runtime's own teardown.
class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(DeviceBackend& backend, const std::vector<std::byte>& id, int ranks, int rank, int device)
      : backend_(backend), nccl_(*NcclLibrary::get()), device_(device), ranks_(ranks) {
    ncclUniqueId unique{};
    if (id.size() != sizeof unique)
      raise<std::invalid_argument>("NCCL process group: an id of ", id.size(), " bytes, not ", sizeof unique);
    std::memcpy(&unique, id.data(), sizeof unique);
    DeviceGuard on(device);
    (void)context(device);  // the GPU's streams exist before NCCL binds to the device
    gpu::check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate", device);
#if DEFT_NCCL_NONBLOCKING
    if (nccl_.comm_init_rank_config) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      answered(nccl_.comm_init_rank_config(&comm_, ranks, unique, rank, &config), "ncclCommInitRank");
      return;
    }
#endif
    check(nccl_.comm_init_rank(&comm_, ranks, unique, rank), "ncclCommInitRank");
  }

  bool joined() override {
    if (!comm_) raise<std::logic_error>("NCCL process group on ", deft::gpu(device_), ": aborted after a timeout");
    return settled();
  }

  bool queue(dist::CollectiveKind kind, dist::ReduceOp op, DType dtype, std::size_t count, int root, const void* in,
             void* out, std::chrono::steady_clock::time_point deadline) override {
    if (!comm_) raise<std::logic_error>("NCCL process group on ", deft::gpu(device_), ": aborted after a timeout");
    DeviceContext& ctx = context(device_);
    DeviceGuard on(device_);
    LaneAccess access(backend_, device_, DeviceContext::collective_lane, {{in}, {out}});
    std::lock_guard no_frees(collective_launches());
    const cudaStream_t stream = ctx.collective_stream;
    const ncclDataType_t type = nccl_type(dtype);
    ncclResult_t status = ncclSuccess;
    switch (kind) {
      case dist::CollectiveKind::allreduce:
        status = nccl_.all_reduce(in, out, count, type, nccl_op(op), comm_, stream);
        break;
      case dist::CollectiveKind::broadcast: status = nccl_.broadcast(in, out, count, type, root, comm_, stream); break;
      case dist::CollectiveKind::allgather: status = nccl_.all_gather(in, out, count, type, comm_, stream); break;
      case dist::CollectiveKind::reduce_scatter:
        status = nccl_.reduce_scatter(in, out, count / std::size_t(ranks_), type, nccl_op(op), comm_, stream);
        break;
      case dist::CollectiveKind::barrier: break;  // no data: the host's barrier
    }
    answered(status, dist::kind_name(kind));
    // On the stream before `access` marks the lane after it, and before any
    // other work goes on NCCL's stream (NCCL's rule). Usually NCCL
    // connecting to ranks that all joined; a rank stuck here is the
    // caller's timeout to report.
    for (int polls = 0; !settled(); ++polls) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      pause(polls);
    }
    gpu::check(cudaEventRecord(done_, stream), "cudaEventRecord", device_);
    return true;
  }

  bool finished() override {
    DeviceGuard on(device_);
    const cudaError_t status = cudaEventQuery(done_);
    if (status == cudaErrorNotReady) {
      discard(status);
      return false;
    }
    gpu::check(status, "an NCCL collective", device_);
    return true;
  }

  void abort() noexcept override {
    if (comm_) (void)nccl_.comm_abort(comm_);
    comm_ = nullptr;
  }

 private:
  // A non-blocking communicator's call may answer ncclInProgress: it then
  // goes on in NCCL's threads, and no other NCCL call may come before
  // settled() said it ended.
  void answered(ncclResult_t status, const char* what) {
    if (status == ncclInProgress) {
      pending_ = what;
      return;
    }
    if (status != ncclSuccess) abort();
    check(status, what);
  }
  bool settled() {
    if (!pending_) return true;
#if DEFT_NCCL_NONBLOCKING
    ncclResult_t state = ncclSuccess;
    ncclResult_t status = nccl_.comm_get_async_error(comm_, &state);
    if (status == ncclSuccess && state == ncclInProgress) return false;
    if (status == ncclSuccess) status = state;
    if (status != ncclSuccess) abort();
    check(status, std::exchange(pending_, nullptr));
#endif
    pending_ = nullptr;
    return true;
  }
  static void pause(int polls) { back_off(polls, thresholds::nccl_poll_max_sleep_us); }

  void check(ncclResult_t status, const char* what) const {
    if (status != ncclSuccess)
      raise<std::runtime_error>("NCCL ", what, " across processes on ", deft::gpu(device_), ": ",
                                nccl_.error_string(status));
  }

  DeviceBackend& backend_;
  const NcclLibrary& nccl_;
  int device_, ranks_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t done_ = nullptr;
  const char* pending_ = nullptr;  // the call that answered ncclInProgress, until it ended
};

inline bool nccl_groups_processes() { return NcclLibrary::get() != nullptr; }

inline std::vector<std::byte> nccl_new_group_id() {
  const NcclLibrary* nccl = NcclLibrary::get();
  if (!nccl) raise<std::runtime_error>("NCCL process group: libnccl cannot be loaded");
  ncclUniqueId id{};
  if (const ncclResult_t status = nccl->get_unique_id(&id); status != ncclSuccess)
    raise<std::runtime_error>("ncclGetUniqueId: ", nccl->error_string(status));
  std::vector<std::byte> bytes(sizeof id);
  std::memcpy(bytes.data(), &id, sizeof id);
  return bytes;
}

inline std::unique_ptr<ProcessGroup> nccl_join_group(DeviceBackend& backend, const std::vector<std::byte>& id,
                                                     int ranks, int rank, int device) {
  if (!NcclLibrary::get()) raise<std::runtime_error>("NCCL process group: libnccl cannot be loaded");
  return std::make_unique<NcclProcessGroup>(backend, id, ranks, rank, device);
}

inline bool nccl_sums_across(const std::vector<int>& devices) { return Collectives::get().usable(devices); }

inline void nccl_sum(DeviceBackend& backend, const std::vector<SumPart>& parts, std::size_t count, DType dtype) {
  Collectives::get().sum(backend, parts, count, dtype);
}

#else  // no NCCL header: allreduce sums through copies, and collectives across processes go through the host

inline bool nccl_groups_processes() { return false; }
inline std::vector<std::byte> nccl_new_group_id() {
  raise<std::logic_error>("deft was compiled without NCCL's header: no collectives between processes on GPUs");
}
inline std::unique_ptr<ProcessGroup> nccl_join_group(DeviceBackend&, const std::vector<std::byte>&, int, int, int) {
  raise<std::logic_error>("deft was compiled without NCCL's header: no collectives between processes on GPUs");
}

inline bool nccl_sums_across(const std::vector<int>&) { return false; }
inline void nccl_sum(DeviceBackend&, const std::vector<SumPart>&, std::size_t, DType) {
  raise<std::logic_error>("deft was compiled without NCCL's header: it cannot sum across GPUs with NCCL");
}

#endif

}  // namespace deft::detail::gpu
