// The interface of a group of processes that run collectives together
// (deft::dist::Communicator), without any transport: tensors' collectives
// (collectives.hpp) and the Trainer record against it, and dist/mpi.hpp
// implements it over MPI. Only programs that include deft/dist.hpp need MPI.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "../core/collective.hpp"
#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "../engine/buffer.hpp"

namespace deft::dist {

/// A failure of a collective or of the transport (an MPI error, ranks that
/// disagree on a collective, a communicator already broken by an earlier one).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A collective that some rank did not join within the communicator's timeout.
struct Timeout : Error {
  using Error::Error;
};

/// One collective, as every rank must record it: the same kind, reduction,
/// element type, element count and root, at the same place in the sequence
/// of the communicator's collectives.
struct Collective {
  CollectiveKind kind = CollectiveKind::allreduce;  ///< which collective
  ReduceOp op = ReduceOp::sum;                      ///< how allreduce and reduce_scatter combine
  DType dtype = DType::float32;                     ///< the element type
  std::int64_t count = 0;   ///< elements of this rank's input
  int root = 0;             ///< broadcast's source rank
  std::uint64_t sequence = 0;  ///< its place among the communicator's collectives, from 0
  Shape shape;                 ///< this rank's input shape, for messages
  /// Where its input and output are: the host, or a GPU when the
  /// communicator runs collectives there (Communicator::runs_on). Ranks
  /// agree on the type; each has its own GPU.
  Device device;
};

/// "allreduce #12 (sum of 1024 float32, shape (32, 32))": how messages name a collective.
inline std::string describe(const Collective& c) {
  std::string s = std::string(kind_name(c.kind)) + " #" + std::to_string(c.sequence);
  if (c.kind == CollectiveKind::barrier) return s;
  s += " (";
  if (c.kind == CollectiveKind::allreduce || c.kind == CollectiveKind::reduce_scatter) s += std::string(op_name(c.op)) + " of ";
  s += std::to_string(c.count) + " " + dtype_name(c.dtype) + ", shape " + c.shape.to_string();
  if (c.kind == CollectiveKind::broadcast) s += ", from rank " + std::to_string(c.root);
  if (c.device.type == DeviceType::gpu) s += ", on the GPU";
  return s + ")";
}

/// A group of processes (ranks 0..size()-1) that run collectives together.
/// Collectives are recorded as deferred tasks (collectives.hpp) and run one
/// at a time, in the order they were recorded: every rank must record the
/// same collectives in the same order, from one thread at a time.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This process's rank, 0..size()-1.
  virtual int rank() const = 0;
  /// The number of ranks.
  virtual int size() const = 0;
  /// Runs collective `c` on memory of c.device, on the calling thread (a
  /// worker), until it completes: `in` holds this rank's c.count elements,
  /// `out` the result (allgather: size() * count; reduce_scatter: count /
  /// size()). For allreduce and broadcast `in` may be `out` (in place).
  /// Called in sequence order. Throws Error or Timeout.
  virtual void run(const Collective& c, const void* in, void* out) = 0;
  /// Where collectives on tensors on `d` run: `d` itself where this
  /// communicator runs them there (a GPU, through NCCL), else the host,
  /// through which such tensors are staged.
  virtual Device runs_on(Device d) {
    (void)d;
    return Device{};
  }

  /// Records the next collective: `record(sequence, previous)` builds and
  /// records its task, given its place in the sequence and the last
  /// collective's output (null for the first), which the task must read, and
  /// returns its output. Under one lock, so that places and predecessors agree.
  template <class Record>
  void record_next(Record&& record) {
    std::lock_guard lk(m_);
    auto output = record(next_sequence_.load(std::memory_order_relaxed), std::as_const(last_output_));
    last_output_ = std::move(output);
    next_sequence_.fetch_add(1, std::memory_order_relaxed);
  }
  /// Called by the task of the collective writing `output` once it ran:
  /// the next one need not wait for it, and the communicator stops holding
  /// its output (which may be a tensor's storage, such as a gradient's).
  /// Never waits: a worker must not wait for a recording thread, which may
  /// wait for the engine while it holds the lock (record_next). That thread
  /// is then recording the next collective, which replaces the output held.
  void ran(const deft::detail::Buffer* output) {
    std::shared_ptr<deft::detail::Buffer> last;  // released after the lock
    std::unique_lock lk(m_, std::try_to_lock);
    if (lk.owns_lock() && last_output_.get() == output) last = std::move(last_output_);
  }
  /// Collectives recorded so far.
  std::uint64_t recorded() const { return next_sequence_.load(std::memory_order_relaxed); }

 private:
  std::mutex m_;
  std::atomic<std::uint64_t> next_sequence_{0};  // written under m_
  std::shared_ptr<deft::detail::Buffer> last_output_;
};

}  // namespace deft::dist
