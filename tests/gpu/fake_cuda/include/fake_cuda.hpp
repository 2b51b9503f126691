// What the stand-in's other parts (its Thrust policy, cuBLAS and NCCL) need
// of its runtime: work queued on a stream as a kernel would be.
#pragma once
#include <cstddef>
#include <functional>

#include <cuda_runtime_api.h>

namespace fake_cuda {

/// Queues `work` on `stream` (or into the stream's capture) as a kernel
/// launch: the calling thread's current device must be the stream's, as
/// CUDA requires of a launch. `what` names the launch in the stand-in's
/// messages. Work that throws faults its device as a kernel's fault does
/// on a GPU: every later call for the device returns cudaErrorLaunchFailure.
cudaError_t launch(cudaStream_t stream, std::function<void()> work, const char* what);

/// Whether `device`'s primary context exists: made by the first call that
/// needs one while the device is current, and by cudaSetDevice (CUDA 12's
/// rule). deft must not make one on a GPU the program never used.
bool has_context(int device);

/// Makes `device`'s primary context (for the stand-in's cuBLAS and NCCL).
void make_context(int device);

/// The device `stream` belongs to, or -1 for a handle that is not a stream.
int device_of(cudaStream_t stream);

/// The device whose memory holds [p, p + bytes), or -1.
int device_memory_of(const void* p, std::size_t bytes);

/// NCCL's group calls (the stand-in's nccl.cpp): while one thread queues a
/// group, another's cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost or
/// peer mapping fails with cudaErrorNotPermitted, as it may hang on GPUs.
void collective_group(bool open);

/// How many times `what` was queued so far: a launch's name (for_each,
/// transform, cublas gemm, ncclAllReduce, ncclBroadcast, ncclAllGather,
/// ncclReduceScatter) or one of cudaMemcpyAsync,
/// cudaMemcpyPeerAsync, cudaStreamWaitEvent, cudaStreamBeginCapture and
/// cudaGraphLaunch: tests check that their work took the paths they mean.
unsigned long long calls(const char* what);

/// What a test makes a call of the stand-in do, once.
enum class Fault { none, fail, hang };
/// Makes this process's next `call` fail at once (ncclSystemError), or
/// never end. "ncclCommInitRank" (with or without a config) takes both: as
/// a blocking call a hang waits until the process ends, as a non-blocking
/// one its communicator stays in progress until aborted. A collective
/// ("ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter")
/// on a non-blocking communicator takes a hang: it answers ncclInProgress,
/// and so does every ncclCommGetAsyncError after it, until aborted. Tests
/// reach through it a rank that cannot join a communicator, and one whose
/// NCCL never takes a collective.
void inject(const char* call, Fault fault);
/// The fault injected for `call`, which it takes (the stand-in's own use).
Fault take_fault(const char* call);

/// Prints "fake CUDA: <message>" to stderr: the stand-in's reason for an error it returns.
void explain(const char* message);

}  // namespace fake_cuda
