// The GPU evaluators run on the host through Thrust's C++ backend
// (thrust::cpp::par): a CPU-only machine checks the functors a CUDA build
// launches. Memory is plain host vectors; `translate` is the identity.
// Built with DEFT_GPU_EMULATION, it also runs tensors on emulated GPUs.
#define BOOST_TEST_MODULE deft_gpu_kernels_host
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <thrust/system/cpp/execution_policy.h>

#include "kernel_checks.hpp"
#include "tensor_checks.hpp"

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

BOOST_AUTO_TEST_SUITE_END()

// Tensors on the emulated gpu(0) and gpu(1) (DEFT_GPU_EMULATION): the
// engine, executor and backend paths of a CUDA build, run on the host.
BOOST_AUTO_TEST_SUITE(gpu_tensors_emulated)

DEFT_GPU_TENSOR_CASES(true)

BOOST_AUTO_TEST_CASE(num_gpus_counts_the_backends_devices) { BOOST_TEST(deft::num_gpus() == 2); }

// Copies to the host and waits go after the mark of the buffer's writer (on
// CUDA: its event, so later kernels keep running); the emulated marks name
// their device, so a wrong buffer's mark would throw.
BOOST_AUTO_TEST_CASE(copies_and_waits_follow_the_buffers_mark) {
  auto& backend = deft::detail::gpu::emulated_backend();
  const long copies = backend.marked_copies, waits = backend.marked_waits;
  const auto v = gpu_tensors::random_values(64, 21);
  deft::Tensor<float> x = deft::Tensor<float>(v, {64}).to(deft::gpu(1)) * 2.0f;
  x.wait_to_read();
  BOOST_TEST(backend.marked_waits == waits + 1);
  std::vector<double> want(v.begin(), v.end());
  for (auto& e : want) e *= 2;
  gpu_tensors::expect_near(x.to_vector(), want, 0, "to_vector");
  gpu_tensors::expect_near(x.to(deft::cpu()).to_vector(), want, 0, "to(cpu())");
  BOOST_TEST(backend.marked_copies == copies + 2);
}

BOOST_AUTO_TEST_CASE(device_pool_is_reused_in_a_steady_loop) {
  auto& pool = deft::detail::gpu::emulated_backend().pool(0);
  deft::Tensor<float> x = deft::ones<float>({256, 256}, deft::gpu(0));
  for (int i = 0; i < 3; ++i) x = x * 2.0f + 1.0f;
  x.wait_to_read();
  const auto misses = pool.stats().misses;
  for (int i = 0; i < 20; ++i) {
    x = x * 0.5f + 1.0f;
    x.wait_to_read();
  }
  BOOST_TEST(pool.stats().misses == misses);  // every buffer came from the cache
  BOOST_TEST(pool.stats().hits > 0u);
}

BOOST_AUTO_TEST_SUITE_END()

// StagingArea (eval/gpu/staging.hpp), which stages CUDA's copies to a GPU
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
  auto pool = std::make_shared<deft::engine::CachingHostAllocator>(std::make_shared<deft::engine::DefaultHostAllocator>(),
                                                                   std::size_t(1) << 20, 256);
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
  auto pool = std::make_shared<deft::engine::CachingHostAllocator>(std::make_shared<deft::engine::DefaultHostAllocator>(),
                                                                   std::size_t(1) << 20, 256);
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

BOOST_AUTO_TEST_SUITE_END()
