// Sums across GPUs (allreduce) through NCCL, for the CUDA backend. NCCL is
// loaded with dlopen when a sum first needs it, not linked: a program that
// never sums across GPUs, or a machine without libnccl, runs without it, and
// allreduce then sums through copies. Its header is needed at compile time
// (the CUDA toolkit's, or NCCL's own); without it this backend has no
// collectives. Plain C++ over the CUDA runtime (g++ and nvcc both compile it).
#pragma once
#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../../core/device.hpp"
#include "../../core/error.hpp"
#include "../backend.hpp"
#include "runtime.hpp"

#if __has_include(<nccl.h>) && __has_include(<dlfcn.h>)
#include <dlfcn.h>
#include <nccl.h>
#define DEFT_HAS_NCCL 1
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
                       find(handle, "ncclGetErrorString", lib->error_string);
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

inline bool nccl_sums_across(const std::vector<int>& devices) { return Collectives::get().usable(devices); }

inline void nccl_sum(DeviceBackend& backend, const std::vector<SumPart>& parts, std::size_t count, DType dtype) {
  Collectives::get().sum(backend, parts, count, dtype);
}

#else  // no NCCL header: allreduce sums through copies

inline bool nccl_sums_across(const std::vector<int>&) { return false; }
inline void nccl_sum(DeviceBackend&, const std::vector<SumPart>&, std::size_t, DType) {
  raise<std::logic_error>("deft was compiled without NCCL's header: it cannot sum across GPUs with NCCL");
}

#endif

}  // namespace deft::detail::gpu
