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

thread_local int group_depth = 0;

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank;
  std::uint64_t calls = 0;  // this rank's allreduces so far
};

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
  for (int r = 0; r < ndev; ++r) comms[r] = new ncclComm{clique, r};
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  ++group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return ncclInvalidUsage;
  --group_depth;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!comm || op != ncclSum) return ncclInvalidArgument;
  if (datatype != ncclFloat32 && datatype != ncclFloat64 && datatype != ncclInt32 && datatype != ncclInt64)
    return ncclInvalidArgument;
  const std::shared_ptr<Clique> clique = comm->clique;
  const int n = int(clique->devices.size()), rank = comm->rank;
  if (n > 1 && group_depth == 0) {
    fake_cuda::explain("ncclAllReduce over several GPUs from one thread outside ncclGroupStart/End");
    return ncclInvalidUsage;
  }
  if (fake_cuda::device_of(stream) != clique->devices[std::size_t(rank)]) {
    fake_cuda::explain("ncclAllReduce on a stream of another device than its communicator's");
    return ncclInvalidArgument;
  }
  const std::uint64_t call = comm->calls++;
  const auto work = [=] {
    std::unique_lock lk(clique->m);
    Round& round = clique->rounds[call];
    round.parts.resize(std::size_t(n));
    round.parts[std::size_t(rank)] = {sendbuff, recvbuff};
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
  // The current device is made the stream's for the launch (NCCL does the same).
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(clique->devices[std::size_t(rank)]);
  const cudaError_t status = fake_cuda::launch(stream, work, "ncclAllReduce");
  cudaSetDevice(previous);
  return status == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
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
