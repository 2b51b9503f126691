// Every tuning constant of deft in one place: the threading cost model, the
// chunk sizes that fix reduction order, the GEMM blocking and the default
// bounds on deferred work. Change numbers here, nowhere else.
#pragma once
#include <cstddef>
#include <cstdint>

namespace deft::thresholds {

// --- threading cost model -------------------------------------------------
// Work is measured in "element-ops": elements times the per-element cost of
// the expression (1 for a load or add, more for transcendental functions).
// Waking a worker and joining it costs roughly 5-20 us, i.e. ~30k element-ops
// of streaming work; below that a loop runs on one thread.
inline constexpr std::int64_t parallel_min_work = 1 << 15;
// The smallest piece of a parallel loop handed to one thread (in element-ops).
inline constexpr std::int64_t parallel_grain_work = 1 << 14;
// Pieces per worker so that uneven progress still balances.
inline constexpr int chunks_per_worker = 4;

/// How many pieces a loop of `work` element-ops should be cut into.
constexpr std::int64_t parallel_chunks(std::int64_t work, int workers) {
  if (workers <= 1 || work < parallel_min_work) return 1;
  const std::int64_t by_grain = work / parallel_grain_work;
  const std::int64_t by_workers = std::int64_t(workers) * chunks_per_worker;
  const std::int64_t n = by_grain < by_workers ? by_grain : by_workers;
  return n < 1 ? 1 : n;
}

// --- reductions -----------------------------------------------------------
// Reductions are cut into pieces of this many elements regardless of the
// worker count, so that a sum gives the same bits with 1 or 16 workers.
inline constexpr std::int64_t reduce_chunk = 1 << 14;
// Elements evaluated at once when a reduction consumes an expression
// (fits in L1 together with the accumulators).
inline constexpr std::int64_t reduce_block = 1024;

// --- matrix products ------------------------------------------------------
inline constexpr std::int64_t gemm_mr = 6;     // rows of the register tile
inline constexpr std::int64_t gemm_kc = 256;   // depth of a packed panel (L1)
inline constexpr std::int64_t gemm_mc = 96;    // rows of a packed A block (L2), multiple of gemm_mr
inline constexpr std::int64_t gemm_nc = 2048;  // columns of a packed B block (L3)

// --- bounds on deferred work (defaults of engine::Limits) -----------------
// Recorded but unsubmitted work is handed to the workers past these...
inline constexpr std::size_t max_recorded_tasks = 256;
inline constexpr std::size_t max_recorded_bytes = std::size_t(64) << 20;
// ...and the recording thread waits while submitted work exceeds these.
inline constexpr std::size_t max_inflight_tasks = 1024;
inline constexpr std::size_t max_inflight_bytes = std::size_t(128) << 20;

// Storage alignment: one cache line, enough for any SIMD width deft uses.
inline constexpr std::size_t alignment = 64;

}  // namespace deft::thresholds
