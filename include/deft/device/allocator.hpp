// Where host tensor storage comes from. The default takes aligned memory from
// the C heap and keeps large freed blocks for reuse (CachingHostAllocator,
// which caches each GPU's memory too); a user may install another allocator
// (an arena, pinned memory, a tracking or fault-injecting one) for the
// buffers allocated afterwards.
#pragma once
#include <algorithm>
#include <bit>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <utility>
#include <vector>

#include "../core/config.hpp"
#include "../core/thresholds.hpp"

namespace deft::engine {

/// Allocates the storage of host tensors. Called from the worker that first
/// writes a buffer, so it must be thread-safe. allocate() reports failure by
/// throwing (std::bad_alloc preferably) or returning nullptr; the task that
/// needed the memory then fails and its sync points rethrow the error.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  /// `bytes` is a positive multiple of `alignment`, a power of two.
  virtual void* allocate(std::size_t bytes, std::size_t alignment) = 0;
  /// Frees `p`, which allocate(bytes, alignment) returned.
  virtual void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept = 0;
  /// Told by a cache over this allocator (BlockReuse::split) before it hands
  /// out [p, p + bytes) again: memory this allocator returned, possibly cut
  /// from a larger block or merged from several. May throw; a GPU's
  /// upstream makes the lanes treat the range as one block (lanes.hpp).
  virtual void reissue(void* /*p*/, std::size_t /*bytes*/) {}
};

/// std::aligned_alloc / std::free.
class DefaultHostAllocator final : public HostAllocator {
 public:
  /// std::aligned_alloc(alignment, bytes).
  void* allocate(std::size_t bytes, std::size_t alignment) override { return std::aligned_alloc(alignment, bytes); }
  /// std::free(p).
  void deallocate(void* p, std::size_t, std::size_t) noexcept override { std::free(p); }
};

/// How a CachingHostAllocator reuses its free blocks.
enum class BlockReuse {
  /// A free block serves requests of its own size class only (the host's
  /// default: the C heap serves other sizes well).
  same_class,
  /// The smallest free block that fits serves a request, and what it has
  /// left over stays free; free neighbours from one upstream allocation
  /// merge again (a GPU's pool: memory freed by one shape serves another).
  /// Small requests (cache_small_request_bytes) are cut from allocations of
  /// their own, made cache_small_segment_bytes large at least.
  split,
};

/// Keeps freed blocks of `min_bytes` (host_cache_min_bytes) and more, by size
/// class, and hands them out again instead of asking `upstream` (a block of
/// the request's class, or with BlockReuse::split a part of any larger
/// one); smaller blocks pass straight through. Past limit() free bytes the
/// cache gives back free blocks that are whole upstream allocations, the
/// largest first; when the upstream fails, it gives back all of those and
/// the request is tried again. The upstream may be any allocator: a GPU's
/// caches device memory.
class CachingHostAllocator final : public HostAllocator {
 public:
  /// What the cache did so far.
  struct Stats {
    std::uint64_t hits = 0;        ///< cacheable requests served from the cache
    std::uint64_t misses = 0;      ///< cacheable requests passed to the upstream allocator
    std::size_t cached_bytes = 0;  ///< free bytes held now
    std::size_t held_bytes = 0;    ///< bytes taken from the upstream and not given back (in use or free)
    std::uint64_t splits = 0;      ///< requests served by part of a larger free block (BlockReuse::split)
  };

  /// Caches what `upstream` allocates from `min_bytes` up, holding at most `limit` free bytes.
  explicit CachingHostAllocator(std::shared_ptr<HostAllocator> upstream = std::make_shared<DefaultHostAllocator>(),
                                std::size_t limit = thresholds::host_cache_max_bytes,
                                std::size_t min_bytes = thresholds::host_cache_min_bytes,
                                BlockReuse reuse = BlockReuse::same_class)
      : upstream_(std::move(upstream)), limit_(limit), min_bytes_(min_bytes), reuse_(reuse) {}
  ~CachingHostAllocator() override { release(); }
  CachingHostAllocator(const CachingHostAllocator&) = delete;
  CachingHostAllocator& operator=(const CachingHostAllocator&) = delete;

  /// The size a request of `bytes` is rounded up to (a multiple of `alignment`).
  std::size_t size_class(std::size_t bytes, std::size_t alignment) const {
    static_assert(std::has_single_bit(unsigned(thresholds::host_cache_classes_per_octave)));
    constexpr int class_bits = std::countr_zero(unsigned(thresholds::host_cache_classes_per_octave));
    if (bytes < min_bytes_) return bytes;
    const int octave = int(std::bit_width(bytes)) - 1;
    const std::size_t step = std::max(alignment, std::size_t(1) << std::max(0, octave - class_bits));
    if (bytes > std::numeric_limits<std::size_t>::max() - (step - 1)) return bytes;  // would wrap: upstream refuses it
    return (bytes + step - 1) / step * step;
  }

  DEFT_DECL void* allocate(std::size_t bytes, std::size_t alignment) override;  // DEFT_DECL: see ~Task()

  DEFT_DECL void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override;

  /// Gives every free block back to the upstream, except parts of
  /// allocations still partly in use (BlockReuse::split).
  void release() noexcept {
    std::lock_guard lk(m_);
    trim(0, blocks_.end());
  }
  /// Caps the free bytes held (0: cache nothing), giving blocks back past the new cap.
  void set_limit(std::size_t bytes) noexcept {
    std::lock_guard lk(m_);
    limit_ = bytes;
    trim(limit_, blocks_.end());
  }
  /// The cap on the free bytes held.
  std::size_t limit() const noexcept {
    std::lock_guard lk(m_);
    return limit_;
  }
  /// Hits, misses and the bytes held now.
  Stats stats() const noexcept {
    std::lock_guard lk(m_);
    return stats_;
  }

 private:
  // Free blocks by kind of allocation and alignment, then size, then the
  // latest freed first (its memory is the likeliest to be in a cache): the
  // first at or after {small, alignment, size} is the smallest that fits.
  struct FreeKey {
    bool small;
    std::size_t alignment, size;
    std::uint64_t age;  // counts down as blocks are freed
    std::uintptr_t address;
    auto operator<=>(const FreeKey&) const = default;
  };
  using FreeSet = std::set<FreeKey>;
  // Every block taken from the upstream, or cut from one, by address. A
  // block in use keeps its node of `free_`, so freeing one allocates nothing.
  struct Block {
    std::size_t size, alignment;
    bool small;               // part of an allocation for small requests (see new_segment)
    bool starts_segment;      // the start of an upstream allocation: not merged with the block before
    std::uint64_t age = 0;    // its key's, while listed
    FreeSet::node_type node;  // empty while the block is listed in free_
    bool free() const { return node.empty(); }
  };
  using Blocks = std::map<std::uintptr_t, Block>;

  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  static FreeKey key(Blocks::const_iterator b) {
    return {b->second.small, b->second.alignment, b->second.size, b->second.age, b->first};
  }
  // Whether a request is served from allocations for small requests only.
  bool small(std::size_t size) const {
    return reuse_ == BlockReuse::split && size <= thresholds::cache_small_request_bytes;
  }

  // An upstream request; when it fails with free blocks held, they go back
  // and it is tried once more (free blocks of other sizes are no use to it).
  void* from_upstream(std::size_t size, std::size_t alignment);

  // How large a new upstream allocation for a request of `size` bytes is:
  // that size, or in a splitting pool a larger one whose rest later requests
  // are cut from (thresholds::cache_small_segment_bytes and the figures after it).
  std::size_t segment_bytes(std::size_t size) const {
    if (reuse_ != BlockReuse::split) return size;
    if (small(size)) return std::max(size, thresholds::cache_small_segment_bytes);
    if (size < thresholds::cache_mid_request_bytes) return thresholds::cache_mid_segment_bytes;
    const std::size_t round = thresholds::cache_large_round_bytes;
    return size > std::numeric_limits<std::size_t>::max() - round ? size : (size + round - 1) / round * round;
  }

  // A new upstream allocation for a request of `size` bytes, cut to that
  // size and in use: segment_bytes(size), or just `size` when the upstream
  // has not that much (`whole` then says so). Small and large requests never
  // share an allocation, so that a long-lived small tensor never keeps a
  // large block from going back.
  void* new_segment(std::size_t size, std::size_t alignment, bool& whole);

  // A free block for `size` bytes of the request's kind, cut from a larger
  // one where reuse_ allows; null if none.
  void* take_free(std::size_t size, std::size_t alignment);

  // Cuts block `b` (in use) to `size` bytes, listing the rest as a free
  // block, when the rest is worth it; false when `b` stays whole.
  bool cut(Blocks::iterator b, std::size_t size) noexcept;

  // Lists block `b` as free, merged with its free neighbours of the same
  // upstream allocation; returns the merged block.
  Blocks::iterator make_free(Blocks::iterator b) {
    stats_.cached_bytes += b->second.size;
    const std::uint64_t age = --next_age_;
    if (const auto next = std::next(b); next != blocks_.end() && !next->second.starts_segment && next->second.free()) {
      free_.erase(key(next));
      b->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (!b->second.starts_segment)
      if (const auto prev = std::prev(b); prev->second.free()) {
        prev->second.node = free_.extract(key(prev));
        prev->second.size += b->second.size;
        blocks_.erase(b);
        b = prev;
      }
    b->second.age = age;
    b->second.node.value() = key(b);
    free_.insert(std::move(b->second.node));
    return b;
  }

  // A free block that is a whole upstream allocation, which can go back.
  bool whole(Blocks::const_iterator b) const {
    const auto next = std::next(b);
    return b->second.starts_segment && b->second.free() && (next == blocks_.end() || next->second.starts_segment);
  }
  void give_back(Blocks::iterator b) noexcept;
  // Gives whole free blocks back until at most `limit` free bytes are held:
  // `first` (the block just freed) if it is one, then the largest.
  void trim(std::size_t limit, Blocks::iterator first) noexcept;

  std::shared_ptr<HostAllocator> upstream_;
  mutable std::mutex m_;
  std::size_t limit_;
  std::size_t min_bytes_;
  BlockReuse reuse_;
  Stats stats_;
  Blocks blocks_;
  FreeSet free_;
  std::uint64_t next_age_ = std::uint64_t(-1);
};

}  // namespace deft::engine

namespace deft::detail {

/// `bytes` rounded up to a multiple of `alignment` (a power of two): the sizes
/// HostAllocator::allocate takes, as std::aligned_alloc requires. Every
/// caller of an allocator rounds with this one function.
constexpr std::size_t aligned_size(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) & ~(alignment - 1);
}

/// The installed allocator. Every buffer keeps the allocator that gave it its
/// memory, so replacing the allocator never frees memory with the wrong one.
class AllocatorSlot {
 public:
  static AllocatorSlot& get() {
    static auto* slot = new AllocatorSlot();  // leaked: buffers may be freed during static destruction
    return *slot;
  }
  std::shared_ptr<engine::HostAllocator> current() {
    std::lock_guard lk(m_);
    return current_;
  }
  std::shared_ptr<engine::HostAllocator> exchange(std::shared_ptr<engine::HostAllocator> a) {
    if (!a) a = std::make_shared<engine::CachingHostAllocator>();
    std::lock_guard lk(m_);
    return std::exchange(current_, std::move(a));
  }

 private:
  AllocatorSlot() : current_(std::make_shared<engine::CachingHostAllocator>()) {}
  std::mutex m_;
  std::shared_ptr<engine::HostAllocator> current_;
};

}  // namespace deft::detail

namespace deft::engine {

/// Installs `a` for host buffers allocated from now on (nullptr: a new
/// CachingHostAllocator over the C heap, the default)
/// and returns the allocator it replaces. Buffers already allocated are freed
/// by the allocator that allocated them.
inline std::shared_ptr<HostAllocator> set_host_allocator(std::shared_ptr<HostAllocator> a) {
  return detail::AllocatorSlot::get().exchange(std::move(a));
}
/// The allocator new buffers take their memory from.
inline std::shared_ptr<HostAllocator> host_allocator() { return detail::AllocatorSlot::get().current(); }

/// Frees the blocks the installed allocator keeps for reuse, if it is a
/// CachingHostAllocator (memory held by live tensors stays).
inline void release_cached_host_memory() {
  if (auto c = std::dynamic_pointer_cast<CachingHostAllocator>(host_allocator())) c->release();
}

#if DEFT_DEFINE_RUNTIME
DEFT_DECL void* CachingHostAllocator::allocate(std::size_t bytes, std::size_t alignment) {
  const std::size_t size = size_class(bytes, alignment);
  if (bytes < min_bytes_) return from_upstream(size, alignment);
  void* p = nullptr;
  {
    std::lock_guard lk(m_);
    p = take_free(size, alignment);
    ++(p ? stats_.hits : stats_.misses);
  }
  // A new allocation that is the block itself is known whole to its
  // upstream already: only cut or merged memory is reissued.
  bool fresh_whole = false;
  if (!p) p = new_segment(size, alignment, fresh_whole);
  if (p && reuse_ == BlockReuse::split && !fresh_whole) {
    try {
      upstream_->reissue(p, size);
    } catch (...) {
      deallocate(p, bytes, alignment);
      throw;
    }
  }
  return p;
}

DEFT_DECL void CachingHostAllocator::deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
  if (bytes >= min_bytes_) {
    std::lock_guard lk(m_);
    if (const auto b = blocks_.find(address(p)); b != blocks_.end()) {
      if (!b->second.free()) trim(limit_, make_free(b));  // (freed twice: a caller's bug, ignored)
      return;
    }
  }
  upstream_->deallocate(p, size_class(bytes, alignment), alignment);
}

DEFT_DECL void* CachingHostAllocator::from_upstream(std::size_t size, std::size_t alignment) {
  void* p = nullptr;
  try {
    p = upstream_->allocate(size, alignment);
  } catch (...) {
    if (stats().cached_bytes == 0) throw;
  }
  if (p || stats().cached_bytes == 0) return p;
  release();
  return upstream_->allocate(size, alignment);
}

DEFT_DECL void* CachingHostAllocator::new_segment(std::size_t size, std::size_t alignment, bool& whole) {
  const bool for_small = small(size);
  std::size_t bytes = segment_bytes(size);
  void* p = nullptr;
  if (bytes != size) {
    try {
      p = from_upstream(bytes, alignment);
    } catch (...) {  // a nearly full device: the request alone may still fit
    }
    if (!p) bytes = size;
  }
  if (!p) p = from_upstream(bytes, alignment);
  if (!p) return nullptr;
  whole = bytes == size;
  try {
    std::lock_guard lk(m_);
    const auto [b, added] = blocks_.emplace(address(p), Block{bytes, alignment, for_small, true, 0, {}});
    try {
      b->second.node = free_.extract(free_.insert(key(b)).first);
    } catch (...) {
      blocks_.erase(b);
      throw;
    }
    stats_.held_bytes += bytes;
    if (bytes != size) cut(b, size);
  } catch (...) {  // no memory to note the block: it was never handed out
    upstream_->deallocate(p, bytes, alignment);
    throw;
  }
  return p;
}

DEFT_DECL void* CachingHostAllocator::take_free(std::size_t size, std::size_t alignment) {
  const bool for_small = small(size);
  const auto it = free_.lower_bound({for_small, alignment, size, 0, 0});
  if (it == free_.end() || it->small != for_small || it->alignment != alignment ||
      (reuse_ == BlockReuse::same_class && it->size != size))
    return nullptr;
  const auto b = blocks_.find(it->address);
  b->second.node = free_.extract(it);
  stats_.cached_bytes -= b->second.size;
  if (reuse_ == BlockReuse::split && b->second.size != size && cut(b, size)) ++stats_.splits;
  return reinterpret_cast<void*>(b->first);
}

DEFT_DECL bool CachingHostAllocator::cut(Blocks::iterator b, std::size_t size) noexcept {
  const std::size_t rest = b->second.size - size;
  if (rest < std::max({min_bytes_, b->second.alignment, thresholds::cache_split_min_bytes})) return false;
  if (!b->second.small && rest <= thresholds::cache_small_request_bytes) return false;  // no large request fits it
  try {
    const auto r = blocks_.emplace_hint(std::next(b), b->first + size,
                                        Block{rest, b->second.alignment, b->second.small, false, b->second.age, {}});
    try {
      free_.insert(key(r));
    } catch (...) {
      blocks_.erase(r);
      throw;
    }
  } catch (...) {  // no memory to note the rest: the whole block serves the request
    return false;
  }
  b->second.size = size;
  stats_.cached_bytes += rest;
  return true;
}

DEFT_DECL void CachingHostAllocator::give_back(Blocks::iterator b) noexcept {
  free_.erase(key(b));
  stats_.cached_bytes -= b->second.size;
  stats_.held_bytes -= b->second.size;
  upstream_->deallocate(reinterpret_cast<void*>(b->first), b->second.size, b->second.alignment);
  blocks_.erase(b);
}

DEFT_DECL void CachingHostAllocator::trim(std::size_t limit, Blocks::iterator first) noexcept {
  if (stats_.cached_bytes <= limit) return;
  if (first != blocks_.end() && whole(first)) give_back(first);
  for (auto it = free_.end(); it != free_.begin() && stats_.cached_bytes > limit;) {
    --it;
    if (const auto b = blocks_.find(it->address); whole(b)) {
      it = std::next(it);  // stays valid: only *it's node is erased
      give_back(b);
    }
  }
}
#endif

}  // namespace deft::engine
