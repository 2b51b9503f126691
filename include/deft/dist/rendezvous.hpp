// The rendezvous's message, without MPI: what a rank says of its next
// collective, which every other rank checks against its own before the
// collective runs. A small collective's data rides along (a broadcast's
// from its root only): each rank then finishes the collective from the
// messages it received, combining in rank order (the same bits on every
// rank), and the collective costs one exchange instead of two. dist/mpi.hpp
// sends and receives these messages.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../core/thresholds.hpp"
#include "communicator.hpp"
#include "ring.hpp"

namespace deft::dist::detail {

/// What a rank says of its next collective in the rendezvous.
struct Announcement {
  std::uint64_t sequence;
  std::int64_t count;
  std::int32_t kind, op, dtype, root, rank;
  std::int32_t dims, device;
  std::int64_t shape[6];

  static Announcement of(const Collective& c) {
    Announcement a{};
    a.sequence = c.sequence;
    a.count = c.count;
    a.kind = std::int32_t(c.kind);
    a.op = std::int32_t(c.op);
    a.dtype = std::int32_t(c.dtype);
    a.root = c.root;
    a.device = std::int32_t(c.device.type);
    a.rank = std::int32_t(c.shape.rank());
    a.dims = std::min<std::int32_t>(a.rank, 6);
    for (std::int32_t i = 0; i < a.dims; ++i) a.shape[i] = c.shape[std::size_t(i)];
    return a;
  }
  bool agrees_with(const Announcement& o) const {
    // Shapes too: (2, 3) against (3, 2) would combine elements of different meaning.
    return sequence == o.sequence && count == o.count && kind == o.kind && op == o.op && dtype == o.dtype &&
           root == o.root && device == o.device && rank == o.rank && std::equal(shape, shape + dims, o.shape);
  }
  Collective collective() const {
    Collective c;
    c.sequence = sequence;
    c.count = count;
    c.kind = CollectiveKind(kind);
    c.op = ReduceOp(op);
    c.dtype = DType(dtype);
    c.root = root;
    c.device.type = DeviceType(device);
    for (std::int32_t i = 0; i < dims; ++i) c.shape.push_back(shape[i]);
    return c;
  }
};

/// Whether `c`, among `ranks` ranks, runs inside its rendezvous: a
/// collective of host memory whose input is at most
/// thresholds::rendezvous_data_max_bytes, in a world of at most
/// thresholds::rendezvous_data_max_ranks (a barrier always was one).
inline bool data_rides_rendezvous(const Collective& c, int ranks) {
  const std::size_t bytes = std::size_t(c.count) * dtype_size(c.dtype);
  return c.kind != CollectiveKind::barrier && c.device.type != DeviceType::gpu && ranks > 1 &&
         ranks <= thresholds::rendezvous_data_max_ranks && bytes <= thresholds::rendezvous_data_max_bytes;
}

/// Whether this rank's message carries its input (a broadcast's root only).
inline bool sends_data(const Collective& c, int rank) {
  return c.kind != CollectiveKind::broadcast || rank == c.root;
}

/// The bytes of `rank`'s rendezvous message for `c`: its announcement, and
/// its input where that rides along.
inline std::size_t rendezvous_message_bytes(const Collective& c, int ranks, int rank) {
  const bool data = data_rides_rendezvous(c, ranks) && sends_data(c, rank);
  return sizeof(Announcement) + (data ? std::size_t(c.count) * dtype_size(c.dtype) : 0);
}

/// The bytes a rank receives from each other rank: an announcement, and
/// room for data where a world's allreduces may carry it (every rank posts
/// the same, so that a peer at another collective is named, not truncated).
inline std::size_t rendezvous_slot_bytes(int ranks) {
  const bool data = ranks <= thresholds::rendezvous_data_max_ranks;
  return (sizeof(Announcement) + (data ? thresholds::rendezvous_data_max_bytes : 0) + 7) / 8 * 8;
}

/// out[0, n) = data(0) (op) data(1) (op) ... (op) data(ranks - 1): every rank
/// combines in this order, so all end with the same bits. `data(r)` is rank
/// r's n elements; none may be `out` (a mean sums; its division comes after).
template <class T, class DataOf>
void combine_in_rank_order(T* out, std::int64_t n, ReduceOp op, int ranks, DataOf&& data) {
  if (n == 0) return;
  std::memcpy(out, data(0), std::size_t(n) * sizeof(T));
  for (int r = 1; r < ranks; ++r) combine_into(out, data(r), n, op);
}

/// Finishes `c` on `rank` of `ranks` from every rank's input: `data(r)` is
/// rank r's `c.count` elements (the root's alone for a broadcast) and none
/// of them is `out`. A mean sums; its division comes after.
template <class T, class DataOf>
void finish_from_inputs(const Collective& c, int rank, int ranks, T* out, DataOf&& data) {
  const std::int64_t n = c.count;
  switch (c.kind) {
    case CollectiveKind::allreduce: return combine_in_rank_order(out, n, c.op, ranks, data);
    case CollectiveKind::broadcast:
      if (n > 0) std::memcpy(out, data(c.root), std::size_t(n) * sizeof(T));
      return;
    case CollectiveKind::allgather:
      for (int r = 0; r < ranks && n > 0; ++r)
        std::memcpy(out + std::int64_t(r) * n, data(r), std::size_t(n) * sizeof(T));
      return;
    case CollectiveKind::reduce_scatter: {  // this rank's block of the combination
      const std::int64_t block = n / ranks;
      const auto block_of = [&](int r) { return data(r) + std::int64_t(rank) * block; };
      return combine_in_rank_order(out, block, c.op, ranks, block_of);
    }
    case CollectiveKind::barrier: return;
  }
}

}  // namespace deft::dist::detail
