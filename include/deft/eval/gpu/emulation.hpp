// A stand-in for the CUDA backend, for tests on machines without a GPU (CI):
// two "GPUs" whose memory is host memory from pools of their own and whose
// kernels run through Thrust's C++ backend, on the calling thread. Tensors on
// gpu(0) and gpu(1) then take every path a CUDA build takes: the engine,
// on_device's GPU executor, the device pools, copies through the backend.
// Defined by the test targets with DEFT_GPU_EMULATION and
// THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP; never in a user's build.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include <thrust/system/cpp/execution_policy.h>

#include "../../core/error.hpp"
#include "../../engine/allocator.hpp"
#include "../../engine/device_backend.hpp"
#include "kernels.hpp"
#include "staging.hpp"

namespace deft::detail::gpu {

/// The emulated devices' side of a staged copy: the "DMA" is a memcpy, done
/// at once. (tests/gpu checks StagingArea with DMAs that finish later.)
struct EmulatedUploadQueue {
  using Mark = int;
  void copy(void* to, const void* staged, std::size_t n) { std::memcpy(to, staged, n); }
  static Mark mark() { return 0; }
  static bool finished(Mark) { return true; }
  static void wait(Mark) {}
};

class EmulatedBackend final : public DeviceBackend {
 public:
  static constexpr int devices = 2;
  // Small chunks, so that the tests' tensors take several (CUDA's are 4 MiB).
  static constexpr std::size_t staging_chunk_bytes = std::size_t(16) << 10;

  const char* name() const override { return "emulated"; }
  int device_count() override { return devices; }
  std::shared_ptr<engine::HostAllocator> memory(int index) override { return pools_.at(std::size_t(index)); }
  /// A mark that names its device, so a copy or wait ordered after another
  /// device's mark (a wrong buffer's) is caught.
  std::shared_ptr<void> mark(int index) override { return std::make_shared<int>(index); }
  std::shared_ptr<engine::HostAllocator> pinned_memory() override { return pinned_; }
  void copy(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes,
            const void* after) override {
    if (after) check_mark(from_device.index, after), ++marked_copies;
    if (from_device.type == DeviceType::cpu && to_device.type != DeviceType::cpu) {
      EmulatedUploadQueue queue;
      staging_.upload(to, from, bytes, queue);
      ++staged_uploads;
    } else if (bytes) {
      std::memcpy(to, from, bytes);
    }
  }
  void synchronize(int) override {}
  void wait_for(int index, const void* mark) override {
    if (mark) check_mark(index, mark), ++marked_waits;
  }
  void synchronize_all() override {}

  /// Copies from a device and waits that were ordered by a buffer's mark;
  /// copies to a device (each staged through pinned blocks).
  std::atomic<long> marked_copies{0}, marked_waits{0}, staged_uploads{0};

  static void check_mark(int device, const void* mark) {
    if (*static_cast<const int*>(mark) != device)
      raise<std::logic_error>("emulated gpu(", device, "): ordered after a mark of gpu(", *static_cast<const int*>(mark),
                              ")");
  }

  /// The pool of emulated device `index`, for tests of its caching.
  engine::CachingHostAllocator& pool(int index) { return *pools_.at(std::size_t(index)); }
  /// The stand-in for page-locked memory (a pool of its own).
  engine::CachingHostAllocator& pinned_pool() { return *pinned_; }

 private:
  std::shared_ptr<engine::CachingHostAllocator> pinned_ = std::make_shared<engine::CachingHostAllocator>(
      std::make_shared<engine::DefaultHostAllocator>(), std::size_t(64) << 20, 0);
  StagingArea<EmulatedUploadQueue> staging_{pinned_, staging_chunk_bytes};
  std::array<std::shared_ptr<engine::CachingHostAllocator>, devices> pools_{
      std::make_shared<engine::CachingHostAllocator>(), std::make_shared<engine::CachingHostAllocator>()};
};

inline EmulatedBackend& emulated_backend() {
  static auto* backend = new EmulatedBackend();  // leaked: buffers may be freed during static destruction
  return *backend;
}

inline const bool emulated_backend_registered = register_gpu_backend(&emulated_backend());

/// Executor<gpu>'s launch context: Thrust's sequential host policy.
class Launch {
 public:
  explicit Launch(int device) {
    if (device < 0 || device >= EmulatedBackend::devices) raise("no device ", deft::gpu(device), " in the emulation");
  }
  static auto policy() { return thrust::cpp::par; }
  template <class T>
  void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool trans_a,
            bool trans_b) const {
    naive_gemm(policy(), m, n, k, a, b, c, trans_a, trans_b);
  }
};

}  // namespace deft::detail::gpu
