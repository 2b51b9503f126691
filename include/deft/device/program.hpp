// Device programs: GPU work recorded once and launched again as a whole (on
// CUDA, a graph), which a hybridized forward replays with one launch instead
// of one per kernel (see trace.hpp's ProgramTask). A program's kernels keep
// the memory they were recorded with, so while one records on a thread
// (ProgramCapture): the memory its work uses is collected, to be declared to
// the lanes once per launch; its scratch blocks are kept for the program's
// lifetime; and what a program could not repeat (a copy to or from the host,
// work for another device) is refused before it is queued.
// Plain C++: the engine knows nothing of CUDA.
#pragma once
#include <algorithm>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../core/device.hpp"
#include "../core/error.hpp"
#include "allocator.hpp"

namespace deft::detail {

/// The device memory one kernel or copy reads and writes (pointers anywhere
/// inside the blocks a device's pool handed out), declared so that work on
/// different lanes of a device is ordered (device/cuda/lanes.hpp).
struct MemoryUses {
  std::vector<const void*> reads, writes;
};

/// GPU work recorded once, launched again as a whole on the memory it was
/// recorded with (DeviceBackend::record).
class DeviceProgram {
 public:
  virtual ~DeviceProgram() = default;
  /// Queues the whole program on the calling thread's lane of its device.
  virtual void launch() = 0;
};

/// Raised, before anything is queued, by work that a device program could
/// not repeat: the recording is abandoned and the work runs as it is.
class NotRecordable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What a recorded program uses and holds: the union of its work's memory
/// uses, declared to the lanes at each launch, and the scratch blocks its
/// kernels took, returned to their pools with the program (the lanes' record
/// orders their next user after its last launch).
class ProgramMemory {
 public:
  ProgramMemory() = default;
  ProgramMemory(ProgramMemory&& o) noexcept : uses(std::move(o.uses)), scratch(std::move(o.scratch)) { o.scratch.clear(); }
  ProgramMemory& operator=(ProgramMemory&&) = delete;
  ~ProgramMemory() {
    for (const Kept& k : scratch) k.pool->deallocate(k.data, k.bytes, k.alignment);
  }

  struct Kept {
    std::shared_ptr<engine::HostAllocator> pool;
    void* data;
    std::size_t bytes, alignment;
  };
  MemoryUses uses;
  std::vector<Kept> scratch;
};

/// Makes the calling thread's GPU work for `device` part of a program while
/// it lives. `record`: the uses are collected into `memory` and scratch is
/// allocated and kept there. `repeat` (the emulated GPUs of the tests, which launches a
/// program by running its work again): the work must use exactly the
/// memory it was recorded with, as a CUDA graph would; std::logic_error
/// otherwise.
class ProgramCapture {
 public:
  enum class Mode { record, repeat };
  ProgramCapture(int device, ProgramMemory& memory, Mode mode)
      : device_(device), memory_(memory), mode_(mode), previous_(slot()) {
    slot() = this;
  }
  ~ProgramCapture() {
    slot() = previous_;
    if (mode_ == Mode::record) sort_uses();
  }
  ProgramCapture(const ProgramCapture&) = delete;
  ProgramCapture& operator=(const ProgramCapture&) = delete;

  /// The capture of the calling thread, if any.
  static ProgramCapture* active() { return slot(); }
  /// Refuses `what` while the calling thread records a program.
  static void refuse(const char* what) {
    if (ProgramCapture* c = active())
      raise<NotRecordable>(what, " cannot be part of a program recorded for ", deft::gpu(c->device_));
  }

  /// The uses of work queued for `device` while capturing (see LaneAccess).
  void use(int device, const MemoryUses& u) {
    if (device != device_)
      raise<NotRecordable>("work for ", deft::gpu(device), " cannot be part of a program recorded for ", deft::gpu(device_));
    if (mode_ == Mode::record) {
      auto& all = memory_.uses;
      all.reads.insert(all.reads.end(), u.reads.begin(), u.reads.end());
      all.writes.insert(all.writes.end(), u.writes.begin(), u.writes.end());
      return;
    }
    for (const void* p : u.reads) expect(memory_.uses.reads, p, "read");
    for (const void* p : u.writes) expect(memory_.uses.writes, p, "wrote");
  }
  /// Scratch memory while capturing: kept by the program (recorded), or the
  /// block it kept in the same turn (repeated).
  void* scratch(std::shared_ptr<engine::HostAllocator> pool, std::size_t bytes, std::size_t alignment) {
    auto& kept = memory_.scratch;
    if (mode_ == Mode::repeat) {
      if (next_scratch_ >= kept.size() || kept[next_scratch_].bytes != bytes)
        raise<std::logic_error>("a program launched on ", deft::gpu(device_),
                                " asked for scratch memory it was not recorded with");
      return kept[next_scratch_++].data;
    }
    kept.reserve(kept.size() + 1);
    void* p = pool->allocate(bytes, alignment);
    if (!p) throw std::bad_alloc();
    kept.push_back({std::move(pool), p, bytes, alignment});
    return p;
  }

 private:
  static ProgramCapture*& slot() {
    thread_local ProgramCapture* capture = nullptr;
    return capture;
  }
  void expect(const std::vector<const void*>& recorded, const void* p, const char* verb) const {
    if (!std::binary_search(recorded.begin(), recorded.end(), p))
      raise<std::logic_error>("a program launched on ", deft::gpu(device_), " ", verb,
                              " memory it was not recorded with");
  }
  void sort_uses() {
    for (auto* v : {&memory_.uses.reads, &memory_.uses.writes}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
  }

  int device_;
  ProgramMemory& memory_;
  Mode mode_;
  std::size_t next_scratch_ = 0;
  ProgramCapture* previous_;
};

}  // namespace deft::detail
