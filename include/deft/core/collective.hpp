// The names of collectives across processes and of their reductions: what
// dist::Communicator runs and what a device backend's process groups
// (NCCL across processes) queue, so that both layers speak of one thing.
#pragma once
#include <cstdint>

namespace deft::dist {

/// How allreduce and reduce_scatter combine the ranks' elements.
enum class ReduceOp : std::uint8_t {
  sum,
  mean,  ///< the sum divided by the number of ranks (integers: truncated)
  max,
  min,
};

/// Which collective a Collective describes.
enum class CollectiveKind : std::uint8_t { allreduce, broadcast, allgather, reduce_scatter, barrier };

/// The collective's name, as messages print it.
inline const char* kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::allgather: return "allgather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::barrier: return "barrier";
  }
  return "?";
}

/// The reduction's name, as messages print it.
inline const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

}  // namespace deft::dist
