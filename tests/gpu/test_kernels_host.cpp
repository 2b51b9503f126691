// The GPU evaluators run on the host through Thrust's C++ backend
// (thrust::cpp::par): a CPU-only machine checks the functors a CUDA build
// launches. Memory is plain host vectors; `translate` is the identity.
// Built with DEFT_GPU_EMULATION, it also runs tensors on emulated GPUs.
#define BOOST_TEST_MODULE deft_gpu_kernels_host
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <thrust/system/cpp/execution_policy.h>

#include <deft/engine/graph_dump.hpp>
#include <deft/eval/gpu/divider.hpp>

#include "kernel_checks.hpp"
#include "random_checks.hpp"
#include "tensor_checks.hpp"

// Every piece of emulated GPU work is checked against the lanes' waits.
long gpu_tensors::lane_races() { return deft::detail::gpu::emulated_backend().checker().races.load(); }

namespace {

struct HostMemory {
  static constexpr bool exact = true;  // the same host code as the CPU's: bit-identical results
  std::vector<std::shared_ptr<void>> blocks;

  static auto policy() { return thrust::cpp::par; }
  template <class T>
  void mirror(const deft::Tensor<T>& t) {
    t.wait_to_read();  // the evaluators read the storage directly
  }
  template <class T>
  static const T* translate(const T* p) { return p; }
  template <class T>
  T* make(std::int64_t n) {
    auto block = std::shared_ptr<T[]>(new T[std::size_t(n)]());
    blocks.push_back(block);
    return block.get();
  }
  template <class T>
  static std::vector<T> get(const T* p, std::int64_t n) { return std::vector<T>(p, p + n); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_kernels_host)

DEFT_GPU_KERNEL_CASES(HostMemory)

// The multiply-and-shift quotients equal integer division: every divisor
// up to 2^12 on its critical numerators, random divisors and numerators
// below 2^31, and the bounds; past 2^31 the plain division takes over.
BOOST_AUTO_TEST_CASE(divider_quotients_equal_integer_division) {
  using deft::detail::gpu::Divider;
  constexpr std::int64_t top = (std::int64_t(1) << 31) - 1;
  long checked = 0;
  auto check = [&](const Divider& div, std::int64_t d, std::int64_t n) {
    std::int64_t q = -1;
    const std::int64_t r = div.split(n, q);
    if (q != n / d || r != n % d) BOOST_FAIL(n << " / " << d << ": got " << q << " remainder " << r);
    ++checked;
  };
  for (std::int64_t d = 1; d <= 4096; ++d) {
    const Divider div(d, top);
    for (std::int64_t k : {std::int64_t(0), std::int64_t(1), std::int64_t(2), top / d - 1, top / d})
      for (std::int64_t n : {k * d - 1, k * d, k * d + 1, k * d + d - 1})
        if (n >= 0 && n <= top) check(div, d, n);
  }
  std::mt19937_64 gen(42);
  for (int i = 0; i < 20000; ++i) {
    const int bits = 1 + int(gen() % 31);
    const std::int64_t d = 1 + std::int64_t(gen() % (std::uint64_t(1) << bits)) % top;
    const Divider div(d, top);
    check(div, d, top);
    check(div, d, d - 1);
    for (int j = 0; j < 50; ++j) check(div, d, std::int64_t(gen() % std::uint64_t(top + 1)));
  }
  const std::int64_t wide = std::int64_t(1) << 40;
  check(Divider(3, wide), 3, wide - 1);            // numerators past 2^31
  check(Divider(wide + 7, wide * 4), wide + 7, wide * 3);  // a divisor past 2^31
  BOOST_TEST(checked > 1000000);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {
// The emulated devices' caching pools while it lives (ASan builds give
// exact blocks otherwise: EmulatedBackend::exact_memory).
struct PooledDeviceMemory {
  bool exact = deft::detail::gpu::emulated_backend().exact_memory.exchange(false);
  ~PooledDeviceMemory() { deft::detail::gpu::emulated_backend().exact_memory = exact; }
};
}  // namespace

// Tensors on the emulated gpu(0) and gpu(1) (DEFT_GPU_EMULATION): the
// engine, executor and backend paths of a CUDA build, run on the host.
BOOST_AUTO_TEST_SUITE(gpu_tensors_emulated)

DEFT_GPU_TENSOR_CASES(true)
DEFT_GPU_RANDOM_CASES

BOOST_AUTO_TEST_CASE(num_gpus_counts_the_backends_devices) { BOOST_TEST(deft::num_gpus() == 2); }

// A copy to the host waits for the mark of its source's writer (on CUDA:
// its event), not for the work queued after it on the writer's lane, and
// wait_to_read waits for that mark; the emulated marks name their device,
// so a wrong buffer's mark would throw.
BOOST_AUTO_TEST_CASE(copies_and_waits_follow_the_buffers_mark) {
  auto& backend = deft::detail::gpu::emulated_backend();
  const long races = backend.checker().races.load();
  const auto v = gpu_tensors::random_values(64, 21);
  deft::engine::set_mode(deft::engine::Mode::synchronous);  // tasks run as recorded: a fixed order
  const deft::Tensor<float> x = deft::Tensor<float>(v, {64}).to(deft::gpu(1)) * 2.0f;
  const deft::Tensor<float> later = x * 5.0f;  // on x's lane, after x's mark
  deft::engine::set_mode(deft::engine::Mode::deferred);
  const auto marked = backend.tracker().marked_waits();
  std::vector<double> want(v.begin(), v.end()), want_later(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) want[i] *= 2, want_later[i] = double(v[i]) * 2 * 5;
  gpu_tensors::expect_near(x.to_vector(), want, 0, "to_vector");
  BOOST_TEST(backend.tracker().marked_waits() == marked + 1);
  const long waits = backend.marked_waits;
  x.wait_to_read();
  BOOST_TEST(backend.marked_waits == waits + 1);
  gpu_tensors::expect_near(x.to(deft::cpu()).to_vector(), want, 0, "to(cpu())");
  gpu_tensors::expect_near(later.to_vector(), want_later, 1e-6, "the later work");
  BOOST_TEST(backend.checker().races.load() == races, backend.checker().first_race());
}

// The emulated product checks its operands against the uses its work
// declared: an operand left out of the declaration, which the lanes would
// then not order after its writer, counts as a race (the values alone could
// not show it: emulated kernels run in order). Declared, it does not.
BOOST_AUTO_TEST_CASE(a_product_of_undeclared_memory_is_a_race) {
  namespace gk = deft::detail::gpu;
  auto& checker = gk::emulated_backend().checker();
  const deft::Tensor<float> a(gpu_tensors::random_values(4, 22), {2, 2}, deft::gpu(0));
  const deft::Tensor<float> b(gpu_tensors::random_values(4, 23), {2, 2}, deft::gpu(0));
  const deft::Tensor<float> c(std::vector<float>(4), {2, 2}, deft::gpu(0));
  using Uses = deft::detail::MemoryUses;
  const float* pa = a.leaf().buffer->as<const float>();
  const float* pb = b.leaf().buffer->as<const float>();
  float* pc = c.leaf().buffer->as<float>();
  BOOST_TEST_REQUIRE(checker.races.load() == 0);  // the fixture's rule: none so far
  {
    gk::Launch on(0, Uses{{pa}, {pc}});  // b left out
    on.gemm(2, 2, 2, pa, pb, pc, false, false);
  }
  BOOST_TEST(checker.races.load() == 1);
  BOOST_TEST(checker.first_race().find("a matrix product reads") != std::string::npos, checker.first_race());
  {
    gk::Launch on(0, Uses{{pb}, {pa}});  // the output left out (a declared read does not cover a write)
    on.gemm(2, 2, 2, pb, pb, pc, false, false);
  }
  BOOST_TEST(checker.races.load() == 2);
  checker.races -= 2;  // expected ones: the fixture counts any other
  {
    gk::Launch on(0, Uses{{pa, pb}, {pc}});
    on.gemm(2, 2, 2, pa, pb, pc, false, false);
  }
  BOOST_TEST(checker.races.load() == 0);
  // Through the engine: dot declares both operands, views of them included.
  const auto got = deft::dot(a.rows(1, 2), b).to_vector();
  const auto va = a.to_vector(), vb = b.to_vector();
  for (int j = 0; j < 2; ++j)
    BOOST_TEST(got[std::size_t(j)] == va[2] * vb[std::size_t(j)] + va[3] * vb[std::size_t(2 + j)],
               boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(checker.races.load() == 0);
}

BOOST_AUTO_TEST_CASE(device_pool_is_reused_in_a_steady_loop) {
  const PooledDeviceMemory pooled;
  auto& pool = deft::detail::gpu::emulated_backend().pool(0);
  deft::Tensor<float> x = deft::ones<float>({256, 256}, deft::gpu(0));
  const auto step = [&] {
    const deft::Tensor<float> y = x * 0.5f + 1.0f;  // x is still held: y takes a block of its own
    y.wait_to_read();
    x = y;  // x's old block goes back to the pool, for the next step's y
  };
  step();
  const auto before = pool.stats();
  for (int i = 0; i < 20; ++i) step();
  const auto after = pool.stats();
  BOOST_TEST(after.misses == before.misses);  // every buffer came from the cache
  BOOST_TEST(after.hits >= before.hits + 20);
}

// A GPU's pool cuts a freed block for smaller tensors of other shapes
// instead of asking the device for more memory, and caches scalars (a loss)
// too, which before went to cudaMalloc and cudaFree at every step.
BOOST_AUTO_TEST_CASE(freed_device_blocks_serve_other_shapes_and_scalars) {
  const PooledDeviceMemory pooled;
  auto& pool = deft::detail::gpu::emulated_backend().pool(0);
  const auto values = gpu_tensors::random_values(1000 * 1000, 63);  // 4 MB: large requests
  const deft::Tensor<float> x = deft::Tensor<float>(values, {1000, 1000}).to(deft::gpu(0));
  x.wait_to_read();
  deft::engine::release_cached_memory(deft::gpu(0));  // only the block freed below is free and whole
  {
    deft::Tensor<float> big = x * 3.0f;
    big.wait_to_read();
  }
  const auto before = pool.stats();
  // 1.2 and 2.4 MB (classes of 1.25 and 2.5 MiB) fit the 4 MiB class of `big`.
  const deft::Tensor<float> top = x.rows(0, 300) * 2.0f, bottom = x.rows(300, 900) + 1.0f;
  std::vector<double> want_top(values.begin(), values.begin() + 300 * 1000),
      want_bottom(values.begin() + 300 * 1000, values.begin() + 900 * 1000);
  for (auto& v : want_top) v *= 2;
  for (auto& v : want_bottom) v += 1;
  gpu_tensors::expect_near(top.to_vector(), want_top, 0, "top rows");
  gpu_tensors::expect_near(bottom.to_vector(), want_bottom, 1e-6, "bottom rows");  // float rounding of v + 1
  const auto after = pool.stats();
  BOOST_TEST(after.splits >= before.splits + 2, "both results were cut from the freed block");
  BOOST_TEST(after.held_bytes == before.held_bytes, "no new device memory was taken");
  const auto hits = after.hits;
  for (int step = 0; step < 10; ++step) {
    const deft::Tensor<float> loss = deft::ones<float>({}, deft::gpu(0)) * float(step);
    BOOST_TEST(loss.item() == float(step));
  }
  BOOST_TEST(pool.stats().hits >= hits + 10, "each step's scalar came from the pool");
}

// engine::memory_pool_stats reads a device's pool; release_cached_memory
// frees its free blocks (live tensors keep theirs, and stay readable), so the
// next allocation of a freed size asks the upstream again.
BOOST_AUTO_TEST_CASE(a_devices_cached_memory_can_be_released) {
  const PooledDeviceMemory pooled;
  auto& pool = deft::detail::gpu::emulated_backend().pool(1);
  // 11.6 MB: a large request, an allocation of its own (smaller ones may share one)
  const auto values = gpu_tensors::random_values(1700 * 1700, 60);
  deft::Tensor<float> kept = deft::Tensor<float>(values, {1700, 1700}).to(deft::gpu(1));
  {
    deft::Tensor<float> dropped = kept * 2.0f;
    dropped.wait_to_read();
  }  // its block goes back to the pool
  const auto before = deft::engine::memory_pool_stats(deft::gpu(1));
  BOOST_TEST(before.cached_bytes == pool.stats().cached_bytes);
  BOOST_TEST(before.cached_bytes >= 1700u * 1700u * sizeof(float));
  deft::engine::release_cached_memory(deft::gpu(1));
  BOOST_TEST(deft::engine::memory_pool_stats(deft::gpu(1)).cached_bytes == 0u);
  BOOST_TEST(kept.to_vector() == values, boost::test_tools::per_element());
  const auto misses = pool.stats().misses;
  deft::Tensor<float> again = kept * 2.0f;
  again.wait_to_read();
  BOOST_TEST(pool.stats().misses == misses + 1);  // nothing cached to take it from
  BOOST_CHECK_EXCEPTION(deft::engine::release_cached_memory(deft::gpu(2)), std::invalid_argument,
                        [](const std::invalid_argument& e) { return std::string(e.what()).find("no device gpu(2)") != std::string::npos; });
  BOOST_CHECK_EXCEPTION(deft::engine::memory_pool_stats(deft::gpu(-1)), std::invalid_argument,
                        [](const std::invalid_argument& e) { return std::string(e.what()).find("memory_pool_stats") != std::string::npos; });
}

BOOST_AUTO_TEST_SUITE_END()

// StagingArea (device/cuda/staging.hpp), which stages CUDA's copies to a GPU
// through pinned blocks, with a queue whose DMAs run only when the test (or
// a wait) lets them: a block handed out again before its DMA ran would be
// overwritten, and the DMA would then deliver the wrong bytes.
namespace {

struct DeferredQueue {
  struct Dma {
    void* to;
    const void* from;
    std::size_t n;
  };
  using Mark = long;  // the DMAs queued up to the mark
  static inline std::vector<Dma> queued;
  static inline long ran = 0, waits = 0;

  void copy(void* to, const void* staged, std::size_t n) { queued.push_back({to, staged, n}); }
  static Mark mark() { return long(queued.size()); }
  static bool finished(Mark m) { return ran >= m; }
  static void wait(Mark m) {
    ++waits;
    run_until(m);
  }
  static void run_until(long m) {
    for (; ran < m; ++ran) std::memcpy(queued[std::size_t(ran)].to, queued[std::size_t(ran)].from, queued[std::size_t(ran)].n);
  }
  static void reset() { queued.clear(), ran = 0, waits = 0; }
};

// The staging tests' pinned pool: caches blocks of 256 bytes and up.
std::shared_ptr<deft::engine::CachingHostAllocator> staging_pool(
    std::shared_ptr<deft::engine::HostAllocator> upstream = std::make_shared<deft::engine::DefaultHostAllocator>()) {
  return std::make_shared<deft::engine::CachingHostAllocator>(std::move(upstream), std::size_t(1) << 20, 256);
}

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_staging)

using Area = deft::detail::gpu::StagingArea<DeferredQueue>;
constexpr std::size_t chunk = 8 << 10, bound = 32 << 10;

BOOST_AUTO_TEST_CASE(uploads_arrive_whole_within_the_bound) {
  DeferredQueue::reset();
  auto pool = staging_pool();
  Area area(pool, chunk, bound);
  const std::vector<std::size_t> sizes{0, 1, 7, 4095, 4096, 8191, 8192, 8193, 3 * 8192 + 5, 100000, 33};
  std::vector<std::vector<unsigned char>> src, dst;
  DeferredQueue queue;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(random_bytes(sizes[i], unsigned(i) + 1));
    dst.emplace_back(sizes[i], 0);
    area.upload(dst.back().data(), src.back().data(), sizes[i], queue);
    BOOST_TEST(area.bytes_in_flight() <= bound);
    std::fill(src.back().begin(), src.back().end(), 0xAB);  // the source may be reused on return
  }
  BOOST_TEST(DeferredQueue::waits > 0);  // 100000 bytes cannot wait at once within 32 KiB
  DeferredQueue::run_until(DeferredQueue::mark());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    BOOST_TEST((dst[i] == random_bytes(sizes[i], unsigned(i) + 1)), "upload " << i << " of " << sizes[i] << " bytes");
  area.drain();
  BOOST_TEST(area.bytes_in_flight() == 0u);
}

BOOST_AUTO_TEST_CASE(blocks_return_to_the_pool_once_their_dma_ran) {
  DeferredQueue::reset();
  auto pool = staging_pool();
  Area area(pool, chunk, bound);
  DeferredQueue queue;
  const auto a = random_bytes(5000, 7), b = random_bytes(5000, 8);
  std::vector<unsigned char> da(5000), db(5000);
  area.upload(da.data(), a.data(), a.size(), queue);
  area.upload(db.data(), b.data(), b.size(), queue);  // a's block is still in flight: a second block
  BOOST_TEST(pool->stats().misses == 2u);
  BOOST_TEST(area.bytes_in_flight() == 2 * 8192u);  // 5000 bytes take an 8 KiB block
  DeferredQueue::run_until(DeferredQueue::mark());
  BOOST_TEST((da == a));
  BOOST_TEST((db == b));
  std::vector<unsigned char> dc(5000);
  area.upload(dc.data(), a.data(), a.size(), queue);  // reclaims both finished blocks, reuses one
  BOOST_TEST(pool->stats().misses == 2u);
  BOOST_TEST(pool->stats().hits == 1u);
  BOOST_TEST(area.bytes_in_flight() == 8192u);
  BOOST_TEST(DeferredQueue::waits == 0);
  area.drain();  // waits for the last DMA
  BOOST_TEST((dc == a));
}

// DMAs on different lanes (or to different devices) finish in any order:
// a block whose DMA is done goes back even while an older one is pending.
namespace {
struct OutOfOrderQueue {
  using Mark = std::size_t;  // the DMA's number
  static inline std::vector<DeferredQueue::Dma> queued;
  static inline std::vector<char> done;
  static inline long waits = 0;
  void copy(void* to, const void* staged, std::size_t n) { queued.push_back({to, staged, n}), done.push_back(0); }
  static Mark mark() { return queued.size() - 1; }
  static bool finished(Mark m) { return done[m] != 0; }
  static void wait(Mark m) {
    ++waits;
    run(m);
  }
  static void run(Mark m) {
    if (!done[m]) std::memcpy(queued[m].to, queued[m].from, queued[m].n), done[m] = 1;
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE(a_finished_block_returns_while_an_older_dma_is_pending) {
  auto pool = staging_pool();
  deft::detail::gpu::StagingArea<OutOfOrderQueue> area(pool, chunk, bound);
  OutOfOrderQueue queue;
  const auto a = random_bytes(5000, 9), b = random_bytes(5000, 10);
  std::vector<unsigned char> da(5000), db(5000), dc(5000);
  area.upload(da.data(), a.data(), a.size(), queue);
  area.upload(db.data(), b.data(), b.size(), queue);
  OutOfOrderQueue::run(1);  // b's DMA finishes first
  area.upload(dc.data(), b.data(), b.size(), queue);  // takes b's block back, not a third one
  BOOST_TEST(pool->stats().misses == 2u);
  BOOST_TEST(pool->stats().hits == 1u);
  BOOST_TEST(area.bytes_in_flight() == 2 * 8192u);
  BOOST_TEST(OutOfOrderQueue::waits == 0);
  area.drain();
  BOOST_TEST((da == a));
  BOOST_TEST((db == b));
  BOOST_TEST((dc == b));
}

// The emulated backend stages every copy to a device in 16 KiB chunks; a
// copy from a device lands in its stand-in for pinned memory.
BOOST_AUTO_TEST_CASE(tensors_copied_to_a_device_are_staged_and_back_pinned) {
  auto& backend = deft::detail::gpu::emulated_backend();
  const long uploads = backend.staged_uploads;
  const auto pinned_misses = backend.pinned_pool().stats().misses, pinned_hits = backend.pinned_pool().stats().hits;
  const auto v = gpu_tensors::random_values(10000, 41);  // 40 KB: three chunks
  deft::Tensor<float> g = deft::Tensor<float>(v, {100, 100}).to(deft::gpu(1));
  deft::Tensor<float> back = g.to(deft::cpu());
  BOOST_TEST(back.is_pinned());
  BOOST_TEST(backend.staged_uploads == uploads + 1);
  const auto stats = backend.pinned_pool().stats();
  BOOST_TEST(stats.misses + stats.hits > pinned_misses + pinned_hits + 1);  // staging blocks and `back`
  gpu_tensors::expect_near(back.to_vector(), std::vector<double>(v.begin(), v.end()), 0, "round trip");
}

// Downloads (StagingArea::download): a DMA from the device into a pinned
// block runs only when the download waits for it, so a chunk copied out
// before its wait would deliver the block's stale bytes.
namespace {
struct DeferredSource {
  using Mark = long;
  explicit DeferredSource(Area* a, long fail = -1) : area(a), fail_at(fail) {}
  Area* area;
  long fail_at;  // a wait for this mark raises, as a failed DMA would
  std::vector<DeferredQueue::Dma> queued;
  long ran = 0, waits = 0;
  std::size_t most_in_flight = 0;  // the area's reserved bytes at a fetch
  std::vector<long> waits_at_fetch;

  void fetch(void* staged, const void* from, std::size_t n) {
    waits_at_fetch.push_back(waits);
    most_in_flight = std::max(most_in_flight, area->bytes_in_flight());
    std::memset(staged, 0xEE, n);  // what a reused block may hold
    queued.push_back({staged, from, n});
  }
  Mark mark() { return long(queued.size()); }
  void wait(Mark m) {
    ++waits;
    if (m == fail_at) {  // the DMAs before it ran; it never will
      run_until(m - 1);
      ran = m;
      throw std::runtime_error("DMA " + std::to_string(m) + " failed");
    }
    run_until(m);
  }
  void run_until(long m) {
    for (; ran < m; ++ran) std::memcpy(queued[std::size_t(ran)].to, queued[std::size_t(ran)].from, queued[std::size_t(ran)].n);
  }
  std::size_t unstaged = 0;  // bytes copied without a pinned block
  void copy_unstaged(void* to, const void* from, std::size_t n) {
    std::memcpy(to, from, n);
    unstaged += n;
  }
};

// Page-locked memory that runs out after `limit` allocations.
struct ScarceMemory final : deft::engine::HostAllocator {
  explicit ScarceMemory(int limit) : left(limit) {}
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (left-- <= 0) throw std::runtime_error("cudaHostAlloc failed (test)");
    return heap.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override { heap.deallocate(p, bytes, alignment); }
  int left;
  deft::engine::DefaultHostAllocator heap;
};
}  // namespace

BOOST_AUTO_TEST_CASE(downloads_arrive_whole_through_two_blocks) {
  auto pool = staging_pool();
  Area area(pool, chunk, bound);
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(4095), chunk, chunk + 1, 5 * chunk + 17,
                              std::size_t(100000)}) {
    const auto src = random_bytes(n, unsigned(n) + 3);
    std::vector<unsigned char> dst(n, 0);
    DeferredSource source(&area);
    area.download(dst.data(), src.data(), n, source);
    BOOST_TEST((dst == src), "download of " << n << " bytes");
    const std::size_t chunks = (n + chunk - 1) / chunk;
    BOOST_TEST(source.waits == long(chunks));
    BOOST_TEST(area.bytes_in_flight() == 0u);               // every block went back
    BOOST_TEST(source.most_in_flight <= 2 * chunk, "n = " << n);  // this chunk's block and the one before
    // Chunk i + 1's DMA is queued before chunk i is waited for and copied out.
    for (std::size_t i = 1; i < source.waits_at_fetch.size(); ++i)
      BOOST_TEST(source.waits_at_fetch[i] == long(i) - 1, "fetch " << i << " of " << n << " bytes");
  }
}

BOOST_AUTO_TEST_CASE(a_failed_download_raises_after_the_chunks_before_it) {
  auto pool = staging_pool();
  Area area(pool, chunk, bound);
  const auto src = random_bytes(4 * chunk, 12);
  std::vector<unsigned char> dst(src.size(), 0);
  DeferredSource source(&area, 3);  // the third chunk's DMA fails
  BOOST_CHECK_EXCEPTION(area.download(dst.data(), src.data(), src.size(), source), std::runtime_error,
                        [](const std::runtime_error& e) { return std::string(e.what()) == "DMA 3 failed"; });
  BOOST_TEST(area.bytes_in_flight() == 0u);  // the failed chunk's and the next one's blocks went back
  BOOST_TEST(std::equal(src.begin(), src.begin() + 2 * chunk, dst.begin()));
  BOOST_TEST(source.waits == 4);  // the fourth chunk, queued already, was waited for before its block went back
  const auto stats = pool->stats();
  BOOST_TEST(stats.hits + stats.misses == 4u);
  BOOST_TEST(stats.cached_bytes == 2 * chunk);  // two blocks, both free again
}

// A download of a ready value must not wait for uploads, whose DMAs queue
// behind kernels: here the uploads fill the bound and never run.
BOOST_AUTO_TEST_CASE(downloads_do_not_wait_for_uploads) {
  DeferredQueue::reset();
  auto pool = staging_pool();
  Area area(pool, chunk, bound);
  DeferredQueue uploads;
  const auto up = random_bytes(bound, 21);
  std::vector<unsigned char> up_dst(bound, 0);
  area.upload(up_dst.data(), up.data(), up.size(), uploads);  // the bound is full
  BOOST_TEST(area.bytes_in_flight() == bound);
  const auto src = random_bytes(3 * chunk + 5, 22);
  std::vector<unsigned char> dst(src.size(), 0);
  DeferredSource source(&area);
  area.download(dst.data(), src.data(), src.size(), source);
  BOOST_TEST((dst == src));
  BOOST_TEST(DeferredQueue::waits == 0);     // no upload was waited for
  BOOST_TEST(DeferredQueue::ran == 0);
  BOOST_TEST(area.bytes_in_flight() == bound);  // the uploads' blocks, still waiting
  area.drain();
  BOOST_TEST((up_dst == up));
}

// Without page-locked memory (pinning failed), a download goes on through
// the driver's own staging from the chunk that got no block.
BOOST_AUTO_TEST_CASE(a_download_without_pinned_memory_goes_unstaged) {
  for (const int blocks : {0, 1, 2}) {
    auto pool = staging_pool(std::make_shared<ScarceMemory>(blocks));
    Area area(pool, chunk, bound);
    const auto src = random_bytes(4 * chunk, 30 + unsigned(blocks));  // chunks of one size: two blocks serve them all
    std::vector<unsigned char> dst(src.size(), 0);
    DeferredSource source(&area);
    area.download(dst.data(), src.data(), src.size(), source);
    BOOST_TEST((dst == src), blocks << " blocks");
    // Two blocks serve every chunk; with fewer, the rest from the first chunk without one.
    BOOST_TEST(source.unstaged == (blocks == 2 ? 0 : src.size() - std::size_t(blocks) * chunk), blocks << " blocks");
    BOOST_TEST(area.bytes_in_flight() == 0u);
  }
}

// The emulated backend stages a copy into pageable memory (to_vector, item)
// and copies straight into its stand-in for pinned memory.
BOOST_AUTO_TEST_CASE(copies_into_pageable_memory_are_staged) {
  auto& backend = deft::detail::gpu::emulated_backend();
  const auto v = gpu_tensors::random_values(10000, 43);  // 40 KB: three 16 KiB chunks
  deft::Tensor<float> g = deft::Tensor<float>(v, {100, 100}).to(deft::gpu(0));
  const long staged = backend.staged_downloads;
  deft::Tensor<float> pinned = g.to(deft::cpu());
  pinned.wait_to_read();
  BOOST_TEST(pinned.is_pinned());
  BOOST_TEST(backend.staged_downloads == staged);  // a DMA straight into the pinned tensor
  gpu_tensors::expect_near(g.to_vector(), std::vector<double>(v.begin(), v.end()), 0, "to_vector");
  BOOST_TEST(backend.staged_downloads == staged + 1);
  BOOST_TEST(deft::Tensor<float>(std::vector<float>{v[7]}, {1}).to(deft::gpu(1)).item() == v[7]);
  BOOST_TEST(backend.staged_downloads == staged + 2);
}

BOOST_AUTO_TEST_SUITE_END()

// Lanes (device/cuda/lanes.hpp): several streams per GPU, ordered by the memory
// each piece of work uses. Kernels run at once in the emulation, so the
// waits are checked by LaneClockChecker, which keeps the vector clocks a
// real GPU's streams would have and counts work not ordered after an
// earlier conflicting use of its memory (a race on a GPU).
namespace {

namespace gk = deft::detail::gpu;
using deft::detail::MemoryUses;
using deft::Tensor;

// Every test above and below ran its GPU work through the checker.
struct NoLaneRaces {
  void teardown() {
    auto& checker = gk::emulated_backend().checker();
    BOOST_TEST(checker.races.load() == 0, "lanes raced: " << checker.first_race());
  }
};

// The work queued on gpu(0)'s compute lanes so far.
std::array<long, gk::EmulatedBackend::compute_lanes> lane_work() {
  std::array<long, gk::EmulatedBackend::compute_lanes> n{};
  for (std::size_t k = 0; k < n.size(); ++k) n[k] = gk::emulated_backend().lane_work[k].load();
  return n;
}
// Per lane: how much was queued since `before`.
std::array<long, gk::EmulatedBackend::compute_lanes> queued_since(
    const std::array<long, gk::EmulatedBackend::compute_lanes>& before) {
  auto now = lane_work();
  for (std::size_t k = 0; k < now.size(); ++k) now[k] -= before[k];
  return now;
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(NoLaneRaces);

namespace {
// A tracker and the checker of its waits over `lanes` lanes, with two
// 64-byte blocks x and y; run() queues a piece of work on a lane.
struct CheckedLanes {
  explicit CheckedLanes(int lanes) : checker(lanes), tracker(lanes, {&checker}) {
    for (char* b : {x, y}) tracker.add_block(b, sizeof x), checker.add_block(b, sizeof x);
  }
  void run(int lane, const MemoryUses& uses) {
    tracker.before(lane, uses);
    tracker.after(lane, uses);
  }
  gk::LaneClockChecker checker;
  gk::LaneTracker<gk::LaneClockChecker::Ref> tracker;
  char x[64], y[64];
};
}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_lanes)

BOOST_AUTO_TEST_CASE(checker_sees_work_not_ordered_after_a_conflicting_use) {
  gk::LaneClockChecker c(3);
  static char block[256];
  c.add_block(block, sizeof block);
  c.queued(0, {{}, {block}});       // written on lane 0
  c.queued(0, {{block + 8}, {}});   // read on lane 0: after it by the lane's order
  BOOST_TEST(c.races.load() == 0);
  c.queued(1, {{block + 16}, {}});  // read on lane 1 without a wait
  BOOST_TEST(c.races.load() == 1);
  c.order(0, 1);
  c.queued(1, {{block}, {}});       // after a wait for lane 0
  BOOST_TEST(c.races.load() == 1);
  c.queued(2, {{}, {block}});       // a write on lane 2 after the write and reads on lanes 0 and 1
  BOOST_TEST(c.races.load() == 4);
  c.host_waited(2);                 // the host saw lane 2 finish: later work on any lane follows it
  c.queued(0, {{}, {block + 255}});
  BOOST_TEST(c.races.load() == 4);
  BOOST_TEST(!c.first_race().empty());
}

// A pool cutting and merging blocks (BlockReuse::split) hands memory out
// again through reissue: the range becomes one block with every earlier
// use of its memory, and parts in use at once keep their uses apart (in a
// shared record, one part's write would drop the other's uses).
BOOST_AUTO_TEST_CASE(reissued_memory_keeps_its_uses_and_parts_stay_apart) {
  gk::UseRecord record;
  static char segment[1024];
  record.add_block(segment, sizeof segment);
  const auto conflicts = [&](const MemoryUses& uses) {
    std::vector<std::pair<int, std::uint64_t>> seen;
    record.for_each_conflict(uses, [&](const gk::LaneUse& u) {
      if (u.lane >= 0) seen.emplace_back(u.lane, u.count);
    });
    std::ranges::sort(seen);
    return seen;
  };
  using Seen = std::vector<std::pair<int, std::uint64_t>>;
  record.record({1, 5}, {{}, {segment}});         // lane 1 writes the whole allocation
  record.record({2, 3}, {{segment + 600}, {}});   // lane 2 reads it
  record.reissue(segment, 512);                   // the pool hands out its first half...
  record.reissue(segment + 512, 256);             // ...and part of the rest
  BOOST_TEST((conflicts({{}, {segment}}) == Seen{{1, 5}, {2, 3}}), "a part's first write waits for every earlier use");
  record.record({3, 1}, {{}, {segment}});         // lane 3 writes the first part
  record.record({4, 1}, {{}, {segment + 512}});   // lane 4 writes the second
  BOOST_TEST((conflicts({{segment + 100}, {}}) == Seen{{3, 1}}));
  BOOST_TEST((conflicts({{segment + 700}, {}}) == Seen{{4, 1}}));
  BOOST_TEST((conflicts({{}, {segment + 900}}) == Seen{{1, 5}, {2, 3}}), "the rest keeps the uses it had");
  record.reissue(segment, sizeof segment);        // all freed, merged and handed out whole
  BOOST_TEST((conflicts({{}, {segment + 1000}}) == Seen{{1, 5}, {2, 3}, {3, 1}, {4, 1}}));
  record.reissue(segment, sizeof segment);        // handed out whole again: nothing changes
  BOOST_TEST((conflicts({{}, {segment}}) == Seen{{1, 5}, {2, 3}, {3, 1}, {4, 1}}));
  record.remove_block(segment, sizeof segment);   // given back to the device
  BOOST_TEST(conflicts({{}, {segment}}).empty());
}

// Random work on 6 lanes over 5 blocks, with host waits now and then, and
// then again with marks made after a third of the pieces (as the engine
// marks each GPU buffer after its writer): the tracker's waits leave no
// race; work on one lane needs none.
BOOST_AUTO_TEST_CASE(tracker_orders_random_work_on_many_lanes) {
  constexpr int lanes = 6;
  static std::array<std::array<char, 64>, 5> memory;
  for (const bool with_marks : {false, true}) {  // with marks, some waits are for a mark after a use, not for the lane
    gk::LaneClockChecker checker(lanes);
    gk::LaneTracker<gk::LaneClockChecker::Ref> tracker(lanes, {&checker});
    for (auto& b : memory) tracker.add_block(b.data(), b.size()), checker.add_block(b.data(), b.size());
    std::mt19937 rng(7);
    long work = 0;
    std::vector<std::shared_ptr<void>> marks;
    for (int i = 0; i < 5000; ++i) {
      const int lane = int(rng() % lanes);
      if (rng() % 50 == 0) {  // the host waits for a lane
        tracker.host_waits(lane, [&] { checker.host_waited(lane); });
        continue;
      }
      MemoryUses uses;
      for (auto& b : memory) {
        const auto pick = rng() % 6;
        if (pick == 0) uses.writes.push_back(b.data() + rng() % b.size());
        else if (pick < 3) uses.reads.push_back(b.data() + rng() % b.size());
      }
      const long races = checker.races.load();
      tracker.before(lane, uses);
      tracker.after(lane, uses);
      if (with_marks && rng() % 3 == 0)  // a buffer's ready mark; now and then the host waits for one
        marks.push_back(tracker.mark(lane, [] { return std::make_shared<int>(0); }));
      if (!marks.empty() && rng() % 40 == 0) tracker.finished_mark(marks[rng() % marks.size()].get(), 0, lanes);
      BOOST_REQUIRE_MESSAGE(checker.races.load() == races, "work " << work << ": " << checker.first_race());
      ++work;
    }
    BOOST_TEST_MESSAGE("waits: " << tracker.waits() << ", for marks: " << tracker.marked_waits()
                                 << (with_marks ? "" : " (no marks)"));
    BOOST_TEST(tracker.waits() > 100u);
    BOOST_TEST((tracker.marked_waits() > 100u) == with_marks);
  }
  // The same work on one lane needs no waits at all.
  gk::LaneClockChecker one_checker(1);
  gk::LaneTracker<gk::LaneClockChecker::Ref> one(1, {&one_checker});
  for (auto& b : memory) one.add_block(b.data(), b.size()), one_checker.add_block(b.data(), b.size());
  for (int i = 0; i < 200; ++i) {
    const MemoryUses uses{{memory[std::size_t(i) % 5].data()}, {memory[std::size_t(i + 1) % 5].data()}};
    one.before(0, uses);
    one.after(0, uses);
  }
  BOOST_TEST(one.waits() == 0u);
  BOOST_TEST(one_checker.races.load() == 0);
}

// A reader on another lane waits for the mark made after its input's
// writer, not for work the writer's lane queued later: the checker's clock
// of the reader's lane then does not cover that later work, and a second
// reader of the later work's output waits again.
BOOST_AUTO_TEST_CASE(a_wait_for_a_marked_write_leaves_later_work_out) {
  CheckedLanes l(2);
  const auto make = [] { return std::make_shared<int>(0); };
  l.run(0, {{}, {l.x}});  // lane 0 writes x, and the engine marks x
  const auto x_ready = l.tracker.mark(0, make);
  BOOST_TEST(x_ready != nullptr);
  l.run(0, {{l.x}, {l.y}});  // lane 0 goes on: y from x, unmarked
  l.run(1, {{l.x}, {}});    // lane 1 reads x: waits for x's mark only
  BOOST_TEST(l.tracker.waits() == 1u);
  BOOST_TEST(l.tracker.marked_waits() == 1u);
  l.run(1, {{l.y}, {}});  // y's writer came after the mark: another wait, for the lane
  BOOST_TEST(l.tracker.waits() == 2u);
  BOOST_TEST(l.tracker.marked_waits() == 1u);
  l.run(0, {{}, {l.x}});  // x written again after lane 1's read: lane 0 waits for it
  BOOST_TEST(l.tracker.waits() == 3u);
  BOOST_TEST(l.checker.races.load() == 0, l.checker.first_race());
  (void)l.tracker.mark(0, make);  // after x's second write
  l.run(0, {{}, {l.y}});          // more work on lane 0
  l.run(1, {{l.x}, {}});          // lane 1 reads the new x: waits for its mark, not for y's write
  BOOST_TEST(l.tracker.marked_waits() == 2u);
  l.run(1, {{l.y}, {}});
  BOOST_TEST(l.tracker.waits() == 5u);
  BOOST_TEST(l.checker.races.load() == 0, l.checker.first_race());
  // The host saw a mark finish: the work before it needs no waits, later work does.
  l.run(0, {{}, {l.x}});
  const auto seen = l.tracker.mark(0, make);
  l.run(0, {{}, {l.y}});
  BOOST_TEST(l.tracker.waits() == 6u);  // the write of x waited for lane 1's read
  l.tracker.finished_mark(seen.get(), 0, 2);
  l.tracker.finished_mark(&l.tracker, 0, 2);  // not a mark: nothing
  l.run(1, {{l.x}, {}});
  BOOST_TEST(l.tracker.waits() == 6u);
  l.run(1, {{l.y}, {}});
  BOOST_TEST(l.tracker.waits() == 7u);
  BOOST_TEST(l.checker.races.load() == 0, l.checker.first_race());
}

// The host waiting for a whole lane (a copy to the host waits for the copy
// lane) also sees the work that lane waited for finish: a third lane then
// reads the copied block without a wait. Work queued after the host's wait
// began is not covered.
BOOST_AUTO_TEST_CASE(a_host_wait_for_a_lane_covers_what_it_followed) {
  CheckedLanes l(3);
  l.run(0, {{}, {l.x}});  // lane 0 writes x
  l.run(1, {{l.x}, {}});  // lane 1 (the copy lane) reads x: waits for lane 0
  BOOST_TEST(l.tracker.waits() == 1u);
  int host_waits = 0;
  l.tracker.host_waits(1, [&] {
    ++host_waits;
    l.checker.host_waited(1);
    l.run(0, {{}, {l.y}});  // queued on lane 0 while the host waits: not seen finish
  });
  BOOST_TEST(host_waits == 1);
  l.run(2, {{l.x}, {}});  // lane 2 reads x: its writer is done
  BOOST_TEST(l.tracker.waits() == 1u);
  l.run(2, {{l.y}, {}});  // y's writer may still run
  BOOST_TEST(l.tracker.waits() == 2u);
  // A wait that throws tells the tracker nothing.
  l.run(0, {{}, {l.x}});  // waits for lane 2's read of x
  l.run(1, {{l.x}, {}});
  const auto waits = l.tracker.waits();
  BOOST_CHECK_THROW(l.tracker.host_waits(1, [] { throw std::runtime_error("a kernel failed"); }), std::runtime_error);
  l.run(2, {{l.x}, {}});
  BOOST_TEST(l.tracker.waits() == waits + 1);
  BOOST_TEST(l.checker.races.load() == 0, l.checker.first_race());
}

// A wait for a lane orders the waiting lane after every lane that one
// follows: a lane needing work of lanes 0 and 1, where lane 1 already
// waited for lane 0's, waits once.
BOOST_AUTO_TEST_CASE(a_wait_for_a_lane_covers_the_lanes_it_follows) {
  CheckedLanes l(3);
  l.run(0, {{}, {l.x}});   // lane 0 writes x
  l.run(1, {{l.x}, {}});   // lane 1 reads it: waits for lane 0
  l.run(1, {{}, {l.y}});   // and writes y
  BOOST_TEST(l.tracker.waits() == 1u);
  l.run(2, {{l.x, l.y}, {}});  // lane 2 reads both: one wait, for lane 1, covers lane 0's write of x
  BOOST_TEST(l.tracker.waits() == 2u);
  l.run(2, {{l.x}, {}});
  BOOST_TEST(l.tracker.waits() == 2u);
  l.run(0, {{}, {l.x}});   // lane 0 writes x again, after lane 1's and lane 2's reads
  BOOST_TEST(l.tracker.waits() == 3u, "lane 2 followed lane 1 after its read of x, so one wait covers both");
  BOOST_TEST(l.checker.races.load() == 0, l.checker.first_race());
}

// A chain of statements stays on one lane; two chains forked from one
// tensor run on two lanes, and their join waits for the other lane.
BOOST_AUTO_TEST_CASE(chains_keep_their_lane_and_forks_spread) {
  auto& backend = gk::emulated_backend();
  const auto v = gpu_tensors::random_values(4096, 51);
  deft::Tensor<float> x = deft::Tensor<float>(v, {4096}).to(deft::gpu(0));
  x.wait_to_read();

  auto start = lane_work();
  deft::Tensor<float> y = x * 2.0f;
  for (int i = 0; i < 10; ++i) y = y * 0.5f + 1.0f;
  y.wait_to_read();
  auto n = queued_since(start);
  BOOST_TEST(std::ranges::count(n, 0) == int(n.size()) - 1);  // one lane did it all
  BOOST_TEST(std::ranges::max(n) == 11);

  start = lane_work();
  const auto waits = backend.tracker().waits();
  deft::Tensor<float> a = x * 2.0f, b = x + 1.0f;  // a fork: two readers of x
  for (int i = 0; i < 5; ++i) {
    a = a * 0.5f + 1.0f;
    b = b * 1.5f - 1.0f;
  }
  deft::Tensor<float> joined = a + b;
  const auto got = joined.to_vector();
  n = queued_since(start);
  BOOST_TEST(std::ranges::count(n, 0) == int(n.size()) - 2);  // two lanes
  BOOST_TEST(std::ranges::max(n) >= 6);
  BOOST_TEST(backend.tracker().waits() > waits);  // the join waited for the other lane
  std::vector<double> want(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    double p = double(v[i]) * 2, q = double(v[i]) + 1;
    for (int k = 0; k < 5; ++k) p = p * 0.5 + 1, q = q * 1.5 - 1;
    want[i] = p + q;
  }
  gpu_tensors::expect_near(got, want, 1e-5, "fork and join");
}

// A second reader of x, on another lane than x's writer, waits for x's
// ready mark, not for the first reader's kernels queued on x's lane since.
// Once the host waited for both readers' marks, work reading both needs no
// wait on the device.
BOOST_AUTO_TEST_CASE(a_second_reader_waits_for_its_inputs_mark) {
  auto& backend = gk::emulated_backend();
  const long races = backend.checker().races.load();
  const auto v = gpu_tensors::random_values(4096, 52);
  const auto marked = backend.tracker().marked_waits();
  deft::engine::set_mode(deft::engine::Mode::synchronous);  // tasks run as recorded: a fixed order
  const deft::Tensor<float> x = deft::Tensor<float>(v, {4096}).to(deft::gpu(0)) * 3.0f;
  const deft::Tensor<float> y = x * 2.0f;  // goes on on x's lane
  const deft::Tensor<float> w = x + 1.0f;  // the fork: the next lane
  deft::engine::set_mode(deft::engine::Mode::deferred);
  BOOST_TEST(backend.tracker().marked_waits() >= marked + 1);  // (x's block may have had uses of its own on other lanes)
  y.wait_to_read();
  w.wait_to_read();
  const auto waits = backend.tracker().waits();
  const deft::Tensor<float> both = y + w;  // on y's lane or w's: the other's work is done
  both.wait_to_read();
  BOOST_TEST(backend.tracker().waits() == waits);
  std::vector<double> want_w(v.size()), want_y(v.size()), want_both(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    want_w[i] = double(v[i]) * 3 + 1, want_y[i] = double(v[i]) * 3 * 2;
    want_both[i] = want_w[i] + want_y[i];
  }
  gpu_tensors::expect_near(w.to_vector(), want_w, 1e-6, "the second reader");
  gpu_tensors::expect_near(y.to_vector(), want_y, 1e-6, "the first reader");
  gpu_tensors::expect_near(both.to_vector(), want_both, 1e-6, "both");
  BOOST_TEST(backend.checker().races.load() == races, backend.checker().first_race());
}

// A write in place after readers on other lanes, and a freed block handed
// to a writer on another lane, wait for those uses (the checker sees each).
BOOST_AUTO_TEST_CASE(writes_wait_for_earlier_uses_on_other_lanes) {
  auto& backend = gk::emulated_backend();
  const auto v = gpu_tensors::random_values(8192, 52);
  deft::Tensor<float> x = deft::Tensor<float>(v, {8192}).to(deft::gpu(0));
  // Tasks run as recorded, so the readers are done with x (queued) before
  // x += 1 is recorded, and the host waited for none of it.
  deft::engine::set_mode(deft::engine::Mode::synchronous);
  deft::Tensor<float> a = x * 3.0f, b = x - 2.0f;  // readers of x on two lanes
  const auto waits = backend.tracker().waits();
  x += 1.0f;  // in place, on x's lane, after b's read on another
  deft::engine::set_mode(deft::engine::Mode::deferred);
  BOOST_TEST(backend.tracker().waits() > waits);
  b = deft::Tensor<float>();  // its block goes back to the pool...
  deft::Tensor<float> c = a * 0.25f;  // ...and comes out for a writer, perhaps on another lane
  const auto xs = x.to_vector(), cs = c.to_vector();
  std::vector<double> want_x(v.size()), want_c(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) want_x[i] = double(v[i]) + 1, want_c[i] = double(v[i]) * 3 * 0.25;
  gpu_tensors::expect_near(xs, want_x, 1e-6, "x += 1");
  gpu_tensors::expect_near(cs, want_c, 1e-6, "a * 0.25");
}

// engine::Limits::gpu_lanes = 1 puts every task on lane 0, as one stream.
BOOST_AUTO_TEST_CASE(one_lane_when_the_limits_say_so) {
  const auto saved = deft::engine::limits();
  auto one = saved;
  one.gpu_lanes = 1;
  deft::engine::set_limits(one);
  const auto start = lane_work();
  const auto v = gpu_tensors::random_values(1024, 53);
  deft::Tensor<float> x = deft::Tensor<float>(v, {1024}).to(deft::gpu(0));
  deft::Tensor<float> a = x * 2.0f, b = x + 1.0f, c = a * b;
  c.wait_to_read();
  deft::engine::set_limits(saved);
  const auto n = queued_since(start);
  BOOST_TEST(n[0] == 4);
  BOOST_TEST(n[1] + n[2] == 0);
  auto bad = saved;
  bad.gpu_lanes = 0;
  BOOST_CHECK_THROW(deft::engine::set_limits(bad), std::invalid_argument);
}

// Each GPU takes its own turn of lanes: work alternating between two
// devices spreads over both lanes of each (one turn shared by the devices
// would give each device every other lane, here always the same one).
BOOST_AUTO_TEST_CASE(each_device_takes_its_own_turn_of_lanes) {
  const auto saved = deft::engine::limits();
  auto two = saved;
  two.gpu_lanes = 2;
  deft::engine::set_limits(two);
  deft::engine::set_mode(deft::engine::Mode::synchronous);  // tasks run as recorded: a fixed order
  std::array<long, gk::EmulatedBackend::devices * gk::EmulatedBackend::compute_lanes> before{};
  auto& work = gk::emulated_backend().lane_work;
  for (std::size_t k = 0; k < work.size(); ++k) before[k] = work[k].load();
  std::vector<Tensor<float>> roots;
  for (int i = 0; i < 8; ++i) roots.push_back(deft::full<float>({256}, float(i), deft::gpu(i % 2)));
  deft::engine::set_mode(deft::engine::Mode::deferred);
  deft::engine::set_limits(saved);
  for (int d = 0; d < 2; ++d)
    for (int k = 0; k < 2; ++k) {
      const std::size_t slot = std::size_t(d * gk::EmulatedBackend::compute_lanes + k);
      BOOST_TEST(work[slot].load() - before[slot] == 2, "gpu(" << d << ") lane " << k);
    }
  for (int i = 0; i < 8; ++i) BOOST_TEST(roots[std::size_t(i)].to_vector()[255] == float(i));
}

namespace {
struct Index {
  float operator()(std::int64_t i) const { return float(i); }
};
}  // namespace

// A copy to the host waits on the host for its copy lane, so it takes the
// one paired with the lane that wrote its source, from any thread; the
// lanes' record orders it after that write, and a later write in place
// after the copy's read (the checker sees a missing wait).
BOOST_AUTO_TEST_CASE(copies_to_the_host_take_their_writers_copy_lane) {
  auto& backend = gk::emulated_backend();
  auto& checker = backend.checker();
  const long races = checker.races.load();
  auto pool = backend.memory(0);
  constexpr std::int64_t n = 1024;
  constexpr std::size_t bytes = n * sizeof(float);
  auto* on1 = static_cast<float*>(pool->allocate(bytes, 64));
  auto* on2 = static_cast<float*>(pool->allocate(bytes, 64));
  const deft::detail::Executor<deft::DeviceType::gpu> gpu0{0};
  {
    deft::detail::LaneScope on(0, 1);
    gpu0.generate(n, Index{}, on1);
  }
  {
    deft::detail::LaneScope on(0, 2);
    gpu0.generate(n, Index{}, on2);
  }
  auto& copies = backend.copies_to_host;
  std::array<long, gk::EmulatedBackend::compute_lanes> before{};
  for (std::size_t k = 0; k < before.size(); ++k) before[k] = copies[k].load();
  std::vector<float> a(n), b(n);
  backend.copy(a.data(), deft::cpu(), on1, deft::gpu(0), bytes);  // the user's thread: no lane of its own
  std::thread([&] {
    deft::detail::LaneScope on(0, 0);  // a worker on lane 0
    backend.copy(b.data(), deft::cpu(), on2, deft::gpu(0), bytes);
  }).join();
  BOOST_TEST(copies[0].load() - before[0] == 0);
  BOOST_TEST(copies[1].load() - before[1] == 1);
  BOOST_TEST(copies[2].load() - before[2] == 1);
  {
    deft::detail::LaneScope on(0, 0);
    gpu0.generate(n, Index{}, on1);  // in place, after the copy's read on copy lane 1
  }
  BOOST_TEST(checker.races.load() == races, checker.first_race());
  for (std::int64_t i = 0; i < n; i += 97) BOOST_TEST((a[std::size_t(i)] == float(i) && b[std::size_t(i)] == float(i)));
  backend.synchronize(0);
  pool->deallocate(on1, bytes, 64);
  pool->deallocate(on2, bytes, 64);
}

// Through the engine: two values computed on two lanes are read back on
// two copy lanes (to_vector runs on the user's thread, which has no lane).
BOOST_AUTO_TEST_CASE(values_from_two_lanes_are_read_on_two_copy_lanes) {
  const Tensor<float> x = deft::full<float>({512}, 1.5f, deft::gpu(0)), y = deft::full<float>({512}, 2.5f, deft::gpu(0));
  x.wait_to_read(), y.wait_to_read();
  auto& copies = gk::emulated_backend().copies_to_host;
  std::array<long, gk::EmulatedBackend::compute_lanes> before{};
  for (std::size_t k = 0; k < before.size(); ++k) before[k] = copies[k].load();
  BOOST_TEST(x.to_vector()[511] == 1.5f);
  BOOST_TEST(y.to_vector()[511] == 2.5f);
  int lanes_used = 0;
  for (std::size_t k = 0; k < before.size(); ++k) {
    BOOST_TEST(copies[k].load() - before[k] <= 1);
    lanes_used += copies[k].load() > before[k];
  }
  BOOST_TEST(lanes_used == 2);
}

BOOST_AUTO_TEST_SUITE_END()

// Device programs (device/program.hpp): a hybridized forward on a GPU
// replays as one program, a CUDA graph on a real GPU. An emulated launch
// runs the recorded work again and raises if it touches memory the program
// was not recorded with, which a graph's baked-in addresses would miss.
namespace {

struct ProgramCounts {
  long recorded, launched;
};
ProgramCounts program_counts() {
  auto& b = gk::emulated_backend();
  return {b.programs_recorded.load(), b.program_launches.load()};
}

// A forward with a reduction (its scratch block is kept by the program) and
// a fork and join: y = relu(x - mean(x)) * 2 + (x - mean(x)).
struct Centered : deft::nn::Block {
  Centered() : Block("centered") {}
  Tensor<float> forward(const Tensor<float>& x) override {
    const Tensor<float> c = x - deft::mean(x);
    const Tensor<float> a = deft::relu(c) * 2.0f;
    return a + c;
  }
};
std::vector<double> centered_reference(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m += v;
  m /= double(x.size());
  std::vector<double> y;
  for (float v : x) y.push_back(std::max(double(v) - m, 0.0) * 2 + (double(v) - m));
  return y;
}

// out[i] = v (Executor<gpu>::generate's function).
struct Constant {
  float v;
  float operator()(std::int64_t) const { return v; }
};

// A forward that uploads a host constant each call: no program can repeat it.
struct PlusHostConstant : deft::nn::Block {
  PlusHostConstant() : Block("plus_host_constant") {}
  Tensor<float> forward(const Tensor<float>& x) override {
    const std::vector<float> ones(std::size_t(x.shape().size()), 1.0f);
    return x * 3.0f + Tensor<float>(ones, x.shape()).to(x.device());
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_programs)

// The first call traces, the second records the program (and runs it), the
// later ones launch it; with cuda_graph off nothing is recorded.
BOOST_AUTO_TEST_CASE(a_hybridized_forward_replays_as_one_program) {
  for (const bool graph : {true, false}) {
    Centered block;
    block.hybridize(true, {.cuda_graph = graph});
    const auto before = program_counts();
    for (int call = 0; call < 5; ++call) {
      const auto x = gpu_tensors::random_values(3000, 70 + unsigned(call));
      const Tensor<float> y = block(Tensor<float>(x, {3000}).to(deft::gpu(1)));
      gpu_tensors::expect_near(y.to_vector(), centered_reference(x), 1e-5, "centered forward");
    }
    const auto after = program_counts();
    BOOST_TEST(after.recorded - before.recorded == (graph ? 1 : 0));
    BOOST_TEST(after.launched - before.launched == (graph ? 3 : 0));
    BOOST_TEST(block.traces() == 1);
    BOOST_TEST(block.cuda_graphs() == (graph ? 1 : 0));
  }
}

// A forward that copies from the host records no program; its replays run
// kernel by kernel and stay right.
BOOST_AUTO_TEST_CASE(forwards_that_copy_from_the_host_replay_kernel_by_kernel) {
  PlusHostConstant block;
  block.hybridize();
  const auto before = program_counts();
  for (int call = 0; call < 4; ++call) {
    const auto x = gpu_tensors::random_values(500, 80 + unsigned(call));
    const auto y = block(Tensor<float>(x, {500}).to(deft::gpu(0))).to_vector();
    std::vector<double> want;
    for (float v : x) want.push_back(double(v) * 3 + 1);
    gpu_tensors::expect_near(y, want, 1e-6, "x * 3 + an uploaded constant");
  }
  BOOST_TEST(program_counts().recorded == before.recorded);
  BOOST_TEST(program_counts().launched == before.launched);
  BOOST_TEST(block.cuda_graphs() == 0);
}

// A small LeNet (convolutions take scratch blocks and products, pooling,
// dense layers) replayed as one program gives what its imperative forward
// gave, at every launch.
BOOST_AUTO_TEST_CASE(a_convolutional_forward_replays_as_one_program) {
  namespace nn = deft::nn;
  deft::random::seed(17);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2D>(4, 3, 1, 1, nn::Act::relu), std::make_shared<nn::MaxPool2D>(2),
           std::make_shared<nn::Conv2D>(6, 3, 1, 0, nn::Act::relu), std::make_shared<nn::AvgPool2D>(2),
           std::make_shared<nn::Flatten>(), std::make_shared<nn::Dense>(10));
  net->initialize(nn::init::xavier(), {deft::gpu(0)});
  std::vector<Tensor<float>> xs;
  std::vector<std::vector<float>> imperative;
  for (unsigned k = 0; k < 3; ++k) {
    xs.push_back(Tensor<float>(gpu_tensors::random_values(2 * 2 * 12 * 12, 90 + k), {2, 2, 12, 12}).to(deft::gpu(0)));
    imperative.push_back((*net)(xs.back()).to_vector());
  }
  net->hybridize();
  const auto before = program_counts();
  for (int call = 0; call < 7; ++call) {
    const auto got = (*net)(xs[std::size_t(call) % 3]).to_vector();
    BOOST_TEST(got == imperative[std::size_t(call) % 3], boost::test_tools::per_element());
  }
  BOOST_TEST(program_counts().recorded - before.recorded == 1);
  BOOST_TEST(program_counts().launched - before.launched == 5);
  BOOST_TEST(net->cuda_graphs() == 1);
}

// A launch that would touch other memory than the recording did, or ask for
// other scratch, is an error (a graph would use the recorded addresses).
BOOST_AUTO_TEST_CASE(a_launch_on_other_memory_is_refused) {
  auto& backend = gk::emulated_backend();
  auto pool = backend.memory(0);
  void* a = pool->allocate(4096, 64);
  void* b = pool->allocate(4096, 64);
  void* target = a;
  std::int64_t scratch_elements = 16;
  const deft::detail::Executor<deft::DeviceType::gpu> on{0};
  auto program = backend.record(0, [&] {
    on.generate(1024, Constant{2.0f}, static_cast<float*>(target));
    gk::Scratch<float> scratch(0, scratch_elements);
  });
  BOOST_REQUIRE(program);
  BOOST_TEST(static_cast<float*>(a)[1023] == 2.0f);
  program->launch();  // the same memory: fine
  target = b;
  BOOST_CHECK_EXCEPTION(program->launch(), std::logic_error, [](const std::logic_error& e) {
    return std::string(e.what()).find("memory it was not recorded with") != std::string::npos;
  });
  target = a;
  scratch_elements = 64;
  BOOST_CHECK_EXCEPTION(program->launch(), std::logic_error, [](const std::logic_error& e) {
    return std::string(e.what()).find("scratch memory it was not recorded with") != std::string::npos;
  });
  // Copies to or from the host and work for another device cannot record.
  std::vector<float> host(1024);
  BOOST_CHECK_THROW(backend.record(0, [&] { deft::detail::copy_bytes(a, deft::gpu(0), host.data(), deft::cpu(), 4096); }),
                    deft::detail::NotRecordable);
  BOOST_CHECK_THROW(backend.record(0, [&] { deft::detail::copy_bytes(host.data(), deft::cpu(), a, deft::gpu(0), 4096); }),
                    deft::detail::NotRecordable);
  const deft::detail::Executor<deft::DeviceType::gpu> on_other{1};
  BOOST_CHECK_THROW(backend.record(0, [&] { on_other.generate(4, Constant{1.0f}, static_cast<float*>(b)); }),
                    deft::detail::NotRecordable);
  program.reset();
  backend.synchronize(0);
  pool->deallocate(a, 4096, 64);
  pool->deallocate(b, 4096, 64);
}

BOOST_AUTO_TEST_SUITE_END()

// Frees that could end a CUDA-graph capture (cudaFree, cudaFreeHost) wait
// for the recordings (FreeGate): the CUDA upstreams and the emulated
// devices' memory share the gate.
namespace {

struct CountingGate final : gk::FreeGate {
  std::mutex m;
  std::vector<void*> released;
  std::function<void()> before_release;
  void release(void* p, std::size_t, std::size_t) noexcept override {
    if (before_release) before_release();
    std::lock_guard lk(m);
    released.push_back(p);
  }
  std::vector<void*> seen() {
    std::lock_guard lk(m);
    return released;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_free_gate)

BOOST_AUTO_TEST_CASE(frees_during_recordings_wait_for_the_last_to_end) {
  CountingGate gate;
  int blocks[3];
  gate.free_or_park(&blocks[0], 64, 64);
  BOOST_TEST(gate.seen() == std::vector<void*>{&blocks[0]});  // no recording: freed at once
  {
    std::optional<gk::FreeGate::Capturing> first(std::in_place, gate);
    gk::FreeGate::Capturing second(gate);  // two devices record at once (page-locked memory's gate)
    gate.free_or_park(&blocks[1], 64, 64);
    gate.free_or_park(&blocks[2], 64, 64);
    BOOST_TEST(gate.parked() == 2u);
    first.reset();
    BOOST_TEST(gate.parked() == 2u);  // the other recording still runs
    BOOST_TEST(gate.seen().size() == 1u);
  }
  BOOST_TEST(gate.parked() == 0u);
  BOOST_TEST(gate.seen() == (std::vector<void*>{&blocks[0], &blocks[1], &blocks[2]}));
}

BOOST_AUTO_TEST_CASE(a_recording_starts_once_the_frees_under_way_end) {
  CountingGate gate;
  std::promise<void> go;
  std::shared_future<void> going = go.get_future().share();
  std::atomic<bool> freeing{false}, recording{false};
  gate.before_release = [&] {
    freeing = true;
    going.wait();
  };
  int block;
  std::thread frees([&] { gate.free_or_park(&block, 64, 64); });
  while (!freeing) std::this_thread::yield();
  std::thread records([&] {
    gk::FreeGate::Capturing capture(gate);
    recording = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  BOOST_TEST(!recording);  // cudaFree is waiting for the device: a capture now would end
  go.set_value();
  frees.join();
  records.join();
  BOOST_TEST(recording);
  BOOST_TEST(gate.seen() == std::vector<void*>{&block});
}

// An emulated device's block, and a page-locked one, given back to the
// "driver" while a program records on gpu(1) stay until the recording ends
// (the lanes still know the device's); gpu(0)'s go back at once.
BOOST_AUTO_TEST_CASE(blocks_freed_while_recording_are_parked) {
  auto& backend = gk::emulated_backend();
  const std::size_t bytes = std::size_t(8) << 20;  // an upstream allocation of its own
  const auto give_back = [&](deft::engine::CachingHostAllocator& pool) {
    void* p = pool.allocate(bytes, 64);
    pool.deallocate(p, bytes, 64);
    pool.release();  // the free block goes back upstream
  };
  std::size_t parked_device = 0, parked_pinned = 0, parked_other = 1;
  const auto program = backend.record(1, [&] {
    give_back(backend.pool(1));
    give_back(backend.pinned_pool());
    give_back(backend.pool(0));
    parked_device = backend.upstream(1).parked();
    parked_pinned = backend.pinned_upstream().parked();
    parked_other = backend.upstream(0).parked();
  });
  BOOST_TEST(parked_device >= 1u);
  BOOST_TEST(parked_pinned >= 1u);
  BOOST_TEST(parked_other == 0u);  // no recording on gpu(0)
  BOOST_TEST(backend.upstream(1).parked() == 0u);
  BOOST_TEST(backend.pinned_upstream().parked() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

// Sums across GPUs (allreduce through the backend's collective; NCCL on
// CUDA): parts on distinct emulated GPUs are summed by one collective task
// and take the sums as their new versions, without copies.
namespace {

long collective_sums() { return gk::emulated_backend().collective_sums.load(); }

// Turns the emulated collective off while it lives: allreduce sums through copies.
struct WithoutCollectives {
  WithoutCollectives() { gk::emulated_backend().collectives = false; }
  ~WithoutCollectives() { gk::emulated_backend().collectives = true; }
};

template <class T>
std::vector<Tensor<T>> random_parts(const std::vector<deft::Device>& devices, deft::Shape shape, unsigned seed) {
  std::vector<Tensor<T>> parts;
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const auto v = gpu_tensors::random_values<T>(shape.size(), seed + unsigned(d), -100, 100);
    parts.push_back(Tensor<T>(v, shape).to(devices[d]));
  }
  return parts;
}
template <class T>
std::vector<double> sum_of(const std::vector<std::vector<T>>& before) {
  std::vector<double> s(before[0].size(), 0.0);
  for (const auto& b : before)
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += double(b[i]);
  return s;
}

std::shared_ptr<deft::nn::Sequential> two_layer_net() {
  auto net = std::make_shared<deft::nn::Sequential>();
  net->add(std::make_shared<deft::nn::Dense>(12, deft::nn::Act::relu), std::make_shared<deft::nn::Dense>(3));
  return net;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_collectives)

const std::vector<deft::Device> both_gpus = {deft::gpu(0), deft::gpu(1)};

// Every part ends with the same bits, the sum of the parts (against a double
// loop: |error| <= 1e-6 of the sum of magnitudes for float, exact for
// int64); another handle of a part's storage sees the sum; a reader
// recorded before the allreduce still reads the old value.
BOOST_AUTO_TEST_CASE(allreduce_over_two_gpus_is_one_collective) {
  const long races = gk::emulated_backend().checker().races.load();
  auto parts = random_parts<float>(both_gpus, {7, 33}, 300);
  std::vector<std::vector<float>> before;
  for (const auto& p : parts) before.push_back(p.to_vector());
  const Tensor<float> alias = parts[1];     // shares part 1's storage
  const Tensor<float> earlier = parts[0] * 2.0f;  // recorded before: reads the old part 0
  const long sums = collective_sums();
  deft::allreduce(parts);
  BOOST_TEST(collective_sums() == sums);  // deferred: nothing ran yet
  const auto got0 = parts[0].to_vector(), got1 = parts[1].to_vector();
  BOOST_TEST(collective_sums() == sums + 1);
  BOOST_TEST(parts[0].device() == deft::gpu(0));
  BOOST_TEST(parts[1].device() == deft::gpu(1));
  BOOST_TEST(got0 == got1, boost::test_tools::per_element());
  BOOST_TEST(alias.to_vector() == got1, boost::test_tools::per_element());
  const auto want = sum_of(before);
  for (std::size_t i = 0; i < want.size(); ++i)
    BOOST_TEST(std::abs(got0[i] - want[i]) <= 1e-6 * (std::abs(before[0][i]) + std::abs(before[1][i])) + 1e-30);
  const auto old = earlier.to_vector();
  for (std::size_t i = 0; i < old.size(); ++i) BOOST_TEST(old[i] == before[0][i] * 2.0f);

  auto exact = random_parts<std::int64_t>(both_gpus, {100}, 310);
  std::vector<std::vector<std::int64_t>> ints;
  for (const auto& p : exact) ints.push_back(p.to_vector());
  deft::allreduce(exact);
  for (const auto& p : exact) {
    const auto got = p.to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(got[i] == ints[0][i] + ints[1][i]);
  }
  BOOST_TEST(collective_sums() == sums + 2);
  BOOST_TEST(gk::emulated_backend().checker().races.load() == races, gk::emulated_backend().checker().first_race());
}

// Parts the collective cannot take sum through copies, to the same result:
// a mix of the host and a GPU, two parts on one GPU, a part that is a view
// of a larger tensor (which then holds the sum in its rows), and any parts
// when the backend has no collective.
BOOST_AUTO_TEST_CASE(other_parts_sum_through_copies) {
  const long sums = collective_sums();
  const std::vector<std::vector<deft::Device>> layouts = {
      {deft::cpu(), deft::gpu(0)}, {deft::gpu(1), deft::gpu(1)}, {deft::gpu(0), deft::gpu(1)}};
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    std::optional<WithoutCollectives> off;
    if (l == 2) off.emplace();
    auto parts = random_parts<double>(layouts[l], {5, 9}, 320 + unsigned(l));
    std::vector<std::vector<double>> before;
    for (const auto& p : parts) before.push_back(p.to_vector());
    deft::allreduce(parts);
    const auto want = sum_of(before);
    for (const auto& p : parts) gpu_tensors::expect_near(p.to_vector(), want, 1e-12, "allreduce through copies");
  }
  Tensor<float> whole = Tensor<float>(gpu_tensors::random_values(24, 330), {6, 4}).to(deft::gpu(1));
  std::vector<Tensor<float>> parts = {whole.rows(0, 3), Tensor<float>(gpu_tensors::random_values(12, 331), {3, 4}).to(deft::gpu(0))};
  std::vector<std::vector<float>> before = {parts[0].to_vector(), parts[1].to_vector()};
  const auto tail = whole.rows(3, 6).to_vector();
  deft::allreduce(parts);
  const auto want = sum_of(before);
  gpu_tensors::expect_near(whole.rows(0, 3).to_vector(), want, 1e-6, "the view's rows");
  BOOST_TEST(whole.rows(3, 6).to_vector() == tail, boost::test_tools::per_element());
  BOOST_TEST(collective_sums() == sums);
}

// A part nobody keeps is still a destination of the collective; a part
// whose writer failed fails every part with that error, at each sync point.
BOOST_AUTO_TEST_CASE(dropped_and_failed_parts) {
  auto parts = random_parts<float>(both_gpus, {64}, 340);
  const auto a = parts[0].to_vector(), b = parts[1].to_vector();
  deft::allreduce(parts);
  parts.pop_back();  // part 1's sum has no reader now
  const auto got = parts[0].to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(got[i] == a[i] + b[i]);
  auto again = random_parts<float>(both_gpus, {64}, 342);
  const auto c = again[0].to_vector(), d = again[1].to_vector();
  deft::allreduce(again);
  again.erase(again.begin());  // part 0's sum, the collective task's own output, has no reader now
  const auto kept = again[0].to_vector();
  for (std::size_t i = 0; i < kept.size(); ++i) BOOST_TEST(kept[i] == c[i] + d[i]);

  const Tensor<float> host(gpu_tensors::random_values(16, 341), {16});
  auto failing = deft::map([](float v) -> float {
    if (v > -1000) throw std::runtime_error("a failing writer");
    return v;
  }, host);
  std::vector<Tensor<float>> bad = {Tensor<float>(failing).to(deft::gpu(0)), Tensor<float>(host).to(deft::gpu(1))};
  deft::allreduce(bad);
  for (const auto& p : bad)
    BOOST_CHECK_EXCEPTION(p.to_vector(), std::runtime_error,
                          [](const std::runtime_error& e) { return std::string(e.what()).find("a failing writer") != std::string::npos; });
  BOOST_CHECK_THROW(deft::wait_all(), std::runtime_error);  // the map's failure, reported once more; then cleared
  deft::wait_all();
}

// Many tensors over two GPUs: each bucket is one collective over the packed
// parts, and each tensor ends with the sum a collective of its own gives it.
BOOST_AUTO_TEST_CASE(allreduce_of_many_tensors_is_one_collective_per_bucket) {
  const long races = gk::emulated_backend().checker().races.load();
  const std::vector<deft::Shape> shapes = {{3, 5}, {}, {40}, {2, 2, 2}};
  std::vector<std::vector<Tensor<float>>> tensors, alone;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    tensors.push_back(random_parts<float>(both_gpus, shapes[i], 360 + 2 * unsigned(i)));
    alone.emplace_back();
    for (const auto& p : tensors.back()) alone.back().push_back(Tensor<float>(p.to_vector(), p.shape()).to(p.device()));
  }
  long sums = collective_sums();
  for (auto& parts : alone) deft::allreduce(parts);
  deft::wait_all();
  BOOST_TEST(collective_sums() == sums + long(shapes.size()));
  sums = collective_sums();
  deft::allreduce(tensors, 200);  // {}, {40} and {2, 2, 2} (196 bytes) in one bucket, {3, 5} alone
  deft::wait_all();
  BOOST_TEST(collective_sums() == sums + 2);
  for (std::size_t i = 0; i < shapes.size(); ++i)
    for (std::size_t d = 0; d < 2; ++d) {
      BOOST_TEST(tensors[i][d].device() == both_gpus[d]);
      BOOST_TEST(tensors[i][d].to_vector() == alone[i][d].to_vector(), boost::test_tools::per_element());
    }
  BOOST_TEST(gk::emulated_backend().checker().races.load() == races, gk::emulated_backend().checker().first_race());
}

// The seeds' data-parallel step on two GPUs: the Trainer allreduces the
// gradients with the collective, all four parameters' in one bucket (one
// collective per step), or each alone with buckets off. The parameters
// after 4 steps equal, bit for bit, those of the same training summed
// through copies (two parts: both sum part 0 + part 1 in float), and stay
// equal across devices.
BOOST_AUTO_TEST_CASE(data_parallel_training_sums_gradients_with_the_collective) {
  deft::random::seed(350);
  const Tensor<float> x = deft::random::normal<float>(0, 1, {8, 5});
  const Tensor<std::int64_t> y(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 2, 1}, {8});
  const deft::nn::SoftmaxCrossEntropyLoss loss;
  std::vector<std::vector<std::vector<float>>> trained;
  enum class Sum { bucketed, per_parameter, copies };
  std::vector<long> used;
  for (const Sum how : {Sum::bucketed, Sum::per_parameter, Sum::copies}) {
    std::optional<WithoutCollectives> off;
    if (how == Sum::copies) off.emplace();
    auto net = two_layer_net();
    deft::random::seed(351);
    net->initialize(deft::nn::init::xavier(), both_gpus);
    const auto xs = deft::split_and_load(x, both_gpus);
    const auto ys = deft::split_and_load(y, both_gpus);
    deft::nn::Trainer trainer(net->collect_params(), deft::nn::SGD{.learning_rate = 0.1f, .momentum = 0.9f});
    if (how == Sum::per_parameter) trainer.set_allreduce_bucket_bytes(0);
    const long sums = collective_sums();
    for (int step = 0; step < 4; ++step) {
      {
        deft::autograd::record rec;
        for (std::size_t d = 0; d < 2; ++d) loss((*net)(xs[d]), ys[d]).backward();
      }
      trainer.step(8);
    }
    std::vector<std::vector<float>> params;
    for (auto* p : net->collect_params()) {
      const auto on0 = p->data(deft::gpu(0)).to_vector(), on1 = p->data(deft::gpu(1)).to_vector();
      BOOST_TEST(on0 == on1, boost::test_tools::per_element());
      params.push_back(on0);
    }
    trained.push_back(params);
    used.push_back(collective_sums() - sums);
  }
  BOOST_TEST(used == (std::vector<long>{4, 4 * 4, 0}), boost::test_tools::per_element());  // 4 steps, 4 parameters
  for (std::size_t run = 1; run < trained.size(); ++run) {
    BOOST_TEST_REQUIRE(trained[0].size() == trained[run].size());
    for (std::size_t i = 0; i < trained[0].size(); ++i)
      BOOST_TEST(trained[0][i] == trained[run][i], boost::test_tools::per_element());
  }
}

// A parameter on the host and a GPU is updated once, on its first copy,
// which is then copied to the other (their kernels may round an update
// differently: Trainer::update), and its clipped gradients are scaled by
// the first device's norm (their sums add in different orders:
// clip_global_norm). That is one copy per parameter and one of the scale
// more than the same step on two GPUs summing through copies, where each
// GPU clips and updates its own copy. Copies and gradients end equal.
BOOST_AUTO_TEST_CASE(a_parameter_on_the_host_and_a_gpu_is_updated_once) {
  const WithoutCollectives off;
  const auto copies_in_a_step = [](const std::vector<deft::Device>& devices) {
    deft::random::seed(360);
    auto net = two_layer_net();
    net->initialize(deft::nn::init::xavier(), devices);
    const Tensor<float> x = deft::random::normal<float>(0, 1, {8, 5});
    const Tensor<std::int64_t> y(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 2, 1}, {8});
    const auto xs = deft::split_and_load(x, devices);
    const auto ys = deft::split_and_load(y, devices);
    deft::nn::Trainer trainer(net->collect_params(), deft::nn::SGD{.learning_rate = 0.1f, .momentum = 0.9f});
    trainer.set_allreduce_bucket_bytes(0);
    {
      deft::autograd::record rec;
      for (std::size_t d = 0; d < devices.size(); ++d) deft::nn::SoftmaxCrossEntropyLoss()((*net)(xs[d]), ys[d]).backward();
    }
    deft::wait_all();  // only the step's own work is pending in the dump
    const deft::engine::Mode mode = deft::engine::mode();
    deft::engine::set_mode(deft::engine::Mode::deferred);
    trainer.allreduce_grads();
    (void)deft::nn::clip_global_norm(net->collect_params(), 0.01f);  // clips: the norm is far above
    trainer.update(8);
    const std::string graph = (std::filesystem::temp_directory_path() / "deft_update_once.dot").string();
    BOOST_TEST_REQUIRE(deft::engine::dump_graph(graph) > 0);
    deft::engine::set_mode(mode);
    std::ifstream in(graph);
    const std::string dot((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::filesystem::remove(graph);
    long copies = 0;
    for (std::size_t at = dot.find("label=\"to\\n"); at != std::string::npos; at = dot.find("label=\"to\\n", at + 1)) ++copies;
    for (auto* p : net->collect_params()) {
      BOOST_TEST(p->data(devices[1]).to(deft::cpu()).to_vector() == p->data(devices[0]).to(deft::cpu()).to_vector(),
                 boost::test_tools::per_element());
      BOOST_TEST(p->grad(devices[1]).to(deft::cpu()).to_vector() == p->grad(devices[0]).to(deft::cpu()).to_vector(),
                 boost::test_tools::per_element());
    }
    return copies;
  };
  const long two_gpus = copies_in_a_step(both_gpus), mixed = copies_in_a_step({deft::cpu(), deft::gpu(0)});
  BOOST_TEST(two_gpus > 0);
  BOOST_TEST(mixed == two_gpus + 4 + 1);  // 4 parameters, 1 scale
}

BOOST_AUTO_TEST_SUITE_END()
