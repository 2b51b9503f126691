// deft's Communicator over MPI (Open MPI, MPICH, started by mpirun); the
// process-wide set-up (dist::init, rank, size, finalize) is world.hpp. Every MPI call of a collective runs on the engine's worker that
// runs its task, one collective at a time, so MPI_THREAD_SERIALIZED is
// enough. GPU tensors' collectives run on the GPU over NCCL, whose
// communicator is bootstrapped over MPI (ncclGetUniqueId on rank 0, then
// MPI_Bcast), where the CUDA backend loads NCCL. Before each collective the ranks exchange its description on a
// communicator of their own (the rendezvous): ranks that disagree (another
// collective, shape or element type, a skipped collective) are named at
// once, and ranks that never arrive are named when the timeout passes (the
// watchdog), instead of a hang.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/backoff.hpp"
#include "../core/device.hpp"
#include "../core/thresholds.hpp"
#include "../engine/api.hpp"
#include "../eval/executor.hpp"
#include "collectives.hpp"
#include "rendezvous.hpp"
#include "ring.hpp"

namespace deft::dist {

/// What a collective that some rank never joins does after the timeout.
enum class OnTimeout {
  abort,  ///< print the message and MPI_Abort the job (PyTorch's NCCL watchdog default)
  raise,  ///< throw Timeout at the sync point; the communicator is then unusable
};

/// How an MpiCommunicator checks its collectives.
struct Options {
  /// How long a rank waits for the others to reach a collective. The
  /// environment variable DEFT_DIST_TIMEOUT_S (seconds) replaces this
  /// default, not a timeout the program sets.
  std::chrono::milliseconds timeout{60000};
  OnTimeout on_timeout = OnTimeout::abort;  ///< what a collective that times out does
  /// Exchange each collective's description before running it (one small
  /// message to and from every rank): what names mismatched collectives and
  /// lets the timeout work. Off: each collective is the bare MPI call.
  bool rendezvous = true;
  /// dist::init adds one worker to the engine: a collective holds the
  /// worker that runs it until every rank joined, and the extra one keeps
  /// the computation going meanwhile (the backward the gradients' sums
  /// should overlap). It mostly sleeps while collectives wait.
  bool extra_worker = true;
  /// Collectives on GPU tensors run on the GPU, over an NCCL communicator
  /// between the ranks (bootstrapped over MPI on first use), where the CUDA
  /// backend loads NCCL. Off, or without NCCL: they are staged through host
  /// memory and MPI. Every rank must take the same path (checked).
  bool gpu_collectives = true;
};

namespace detail {

inline MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

template <class T>
void divide(void* data, std::int64_t n, int by) {
  T* p = static_cast<T*>(data);
  for (std::int64_t i = 0; i < n; ++i) p[i] = T(p[i] / T(by));
}

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, std::size_t(len));
}

inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace detail

/// A Communicator over an MPI communicator (a duplicate of the one given,
/// so that deft's messages never match the program's own).
class MpiCommunicator final : public Communicator {
 public:
  /// A communicator over the ranks of `comm` (collective: every rank of
  /// `comm` makes one, in the same order). dist::Error when MPI fails.
  explicit MpiCommunicator(MPI_Comm comm, Options options = {}) : options_(options) {
    const char* s = options.timeout == Options{}.timeout ? std::getenv("DEFT_DIST_TIMEOUT_S") : nullptr;
    if (s) {
      char* end = nullptr;
      const double seconds = std::strtod(s, &end);
      if (end == s || !(seconds > 0))
        deft::detail::raise("dist: DEFT_DIST_TIMEOUT_S must be a positive number of seconds, got '", s, "'");
      options_.timeout = std::chrono::milliseconds(std::int64_t(seconds * 1000));
    }
    check(MPI_Comm_dup(comm, &data_), "MPI_Comm_dup");
    check(MPI_Comm_dup(comm, &control_), "MPI_Comm_dup");
    // Errors come back as codes (and become deft exceptions), instead of
    // MPI's default of aborting the job from inside the call.
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(data_, &rank_);
    MPI_Comm_size(data_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || broken_) return;  // a broken one may have requests in flight: MPI_Finalize reclaims them
    MPI_Comm_free(&data_);
    MPI_Comm_free(&control_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// A GPU's tensors stay there (NCCL) when Options::gpu_collectives is on
  /// and the CUDA backend loads NCCL; one GPU per rank, the first one asked
  /// for: tensors on another go through the host.
  Device runs_on(Device d) override {
    if (d.type != DeviceType::gpu || !options_.gpu_collectives) return Device{};
    std::lock_guard lk(gpu_m_);
    if (!gpu_) {
      deft::detail::DeviceBackend* backend = deft::detail::gpu_backend();
      gpu_ = backend && backend->groups_processes() ? d : Device{};
    }
    return *gpu_ == d ? d : Device{};
  }
  /// deft's duplicate of the communicator it was made from.
  MPI_Comm comm() const { return data_; }
  /// Its options (the timeout after DEFT_DIST_TIMEOUT_S).
  const Options& options() const { return options_; }

  void run(const Collective& c, const void* in, void* out) override {
    if (broken_)
      deft::detail::raise<Error>("dist: rank ", rank_, " cannot run ", describe(c),
                                 ": an earlier collective failed on this communicator (", broken_reason_, ")");
    if (options_.rendezvous && detail::data_rides_rendezvous(c, size_)) {
      rendezvous(c, detail::sends_data(c, rank_) ? in : nullptr);
      finish_from_rendezvous(c, out);
      return;
    }
    if (options_.rendezvous) rendezvous(c);
    if (c.device.type == DeviceType::gpu) return run_on_gpu(c, in, out);
    if (c.count > std::numeric_limits<int>::max())
      deft::detail::raise<Error>("dist: ", describe(c), " has more elements than one MPI call takes (2^31 - 1)");
    const int n = int(c.count);
    const MPI_Datatype type = detail::mpi_type(c.dtype);
    const MPI_Op op = detail::mpi_op(c.op);
    if (c.kind == CollectiveKind::broadcast && rank_ == c.root && n > 0 && in != out)
      std::memcpy(out, in, std::size_t(n) * dtype_size(c.dtype));
    if (in == out && c.kind == CollectiveKind::allreduce) in = MPI_IN_PLACE;  // writing its input's storage
    // With the watchdog, the non-blocking form, polled against the timeout:
    // a peer that stops after the rendezvous cannot hold this rank forever.
    const std::size_t bytes = std::size_t(n) * dtype_size(c.dtype);
    if (options_.rendezvous && c.kind == CollectiveKind::allreduce && size_ > 1 &&
        bytes >= thresholds::mpi_ring_min_bytes && bytes <= thresholds::mpi_ring_max_bytes) {
      if (in != MPI_IN_PLACE) std::memcpy(out, in, bytes);
      run_ring(c, out);
    } else if (options_.rendezvous) {
      requests_.assign(1, MPI_REQUEST_NULL);
      MPI_Request* r = requests_.data();
      switch (c.kind) {
        case CollectiveKind::allreduce: check(MPI_Iallreduce(in, out, n, type, op, data_, r), c); break;
        case CollectiveKind::broadcast: check(MPI_Ibcast(out, n, type, c.root, data_, r), c); break;
        case CollectiveKind::allgather: check(MPI_Iallgather(in, n, type, out, n, type, data_, r), c); break;
        case CollectiveKind::reduce_scatter:
          check(MPI_Ireduce_scatter_block(in, out, n / size_, type, op, data_, r), c);
          break;
        case CollectiveKind::barrier: break;  // the rendezvous was one
      }
      await(c, {});
    } else {
      switch (c.kind) {
        case CollectiveKind::allreduce: check(MPI_Allreduce(in, out, n, type, op, data_), c); break;
        case CollectiveKind::broadcast: check(MPI_Bcast(out, n, type, c.root, data_), c); break;
        case CollectiveKind::allgather: check(MPI_Allgather(in, n, type, out, n, type, data_), c); break;
        case CollectiveKind::reduce_scatter: check(MPI_Reduce_scatter_block(in, out, n / size_, type, op, data_), c); break;
        case CollectiveKind::barrier: check(MPI_Barrier(data_), c); break;
      }
    }
    divide_if_mean(c, out);
  }

 private:
  // MPI has no mean: the sum, divided here (a reduce_scatter's output is this rank's block).
  void divide_if_mean(const Collective& c, void* out) const {
    if (c.op != ReduceOp::mean) return;
    const std::int64_t n = c.kind == CollectiveKind::allreduce        ? c.count
                           : c.kind == CollectiveKind::reduce_scatter ? c.count / size_
                                                                      : 0;
    visit_dtype(c.dtype, [&](auto e) { detail::divide<typename decltype(e)::type>(out, n, size_); });
  }
  // Where rank r's message starts in received_ (a slot per rank, 8-byte words).
  std::uint64_t* received_from(int r) {
    return received_.data() + std::size_t(r) * detail::rendezvous_slot_bytes(size_) / 8;
  }

  void fail(std::string reason) {
    broken_ = true;
    broken_reason_ = std::move(reason);
  }
  void check(int code, const char* call) {
    if (code != MPI_SUCCESS) deft::detail::raise<Error>("dist: ", call, " failed: ", detail::mpi_error_text(code));
  }
  void check(int code, const Collective& c) {
    if (code == MPI_SUCCESS) return;
    const std::string text = detail::mpi_error_text(code);
    fail(text);
    deft::detail::raise<Error>("dist: ", describe(c), " failed on rank ", rank_, " of ", size_, ": ", text);
  }

  // A large allreduce, with the watchdog: the ring's steps (dist/ring.hpp),
  // each a receive from the previous rank and a send to the next, polled
  // against the timeout like any request. (Sending each block in parts, to
  // combine one while the next travels, was no faster on 2 ranks: MPI
  // moves data only inside the polls.)
  void run_ring(const Collective& c, void* data) {
    visit_dtype(c.dtype, [&](auto e) {
      using T = typename decltype(e)::type;
      constexpr int tag = 0x5de7;
      const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
      const MPI_Datatype type = detail::mpi_type(c.dtype);
      ring_scratch_.resize((std::size_t(c.count / size_ + 1) * sizeof(T) + 7) / 8);
      detail::ring_allreduce(static_cast<T*>(data), c.count, c.op, rank_, size_,
                             reinterpret_cast<T*>(ring_scratch_.data()),
                             [&](const T* send, std::int64_t send_n, T* recv, std::int64_t recv_n) {
                               requests_.assign(2, MPI_REQUEST_NULL);
                               check(MPI_Irecv(recv, int(recv_n), type, prev, tag, data_, &requests_[0]), c);
                               check(MPI_Isend(send, int(send_n), type, next, tag, data_, &requests_[1]), c);
                               await(c, {});
                             });
    });
  }

  // GPU memory, over the NCCL communicator made by the first such
  // collective; waits for the GPU to finish it, against the timeout.
  void run_on_gpu(const Collective& c, const void* in, void* out) {
    if (!group_) join_gpu_group(c);
    const auto start = std::chrono::steady_clock::now();
    const bool queued = breaks([&] {
      return group_->queue(c.kind, c.op, c.dtype, std::size_t(c.count), c.root, in, out, start + options_.timeout);
    });
    if (!queued)
      gpu_timed_out(c, " for NCCL to take the collective; every rank had joined it, so one stopped or is stuck");
    for (int polls = 0; !breaks([&] { return group_->finished(); }); ++polls) {
      if (std::chrono::steady_clock::now() - start > options_.timeout) gpu_timed_out(c);
      pause(polls);
    }
  }

  // Runs one call to the NCCL group: a failed one leaves the communicator unusable.
  template <class Step>
  std::invoke_result_t<Step> breaks(Step&& step) {
    try {
      return step();
    } catch (const std::exception& e) {
      fail(e.what());
      throw;
    }
  }

  // NCCL's bootstrap: rank 0 makes the id and broadcasts it over MPI, then
  // every rank joins with its GPU. A rank 0 that cannot make one sends an
  // empty id, so that every rank raises instead of waiting. The ranks then
  // tell each other over MPI whether they could start joining, so that one
  // that failed is named on every rank at once; the group then forms
  // (NCCL connecting the ranks) within the timeout.
  void join_gpu_group(const Collective& c) {
    deft::detail::DeviceBackend& backend = *deft::detail::gpu_backend();
    std::vector<std::byte> id;
    std::string why;
    if (rank_ == 0) try {
        id = backend.new_process_group_id();
      } catch (const std::exception& e) {
        why = e.what();
      }
    std::int64_t bytes = std::int64_t(id.size());
    requests_.assign(1, MPI_REQUEST_NULL);
    check(MPI_Ibcast(&bytes, 1, MPI_INT64_T, 0, control_, requests_.data()), c);
    await(c, {});
    if (bytes == 0) {
      fail("rank 0 could not make an NCCL communicator's id");
      deft::detail::raise<Error>("dist: ", describe(c), ": rank 0 could not make an NCCL communicator's id",
                                 why.empty() ? "" : ": ", why);
    }
    id.resize(std::size_t(bytes));
    requests_.assign(1, MPI_REQUEST_NULL);
    check(MPI_Ibcast(id.data(), int(bytes), MPI_BYTE, 0, control_, requests_.data()), c);
    await(c, {});
    std::string failure;
    try {
      group_ = backend.join_process_group(id, size_, rank_, c.device.index);
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.rfind("deft: ", 0) == 0) failure.erase(0, 6);  // quoted inside deft's own message
    }
    std::vector<std::int32_t> started(std::size_t(size_), 0);
    started[std::size_t(rank_)] = failure.empty() ? 1 : 0;
    requests_.assign(1, MPI_REQUEST_NULL);
    check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, started.data(), 1, MPI_INT32_T, control_,
                         requests_.data()),
          c);
    await(c, {});
    std::vector<int> failed;
    for (int r = 0; r < size_; ++r)
      if (!started[std::size_t(r)]) failed.push_back(r);
    if (!failed.empty()) {
      if (group_) group_->abort();  // NCCL may still be waiting for the ranks that failed
      const std::string reason = "rank(s) " + detail::rank_list(failed) + " of " + std::to_string(size_) +
                                 " could not join NCCL's communicator" +
                                 (failure.empty() ? std::string{} : " (rank " + std::to_string(rank_) + ": " + failure + ")");
      fail(reason);
      deft::detail::raise<Error>("dist: ", describe(c), ": ", reason);
    }
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0; !breaks([&] { return group_->joined(); }); ++polls) {
      if (std::chrono::steady_clock::now() - start > options_.timeout)
        gpu_timed_out(c, " for NCCL's communicator to form; every rank started joining it, so one is stuck or "
                         "cannot reach the others");
      pause(polls);
    }
  }

  static void pause(int polls) { deft::detail::back_off(polls, thresholds::mpi_poll_max_sleep_us); }

  // Sends `c`'s announcement to every other rank and receives theirs,
  // polling until all arrived or the timeout passed. Polling drives MPI's
  // progress (Open MPI has no progress thread by default). With `data`
  // (detail::data_rides_rendezvous), c's input goes along. A message goes
  // in pieces that MPI sends without waiting for the receiver
  // (thresholds::rendezvous_piece_bytes); the first, with the announcement,
  // is received from every rank before the rest, so that a rank at another
  // collective, whose message may be shorter, is named, not waited for.
  void rendezvous(const Collective& c, const void* data = nullptr) {
    if (size_ == 1) return;
    constexpr int tag = 0x5def;
    const std::size_t piece = thresholds::rendezvous_piece_bytes;
    const detail::Announcement mine = detail::Announcement::of(c);
    const std::size_t message = sizeof mine + (data ? std::size_t(c.count) * dtype_size(c.dtype) : 0);
    const std::size_t slot = detail::rendezvous_slot_bytes(size_);
    // 8-byte words: every slot's announcement and data start aligned.
    sent_.resize((message + 7) / 8);
    std::memcpy(sent_.data(), &mine, sizeof mine);
    if (message > sizeof mine) std::memcpy(sent_.data() + sizeof mine / 8, data, message - sizeof mine);
    received_.resize(std::size_t(size_) * slot / 8);
    const auto bytes_of = [](std::uint64_t* words) { return reinterpret_cast<char*>(words); };
    const auto request = [&] { return &requests_.emplace_back(MPI_REQUEST_NULL); };  // valid until the next one
    requests_.clear();
    std::vector<int> peer;  // peer[k]: the rank of receive k
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      check(MPI_Irecv(received_from(r), int(std::min(piece, slot)), MPI_BYTE, r, tag, control_, request()), c);
      peer.push_back(r);
    }
    for (int r = 0; r < size_; ++r)
      for (std::size_t at = 0; r != rank_ && at < message; at += piece)
        check(MPI_Isend(bytes_of(sent_.data()) + at, int(std::min(piece, message - at)), MPI_BYTE, r, tag, control_,
                        request()),
              c);
    await(c, peer, peer.size());
    for (int r : peer) {
      detail::Announcement theirs;
      std::memcpy(&theirs, received_from(r), sizeof theirs);
      if (mine.agrees_with(theirs)) continue;
      const std::string reason = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " is at " +
                                 describe(c) + " but rank " + std::to_string(r) + " is at " +
                                 describe(theirs.collective()) +
                                 "; every rank must record the same collectives in the same order";
      fail(reason);
      deft::detail::raise<Error>("dist: ", reason);
    }
    // Every rank is at c: the rest of each message, and this rank's sends.
    for (int r : peer) {
      const std::size_t theirs = detail::rendezvous_message_bytes(c, size_, r);
      for (std::size_t at = piece; at < theirs; at += piece)
        check(MPI_Irecv(bytes_of(received_from(r)) + at, int(std::min(piece, theirs - at)), MPI_BYTE, r, tag, control_,
                        request()),
              c);
    }
    await(c, {});
  }

  // After a rendezvous that carried the ranks' inputs: c's result (this
  // rank's input from what it sent, since `out` may be its input).
  void finish_from_rendezvous(const Collective& c, void* out) {
    const std::size_t skip = sizeof(detail::Announcement) / 8;
    visit_dtype(c.dtype, [&](auto e) {
      using T = typename decltype(e)::type;
      detail::finish_from_inputs(c, rank_, size_, static_cast<T*>(out), [&](int r) {
        const std::uint64_t* words = r == rank_ ? sent_.data() : received_from(r);
        return reinterpret_cast<const T*>(words + skip);
      });
    });
    divide_if_mean(c, out);
  }

  // Polls the first n of requests_ (all by default) until they completed or
  // the timeout passed (then timed_out). `peer[k]`, when given, is the rank
  // request k receives from. Polling drives MPI's progress (Open MPI has no
  // progress thread by default).
  void await(const Collective& c, const std::vector<int>& peer, std::size_t n = std::size_t(-1)) {
    n = std::min(n, requests_.size());
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Testall(int(n), requests_.data(), &done, MPI_STATUSES_IGNORE), c);
      if (done) return;
      if (std::chrono::steady_clock::now() - start > options_.timeout) {
        std::vector<int> missing;
        for (std::size_t i = 0; i < peer.size(); ++i) {  // Testall leaves completed ones in place: test each
          int arrived = 0;
          MPI_Test(&requests_[i], &arrived, MPI_STATUS_IGNORE);
          if (!arrived) missing.push_back(peer[i]);
        }
        timed_out(c, missing);
      }
      pause(polls);
    }
  }

  static constexpr const char* waiting_for_data = " for its data; every rank had joined it, so one stopped or is stuck";

  // A collective on GPU memory, or the NCCL group's forming, that ran out of
  // time. Raising, the group is aborted first, so that NCCL stops waiting
  // for the other ranks; aborting, MPI_Abort ends every rank anyway.
  [[noreturn]] void gpu_timed_out(const Collective& c, const char* waiting_for = waiting_for_data) {
    if (options_.on_timeout == OnTimeout::raise) group_->abort();
    timed_out(c, {}, waiting_for);
  }

  // `waiting_for`: what the rank waited for when every rank had arrived.
  [[noreturn]] void timed_out(const Collective& c, const std::vector<int>& missing,
                              const char* waiting_for = waiting_for_data) {
    const double seconds = double(options_.timeout.count()) / 1000.0;
    const std::string reason = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " +
                               std::to_string(seconds).substr(0, std::to_string(seconds).find('.') + 2) + " s at " +
                               describe(c) +
                               (missing.empty()
                                    ? std::string(waiting_for)
                                    : " for rank(s) " + detail::rank_list(missing) +
                                          ", which did not reach it (stopped, stuck, or recording other collectives)");
    if (options_.on_timeout == OnTimeout::abort) {
      std::fprintf(stderr, "deft: dist: %s; aborting the job\n", reason.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
      std::abort();
    }
    // The rendezvous's receives from the missing ranks stay posted: cancel
    // them, so that MPI_Finalize does not wait for them. A collective's
    // request cannot be cancelled; it stays with the broken communicator.
    if (!missing.empty())
      for (auto& r : requests_)
        if (r != MPI_REQUEST_NULL) {
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
    fail("timed out: " + reason);
    deft::detail::raise<Timeout>("dist: ", reason);
  }

  Options options_;
  MPI_Comm data_ = MPI_COMM_NULL, control_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  // Only the worker running the current collective touches these (collectives run one at a time).
  // The rendezvous's message and those received (a slot per rank), in
  // 8-byte words so that the data after each announcement is aligned.
  std::vector<std::uint64_t> sent_, received_;
  std::vector<MPI_Request> requests_;
  std::vector<std::uint64_t> ring_scratch_;  // a block of the ring's allreduce (8-byte aligned)
  bool broken_ = false;
  std::string broken_reason_;
  std::mutex gpu_m_;
  std::optional<Device> gpu_;  // the GPU whose tensors' collectives run there (the host: none); decided once
  std::unique_ptr<deft::detail::ProcessGroup> group_;  // NCCL over gpu_, made by the first such collective
};

}  // namespace deft::dist
