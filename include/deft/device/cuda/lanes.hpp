// Several streams ("lanes") per GPU, and the waits that keep them correct.
//
// Independent subtrees run on different lanes of their GPU. What keeps work
// on different lanes ordered is not the engine's task graph but the memory
// each piece of work touches: every kernel and copy declares the device
// blocks it reads and writes (LaneAccess), and LaneTracker makes its lane
// wait for the earlier uses of those blocks queued on other lanes (a read
// after a write, a write after reads or a write). This covers what the task
// graph cannot see: a block freed by one lane and handed by the pool to the
// next writer on another, a buffer written in place after readers on other
// lanes finished queueing, scratch memory. Which lane a task takes (the
// engine's policy, engine.hpp) then only decides speed, never correctness.
//
// Plain C++, templated on the device side (Queue): CUDA's events, or the
// emulation's clock checker (tests/gpu/emulation), which verifies the waits.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "../backend.hpp"
#include "../../core/light_mutex.hpp"

namespace deft::detail::gpu {

/// The lanes of one device, numbered: `compute` compute lanes (kernels and
/// copies onto the device), then a copy lane per compute lane (copies to
/// the host), then the collective lane (sums across GPUs). A copy to the
/// host waits on the host for its copy lane, so it takes the one paired
/// with the compute lane that wrote its source: a copy of a ready value
/// does not wait behind the copy of a value a long kernel on another lane
/// still computes.
struct LaneLayout {
  int compute;
  /// The copy lane for a source written on `lane` (any other lane, or
  /// none known: the first copy lane).
  constexpr int copy_for(int lane) const { return compute + (lane >= 0 && lane < compute ? lane : 0); }
  /// The same for a writer numbered as the lanes' record numbers lanes
  /// (device * tracked() + lane; -1: none known).
  constexpr int copy_after(int recorded_writer) const {
    return copy_for(recorded_writer < 0 ? -1 : recorded_writer % tracked());
  }
  constexpr bool is_copy(int lane) const { return lane >= compute && lane < 2 * compute; }
  constexpr int collective() const { return 2 * compute; }
  /// Lanes with a record (the collective one the last).
  constexpr int tracked() const { return 2 * compute + 1; }
};

/// One piece of work on a lane: its lane and its number there.
struct LaneUse {
  int lane = -1;
  std::uint64_t count = 0;
};

/// Puts `u` into `uses`, which holds at most one use per lane: the latest.
inline void keep_latest(std::vector<LaneUse>& uses, const LaneUse& u) {
  if (u.lane < 0) return;
  const auto same = std::ranges::find(uses, u.lane, &LaneUse::lane);
  if (same == uses.end()) uses.push_back(u);
  else same->count = std::max(same->count, u.count);
}

/// Which work used which device blocks: the latest write of each block, and
/// the reads since (the latest per lane). Not thread-safe.
class UseRecord {
 public:
  /// Device memory [base, base + bytes) (an allocation the pools hand out
  /// to buffers and scratch, whole or in parts).
  void add_block(const void* base, std::size_t bytes) { blocks_[key(base)] = Block{bytes, {}, {}}; }
  /// Forgets [base, base + bytes), an allocation given back.
  void remove_block(const void* base, std::size_t bytes) {
    blocks_.erase(blocks_.lower_bound(key(base)), blocks_.lower_bound(key(base) + bytes));
  }
  /// Makes [base, base + bytes), memory a pool hands out again, one block:
  /// cut from a larger one or merged from several, whose every earlier use
  /// it keeps (as reads, so that its first write waits for all of them).
  /// The rest of a block it was cut from keeps its own uses: blocks in use
  /// at once never share a record, in which one's write would drop the
  /// other's uses.
  void reissue(const void* base, std::size_t bytes) {
    const std::uintptr_t from = key(base), to = from + bytes;
    split_at(from);
    split_at(to);
    const auto first = blocks_.find(from), last = blocks_.lower_bound(to);
    if (first == blocks_.end() || (std::next(first) == last && first->second.bytes == bytes)) return;
    Block merged{bytes, {}, {}};
    for (auto it = first; it != last; ++it) {
      keep_latest(merged.reads, it->second.write);
      for (const LaneUse& r : it->second.reads) keep_latest(merged.reads, r);
    }
    blocks_.erase(first, last);
    blocks_.emplace(from, std::move(merged));
  }

  /// Calls f(use) for every recorded use that work with `uses` conflicts
  /// with: the write before a read; the write and the reads before a write.
  template <class F>
  void for_each_conflict(const MemoryUses& uses, F&& f) {
    for (const void* p : uses.reads)
      if (Block* b = find(p)) f(b->write);
    for (const void* p : uses.writes)
      if (Block* b = find(p)) {
        f(b->write);
        for (const LaneUse& r : b->reads) f(r);
      }
  }
  /// The start of the block holding `p`; nullptr when no block does.
  const void* block_start(const void* p) const {
    const auto it = holding(p);
    return it == blocks_.end() ? nullptr : reinterpret_cast<const void*>(it->first);
  }
  /// The lane of the latest write of the block holding `p` (-1: none known).
  int writer_lane(const void* p) const {
    const auto it = holding(p);
    return it == blocks_.end() ? -1 : it->second.write.lane;
  }
  /// Records `uses` as done by the work `now`.
  void record(const LaneUse& now, const MemoryUses& uses) {
    for (const void* p : uses.reads)
      if (Block* b = find(p)) keep_latest(b->reads, now);
    for (const void* p : uses.writes)
      if (Block* b = find(p)) {
        b->write = now;
        b->reads.clear();
      }
  }

 private:
  struct Block {
    std::size_t bytes = 0;
    LaneUse write;               // none (lane -1) before the first
    std::vector<LaneUse> reads;
  };
  static std::uintptr_t key(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  // Cuts the block holding `at` in two there (both keep its uses).
  void split_at(std::uintptr_t at) {
    auto it = blocks_.upper_bound(at);
    if (it == blocks_.begin()) return;
    --it;
    if (it->first == at || at >= it->first + it->second.bytes) return;
    Block tail = it->second;
    tail.bytes = it->first + it->second.bytes - at;
    it->second.bytes = at - it->first;
    blocks_.emplace_hint(std::next(it), at, std::move(tail));
  }
  std::map<std::uintptr_t, Block>::const_iterator holding(const void* p) const {
    if (!p || blocks_.empty()) return blocks_.end();
    auto it = blocks_.upper_bound(key(p));
    if (it == blocks_.begin()) return blocks_.end();
    --it;
    return key(p) < it->first + it->second.bytes ? it : blocks_.end();
  }
  Block* find(const void* p) {
    const auto it = holding(p);
    return it == blocks_.end() ? nullptr : const_cast<Block*>(&it->second);  // this is not const
  }
  std::map<std::uintptr_t, Block> blocks_;
};

/// Marks a LaneTracker keeps per lane for waits to use (the latest ones).
inline constexpr std::size_t lane_marks_kept = 16;

/// Queue: `order(from, to)` makes work queued on lane `to` from now on wait
/// for the work queued on lane `from` so far; `order_at(from, count, mark,
/// to)` makes it wait for a mark made on `from` after its first `count`
/// pieces of work (see LaneTracker::mark). `marked(lane, count)`,
/// `finished_at(lane, count)` and `queued(lane, uses)` are told of each
/// mark, of each the host saw finish, and of each piece of work once it is
/// queued (a checker's hooks; may do nothing).
template <class Queue>
class LaneTracker {
 public:
  LaneTracker(int lanes, Queue queue)
      : queue_(std::move(queue)), issued_(std::size_t(lanes), 0), done_(std::size_t(lanes), 0),
        seen_(std::size_t(lanes) * std::size_t(lanes), 0), marks_(std::size_t(lanes) * lane_marks_kept),
        mark_seen_(marks_.size() * std::size_t(lanes), 0), next_mark_(std::size_t(lanes), 0), lanes_(lanes) {}

  /// A device allocation, given back, and handed out again (see UseRecord).
  void add_block(const void* base, std::size_t bytes) {
    std::lock_guard lk(m_);
    record_.add_block(base, bytes);
  }
  void remove_block(const void* base, std::size_t bytes) {
    std::lock_guard lk(m_);
    record_.remove_block(base, bytes);
  }
  void reissue(const void* base, std::size_t bytes) {
    std::lock_guard lk(m_);
    record_.reissue(base, bytes);
  }
  /// The lane that last wrote the block holding `p` (-1: none known).
  int writer_lane(const void* p) {
    std::lock_guard lk(m_);
    return record_.writer_lane(p);
  }

  /// Before queuing work with `uses` on `lane`: orders the lane after every
  /// earlier conflicting use on another lane not known to be done.
  void before(int lane, const MemoryUses& uses) {
    std::lock_guard lk(m_);
    needed_.clear();  // (other lane, its latest conflicting use the lane does not follow yet)
    record_.for_each_conflict(uses, [&](const LaneUse& u) {
      if (u.lane < 0 || u.lane == lane || u.count <= done_[std::size_t(u.lane)] || u.count <= seen(lane, u.lane))
        return;
      keep_latest(needed_, u);
    });
    // A wait for a lane also orders this one after every lane that one
    // follows, so lanes another needed lane already follows go last and
    // often need no wait of their own (a third lane through a second).
    for (const bool last : {false, true})
      for (const LaneUse& u : needed_) {
        if (u.count <= seen(lane, u.lane) || (!last && followed_by_another(lane, u))) continue;
        wait(lane, u);
      }
  }

  /// Makes a mark on `lane` (make() records it, the engine's ready mark of
  /// a buffer) and keeps it with the count of work queued there so far:
  /// later waits for that work wait for the mark, not for everything the
  /// lane queued by then. Under the tracker's lock, so that no work queued
  /// meanwhile is taken to be before the mark. Returns make()'s mark.
  template <class Make>
  std::shared_ptr<void> mark(int lane, Make&& make) {
    std::lock_guard lk(m_);
    std::shared_ptr<void> m = make();
    const std::uint64_t count = issued_[std::size_t(lane)];
    const std::size_t latest = slot(lane, next_mark_[std::size_t(lane)] + lane_marks_kept - 1);
    // Nothing to wait for, or an earlier mark covers the same work.
    if (!m || count <= done_[std::size_t(lane)] || marks_[latest].count == count) return m;
    const std::size_t at = slot(lane, next_mark_[std::size_t(lane)]++);
    marks_[at] = {count, m};
    std::copy_n(&seen(lane, 0), lanes_, &mark_seen_[at * std::size_t(lanes_)]);
    queue_.marked(lane, count);
    return m;
  }

  /// Once that work is queued: records its uses. (Recorded only now, so
  /// that a lane ordered after this one's queued work is never taken to be
  /// after work that was still being queued.)
  void after(int lane, const MemoryUses& uses) {
    std::lock_guard lk(m_);
    record_.record({lane, ++issued_[std::size_t(lane)]}, uses);
    queue_.queued(lane, uses);
  }

  /// Runs wait(), which makes the host wait for everything queued on `lane`
  /// so far (outside the tracker's lock), then drops the waits that work,
  /// and the work the lane was ordered after, would still need. Nothing is
  /// dropped when wait() throws.
  template <class Wait>
  void host_waits(int lane, Wait&& wait) {
    std::vector<std::uint64_t> upto(std::size_t(lanes_), 0);
    {
      std::lock_guard lk(m_);
      std::copy_n(&seen(lane, 0), lanes_, upto.begin());
      upto[std::size_t(lane)] = issued_[std::size_t(lane)];
    }
    wait();
    std::lock_guard lk(m_);
    for (std::size_t k = 0; k < upto.size(); ++k) done_[k] = std::max(done_[k], upto[k]);
  }

  /// The host saw `mark` finish (one mark() kept, on one of the lanes
  /// [first, first + count)): the work before it, and what its lane followed
  /// then, needs no waits any more. Nothing for a mark no longer kept.
  void finished_mark(const void* mark, int first, int count) {
    if (!mark) return;
    std::lock_guard lk(m_);
    for (int lane = first; lane < first + count; ++lane)
      for (std::size_t i = 0; i < lane_marks_kept; ++i) {
        const std::size_t at = slot(lane, i);
        if (marks_[at].mark.get() != mark) continue;
        const std::uint64_t* then = &mark_seen_[at * std::size_t(lanes_)];
        for (int k = 0; k < lanes_; ++k) done_[std::size_t(k)] = std::max(done_[std::size_t(k)], then[k]);
        done_[std::size_t(lane)] = std::max(done_[std::size_t(lane)], marks_[at].count);
        queue_.finished_at(lane, marks_[at].count);
        return;
      }
  }

  /// Waits made so far, and how many of them waited for a mark (order_at)
  /// rather than for everything the other lane had queued (order).
  std::uint64_t waits() {
    std::lock_guard lk(m_);
    return waits_;
  }
  std::uint64_t marked_waits() {
    std::lock_guard lk(m_);
    return marked_waits_;
  }

 private:
  struct Marked {
    std::uint64_t count = 0;  // the lane's work before the mark; 0: an empty slot
    std::shared_ptr<void> mark;
  };

  std::uint64_t& seen(int to, int from) { return seen_[std::size_t(to) * std::size_t(lanes_) + std::size_t(from)]; }
  std::size_t slot(int lane, std::size_t i) const { return std::size_t(lane) * lane_marks_kept + i % lane_marks_kept; }

  // Orders `lane` after use u on another lane: after the earliest kept mark
  // made after it (and what that lane followed then), or else after
  // everything that lane queued so far (and what it follows now).
  void wait(int lane, const LaneUse& u) {
    ++waits_;
    const Marked* best = nullptr;
    std::size_t best_at = 0;
    for (std::size_t i = 0; i < lane_marks_kept; ++i) {
      const std::size_t at = slot(u.lane, i);
      if (marks_[at].count >= u.count && (!best || marks_[at].count < best->count)) best = &marks_[at], best_at = at;
    }
    if (best && best->count < issued_[std::size_t(u.lane)]) {
      queue_.order_at(u.lane, best->count, best->mark, lane);
      ++marked_waits_;
      const std::uint64_t* then = &mark_seen_[best_at * std::size_t(lanes_)];
      for (int k = 0; k < lanes_; ++k) seen(lane, k) = std::max(seen(lane, k), then[k]);
      seen(lane, u.lane) = std::max(seen(lane, u.lane), best->count);
      return;
    }
    queue_.order(u.lane, lane);
    for (int k = 0; k < lanes_; ++k) seen(lane, k) = std::max(seen(lane, k), seen(u.lane, k));
    seen(lane, u.lane) = issued_[std::size_t(u.lane)];
  }
  // Whether another lane in needed_ that `lane` must still wait for follows u.
  bool followed_by_another(int lane, const LaneUse& u) {
    return std::ranges::any_of(needed_, [&](const LaneUse& other) {
      return other.lane != u.lane && other.count > seen(lane, other.lane) && seen(other.lane, u.lane) >= u.count;
    });
  }

  // Held for a few map lookups per GPU op by every worker queueing GPU
  // work: the engine's lock, which spins briefly before it sleeps.
  LightMutex m_;
  Queue queue_;
  UseRecord record_;
  std::vector<std::uint64_t> issued_, done_;
  // seen(to, from): work queued on `to` from now on runs after `from`'s work
  // up to this count (a wait queued on `to`, or on a lane `to` waited for).
  std::vector<std::uint64_t> seen_;
  std::vector<LaneUse> needed_;  // before()'s, kept to reuse its memory
  // Each lane's latest marks (a ring of lane_marks_kept from lane * lane_marks_kept),
  // with what the lane followed when each was made (lanes_ counts each).
  std::vector<Marked> marks_;
  std::vector<std::uint64_t> mark_seen_;
  std::vector<std::size_t> next_mark_;
  std::uint64_t waits_ = 0, marked_waits_ = 0;
  int lanes_;
};

}  // namespace deft::detail::gpu
