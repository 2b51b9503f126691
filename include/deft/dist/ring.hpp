// A ring allreduce (Patarasuk and Yuan's bandwidth-optimal schedule), over
// whatever moves bytes between neighbours: the buffer is cut into one block
// per rank; p - 1 steps of reduce-scatter, in which each rank sends a block
// to the next rank and combines the block it receives from the previous
// one, leave each rank with one block combined over all ranks; p - 1 steps
// of allgather pass those blocks on around the ring. Each rank sends and
// receives 2(p-1)/p of the buffer, the least an allreduce can. Each block
// is combined on one rank only and then copied, so every rank ends with the
// same bits. dist/mpi.hpp runs it over MPI's point-to-point calls.
#pragma once
#include <cstdint>
#include <utility>

#include "../core/collective.hpp"

namespace deft::dist::detail {

/// Where block b of `count` elements cut into `parts` blocks begins.
inline std::int64_t ring_block_begin(std::int64_t count, int parts, int b) { return count * b / parts; }

/// into[i] = into[i] (op) from[i]; a mean sums (its division comes after).
template <class T>
void combine_into(T* into, const T* from, std::int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean:
      for (std::int64_t i = 0; i < n; ++i) into[i] += from[i];
      return;
    case ReduceOp::max:  // as MPI_MAX: a NaN on either side is not propagated
      for (std::int64_t i = 0; i < n; ++i) into[i] = from[i] > into[i] ? from[i] : into[i];
      return;
    case ReduceOp::min:
      for (std::int64_t i = 0; i < n; ++i) into[i] = from[i] < into[i] ? from[i] : into[i];
      return;
  }
}

/// Combines data[0, count) across `size` ranks in place; this is `rank`.
/// `scratch` holds a block (count / size + 1 elements). `exchange(send,
/// send_count, recv, recv_count)` sends to rank + 1 and receives from rank - 1
/// (around the ring) and returns when both are done.
template <class T, class Exchange>
void ring_allreduce(T* data, std::int64_t count, ReduceOp op, int rank, int size, T* scratch, Exchange&& exchange) {
  const auto block = [&](int b) {
    b = ((b % size) + size) % size;
    const std::int64_t begin = ring_block_begin(count, size, b);
    return std::pair<T*, std::int64_t>(data + begin, ring_block_begin(count, size, b + 1) - begin);
  };
  for (int s = 0; s < size - 1; ++s) {  // after step s, block rank - s - 1 holds s + 2 ranks' terms
    const auto [out, out_n] = block(rank - s);
    const auto [in, in_n] = block(rank - s - 1);
    exchange(out, out_n, scratch, in_n);
    combine_into(in, scratch, in_n, op);
  }
  for (int s = 0; s < size - 1; ++s) {  // block rank + 1 is complete here; pass the complete ones on
    const auto [out, out_n] = block(rank + 1 - s);
    const auto [in, in_n] = block(rank - s);
    exchange(out, out_n, in, in_n);
  }
}

}  // namespace deft::dist::detail
