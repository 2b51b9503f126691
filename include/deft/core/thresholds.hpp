// Every tuning constant of deft in one place: the threading cost model, the
// chunk sizes that fix reduction order, the GEMM blocking and the default
// bounds on deferred work. Change numbers here, nowhere else.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>

namespace deft::thresholds {

// --- threading cost model -------------------------------------------------
// Work is measured in "element-ops": elements times the per-element cost of
// the expression (1 for a load or add, more for transcendental functions).
// One AVX-512 core streams about 40 element-ops per ns from cache, while
// waking a worker and joining it costs roughly 5-20 us, i.e. some 200k-800k
// element-ops. So a loop below parallel_min_work (about 12 us of one core's
// work) is cut at most in two, and only from parallel_burst_min_work, for
// which idle workers poll (below). (Measured with deft_bench --filter
// elementwise: y = a*b + c*2 - max(d, 0) on 4096 floats is 41k element-ops, ~1 us.)
inline constexpr std::int64_t parallel_min_work = std::int64_t(1) << 19;
// The smallest piece of a parallel loop handed to one thread (in element-ops).
inline constexpr std::int64_t parallel_grain_work = std::int64_t(1) << 17;
// Pieces per worker so that uneven progress still balances.
inline constexpr int chunks_per_worker = 4;

// A worker that runs out of jobs polls this long before it sleeps, so that
// the next loop of a burst (the layers of a batch-1 forward) reaches it in
// well under a microsecond. One core burns at most this long per burst.
inline constexpr std::int64_t worker_poll_ns = 50'000;
// A loop from this much work (about 1.5 us of one core) up to
// parallel_min_work is cut in two: a polling worker starts its half at once,
// and a sleeping one is woken for the loops that follow (the caller runs
// any half no worker has taken). Each thread then reads the same half of the
// operands every call, so a batch-1 layer's weights stay in its L2.
inline constexpr std::int64_t parallel_burst_min_work = std::int64_t(1) << 16;
// A thread whose chunks of a loop are done spins this many times (x86
// `pause`: 26 ns each on the 2-core VM, so some 7 us) for the helpers still
// running their last chunk (a few us) before it yields its core.
inline constexpr int helper_spin_count = 256;

/// Whether a loop of `work` element-ops runs in one piece whatever the
/// number of workers (a kernel may then skip asking the engine).
constexpr bool serial_work(std::int64_t work) { return work < parallel_burst_min_work; }

/// How many pieces a loop of `work` element-ops should be cut into.
constexpr std::int64_t parallel_chunks(std::int64_t work, int workers) {
  if (workers <= 1 || serial_work(work)) return 1;
  if (work < parallel_min_work) return 2;
  const std::int64_t by_grain = work / parallel_grain_work;
  const std::int64_t by_workers = std::int64_t(workers) * chunks_per_worker;
  const std::int64_t n = by_grain < by_workers ? by_grain : by_workers;
  return n < 1 ? 1 : n;
}

// An elementwise result of this many bytes or more is written with
// non-temporal stores (it would not stay in cache anyway): the writes then
// skip reading each destination line first. Measured on the 2-core VM with
// the fused 4-input expression at 2^24 floats: 18% faster on one thread.
// DEFT_STREAM_STORE_MIN_BYTES overrides it (a machine whose last-level cache
// holds far more; deft's sanitizer builds, whose tests cross it with arrays
// of this size: see DEFT_SANITIZE in CMakeLists.txt).
#ifndef DEFT_STREAM_STORE_MIN_BYTES
#define DEFT_STREAM_STORE_MIN_BYTES (std::int64_t(32) << 20)
#endif
inline constexpr std::int64_t stream_store_min_bytes = DEFT_STREAM_STORE_MIN_BYTES;

// --- reductions -----------------------------------------------------------
// Reductions are cut into pieces of this many elements regardless of the
// worker count, so that a sum gives the same bits with 1 or 16 workers.
inline constexpr std::int64_t reduce_chunk = 1 << 14;
// Elements evaluated at once when a reduction consumes an expression
// (fits in L1 together with the accumulators).
inline constexpr std::int64_t reduce_block = 1024;

// --- matrix products ------------------------------------------------------
// Register tile of the micro-kernel: gemm_mr rows x gemm_nr_vectors SIMD
// vectors of C stay in registers. ISAs with 32 vector registers (AVX-512,
// NEON) hold 12 x 2 accumulators, those with 16 (AVX2, SSE) 6 x 2.
inline constexpr std::int64_t gemm_mr_32regs = 12;
inline constexpr std::int64_t gemm_mr_16regs = 6;
inline constexpr int gemm_nr_vectors = 2;
constexpr std::int64_t gemm_mr_for(int vector_registers) {
  return vector_registers >= 32 ? gemm_mr_32regs : gemm_mr_16regs;
}
// Cache blocking: a gemm_mr x gemm_kc panel of A stays in L1 while it sweeps
// a gemm_kc x gemm_nc block of B held in L2 (1 MiB in float32). Both are
// upper bounds: k and n are cut into equal blocks no larger than these.
// DEFT_GEMM_KC, DEFT_GEMM_NC and DEFT_GEMM_MC override them (other caches;
// deft's sanitizer builds, whose tests cross them with smaller products).
#ifndef DEFT_GEMM_KC
#define DEFT_GEMM_KC 256
#endif
#ifndef DEFT_GEMM_NC
#define DEFT_GEMM_NC 1024
#endif
#ifndef DEFT_GEMM_MC
#define DEFT_GEMM_MC 192
#endif
inline constexpr std::int64_t gemm_kc = DEFT_GEMM_KC;  // depth of a packed block
inline constexpr std::int64_t gemm_nc = DEFT_GEMM_NC;  // columns of a packed B block (L2)
inline constexpr std::int64_t gemm_mc = DEFT_GEMM_MC;  // rows of A packed at once per thread
static_assert(gemm_kc >= 1 && gemm_nc >= 1 && gemm_mc >= 1, "deft: DEFT_GEMM_KC, _NC and _MC must be positive");
// A product runs on more than one thread from this many multiply-adds
// (m * n * k; about 20 us on one AVX-512 core), its rows split evenly.
inline constexpr std::int64_t gemm_parallel_min_work = std::int64_t(1) << 21;
// Fewer rows than this skip packing: each row streams B once instead
// (batch-1 inference is all matrix-vector-like products).
inline constexpr std::int64_t gemm_min_rows_packed = 4;
// Such a few-row product streams B at its cache's rate, so a second core
// pays only where B does not stay in one core's L2: it is split (below
// parallel_min_work) only when B is more than 1/gemm_few_rows_l2_share of
// the L2, so that each thread's half of B stays in its own L2 from call to
// call. A 2 MiB L2 runs a 512 x 256 layer faster on one core than split
// (docs/benchmarks.md, the batch-1 forward); a 512 KiB L2 does not.
inline constexpr std::int64_t gemm_few_rows_l2_share = 2;
// One core's L2 in bytes where the system does not say.
inline constexpr std::int64_t default_l2_bytes = std::int64_t(1) << 20;

// --- convolutions (eval/cpu/conv.hpp, eval/gpu/conv.hpp) -------------------
// CPU: images per im2col block: as many as keep the block's matrix near this many
// elements (at least one image)...
inline constexpr std::int64_t conv_block_elements = std::int64_t(1) << 16;
// ...but at least min(N, this many) blocks, so that small batches still split.
inline constexpr std::int64_t conv_min_blocks = 8;
// The weight gradient sums one partial (O x C*KH*KW) per group of blocks;
// the partials together hold at most about this many elements.
inline constexpr std::int64_t conv_partial_elements = std::int64_t(1) << 22;
// A convolution's weight gradient per block, dYb (O x len) times colsbᵀ
// (len x K), goes through the packed GEMM when O and K are both at least
// this, through dot products of rows below. One thread on the 2-core VM:
// (O, K, len) = (32, 288, 196) 84 against 41 GFLOP/s, (64, 576, 112) 109
// against 33, (64, 32, 224) 72 against 53; but (16, 144, 392) 36 against 38,
// (32, 16, 392) 21 against 38 and (8, 72, 784) 19 against 49.
inline constexpr std::int64_t conv_weight_packed_min = 32;
// GPU: images per im2col block, as many as keep its matrix within this many
// elements (64 MiB of float; a LeNet batch of 256 takes one block). Bigger
// blocks make fewer, larger GEMMs. DEFT_GPU_CONV_BLOCK_ELEMENTS overrides it
// (smaller blocks hold less device memory; the sanitizer builds, as above).
#ifndef DEFT_GPU_CONV_BLOCK_ELEMENTS
#define DEFT_GPU_CONV_BLOCK_ELEMENTS (std::int64_t(1) << 24)
#endif
inline constexpr std::int64_t gpu_conv_block_elements = DEFT_GPU_CONV_BLOCK_ELEMENTS;

// --- GPU memory (device/cuda/runtime.hpp; the emulated GPUs' pools alike) ----
// Device blocks of every size are cached (a steady training loop then calls
// cudaMalloc only while the cache warms up; were blocks under 256 bytes, a
// loss or any scalar, left to cudaMalloc and cudaFree, which wait for the
// whole device, every step would pay that)...
inline constexpr std::size_t gpu_cache_min_bytes = 1;
// ...with no cap on the free bytes held: a block the cache refuses is given
// to cudaFree, which waits for the whole device, so a full cache would make
// every later allocation stall the GPU (seen on an H100: matrix products 4x
// slower once an earlier phase had filled a 4 GiB cap with large blocks).
// When cudaMalloc fails, the cache frees its blocks and tries again.
inline constexpr std::size_t gpu_cache_max_bytes = std::numeric_limits<std::size_t>::max();

// --- GPU lanes (device/cuda/lanes.hpp) ----------------------------------------
// Compute streams per GPU. Independent subtrees take different ones, so
// that small kernels that each leave most of the GPU idle overlap; more
// would add cross-stream waits at joins without more overlap.
inline constexpr int gpu_lanes = 4;

// --- pinned host memory (device/cuda/staging.hpp) -----------------------------
// A copy to a GPU, or from one into pageable memory, is staged through
// page-locked blocks of at most this size: the worker copies one chunk
// while the DMA of the next (or the previous) one runs.
inline constexpr std::size_t gpu_staging_chunk_bytes = std::size_t(4) << 20;
// At most this many bytes of staging blocks wait for their DMA at once; an
// upload past it waits for the oldest (a bound, like the engine's).
inline constexpr std::size_t gpu_staging_max_bytes = std::size_t(64) << 20;
// Free page-locked bytes kept for reuse (staging blocks, and host tensors
// that copies from a GPU land in). Pinning is slow (cudaHostAlloc maps and
// locks every page), so they are cached; past the cap they are unpinned.
inline constexpr std::size_t pinned_cache_max_bytes = std::size_t(1) << 30;

// --- host memory cache (engine::CachingHostAllocator) ----------------------
// Blocks from this size up are kept for reuse when freed: a steady training
// loop then allocates no new pages (the C heap returns large blocks to the
// kernel, and every first touch of a fresh page costs a fault and a zeroing).
// Smaller blocks stay with malloc, whose own bins serve them well.
inline constexpr std::size_t host_cache_min_bytes = std::size_t(64) << 10;
// Sizes are rounded up to one of this many classes per power of two (at most
// 1/8 waste) so that nearly equal sizes share blocks.
inline constexpr int host_cache_classes_per_octave = 8;
// Default cap on the bytes held free in the cache; past it blocks are freed.
inline constexpr std::size_t host_cache_max_bytes = std::size_t(512) << 20;
// A pool that cuts free blocks (BlockReuse::split, a GPU's) cuts one only
// when it leaves at least this much: a smaller rest stays with the request
// instead of becoming a sliver that fits nothing.
inline constexpr std::size_t cache_split_min_bytes = 512;
// In such a pool, requests up to this size are small: they are cut from
// allocations of their own, made this large at least, and never from the
// allocations of larger requests (PyTorch's allocator's figures). A steady
// loop's biases, scalars and small activations then share a few
// allocations, and a long-lived small tensor never pins a large block.
inline constexpr std::size_t cache_small_request_bytes = std::size_t(1) << 20;
inline constexpr std::size_t cache_small_segment_bytes = std::size_t(2) << 20;
// Larger requests below cache_mid_request_bytes get allocations of
// cache_mid_segment_bytes, which later such requests are cut from; larger
// ones are rounded up to a multiple of cache_large_round_bytes (PyTorch's
// figures). A loop's many mid-sized tensors then warm the pool with a few
// allocations instead of one per size. A large block is cut only when what
// it leaves is larger than a small request: no large request could use less.
inline constexpr std::size_t cache_mid_request_bytes = std::size_t(10) << 20;
inline constexpr std::size_t cache_mid_segment_bytes = std::size_t(20) << 20;
inline constexpr std::size_t cache_large_round_bytes = std::size_t(2) << 20;

// --- several devices (ops/devices.hpp) -------------------------------------
// allreduce of many tensors packs consecutive ones into buckets of at most
// this many bytes, one sum across the devices each (PyTorch DDP's default
// bucket): a net's many small gradients then cost a few collectives or
// copies between devices instead of one each, and the first bucket can be
// summed while the backward still writes the others.
inline constexpr std::size_t allreduce_bucket_bytes = std::size_t(25) << 20;

// --- waiting for other processes (dist/mpi.hpp, device/cuda/collective.hpp) --
// A rank polling a collective first polls at once, then yields, then
// sleeps longer each poll up to this (core/backoff.hpp): longer sleeps wake
// later; shorter ones take the core from the workers more often. MPI's
// requests wait on a peer that may be far behind; NCCL's non-blocking calls
// end within NCCL's own setup.
inline constexpr std::int64_t mpi_poll_max_sleep_us = 1000;
inline constexpr std::int64_t nccl_poll_max_sleep_us = 100;
// An allreduce over MPI from mpi_ring_min_bytes to mpi_ring_max_bytes, with
// the watchdog on, runs as deft's ring of non-blocking point-to-point steps
// (dist/ring.hpp) instead of MPI_Iallreduce: Open MPI's libnbc sends the
// whole buffer to one rank and back for fewer than 4 ranks or in place. On 2
// ranks the ring took 0.8x its time at 1-16 MiB and about the same at 64-256
// KiB, but 1.2x at 64 MiB, where the blocks outgrow the caches.
inline constexpr std::size_t mpi_ring_min_bytes = std::size_t(64) << 10;
inline constexpr std::size_t mpi_ring_max_bytes = std::size_t(16) << 20;
// A collective whose input is at most this many bytes, with the watchdog on,
// sends it with its rendezvous message (dist/rendezvous.hpp): one exchange,
// not a rendezvous and then MPI's collective. Each rank receives this much
// from every other, so only in worlds of at most rendezvous_data_max_ranks.
inline constexpr std::size_t rendezvous_data_max_bytes = std::size_t(16) << 10;
inline constexpr int rendezvous_data_max_ranks = 64;
// A rendezvous message goes in pieces of at most this many bytes (a multiple
// of 8). Open MPI's shared-memory transport sends a message of up to 4 KiB,
// its own headers included, at once; a longer one waits for the receiver's
// acknowledgement, which a 4 KiB allreduce paid (docs/distributed.md).
inline constexpr std::size_t rendezvous_piece_bytes = 4096 - 128;

// --- task memory (engine/task_memory.hpp) ---------------------------------
// Freed task blocks each thread keeps for reuse, per size class of
// task_block_granule bytes up to task_block_classes of them (4 KiB): a
// statement's task holds its expression tree, 1-2 KB for a few operands.
inline constexpr std::size_t task_block_granule = 128;
inline constexpr int task_block_classes = 32;
inline constexpr int task_blocks_kept = 8;

// --- who runs flushed work ---------------------------------------------------
// Handing a task to a worker costs about 0.5-1 us of cache lines moving
// between the cores (the task, its buffers, the engine's lock and counters),
// about what one core takes to read and write 16 KB. Work flushed by the
// recorded-work bound whose tasks touch at most this many bytes on average
// (Task::work: bytes written plus read) runs on the recording thread instead:
// a chain of 100,000 tiny in-place updates (`y += 1`) then costs what
// recording and running it in place does. At most max_recorded_tasks such
// tasks run there at once, so recording pauses for at most a few hundred us.
inline constexpr std::size_t inline_task_work = std::size_t(16) << 10;
// A CPU task of at least this much work holds a core while it runs
// (ThreadPool::enter_core), on a worker or at a sync point: the parallel
// loops it starts take helpers only for the cores that no such task and no
// helper holds. Without it, two independent products on two cores ran on
// three threads (one at the sync point, one on a worker, one helping both)
// and took longer than on one worker. Smaller tasks end before a helper
// that shares their core would cost much, and their loops keep the fast
// hand-off to a polling worker.
inline constexpr std::size_t core_hold_min_work = std::size_t(1) << 20;

// --- bounds on deferred work (defaults of engine::Limits) -----------------
// Recorded but unsubmitted work is handed to the workers past these...
inline constexpr std::size_t max_recorded_tasks = 256;
inline constexpr std::size_t max_recorded_bytes = std::size_t(64) << 20;
// ...and the recording thread waits while submitted work exceeds these.
inline constexpr std::size_t max_inflight_tasks = 1024;
inline constexpr std::size_t max_inflight_bytes = std::size_t(128) << 20;

// --- profiler (engine::trace_to) -------------------------------------------
// Slices one trace keeps (about 64 bytes each); later ones are counted as
// dropped in the file, so a forgotten trace cannot grow without bound.
inline constexpr std::size_t max_trace_slices = std::size_t(1) << 22;

// Storage alignment: one cache line, enough for any SIMD width deft uses
// (host buffers of small_host_buffer_bytes and less take malloc's 16 bytes:
// deft's kernels load and store them unaligned).
inline constexpr std::size_t alignment = 64;
// Host buffers of this size and more start on a page. The heap otherwise
// places consecutive blocks a few cache lines apart modulo 4 KiB, and a
// kernel storing to one while loading slightly further along another stalls
// on 4K aliasing (the core matches a load against earlier stores by the
// address bits below 4 KiB): a fused statement on 4096 floats took 1.47 us
// instead of 1.16 with its output 64 bytes past an input modulo 4 KiB.
inline constexpr std::size_t page_align_min_bytes = std::size_t(16) << 10;
// Host buffers of at most this many bytes are aligned as malloc aligns
// (16 bytes), not on a cache line: glibc's aligned_alloc then takes them
// from its per-thread cache, as malloc does, instead of cutting them out of
// a larger block (memalign), and a statement making a new 4-float tensor
// executes 2,554 instructions instead of 2,993 (bench/record_cost.py).
inline constexpr std::size_t small_host_buffer_bytes = 1024;
inline constexpr std::size_t page_alignment = 4096;

}  // namespace deft::thresholds
