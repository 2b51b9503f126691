// The CUDA runtime as deft uses it: errors become exceptions that carry the
// CUDA error text, and each GPU has one caching memory pool and one stream.
// Plain C++ (the CUDA runtime API is a C library): g++ and nvcc both compile
// it; link CUDA::cudart (deft::cuda does).
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <cuda_runtime_api.h>

#include "../../core/device.hpp"
#include "../../core/error.hpp"
#include "../../engine/allocator.hpp"

namespace deft::detail::gpu {

/// Throws std::runtime_error("deft: <what> on gpu(i): <CUDA's text>") for a
/// failed call. Clears the error first when it is not sticky, so that the
/// next call on the device works again (out of memory, a bad argument).
inline void check(cudaError_t status, const char* what, int device) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  raise<std::runtime_error>(what, " on ", deft::gpu(device), ": ", cudaGetErrorName(status), " (",
                            cudaGetErrorString(status), ")");
}

/// Makes `device` current for the calling thread while it lives.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice", device);
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
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

/// cudaMalloc / cudaFree on one device: the upstream of its cache.
class DeviceMemory final : public engine::HostAllocator {
 public:
  explicit DeviceMemory(int device) : device_(device) {}
  void* allocate(std::size_t bytes, std::size_t) override {
    DeviceGuard on(device_);
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      raise<std::runtime_error>("out of memory on ", deft::gpu(device_), ": cudaMalloc of ", bytes, " bytes failed");
    }
    check(status, "cudaMalloc", device_);
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) noexcept override {
    DeviceGuard on(device_);
    cudaFree(p);
  }

 private:
  int device_;
};

// Device blocks are cached from this size up (every tensor: a steady
// training loop then calls cudaMalloc only while the cache warms up)...
inline constexpr std::size_t device_cache_min_bytes = 256;
// ...holding at most this many free bytes per device.
inline constexpr std::size_t device_cache_max_bytes = std::size_t(4) << 30;

/// One GPU's resources, created on first use: its memory cache and the
/// stream deft's kernels for it run on (stream order makes a freed block
/// safe to reuse for the next kernel without a device-wide sync).
struct DeviceContext {
  int device;
  std::shared_ptr<engine::CachingHostAllocator> memory;  // shared: buffers keep it alive
  cudaStream_t stream = nullptr;

  explicit DeviceContext(int d)
      : device(d),
        memory(std::make_shared<engine::CachingHostAllocator>(std::make_shared<DeviceMemory>(d), device_cache_max_bytes,
                                                              device_cache_min_bytes)) {
    DeviceGuard on(d);
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", d);
  }
  ~DeviceContext() {
    memory->release();
    if (stream) cudaStreamDestroy(stream);
  }
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  /// Waits for every kernel queued on the stream; rethrows their failure.
  void synchronize() { check(cudaStreamSynchronize(stream), "a kernel", device); }
};

/// Every GPU's context, made on first use.
struct Contexts {
  std::mutex m;
  std::vector<std::unique_ptr<DeviceContext>> list;
  static Contexts& get() {
    static Contexts contexts;
    return contexts;
  }
};

/// The context of GPU `index`; raises std::invalid_argument for a GPU that
/// does not exist (naming how many there are).
inline DeviceContext& context(int index) {
  auto& c = Contexts::get();
  std::lock_guard lk(c.m);
  const int n = device_count();
  if (index < 0 || index >= n) raise("no device ", deft::gpu(index), ": this machine has ", n, " CUDA GPU(s)");
  if (c.list.size() < std::size_t(n)) c.list.resize(n);
  if (!c.list[index]) c.list[index] = std::make_unique<DeviceContext>(index);
  return *c.list[index];
}

/// The contexts made so far (those of GPUs this process used).
inline std::vector<DeviceContext*> live_contexts() {
  auto& c = Contexts::get();
  std::lock_guard lk(c.m);
  std::vector<DeviceContext*> live;
  for (auto& ctx : c.list)
    if (ctx) live.push_back(ctx.get());
  return live;
}

}  // namespace deft::detail::gpu
