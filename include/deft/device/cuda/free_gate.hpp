// Frees that must wait for CUDA-graph recordings: cudaFree and cudaFreeHost
// may wait for the device, and a wait for a stream that is capturing ends
// the capture. Plain C++: the CUDA upstreams (runtime.hpp) and the emulated
// devices' memory share it, and the host tests check it.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <vector>

namespace deft::detail::gpu {

/// The freeing side of an upstream allocator. While a FreeGate::Capturing
/// lives, a freed block is parked; the last recording to end frees them.
/// A recording starts only once the frees under way have ended.
class FreeGate {
 public:
  virtual ~FreeGate() = default;

  /// Frees p (HostAllocator::deallocate's arguments) now through
  /// release(), or parks it while a recording runs (also when the list of
  /// parked blocks cannot grow: then it is freed now).
  void free_or_park(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    {
      std::lock_guard lk(m_);
      if (captures_ > 0) try {
          parked_.push_back({p, bytes, alignment});
          return;
        } catch (...) {
        }
      ++freeing_;
    }
    release(p, bytes, alignment);
    done_freeing(1);
  }

  /// Blocks parked now.
  std::size_t parked() const {
    std::lock_guard lk(m_);
    return parked_.size();
  }

  /// Held while a program records on the memory's device (or, for
  /// page-locked memory, on any device).
  class Capturing {
   public:
    explicit Capturing(FreeGate& gate) : gate_(gate) {
      std::unique_lock lk(gate_.m_);
      ++gate_.captures_;
      gate_.freed_.wait(lk, [&] { return gate_.freeing_ == 0; });
    }
    ~Capturing() {
      std::vector<Parked> parked;
      {
        std::lock_guard lk(gate_.m_);
        if (--gate_.captures_ == 0) parked.swap(gate_.parked_);
        gate_.freeing_ += int(parked.size());  // a new recording waits for them
      }
      for (const Parked& b : parked) gate_.release(b.p, b.bytes, b.alignment);
      gate_.done_freeing(int(parked.size()));
    }
    Capturing(const Capturing&) = delete;
    Capturing& operator=(const Capturing&) = delete;

   private:
    FreeGate& gate_;
  };

 protected:
  /// Gives p back for good.
  virtual void release(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;

 private:
  struct Parked {
    void* p;
    std::size_t bytes, alignment;
  };
  void done_freeing(int n) noexcept {
    std::lock_guard lk(m_);
    if ((freeing_ -= n) == 0) freed_.notify_all();
  }

  mutable std::mutex m_;
  std::condition_variable freed_;  // freeing_ went to 0
  int captures_ = 0;               // recordings under way
  int freeing_ = 0;                // blocks being freed now
  std::vector<Parked> parked_;     // blocks freed during a recording
};

}  // namespace deft::detail::gpu
