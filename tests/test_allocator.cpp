// The host memory cache: large freed blocks are reused by size class, small
// ones pass through, the cap holds, and tensors computed through the cache
// keep their values.
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "common.hpp"

using namespace dt;
namespace engine = deft::engine;

namespace {

/// An upstream that counts and remembers what it hands out.
class CountingAllocator final : public engine::HostAllocator {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (bytes > refuse_above) throw std::bad_alloc();  // a nearly full device
    void* p = std::aligned_alloc(alignment, bytes);
    std::lock_guard lk(m_);
    ++allocations;
    live_[p] = {bytes, alignment};
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t) noexcept override {
    {
      std::lock_guard lk(m_);
      ++deallocations;
      const auto it = live_.find(p);
      if (it == live_.end() || it->second.bytes != bytes) ++mismatches;  // freed with another size, or twice
      else live_.erase(it);
    }
    std::free(p);
  }
  /// The alignment live block `p` was asked for (0: not one of ours).
  std::size_t asked_alignment(const void* p) {
    std::lock_guard lk(m_);
    const auto it = live_.find(const_cast<void*>(p));
    return it == live_.end() ? 0 : it->second.alignment;
  }
  std::size_t live() {
    std::lock_guard lk(m_);
    return live_.size();
  }
  std::size_t live_bytes() {
    std::lock_guard lk(m_);
    std::size_t n = 0;
    for (const auto& [p, block] : live_) n += block.bytes;
    return n;
  }
  std::atomic<int> allocations{0}, deallocations{0}, mismatches{0};
  std::size_t refuse_above = std::size_t(-1);

 private:
  struct Block {
    std::size_t bytes, alignment;
  };
  std::mutex m_;
  std::map<void*, Block> live_;
};

constexpr std::size_t align = 64;
constexpr std::size_t big = std::size_t(1) << 20;

/// Installs an allocator for new tensors for the scope's lifetime; the
/// previous one comes back once the work recorded meanwhile has run.
class Installed {
 public:
  explicit Installed(std::shared_ptr<engine::HostAllocator> a) : previous_(engine::set_host_allocator(std::move(a))) {}
  ~Installed() {
    settle();
    engine::set_host_allocator(previous_);
  }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;

 private:
  std::shared_ptr<engine::HostAllocator> previous_;
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(host_memory, EngineFixture)

BOOST_AUTO_TEST_CASE(size_classes) {
  const engine::CachingHostAllocator C;
  const std::size_t small = deft::thresholds::host_cache_min_bytes - align;
  BOOST_TEST(C.size_class(small, align) == small);  // below the cache: exact
  for (std::size_t bytes : {deft::thresholds::host_cache_min_bytes, big - align, big, big + align, 3 * big + 4096,
                            std::size_t(100) << 20}) {
    const std::size_t c = C.size_class(bytes, align);
    BOOST_TEST(c >= bytes);
    BOOST_TEST(c % align == 0u);
    BOOST_TEST(double(c) <= double(bytes) * (1.0 + 1.0 / deft::thresholds::host_cache_classes_per_octave),
               bytes << " rounds up to " << c);
    BOOST_TEST(C.size_class(c, align) == c, "a class size is its own class");
  }
  // A cache of every size (a GPU's): small requests get classes too.
  const engine::CachingHostAllocator all(std::make_shared<engine::DefaultHostAllocator>(), 1 << 20, align);
  BOOST_TEST(all.size_class(small + 1, align) > small + 1);
  BOOST_TEST(all.size_class(small + 1, align) % align == 0u);
  // Sizes whose rounding up would wrap around stay as asked, and the
  // request fails upstream instead of yielding a small block.
  const std::size_t huge = std::numeric_limits<std::size_t>::max() - 4095;
  BOOST_TEST(C.size_class(huge, 4096) >= huge);
  auto up = std::make_shared<CountingAllocator>();
  engine::CachingHostAllocator cache(up);
  void* p = nullptr;
  try {
    p = cache.allocate(huge, 4096);
  } catch (const std::bad_alloc&) {
  }
  BOOST_TEST(p == nullptr);
}

BOOST_AUTO_TEST_CASE(reuses_large_blocks_and_passes_small_ones_through) {
  auto up = std::make_shared<CountingAllocator>();
  {
    engine::CachingHostAllocator cache(up);
    void* a = cache.allocate(big, align);
    cache.deallocate(a, big, align);
    void* b = cache.allocate(big, align);
    BOOST_TEST(b == a, "the freed block is handed out again");
    BOOST_TEST(up->allocations == 1);
    void* c = cache.allocate(big - align, align);  // same class as `big`, but `b` is in use
    BOOST_TEST(up->allocations == 2);
    cache.deallocate(c, big - align, align);
    void* d = cache.allocate(big - 2 * align, align);  // served by c's block
    BOOST_TEST(d == c);
    BOOST_TEST(up->allocations == 2);
    void* e = cache.allocate(4 * big, align);  // another class
    BOOST_TEST(up->allocations == 3);
    const std::size_t small = 4096;
    for (int i = 0; i < 3; ++i) cache.deallocate(cache.allocate(small, align), small, align);
    BOOST_TEST(up->allocations == 6, "small blocks always come from upstream");
    BOOST_TEST(up->deallocations == 3);
    const auto s = cache.stats();
    BOOST_TEST(s.hits == 2u);
    BOOST_TEST(s.misses == 3u);
    cache.deallocate(b, big, align);
    cache.deallocate(d, big - 2 * align, align);
    cache.deallocate(e, 4 * big, align);
    BOOST_TEST(cache.stats().cached_bytes >= 6 * big);
  }  // destruction frees the cached blocks
  BOOST_TEST(up->live() == 0u);
  BOOST_TEST(up->mismatches == 0);
}

BOOST_AUTO_TEST_CASE(holds_at_most_its_limit) {
  auto up = std::make_shared<CountingAllocator>();
  engine::CachingHostAllocator cache(up, 3 * big);
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(cache.allocate(big, align));
  for (void* p : blocks) cache.deallocate(p, big, align);
  BOOST_TEST(cache.stats().cached_bytes == 3 * big);
  BOOST_TEST(up->live() == 3u, "blocks past the limit go back upstream");
  cache.set_limit(big);
  BOOST_TEST(cache.stats().cached_bytes <= big);
  cache.set_limit(0);
  BOOST_TEST(up->live() == 0u);
  cache.deallocate(cache.allocate(big, align), big, align);
  BOOST_TEST(up->live() == 0u, "a zero limit caches nothing");
  BOOST_TEST(up->mismatches == 0);
}

BOOST_AUTO_TEST_CASE(the_latest_freed_block_of_a_class_is_reused_first) {
  auto up = std::make_shared<CountingAllocator>();
  engine::CachingHostAllocator cache(up);
  void* a = cache.allocate(big, align);
  void* b = cache.allocate(big, align);
  cache.deallocate(a, big, align);
  cache.deallocate(b, big, align);  // b's memory is the likelier to be in a cache
  BOOST_TEST(cache.allocate(big, align) == b);
  BOOST_TEST(cache.allocate(big, align) == a);
  cache.deallocate(a, big, align);
  cache.deallocate(b, big, align);
  BOOST_TEST(cache.stats().held_bytes == 2 * big);
  BOOST_TEST(cache.stats().splits == 0u, "same_class never cuts a block");
}

// BlockReuse::split (a GPU's pool): a free block larger than a request
// serves it and keeps the rest free; freed neighbours merge back.
BOOST_AUTO_TEST_CASE(a_splitting_pool_cuts_large_free_blocks_and_merges_them_again) {
  auto up = std::make_shared<CountingAllocator>();
  constexpr std::size_t unit = 256;  // a GPU pool's alignment and smallest cached size
  engine::CachingHostAllocator cache(up, std::size_t(-1), unit, engine::BlockReuse::split);
  const std::size_t whole = 16 * big, part1 = 6 * big, part2 = 8 * big;  // 16 MiB: an allocation of its size
  auto* a = static_cast<std::byte*>(cache.allocate(whole, unit));
  cache.deallocate(a, whole, unit);
  void* b = cache.allocate(part1, unit);
  void* c = cache.allocate(part2, unit);
  BOOST_TEST(up->allocations == 1, "both parts come from the first block");
  BOOST_TEST(b == a);
  BOOST_TEST(c == a + part1, "the second part is cut from what the first left");
  auto s = cache.stats();
  BOOST_TEST(s.splits == 2u);
  BOOST_TEST(s.hits == 2u);
  BOOST_TEST(s.held_bytes == whole);
  BOOST_TEST(s.cached_bytes == whole - part1 - part2);
  // A block partly in use cannot go back upstream.
  cache.release();
  BOOST_TEST(up->live() == 1u);
  BOOST_TEST(cache.stats().cached_bytes == whole - part1 - part2);
  // b's range is free but apart from the tail while c sits between them.
  cache.deallocate(b, part1, unit);
  BOOST_TEST(cache.stats().cached_bytes == whole - part2);
  void* e = cache.allocate(part1 + big, unit);  // fits neither 6 MiB nor 2 MiB free
  BOOST_TEST(up->allocations == 2);
  cache.deallocate(e, part1 + big, unit);
  // With c freed, the three ranges merge into the whole first block again.
  cache.deallocate(c, part2, unit);
  s = cache.stats();
  BOOST_TEST(s.held_bytes == whole + deft::thresholds::cache_mid_segment_bytes);  // e's, 20 MiB
  BOOST_TEST(s.cached_bytes == s.held_bytes);
  BOOST_TEST(cache.allocate(whole, unit) == a, "the merged block serves the whole size");
  BOOST_TEST(cache.stats().splits == 2u);
  cache.deallocate(a, whole, unit);
  cache.release();
  BOOST_TEST(up->live() == 0u);
  BOOST_TEST(cache.stats().held_bytes == 0u);
  BOOST_TEST(up->mismatches == 0, "every block went back whole, with the size it was asked with");
}

// Small requests (up to 1 MiB) in a splitting pool share 2 MiB allocations
// of their own and never cut a large free block, so a long-lived scalar
// cannot keep a large block from going back; large requests never take
// memory from the small requests' allocations.
BOOST_AUTO_TEST_CASE(small_requests_share_allocations_of_their_own) {
  auto up = std::make_shared<CountingAllocator>();
  constexpr std::size_t unit = 256;
  engine::CachingHostAllocator cache(up, std::size_t(-1), unit, engine::BlockReuse::split);
  const std::size_t segment = deft::thresholds::cache_small_segment_bytes;
  void* large = cache.allocate(16 * big, unit);
  cache.deallocate(large, 16 * big, unit);
  std::vector<void*> small;
  for (int i = 0; i < 100; ++i) small.push_back(cache.allocate(4096, unit));  // 400 KiB in all
  BOOST_TEST(up->allocations == 2, "one allocation for the large block, one for every small one");
  BOOST_TEST(cache.stats().held_bytes == 16 * big + segment);
  for (std::size_t i = 1; i < small.size(); ++i)
    BOOST_TEST(static_cast<std::byte*>(small[i]) == static_cast<std::byte*>(small[i - 1]) + 4096);
  BOOST_TEST(cache.allocate(16 * big, unit) == large, "the large block stayed whole");
  cache.deallocate(large, 16 * big, unit);
  for (std::size_t i = 0; i + 1 < small.size(); ++i) cache.deallocate(small[i], 4096, unit);
  // 2 MiB less 4 KiB is free in the small allocation, yet a 1.5 MiB request is large.
  void* mid = cache.allocate(3 * big / 2, unit);
  BOOST_TEST(up->allocations == 2, "cut from the free large block");
  BOOST_TEST(mid == large);
  cache.deallocate(mid, 3 * big / 2, unit);
  cache.release();  // the small allocation is still partly in use
  BOOST_TEST(up->live() == 1u);
  BOOST_TEST(cache.stats().held_bytes == segment);
  cache.deallocate(small.back(), 4096, unit);
  cache.release();
  BOOST_TEST(up->live() == 0u);
  BOOST_TEST(up->mismatches == 0);
}

// Larger requests in a splitting pool: those under 10 MiB are cut from 20
// MiB allocations, larger ones get allocations rounded up to 2 MiB; a
// large block is not cut where it would leave 1 MiB or less, which no large
// request could use. An upstream that cannot give the larger allocation
// gives the request's size.
BOOST_AUTO_TEST_CASE(mid_sized_requests_share_allocations_and_large_ones_round_up) {
  namespace th = deft::thresholds;
  auto up = std::make_shared<CountingAllocator>();
  constexpr std::size_t unit = 256;
  {
    engine::CachingHostAllocator cache(up, std::size_t(-1), unit, engine::BlockReuse::split);
    auto* a = static_cast<std::byte*>(cache.allocate(3 * big, unit));
    BOOST_TEST(up->allocations == 1);
    BOOST_TEST(cache.stats().held_bytes == th::cache_mid_segment_bytes);
    void* b = cache.allocate(5 * big, unit);
    BOOST_TEST(up->allocations == 1, "cut from the same 20 MiB allocation");
    BOOST_TEST(b == a + 3 * big);
    BOOST_TEST(cache.stats().cached_bytes == th::cache_mid_segment_bytes - 8 * big);
    const std::size_t odd = 12 * big + 4096;  // class 13 MiB, an allocation of 14 MiB: its 1 MiB rest stays with it
    void* c = cache.allocate(odd, unit);
    BOOST_TEST(up->allocations == 2);
    BOOST_TEST(cache.stats().held_bytes == th::cache_mid_segment_bytes + 14 * big);
    BOOST_TEST(cache.stats().cached_bytes == 12 * big);
    void* d = cache.allocate(11 * big, unit);  // the free 12 MiB, whole: no large request fits a 1 MiB rest
    BOOST_TEST(d == a + 8 * big);
    BOOST_TEST(cache.stats().cached_bytes == 0u);
    BOOST_TEST(up->allocations == 2);
    cache.deallocate(c, odd, unit);
    cache.deallocate(b, 5 * big, unit);
    cache.deallocate(d, 11 * big, unit);
    cache.deallocate(a, 3 * big, unit);
    const auto s = cache.stats();
    BOOST_TEST(s.cached_bytes == s.held_bytes);
    BOOST_TEST(cache.allocate(th::cache_mid_segment_bytes, unit) == a, "the 20 MiB merged whole again");
    cache.deallocate(a, th::cache_mid_segment_bytes, unit);
    cache.release();
    BOOST_TEST(up->live() == 0u);

    up->refuse_above = 4 * big;  // a nearly full device
    void* e = cache.allocate(3 * big, unit);
    BOOST_TEST(e != nullptr);
    BOOST_TEST(cache.stats().held_bytes == 3 * big, "the request's size when 20 MiB cannot be had");
    cache.deallocate(e, 3 * big, unit);
  }
  BOOST_TEST(up->live() == 0u);
  BOOST_TEST(up->mismatches == 0, "every allocation went back with the size it was asked with");
}

// Random requests and frees against a model of what is in use: no two
// blocks in use overlap, none is overwritten while in use, and the pool's
// counts add up to what the upstream holds.
BOOST_AUTO_TEST_CASE(a_splitting_pool_keeps_blocks_apart_and_its_counts_right) {
  auto up = std::make_shared<CountingAllocator>();
  constexpr std::size_t unit = 256;
  {
    engine::CachingHostAllocator cache(up, std::size_t(-1), unit, engine::BlockReuse::split);
    std::mt19937 g(613);
    struct InUse {
      std::size_t bytes, size;  // asked for, and its class
      std::uint64_t stamp;
    };
    std::map<std::byte*, InUse> live;
    auto stamp_of = [](std::byte* p, std::size_t size) {
      std::uint64_t first, last;
      std::memcpy(&first, p, 8);
      std::memcpy(&last, p + size - 8, 8);
      return std::pair{first, last};
    };
    std::size_t in_use = 0;
    for (std::uint64_t i = 0; i < 20000; ++i) {
      if (live.size() < 40 && g() % 2) {
        const std::size_t bytes = unit * (1 + g() % 4096);  // 256 B to 1 MiB
        auto* p = static_cast<std::byte*>(cache.allocate(bytes, unit));
        const std::size_t size = cache.size_class(bytes, unit);
        BOOST_REQUIRE(reinterpret_cast<std::uintptr_t>(p) % unit == 0u);
        const auto next = live.lower_bound(p);
        BOOST_REQUIRE_MESSAGE(next == live.end() || p + size <= next->first, "request " << i << " overlaps the next block");
        BOOST_REQUIRE_MESSAGE(next == live.begin() || std::prev(next)->first + std::prev(next)->second.size <= p,
                              "request " << i << " overlaps the block before");
        std::memcpy(p, &i, 8);
        std::memcpy(p + size - 8, &i, 8);
        live.emplace(p, InUse{bytes, size, i});
        in_use += size;
      } else if (!live.empty()) {
        auto it = std::next(live.begin(), std::ptrdiff_t(g() % live.size()));
        const auto [first, last] = stamp_of(it->first, it->second.size);
        BOOST_REQUIRE_MESSAGE(first == it->second.stamp && last == it->second.stamp,
                              "block of request " << it->second.stamp << " was overwritten while in use");
        cache.deallocate(it->first, it->second.bytes, unit);
        in_use -= it->second.size;
        live.erase(it);
      }
      if (i % 512 == 0) {
        const auto s = cache.stats();
        BOOST_REQUIRE_EQUAL(s.held_bytes, up->live_bytes());
        // A block cut from a larger one may keep a rest too small to cut off.
        BOOST_REQUIRE_LE(s.cached_bytes + in_use, s.held_bytes);
        BOOST_REQUIRE_LT(s.held_bytes - s.cached_bytes - in_use, deft::thresholds::cache_split_min_bytes * (live.size() + 1));
      }
    }
    for (const auto& [p, u] : live) cache.deallocate(p, u.bytes, unit);
    const auto s = cache.stats();
    BOOST_TEST(s.cached_bytes == s.held_bytes, "everything is free again");
    BOOST_TEST(s.splits > 0u);
    BOOST_TEST(s.hits > 10 * s.misses, "hits " << s.hits << ", misses " << s.misses);
    cache.release();
    BOOST_TEST(up->live() == 0u, "freed blocks merged back into whole upstream blocks");
  }
  BOOST_TEST(up->mismatches == 0);
}

BOOST_AUTO_TEST_CASE(a_failed_upstream_request_empties_the_cache_and_is_retried) {
  // An upstream with room for three big blocks (a device's memory): the
  // cache holds two freed ones of another size, so a request for two more
  // fails upstream until the cache gives its blocks back.
  class Bounded final : public engine::HostAllocator {
   public:
    void* allocate(std::size_t bytes, std::size_t alignment) override {
      if (in_use + bytes > 3 * 4 * big) throw std::runtime_error("out of memory on the test device");
      in_use += bytes;
      return std::aligned_alloc(alignment, bytes);
    }
    void deallocate(void* p, std::size_t bytes, std::size_t) noexcept override {
      in_use -= bytes;
      std::free(p);
    }
    std::size_t in_use = 0;
  };
  auto up = std::make_shared<Bounded>();
  engine::CachingHostAllocator cache(up, std::size_t(1) << 40);
  void* a = cache.allocate(4 * big, align);
  void* b = cache.allocate(4 * big, align);
  cache.deallocate(a, 4 * big, align);
  cache.deallocate(b, 4 * big, align);
  BOOST_TEST(cache.stats().cached_bytes == 8 * big);
  void* c = cache.allocate(8 * big, align);  // fails upstream at first: 8 + 8 cached > 12
  BOOST_TEST(c != nullptr);
  BOOST_TEST(cache.stats().cached_bytes == 0u, "the cache was emptied for the retry");
  BOOST_TEST(up->in_use == cache.size_class(8 * big, align));
  // Nothing cached and no room: the upstream's own error reaches the caller.
  BOOST_CHECK_THROW(cache.allocate(8 * big, align), std::runtime_error);
  cache.deallocate(c, 8 * big, align);
}

BOOST_AUTO_TEST_CASE(concurrent_use) {
  for (const auto reuse : {engine::BlockReuse::same_class, engine::BlockReuse::split}) {
    auto up = std::make_shared<CountingAllocator>();
    {
      engine::CachingHostAllocator cache(up, 16 * big, deft::thresholds::host_cache_min_bytes, reuse);
      std::atomic<int> overwritten{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
          std::mt19937 g(600 + t);
          std::vector<std::pair<std::byte*, std::size_t>> held;
          for (int i = 0; i < 2000; ++i) {
            if (held.size() < 6 && g() % 2) {
              const std::size_t bytes = (std::size_t(1) << (12 + g() % 9)) + align * (g() % 4);
              auto* p = static_cast<std::byte*>(cache.allocate(bytes, align));
              std::memset(p, t + 1, bytes);  // a block shared by two owners would be overwritten
              held.emplace_back(p, bytes);
            } else if (!held.empty()) {
              const auto [p, bytes] = held.back();
              held.pop_back();
              if (p[0] != std::byte(t + 1) || p[bytes - 1] != std::byte(t + 1)) ++overwritten;  // Boost.Test is not thread-safe
              cache.deallocate(p, bytes, align);
            }
          }
          for (const auto& [p, bytes] : held) cache.deallocate(p, bytes, align);
        });
      for (auto& th : threads) th.join();
      BOOST_TEST(overwritten == 0, "blocks handed to two owners at once");
      BOOST_TEST(cache.stats().hits > 0u);
      BOOST_TEST(cache.stats().cached_bytes == cache.stats().held_bytes);
    }
    BOOST_TEST(up->live() == 0u);
    BOOST_TEST(up->mismatches == 0);
  }
}

BOOST_AUTO_TEST_CASE(tensors_reuse_cached_blocks) {
  auto cache = std::make_shared<engine::CachingHostAllocator>();
  const Installed installed(cache);
  std::mt19937 g(611);
  const i64 n = 1 << 18;  // 1 MiB of float32: cached
  const auto xv = random_values<float>(g, n, -1, 1);
  const Tensor<float> x = make(xv, Shape{n});
  for (int step = 0; step < 20; ++step) {
    const Tensor<float> y = x * float(step) + 1.f;  // a new 1 MiB buffer per step, freed at the end of it
    const auto got = y.to_vector();
    std::size_t bad = 0;
    for (i64 i = 0; i < n; ++i) bad += std::abs(double(got[i]) - (double(xv[i]) * step + 1)) > 1e-6 * (1 + step);
    BOOST_REQUIRE_MESSAGE(bad == 0u, "step " << step << ": " << bad << " wrong values");
  }
  const auto s = cache->stats();
  BOOST_TEST(s.hits >= 15u, "hits " << s.hits << ", misses " << s.misses);
  BOOST_TEST(s.misses <= 4u);
  const auto seen = engine::memory_pool_stats(deft::cpu());  // the host's pool is the installed allocator
  BOOST_TEST(seen.hits == s.hits);
  BOOST_TEST(seen.cached_bytes == s.cached_bytes);
  BOOST_TEST(seen.cached_bytes > 0u);
  engine::release_cached_memory(deft::cpu());  // the installed cache is emptied
  BOOST_TEST(cache->stats().cached_bytes == 0u);
  BOOST_TEST(engine::memory_pool_stats(deft::cpu()).cached_bytes == 0u);
}

// Large host buffers start on a page, so that a kernel storing to one while
// loading from another never sees them a few cache lines apart modulo
// 4 KiB (4K aliasing); others on a cache line, and the smallest where
// malloc puts them (16 bytes). The allocator is asked for, and frees with,
// the same alignment and size.
BOOST_AUTO_TEST_CASE(large_buffers_start_on_a_page) {
  auto up = std::make_shared<CountingAllocator>();
  const Installed installed(up);
  std::mt19937 g(612);
  const i64 small = i64(deft::thresholds::small_host_buffer_bytes / 4);
  // 16 KiB, 20000 B, 12 B, 4000 B, and both sides of the small bound.
  for (const i64 n : {i64(1) << 12, i64(5000), i64(3), i64(1000), small, small + 1}) {
    std::vector<Tensor<float>> ts;
    for (int k = 0; k < 4; ++k) ts.push_back(make(random_values<float>(g, n, -1, 1), Shape{n}) * 2.f);
    for (const auto& t : ts) {
      t.wait_to_read();
      const auto at = reinterpret_cast<std::uintptr_t>(t.storage()->data);
      const std::size_t want = n * 4 >= i64(deft::thresholds::page_align_min_bytes) ? 4096
                               : n <= small                                         ? alignof(std::max_align_t)
                                                                                    : 64;
      BOOST_TEST(at % want == 0u, n << " floats at " << at);
      BOOST_TEST(up->asked_alignment(t.storage()->data) == want, n << " floats");
    }
  }
  settle();
  BOOST_TEST(up->mismatches == 0);
}

BOOST_AUTO_TEST_SUITE_END()
