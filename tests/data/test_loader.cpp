// The DataLoader: every sample once per epoch, reproducible shuffles, the
// last-batch policies, prefetching that changes nothing but timing, and
// iterations that stop early without hanging or leaving a thread behind.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <limits>
#include <new>
#include <memory>
#include <numeric>
#include <thread>

#include <deft/data.hpp>
#include <deft/device/allocator.hpp>

#include "data_support.hpp"

using namespace dd;
namespace data = deft::data;
using deft::Shape;
using deft::Tensor;
using data::DataLoader;
using data::LastBatch;
using i64 = std::int64_t;

static_assert(std::input_iterator<DataLoader::Iterator>);
static_assert(std::sentinel_for<std::default_sentinel_t, DataLoader::Iterator>);

namespace {

/// n samples of shape (2, 3) whose features encode their index (sample i is
/// i, i + 0.01, ..., i + 0.05) and whose label is 1000 + i.
struct Set {
  Tensor<float> x;
  Tensor<i64> y;
};
Set indexed_set(i64 n) {
  std::vector<float> x;
  std::vector<i64> y;
  for (i64 i = 0; i < n; ++i) {
    for (int k = 0; k < 6; ++k) x.push_back(float(i) + 0.01f * float(k));
    y.push_back(1000 + i);
  }
  return {Tensor<float>(x, Shape{n, 2, 3}), Tensor<i64>(y, Shape{n})};
}

/// One epoch as the sample indices of each batch, checking on the way that
/// every batch is well formed and that x and y belong to the same samples.
std::vector<std::vector<i64>> epoch_indices(DataLoader& loader) {
  std::vector<std::vector<i64>> batches;
  for (const data::Batch& b : loader) {
    const i64 m = b.y.size();
    BOOST_TEST_REQUIRE((b.x.shape() == Shape{m, 2, 3}));
    BOOST_TEST_REQUIRE((b.y.shape() == Shape{m}));
    BOOST_TEST(b.x.is_ready());
    const auto x = b.x.to_vector();
    const auto y = b.y.to_vector();
    std::vector<i64> idx;
    for (i64 k = 0; k < m; ++k) {
      const i64 i = y[std::size_t(k)] - 1000;
      for (int f = 0; f < 6; ++f) BOOST_TEST_REQUIRE(x[std::size_t(k * 6 + f)] == float(i) + 0.01f * float(f));
      idx.push_back(i);
    }
    batches.push_back(idx);
  }
  return batches;
}

std::vector<i64> flatten(const std::vector<std::vector<i64>>& batches) {
  std::vector<i64> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}
std::vector<std::size_t> sizes(const std::vector<std::vector<i64>>& batches) {
  std::vector<std::size_t> s;
  for (const auto& b : batches) s.push_back(b.size());
  return s;
}
std::vector<i64> iota(i64 n) {
  std::vector<i64> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

/// Threads of this process (Linux), -1 where unknown.
int thread_count() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "Threads:") {
      int n = -1;
      status >> n;
      return n;
    }
    status.ignore(1 << 20, '\n');
  }
  return -1;
}

// The thread count once it has fallen to `expected`, or after 5 s.
int settled_thread_count(int expected) {
  int n = thread_count();
  for (int i = 0; i < 500 && n > expected; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = thread_count();
  }
  return n;
}

/// A host allocator whose allocations throw std::bad_alloc while `failing` is set.
struct Failing final : deft::engine::HostAllocator {
  std::atomic<bool> failing{false};
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (failing) throw std::bad_alloc();
    return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  }
  void deallocate(void* p, std::size_t, std::size_t) noexcept override { std::free(p); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(loader)

BOOST_AUTO_TEST_CASE(bad_arguments) {
  const Set s = indexed_set(10);
  DD_CHECK_THROWS(DataLoader(s.x, s.y, 0), std::invalid_argument, "batch_size must be at least 1, got 0");
  DD_CHECK_THROWS(DataLoader(s.x, s.y, -3), std::invalid_argument, "got -3");
  const Set nine = indexed_set(9);
  DD_CHECK_THROWS(DataLoader(s.x, nine.y, 4), std::invalid_argument, "10 samples of features (shape (10, 2, 3))",
                  "9 labels (shape (9,))");
  DD_CHECK_THROWS(DataLoader(Tensor<float>({1.0f}, Shape{}), Tensor<i64>({1}, Shape{1}), 1), std::invalid_argument,
                  "features need a sample axis", "shape ()");
  DD_CHECK_THROWS(DataLoader(s.x, s.y.reshape({5, 2}), 1), std::invalid_argument, "labels need shape (N,), got shape (5, 2)");
}

BOOST_AUTO_TEST_CASE(every_sample_once_per_epoch) {
  const Set s = indexed_set(103);
  DataLoader loader(s.x, s.y, 8, {.seed = 5});
  BOOST_TEST(loader.size() == 103);
  BOOST_TEST(loader.num_batches() == 13);
  std::vector<std::vector<i64>> orders;
  for (int e = 0; e < 4; ++e) {
    BOOST_TEST(loader.epoch() == std::uint64_t(e));
    const auto batches = epoch_indices(loader);
    BOOST_TEST(batches.size() == 13u);
    auto all = flatten(batches);
    orders.push_back(all);
    BOOST_TEST(all == loader.order_of(std::uint64_t(e)), boost::test_tools::per_element());
    std::sort(all.begin(), all.end());
    BOOST_TEST(all == iota(103), boost::test_tools::per_element());
  }
  BOOST_TEST((orders[0] != iota(103)));  // shuffled
  BOOST_TEST((orders[0] != orders[1]));  // afresh each epoch
  BOOST_TEST((orders[1] != orders[2]));
}

BOOST_AUTO_TEST_CASE(seeds_make_orders_reproducible) {
  const Set s = indexed_set(50);
  DataLoader a(s.x, s.y, 7, {.seed = 42}), b(s.x, s.y, 7, {.seed = 42}), c(s.x, s.y, 7, {.seed = 43});
  for (int e = 0; e < 3; ++e) {
    const auto ea = flatten(epoch_indices(a)), eb = flatten(epoch_indices(b)), ec = flatten(epoch_indices(c));
    BOOST_TEST(ea == eb, boost::test_tools::per_element());
    BOOST_TEST((ea != ec));
  }
  // The order of an epoch depends on (seed, epoch) only: set_epoch resumes.
  DataLoader d(s.x, s.y, 7, {.seed = 42});
  d.set_epoch(2);
  BOOST_TEST(flatten(epoch_indices(d)) == a.order_of(2), boost::test_tools::per_element());
  BOOST_TEST(d.epoch() == 3u);
  // The generator and the shuffle are fixed here, not by the standard
  // library: these are the same on every platform.
  BOOST_TEST(DataLoader(s.x, s.y, 7, {.seed = 42}).order_of(0)[0] == a.order_of(0)[0]);
  // No shuffle: 0..N-1 in every epoch.
  DataLoader plain(s.x, s.y, 7, {.shuffle = false});
  for (int e = 0; e < 2; ++e) BOOST_TEST(flatten(epoch_indices(plain)) == iota(50), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(last_batch_policies) {
  const Set s = indexed_set(10);
  using Sizes = std::vector<std::size_t>;
  DataLoader keep(s.x, s.y, 4, {.last_batch = LastBatch::keep});
  DataLoader discard(s.x, s.y, 4, {.last_batch = LastBatch::discard});
  BOOST_TEST(keep.num_batches() == 3);
  BOOST_TEST(discard.num_batches() == 2);
  for (int e = 0; e < 2; ++e) {
    BOOST_TEST(sizes(epoch_indices(keep)) == (Sizes{4, 4, 2}), boost::test_tools::per_element());
    const auto d = epoch_indices(discard);
    BOOST_TEST(sizes(d) == (Sizes{4, 4}), boost::test_tools::per_element());
    auto expect = discard.order_of(std::uint64_t(e));
    expect.resize(8);  // the last two of the epoch's order are dropped
    BOOST_TEST(flatten(d) == expect, boost::test_tools::per_element());
  }

  // Rollover: the 2 left over come first in the next epoch (12 samples: 3
  // full batches), then 2 are left over again.
  DataLoader roll(s.x, s.y, 4, {.seed = 9, .last_batch = LastBatch::rollover});
  BOOST_TEST(roll.num_batches() == 2);
  const auto e0 = epoch_indices(roll);
  BOOST_TEST(sizes(e0) == (Sizes{4, 4}), boost::test_tools::per_element());
  const auto o0 = roll.order_of(0), o1 = roll.order_of(1), o2 = roll.order_of(2);
  BOOST_TEST(flatten(e0) == std::vector<i64>(o0.begin(), o0.begin() + 8), boost::test_tools::per_element());
  BOOST_TEST(roll.num_batches() == 3);
  const auto e1 = epoch_indices(roll);
  BOOST_TEST(sizes(e1) == (Sizes{4, 4, 4}), boost::test_tools::per_element());
  std::vector<i64> expect1(o0.begin() + 8, o0.end());
  expect1.insert(expect1.end(), o1.begin(), o1.end());
  BOOST_TEST(flatten(e1) == expect1, boost::test_tools::per_element());
  BOOST_TEST(roll.num_batches() == 2);
  const auto e2 = epoch_indices(roll);
  BOOST_TEST(flatten(e2) == std::vector<i64>(o2.begin(), o2.begin() + 8), boost::test_tools::per_element());

  // A batch larger than the data set.
  DataLoader big_keep(s.x, s.y, 64), big_discard(s.x, s.y, 64, {.last_batch = LastBatch::discard});
  BOOST_TEST(sizes(epoch_indices(big_keep)) == (Sizes{10}), boost::test_tools::per_element());
  BOOST_TEST(epoch_indices(big_discard).empty());
  DataLoader big_roll(s.x, s.y, 25, {.last_batch = LastBatch::rollover});  // 10, 20: none; 30: one batch
  BOOST_TEST(epoch_indices(big_roll).empty());
  BOOST_TEST(epoch_indices(big_roll).empty());
  BOOST_TEST(sizes(epoch_indices(big_roll)) == (Sizes{25}), boost::test_tools::per_element());
  // An empty data set has no batches.
  const Set none = indexed_set(0);
  DataLoader empty(none.x, none.y, 4);
  BOOST_TEST(empty.num_batches() == 0);
  BOOST_TEST(epoch_indices(empty).empty());
}

BOOST_AUTO_TEST_CASE(prefetching_changes_nothing_but_timing) {
  // Random features of shape (N, 3, 4), compared in full, batch by batch.
  const i64 n = 1000;
  const Bytes r = random_bytes(std::size_t(n) * 12, 77);
  std::vector<float> xv(r.begin(), r.end());
  std::vector<i64> yv(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) yv[std::size_t(i)] = i % 10;
  const Tensor<float> x(xv, Shape{n, 3, 4});
  const Tensor<i64> y(yv, Shape{n});
  for (LastBatch policy : {LastBatch::keep, LastBatch::discard, LastBatch::rollover}) {
    DataLoader with(x, y, 96, {.seed = 3, .last_batch = policy, .prefetch = true});
    DataLoader without(x, y, 96, {.seed = 3, .last_batch = policy, .prefetch = false});
    for (int e = 0; e < 3; ++e) {
      std::vector<std::pair<std::vector<float>, std::vector<i64>>> a, b;
      for (const auto& [bx, by] : with) a.emplace_back(bx.to_vector(), by.to_vector());
      for (const auto& [bx, by] : without) b.emplace_back(bx.to_vector(), by.to_vector());
      BOOST_TEST_CONTEXT("policy " << int(policy) << ", epoch " << e) {
        BOOST_TEST_REQUIRE(a.size() == b.size());
        for (std::size_t k = 0; k < a.size(); ++k) {
          BOOST_TEST((a[k].first == b[k].first));
          BOOST_TEST((a[k].second == b[k].second));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(breaking_out_early_neither_hangs_nor_leaks_threads) {
  const Set s = indexed_set(500);
  DataLoader loader(s.x, s.y, 3, {.seed = 1});
  epoch_indices(loader);  // the engine's workers (if any) start here
  const int before = thread_count();
  std::vector<data::Batch> kept;
  for (int e = 0; e < 200; ++e) {
    int k = 0;
    for (const auto& b : loader) {
      if (k++ == e % 4) {
        kept.push_back(b);  // batches stay valid after their epoch is gone
        break;
      }
    }
  }
  // An iterator abandoned before its first increment, and one never compared.
  for (int i = 0; i < 20; ++i) (void)loader.begin();
  // pthread_join returns when the thread has finished, a moment before the
  // kernel stops counting it; a leaked thread would stay counted.
  if (before > 0) BOOST_TEST(settled_thread_count(before) == before);
  for (const auto& b : kept) BOOST_TEST(b.x.to_vector()[0] == float(b.y.to_vector()[0] - 1000));
}

BOOST_AUTO_TEST_CASE(an_epoch_outlives_its_loader) {
  const Set s = indexed_set(20);
  auto loader = std::make_unique<DataLoader>(s.x, s.y, 6);
  DataLoader::Iterator it = loader->begin();
  loader.reset();  // the epoch keeps the data it reads
  std::vector<i64> seen;
  for (; it != std::default_sentinel; ++it)
    for (i64 v : it->y.to_vector()) seen.push_back(v - 1000);
  std::sort(seen.begin(), seen.end());
  BOOST_TEST(seen == iota(20), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_batch_size_near_the_int64_limit_is_one_batch) {
  const Set s = indexed_set(10);
  const i64 huge = std::numeric_limits<i64>::max();
  DataLoader keep(s.x, s.y, huge, {.shuffle = false});
  BOOST_TEST(keep.num_batches() == 1);
  const auto batches = epoch_indices(keep);
  BOOST_TEST_REQUIRE(batches.size() == 1u);
  BOOST_TEST(batches[0] == iota(10), boost::test_tools::per_element());
  DataLoader discard(s.x, s.y, huge, {.last_batch = LastBatch::discard});
  BOOST_TEST(discard.num_batches() == 0);
  BOOST_TEST(epoch_indices(discard).empty());
}

BOOST_AUTO_TEST_CASE(a_failed_begin_loses_neither_the_epoch_nor_the_carried_samples) {
  // Allocations of new tensors fail while `failing` is set: batch 0's
  // gather, the first allocation of begin() without prefetching.
  const Set s = indexed_set(10);
  DataLoader roll(s.x, s.y, 4, {.shuffle = false, .last_batch = LastBatch::rollover, .prefetch = false});
  BOOST_TEST(flatten(epoch_indices(roll)) == iota(8), boost::test_tools::per_element());  // carries 8, 9
  BOOST_TEST(roll.epoch() == 1u);
  BOOST_TEST(roll.num_batches() == 3);
  auto failing = std::make_shared<Failing>();
  const auto previous = deft::engine::set_host_allocator(failing);
  failing->failing = true;
  BOOST_CHECK_THROW(roll.begin(), std::bad_alloc);
  failing->failing = false;
  deft::engine::set_host_allocator(previous);
  // The retry is the epoch that failed, with the samples carried into it.
  BOOST_TEST(roll.epoch() == 1u);
  BOOST_TEST(roll.num_batches() == 3);
  std::vector<i64> expect{8, 9};
  for (i64 i = 0; i < 10; ++i) expect.push_back(i);
  BOOST_TEST(flatten(epoch_indices(roll)) == expect, boost::test_tools::per_element());
}


BOOST_AUTO_TEST_CASE(a_failed_step_is_gathered_again_by_the_next) {
  const Set s = indexed_set(10);
  DataLoader loader(s.x, s.y, 4, {.shuffle = false, .last_batch = LastBatch::keep, .prefetch = false});
  auto it = loader.begin();
  BOOST_TEST((*it).y.to_vector() == (std::vector<i64>{1000, 1001, 1002, 1003}), boost::test_tools::per_element());
  auto failing = std::make_shared<Failing>();
  const auto previous = deft::engine::set_host_allocator(failing);
  failing->failing = true;
  BOOST_CHECK_THROW(++it, std::bad_alloc);  // batch 1's gather
  failing->failing = false;
  deft::engine::set_host_allocator(previous);
  BOOST_TEST((*it).y.to_vector() == (std::vector<i64>{1000, 1001, 1002, 1003}), boost::test_tools::per_element());
  ++it;  // batch 1 again, not batch 2
  BOOST_TEST((*it).y.to_vector() == (std::vector<i64>{1004, 1005, 1006, 1007}), boost::test_tools::per_element());
  ++it;
  BOOST_TEST((*it).y.to_vector() == (std::vector<i64>{1008, 1009}), boost::test_tools::per_element());
  ++it;
  BOOST_TEST((it == std::default_sentinel));
}

BOOST_AUTO_TEST_SUITE_END()
