// The stand-in's libnccl.so.2 (the toolkit's nccl.h declares it): sums across the stand-in's GPUs. Each rank's
// part is work on its stream that waits there until every rank's part has
// started, as NCCL's kernels wait for their partners: a rank whose stream
// never reaches its part hangs the others, on a GPU and here (reported
// after a minute, then the process aborts). Ranks sum in rank order, so
// every GPU receives the same bits.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nccl.h>

#include "fake_cuda.hpp"

namespace {

struct Part {
  const void* from;
  void* to;
};

/// One allreduce of a clique: the parts of the ranks that have started it.
struct Round {
  std::vector<Part> parts;
  int arrived = 0, left = 0;
  bool summed = false;
};

struct Clique {
  std::vector<int> devices;  // by rank
  std::mutex m;
  std::condition_variable changed;
  std::map<std::uint64_t, Round> rounds;  // by sequence number
};

template <class T>
void sum_parts(const std::vector<Part>& parts, std::size_t count) {
  std::vector<T> total(count, T(0));
  for (const Part& p : parts)
    for (std::size_t i = 0; i < count; ++i) total[i] += static_cast<const T*>(p.from)[i];
  for (const Part& p : parts) std::memcpy(p.to, total.data(), count * sizeof(T));
}

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank;
  std::uint64_t calls = 0;  // this rank's allreduces so far
};

namespace {

/// An allreduce part waiting for its group's end, where NCCL launches.
struct Queued {
  ncclComm_t comm;
  const void* from;
  void* to;
  std::size_t count;
  ncclDataType_t type;
  cudaStream_t stream;
};

/// The calling thread's group: its depth, the parts queued in it, and
/// whether a call in it failed (the group is then abandoned at its end).
struct Group {
  int depth = 0;
  std::vector<Queued> parts;
  ncclResult_t failed = ncclSuccess;
};
thread_local Group group;

std::size_t size_of(ncclDataType_t t) {
  return t == ncclFloat64 || t == ncclInt64 ? 8 : 4;
}

/// Each rank's part waits on its stream until every rank's part has started.
ncclResult_t launch(const Queued& q) {
  const std::shared_ptr<Clique> clique = q.comm->clique;
  const int n = int(clique->devices.size()), rank = q.comm->rank;
  const std::uint64_t call = q.comm->calls++;
  const void* from = q.from;  // (not a structured binding: clang before 16 cannot capture one)
  void* to = q.to;
  const std::size_t count = q.count;
  const ncclDataType_t datatype = q.type;
  const auto work = [=] {
    std::unique_lock lk(clique->m);
    Round& round = clique->rounds[call];
    round.parts.resize(std::size_t(n));
    round.parts[std::size_t(rank)] = {from, to};
    if (++round.arrived == n) {
      switch (datatype) {
        case ncclFloat32: sum_parts<float>(round.parts, count); break;
        case ncclFloat64: sum_parts<double>(round.parts, count); break;
        case ncclInt32: sum_parts<std::int32_t>(round.parts, count); break;
        default: sum_parts<std::int64_t>(round.parts, count); break;
      }
      round.summed = true;
      clique->changed.notify_all();
    } else if (!clique->changed.wait_for(lk, std::chrono::minutes(1), [&] { return round.summed; })) {
      fake_cuda::explain(("NCCL allreduce: rank " + std::to_string(rank) + " waited a minute for its partners; on GPUs "
                          "this is a hang")
                             .c_str());
      std::abort();
    }
    if (++round.left == n) clique->rounds.erase(call);
  };
  // The stream's device is made current for the launch, as NCCL does.
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(clique->devices[std::size_t(rank)]);
  const cudaError_t status = fake_cuda::launch(q.stream, work, "ncclAllReduce");
  cudaSetDevice(previous);
  return status == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

}  // namespace

extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || ndev <= 0) return ncclInvalidArgument;
  auto clique = std::make_shared<Clique>();
  for (int r = 0; r < ndev; ++r) {
    const int d = devlist ? devlist[r] : r;
    if (d < 0 || d >= devices || std::set<int>(clique->devices.begin(), clique->devices.end()).count(d))
      return ncclInvalidArgument;
    clique->devices.push_back(d);
  }
  for (int r = 0; r < ndev; ++r) {
    fake_cuda::make_context(clique->devices[std::size_t(r)]);  // each rank's resources live on its GPU
    comms[r] = new ncclComm{clique, r};
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  if (group.depth++ == 0) fake_cuda::collective_group(true);
  return ncclSuccess;
}

// The outermost end launches the group's parts, or abandons them all after
// a failed call in the group.
ncclResult_t ncclGroupEnd(void) {
  if (group.depth == 0) return ncclInvalidUsage;
  if (--group.depth > 0) return ncclSuccess;
  std::vector<Queued> parts;
  parts.swap(group.parts);
  ncclResult_t status = std::exchange(group.failed, ncclSuccess);
  if (status == ncclSuccess)
    for (const Queued& q : parts)
      if ((status = launch(q)) != ncclSuccess) break;
  fake_cuda::collective_group(false);
  return status;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const auto fail = [](ncclResult_t status, const char* why) {
    fake_cuda::explain(why);
    if (group.depth > 0 && group.failed == ncclSuccess) group.failed = status;
    return status;
  };
  if (!comm || op != ncclSum) return fail(ncclInvalidArgument, "ncclAllReduce: no communicator, or not a sum");
  if (datatype != ncclFloat32 && datatype != ncclFloat64 && datatype != ncclInt32 && datatype != ncclInt64)
    return fail(ncclInvalidArgument, "ncclAllReduce: a type the stand-in does not sum");
  const int device = comm->clique->devices[std::size_t(comm->rank)];
  if (fake_cuda::device_of(stream) != device)
    return fail(ncclInvalidArgument, "ncclAllReduce on a stream of another device than its communicator's");
  const std::size_t bytes = count * size_of(datatype);
  if (count > 0 && (fake_cuda::device_memory_of(sendbuff, bytes) != device ||
                    fake_cuda::device_memory_of(recvbuff, bytes) != device))
    return fail(ncclInvalidArgument, "ncclAllReduce: a buffer that is not its communicator's device memory");
  const Queued q{comm, sendbuff, recvbuff, count, datatype, stream};
  if (group.depth > 0) {
    group.parts.push_back(q);
    return ncclSuccess;
  }
  if (comm->clique->devices.size() > 1)
    return fail(ncclInvalidUsage, "ncclAllReduce over several GPUs from one thread outside ncclGroupStart/End");
  return launch(q);
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: break;
  }
  return "unknown result code";
}

}  // extern "C"
