// Copies between host memory and a GPU through page-locked ("pinned")
// staging blocks.
//
// To a GPU: cudaMemcpyAsync from pageable memory first waits for the work
// already queued on the destination's stream, so a worker uploading the next
// batch would sit idle until the GPU drained. Staged, the worker copies the
// bytes into a pinned block and queues the DMA from it; the call returns at
// once and the DMA overlaps the kernels queued before it. A block goes back
// to the pinned pool only once its DMA is done.
//
// From a GPU into pageable memory (to_vector, item): the DMA goes into a
// pinned block, and the worker copies chunk i out while chunk i + 1's DMA
// runs. No copy then touches pageable memory through the driver, which
// stages it the same way but may wait on work of other streams meanwhile
// (the hangs next to NCCL's kernels that XLA and Gloo report).
//
// Plain C++: `Queue` is the device's side (CUDA's, the emulation's, a
// test's), so the logic here is checked on machines without a GPU.
#pragma once
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <utility>

#include "../allocator.hpp"
#include "../../core/thresholds.hpp"

namespace deft::detail::gpu {

/// What StagingArea needs of a destination device's queue:
///   void copy(void* to, const void* staged, std::size_t n)  queues a DMA of n bytes;
///   Queue::Mark mark()                  marks the work queued so far;
///   static bool finished(const Mark&)   whether the marked work is done (does not block);
///   static void wait(const Mark&)       blocks until it is.
/// A download's source queue (download()) instead has
///   void fetch(void* staged, const void* from, std::size_t n)  queues a DMA from the device;
///   Mark mark(), and void wait(const Mark&), which raises the DMA's failure;
///   void copy_unstaged(void* to, const void* from, std::size_t n)  copies
///       straight into pageable memory, done on return (no pinned block left).
template <class Queue>
class StagingArea {
 public:
  using Mark = typename Queue::Mark;

  /// Blocks come from `pinned`; a copy is split into chunks of at most
  /// `chunk_bytes` (a power of two), and at most `max_in_flight_bytes` of
  /// upload blocks wait for their DMA at once (past it, an upload waits for
  /// the oldest), in at most max_in_flight_blocks blocks. Downloads take
  /// two blocks each, outside that bound: waiting for uploads, queued behind
  /// kernels, would make a copy of a ready value wait for those kernels.
  StagingArea(std::shared_ptr<engine::HostAllocator> pinned, std::size_t chunk_bytes = thresholds::gpu_staging_chunk_bytes,
              std::size_t max_in_flight_bytes = thresholds::gpu_staging_max_bytes)
      : pinned_(std::move(pinned)), chunk_(chunk_bytes), max_bytes_(std::max(max_in_flight_bytes, chunk_bytes)) {}
  StagingArea(const StagingArea&) = delete;
  StagingArea& operator=(const StagingArea&) = delete;
  ~StagingArea() { drain(); }

  static constexpr std::size_t min_block_bytes = std::size_t(4) << 10;
  static constexpr std::size_t max_in_flight_blocks = 256;

  /// Copies `bytes` from `from` (any host memory) to `to` on q's device. On
  /// return `from` may be reused; the DMAs may still be running.
  void upload(void* to, const void* from, std::size_t bytes, Queue& q) {
    auto* dst = static_cast<std::byte*>(to);
    const auto* src = static_cast<const std::byte*>(from);
    for (std::size_t done = 0; done < bytes;) {
      const std::size_t n = std::min(chunk_, bytes - done);
      const std::size_t size = block_size(n);
      void* block = take(size, Use::upload);
      std::memcpy(block, src + done, n);
      try {
        q.copy(dst + done, block, n);
      } catch (...) {
        give_back(block, size, Use::upload);  // nothing was queued from it
        throw;
      }
      Mark mark{};
      try {
        mark = q.mark();
      } catch (...) {
        // The DMA is queued but cannot be waited for: the block is never
        // reused (a leak, on a device that is failing anyway).
        unreserve(size, Use::upload);
        throw;
      }
      keep_until(block, size, std::move(mark));
      done += n;
    }
  }

  /// Copies `bytes` from `from` on q's device into `to` (any host memory);
  /// done on return. At most two blocks at a time: chunk i is copied out
  /// while chunk i + 1's DMA runs. A failed DMA raises (q.wait), after the
  /// chunks before it arrived. Where no pinned block can be had (pinning
  /// failed), the rest goes through q.copy_unstaged.
  template <class Source>
  void download(void* to, const void* from, std::size_t bytes, Source& q) {
    auto* dst = static_cast<std::byte*>(to);
    const auto* src = static_cast<const std::byte*>(from);
    struct Fetched {
      void* block;
      std::size_t size, offset, n;
      typename Source::Mark mark;
    };
    std::optional<Fetched> last;  // queued, not yet copied out
    // Waits for its DMA and copies it out; its block goes back either way.
    auto deliver = [&](Fetched f) {
      try {
        q.wait(f.mark);
      } catch (...) {
        give_back(f.block, f.size, Use::download);
        throw;
      }
      std::memcpy(dst + f.offset, f.block, f.n);
      give_back(f.block, f.size, Use::download);
    };
    try {
      for (std::size_t done = 0; done < bytes;) {
        const std::size_t n = std::min(chunk_, bytes - done);
        const std::size_t size = block_size(n);
        void* block = nullptr;
        try {
          block = take(size, Use::download);
        } catch (...) {  // no page-locked memory: the driver stages the rest
          if (last) deliver(*std::exchange(last, std::nullopt));
          q.copy_unstaged(dst + done, src + done, bytes - done);
          return;
        }
        try {
          q.fetch(block, src + done, n);
        } catch (...) {
          give_back(block, size, Use::download);  // nothing was queued into it
          throw;
        }
        std::optional<typename Source::Mark> mark;
        try {
          mark.emplace(q.mark());
        } catch (...) {
          unreserve(size, Use::download);  // a DMA may still write it: the block is never reused, as in upload
          throw;
        }
        // Kept before the one before is delivered: should that raise, this
        // block too waits for its DMA and goes back.
        const auto before = std::exchange(last, Fetched{block, size, done, n, std::move(*mark)});
        if (before) deliver(*before);
        done += n;
      }
      if (last) deliver(*std::exchange(last, std::nullopt));
    } catch (...) {
      if (last) {  // queued before the failure: its DMA may still write the block
        try {
          q.wait(last->mark);
        } catch (...) {
        }
        give_back(last->block, last->size, Use::download);
      }
      throw;
    }
  }

  /// Bytes of blocks reserved or waiting for their DMA now (uploads' and downloads').
  std::size_t bytes_in_flight() const {
    std::lock_guard lk(m_);
    return reserved_ + downloading_;
  }

  /// Waits for every DMA from a staging block and returns the blocks to the pool.
  void drain() {
    for (;;) {
      InFlight oldest;
      {
        std::lock_guard lk(m_);
        if (in_flight_.empty()) return;
        oldest = std::move(in_flight_.front());
        in_flight_.pop_front();
      }
      Queue::wait(oldest.mark);
      give_back(oldest.block, oldest.size, Use::upload);
    }
  }

 private:
  enum class Use { upload, download };
  struct InFlight {
    void* block = nullptr;
    std::size_t size = 0;
    Mark mark{};
  };

  // Powers of two from min_block_bytes: few sizes, so the pool's cache hits.
  static std::size_t block_size(std::size_t n) { return std::bit_ceil(std::max(n, min_block_bytes)); }

  // A block of `size` bytes. An upload's is reserved within the bounds:
  // it waits for the oldest DMAs while the new block would pass them.
  void* take(std::size_t size, Use use) {
    for (;;) {
      InFlight oldest;
      {
        std::lock_guard lk(m_);
        reclaim_finished();
        const bool fits = reserved_ + size <= max_bytes_ && in_flight_.size() < max_in_flight_blocks;
        if (use == Use::download || fits || in_flight_.empty()) {
          count(use) += size;
          break;
        }
        oldest = std::move(in_flight_.front());
        in_flight_.pop_front();
      }
      Queue::wait(oldest.mark);  // outside the lock: other uploads go on meanwhile
      give_back(oldest.block, oldest.size, Use::upload);
    }
    void* block = nullptr;
    try {
      block = pinned_->allocate(size, thresholds::alignment);
    } catch (...) {
      unreserve(size, use);
      throw;
    }
    if (!block) {
      unreserve(size, use);
      throw std::bad_alloc();
    }
    return block;
  }

  void keep_until(void* block, std::size_t size, Mark mark) {
    std::lock_guard lk(m_);
    in_flight_.push_back({block, size, std::move(mark)});
  }

  // Returns every block whose DMA is done. DMAs finish out of the order
  // they were queued in (each goes on the uploading thread's lane, or to
  // another device), so a pending one at the front holds back none after
  // it. (At most max_in_flight_blocks queries.)
  void reclaim_finished() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (!Queue::finished(it->mark)) {
        ++it;
        continue;
      }
      pinned_->deallocate(it->block, it->size, thresholds::alignment);
      reserved_ -= it->size;
      it = in_flight_.erase(it);
    }
  }

  void give_back(void* block, std::size_t size, Use use) {
    pinned_->deallocate(block, size, thresholds::alignment);
    unreserve(size, use);
  }
  void unreserve(std::size_t size, Use use) {
    std::lock_guard lk(m_);
    count(use) -= size;
  }
  std::size_t& count(Use use) { return use == Use::upload ? reserved_ : downloading_; }

  std::shared_ptr<engine::HostAllocator> pinned_;
  std::size_t chunk_;
  std::size_t max_bytes_;
  mutable std::mutex m_;
  std::size_t reserved_ = 0;     // upload blocks taken and not yet given back
  std::size_t downloading_ = 0;  // download blocks taken and not yet given back
  std::deque<InFlight> in_flight_;
};

}  // namespace deft::detail::gpu
