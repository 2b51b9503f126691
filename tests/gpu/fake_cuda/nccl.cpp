// The stand-in's libnccl.so.2 (the toolkit's nccl.h declares it), for two
// kinds of communicator:
// - ncclCommInitAll's, across the stand-in's GPUs in one process: sums only.
//   Each rank's part is work on its stream that waits there until every
//   rank's part has started, as NCCL's kernels wait for their partners: a
//   rank whose stream never reaches its part hangs the others, on a GPU and
//   here (reported after a minute, then the process aborts). Ranks sum in
//   rank order, so every GPU receives the same bits.
// - ncclCommInitRank's, one rank per process (or thread), joined through an
//   abstract Unix socket named by the ncclUniqueId. Each collective is work
//   on its stream that sends rank 0 a header and its data; rank 0 combines
//   in rank order and sends each rank its result (a star), so every rank
//   receives the same bits. A peer that dies or aborts fails the
//   collective's work, which faults the device as a failed kernel would.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <cerrno>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <nccl.h>

#include "fake_cuda.hpp"

namespace {

struct Part {
  const void* from;
  void* to;
};

/// One allreduce of a clique: the parts of the ranks that have started it.
struct Round {
  std::vector<Part> parts;
  int arrived = 0, left = 0;
  bool summed = false;
};

struct Clique {
  std::vector<int> devices;  // by rank
  std::mutex m;
  std::condition_variable changed;
  std::map<std::uint64_t, Round> rounds;  // by sequence number
};

template <class T>
void sum_parts(const std::vector<Part>& parts, std::size_t count) {
  std::vector<T> total(count, T(0));
  for (const Part& p : parts)
    for (std::size_t i = 0; i < count; ++i) total[i] += static_cast<const T*>(p.from)[i];
  for (const Part& p : parts) std::memcpy(p.to, total.data(), count * sizeof(T));
}

/// A communicator across processes: this rank's sockets. Shared with the
/// collectives queued on it, so that a destroyed communicator's sockets
/// close only once its queued work ran.
struct Link {
  int rank, nranks, device;
  std::vector<int> fds;  // rank 0: by peer rank (its own is -1); others: fds[0], to rank 0
  std::mutex m;          // one collective at a time on the sockets
  std::uint64_t next = 0;  // collectives run so far (their sequence numbers)
  std::atomic<bool> broken{false}, aborted{false};
  // ncclInProgress while a non-blocking ncclCommInitRank joins, then its result.
  std::atomic<ncclResult_t> joining{ncclSuccess};

  Link(int r, int n, int d) : rank(r), nranks(n), device(d), fds(std::size_t(n), -1) {}
  ~Link() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  /// Makes every peer's and this rank's blocked socket calls return.
  void cut() {
    for (int fd : fds)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;  // ncclCommInitAll's
  int rank;
  std::uint64_t calls = 0;      // this rank's allreduces so far (ncclCommInitAll's)
  std::shared_ptr<Link> link{};  // ncclCommInitRank's
  bool blocking = true;          // ncclCommInitRankConfig's config
  // A non-blocking communicator's collective that answered ncclInProgress:
  // launched by the next ncclCommGetAsyncError, as NCCL may finish
  // enqueueing only then.
  std::function<ncclResult_t()> deferred{};
  bool stuck = false;  // a collective injected to hang: in progress until aborted
};

namespace {

enum Kind : std::int32_t { all_reduce, broadcast, all_gather, reduce_scatter };
const char* const kind_names[] = {"ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter"};

/// A collective waiting for its group's end, where NCCL launches. `count`
/// is NCCL's argument: per rank for ncclAllGather and ncclReduceScatter.
struct Queued {
  ncclComm_t comm;
  const void* from;
  void* to;
  std::size_t count;
  ncclDataType_t type;
  cudaStream_t stream;
  Kind kind = all_reduce;
  ncclRedOp_t op = ncclSum;
  int root = 0;
};

/// The calling thread's group: its depth, the parts queued in it, and
/// whether a call in it failed (the group is then abandoned at its end).
struct Group {
  int depth = 0;
  std::vector<Queued> parts;
  ncclResult_t failed = ncclSuccess;
};
thread_local Group group;

std::size_t size_of(ncclDataType_t t) {
  return t == ncclFloat64 || t == ncclInt64 ? 8 : 4;
}

/// Each rank's part waits on its stream until every rank's part has started.
ncclResult_t launch(const Queued& q) {
  const std::shared_ptr<Clique> clique = q.comm->clique;
  const int n = int(clique->devices.size()), rank = q.comm->rank;
  const std::uint64_t call = q.comm->calls++;
  const void* from = q.from;  // (not a structured binding: clang before 16 cannot capture one)
  void* to = q.to;
  const std::size_t count = q.count;
  const ncclDataType_t datatype = q.type;
  const auto work = [=] {
    std::unique_lock lk(clique->m);
    Round& round = clique->rounds[call];
    round.parts.resize(std::size_t(n));
    round.parts[std::size_t(rank)] = {from, to};
    if (++round.arrived == n) {
      switch (datatype) {
        case ncclFloat32: sum_parts<float>(round.parts, count); break;
        case ncclFloat64: sum_parts<double>(round.parts, count); break;
        case ncclInt32: sum_parts<std::int32_t>(round.parts, count); break;
        default: sum_parts<std::int64_t>(round.parts, count); break;
      }
      round.summed = true;
      clique->changed.notify_all();
    } else if (!clique->changed.wait_for(lk, std::chrono::minutes(1), [&] { return round.summed; })) {
      fake_cuda::explain(("NCCL allreduce: rank " + std::to_string(rank) + " waited a minute for its partners; on GPUs "
                          "this is a hang")
                             .c_str());
      std::abort();
    }
    if (++round.left == n) clique->rounds.erase(call);
  };
  // The stream's device is made current for the launch, as NCCL does.
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(clique->devices[std::size_t(rank)]);
  const cudaError_t status = fake_cuda::launch(q.stream, work, "ncclAllReduce");
  cudaSetDevice(previous);
  return status == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

// Across processes --------------------------------------------------------------

using Clock = std::chrono::steady_clock;
// Joining: how long a rank looks for rank 0, and rank 0 for the others.
constexpr auto join_limit = std::chrono::seconds(60);
// A collective whose partner does not get there within this long is
// reported as a hang (then the process aborts). Longer than a join: ranks
// may compute for a while between collectives.
constexpr auto hang_limit = std::chrono::minutes(2);

enum class Io { ok, closed, timed_out };

/// Waits for `fd` to be ready for `events` until `deadline`, or until
/// `*stop` (an abort while joining: Io::closed).
Io ready(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* stop = nullptr) {
  for (;;) {
    if (stop && *stop) return Io::closed;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Io::timed_out;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, int(std::min<long long>(left, stop ? 50 : 1000)));
    if (n > 0) return Io::ok;  // readable, writable, or hung up: the call that follows tells which
    if (n < 0 && errno != EINTR) return Io::closed;
  }
}

Io send_all(int fd, const void* data, std::size_t bytes, Clock::time_point deadline,
            const std::atomic<bool>* stop = nullptr) {
  auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    if (const Io io = ready(fd, POLLOUT, deadline, stop); io != Io::ok) return io;
    const ssize_t k = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);  // no SIGPIPE from a dead peer
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Io::closed;
    }
    p += k;
    bytes -= std::size_t(k);
  }
  return Io::ok;
}

Io recv_all(int fd, void* data, std::size_t bytes, Clock::time_point deadline,
            const std::atomic<bool>* stop = nullptr) {
  auto* p = static_cast<unsigned char*>(data);
  while (bytes > 0) {
    if (const Io io = ready(fd, POLLIN, deadline, stop); io != Io::ok) return io;
    const ssize_t k = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (k == 0) return Io::closed;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Io::closed;
    }
    p += k;
    bytes -= std::size_t(k);
  }
  return Io::ok;
}

/// The abstract socket (sun_path[0] == '\0': no file to clean up) named by an id.
struct Address {
  sockaddr_un addr{};
  socklen_t length = 0;
};
bool address_of(const ncclUniqueId& id, Address& a) {
  const std::size_t n = strnlen(id.internal, sizeof id.internal);
  if (n == 0 || n + 1 > sizeof a.addr.sun_path) return false;
  a.addr.sun_family = AF_UNIX;
  std::memcpy(a.addr.sun_path + 1, id.internal, n);
  a.length = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + n);
  return true;
}

/// What a joining rank tells rank 0.
struct Hello {
  std::int32_t rank, nranks;
};

ncclResult_t refuse(ncclResult_t status, const std::string& why) {
  fake_cuda::explain(why.c_str());
  return status;
}

/// Rank 0: accepts the others, checks who they say they are, and tells each
/// whether the communicator is made (one status byte: 0 yes).
ncclResult_t accept_ranks(Link& link, const Address& a, const std::string& name) {
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return refuse(ncclSystemError, "ncclCommInitRank: socket: " + std::string(std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{listener};
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&a.addr), a.length) != 0 || ::listen(listener, link.nranks) != 0)
    return refuse(ncclSystemError, "ncclCommInitRank: rank 0 cannot listen on @" + name + ": " + std::strerror(errno) +
                                       " (an id used by two rank 0s?)");
  const auto deadline = Clock::now() + join_limit;
  std::vector<std::pair<int, Hello>> joined;
  const auto close_joined = [&] {
    for (const auto& j : joined) ::close(j.first);
  };
  while (int(joined.size()) < link.nranks - 1) {
    int fd = -1;
    if (ready(listener, POLLIN, deadline, &link.aborted) == Io::ok) fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    Hello hello{};
    if (fd >= 0 && recv_all(fd, &hello, sizeof hello, deadline, &link.aborted) == Io::ok) {
      joined.emplace_back(fd, hello);
      continue;
    }
    if (fd >= 0) ::close(fd);
    if (link.aborted) {
      close_joined();
      return refuse(ncclInvalidUsage, "ncclCommInitRank: rank 0's communicator was aborted while joining");
    }
    if (Clock::now() < deadline) continue;
    close_joined();
    return refuse(ncclSystemError, "ncclCommInitRank: rank 0 waited 60 s, and only " + std::to_string(joined.size()) +
                                       " of the other " + std::to_string(link.nranks - 1) + " ranks joined");
  }
  std::string wrong;
  for (const auto& [fd, hello] : joined) {
    if (hello.nranks != link.nranks)
      wrong = "rank " + std::to_string(hello.rank) + " says there are " + std::to_string(hello.nranks) +
              " ranks, rank 0 says " + std::to_string(link.nranks);
    else if (hello.rank < 1 || hello.rank >= link.nranks)
      wrong = "a rank joined as rank " + std::to_string(hello.rank) + " of " + std::to_string(link.nranks);
    else if (link.fds[std::size_t(hello.rank)] >= 0)
      wrong = "two ranks joined as rank " + std::to_string(hello.rank);
    if (!wrong.empty()) break;
    link.fds[std::size_t(hello.rank)] = fd;
  }
  const unsigned char verdict = wrong.empty() ? 0 : 1;
  for (const auto& j : joined) (void)send_all(j.first, &verdict, 1, deadline + join_limit);
  if (wrong.empty()) return ncclSuccess;
  std::fill(link.fds.begin(), link.fds.end(), -1);
  close_joined();
  return refuse(ncclInvalidUsage, "ncclCommInitRank: " + wrong);
}

/// Another rank: connects to rank 0 (which may not listen yet), says who it
/// is and waits for rank 0's verdict.
ncclResult_t join_rank0(Link& link, const Address& a, const std::string& name) {
  const std::string who = "ncclCommInitRank: rank " + std::to_string(link.rank) + " of " + std::to_string(link.nranks);
  const auto deadline = Clock::now() + join_limit;
  int fd = -1;
  for (;;) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return refuse(ncclSystemError, who + ": socket: " + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.length) == 0) break;
    ::close(fd);
    if (link.aborted) return refuse(ncclInvalidUsage, who + ": its communicator was aborted while joining");
    if (Clock::now() >= deadline) return refuse(ncclSystemError, who + " did not find rank 0 (@" + name + ") within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  link.fds[0] = fd;
  const Hello hello{link.rank, link.nranks};
  unsigned char verdict = 1;
  // Rank 0 may wait up to join_limit for the last rank before it answers.
  const Io io = send_all(fd, &hello, sizeof hello, deadline + join_limit, &link.aborted) == Io::ok
                    ? recv_all(fd, &verdict, 1, Clock::now() + join_limit + std::chrono::seconds(10), &link.aborted)
                    : Io::closed;
  if (io == Io::ok && verdict == 0) return ncclSuccess;
  ::close(fd);
  link.fds[0] = -1;
  if (io != Io::ok) return refuse(ncclSystemError, who + ": rank 0 did not answer (it failed, or not all ranks joined)");
  return refuse(ncclInvalidUsage, who + ": rank 0 refused the communicator (see its message)");
}

/// What every rank sends rank 0 before each collective: all must agree.
struct Header {
  std::uint64_t seq, count;
  std::int32_t kind, op, type, root;
  bool operator==(const Header&) const = default;
};

std::string describe(const Header& h) {
  static const char* const ops[] = {"sum", "prod", "max", "min", "avg"};
  const char* type = h.type == ncclFloat32 ? "float32" : h.type == ncclFloat64 ? "float64" : h.type == ncclInt32 ? "int32" : "int64";
  if (h.kind < all_reduce || h.kind > reduce_scatter) return "collective " + std::to_string(h.seq) + ", of no known kind";
  std::string s = "collective " + std::to_string(h.seq) + ", " + kind_names[h.kind] + "(count " + std::to_string(h.count) +
                  ", " + type;
  if ((h.kind == all_reduce || h.kind == reduce_scatter) && h.op >= ncclSum && h.op <= ncclAvg) s += std::string(", ") + ops[h.op];
  if (h.kind == broadcast) s += ", root " + std::to_string(h.root);
  return s + ")";
}

template <class T>
T combine(ncclRedOp_t op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wraps, as a GPU's integers do, instead of undefined overflow
    switch (op) {
      case ncclProd: return T(U(a) * U(b));
      case ncclMax: return std::max(a, b);
      case ncclMin: return std::min(a, b);
      default: return T(U(a) + U(b));
    }
  } else {
    switch (op) {
      case ncclProd: return a * b;
      case ncclMax: return std::fmax(a, b);  // CUDA's fmaxf/fminf: a NaN loses
      case ncclMin: return std::fmin(a, b);
      default: return a + b;
    }
  }
}

/// Reduces `elements` values of every rank's data in rank order into `out`.
template <class T>
void reduce(ncclRedOp_t op, const std::vector<std::vector<unsigned char>>& data, std::size_t elements, void* out) {
  if (elements == 0) return;
  std::vector<T> acc(elements);
  std::memcpy(acc.data(), data[0].data(), elements * sizeof(T));
  for (std::size_t r = 1; r < data.size(); ++r)
    for (std::size_t i = 0; i < elements; ++i) {
      T x;
      std::memcpy(&x, data[r].data() + i * sizeof(T), sizeof(T));
      acc[i] = combine(op, acc[i], x);
    }
  if (op == ncclAvg)
    for (T& x : acc) x = T(x / T(data.size()));
  std::memcpy(out, acc.data(), elements * sizeof(T));
}

void reduce_as(ncclDataType_t type, ncclRedOp_t op, const std::vector<std::vector<unsigned char>>& data,
               std::size_t elements, void* out) {
  switch (type) {
    case ncclFloat32: reduce<float>(op, data, elements, out); break;
    case ncclFloat64: reduce<double>(op, data, elements, out); break;
    case ncclInt32: reduce<std::int32_t>(op, data, elements, out); break;
    default: reduce<std::int64_t>(op, data, elements, out); break;
  }
}

/// One collective across processes, as its stream runs it.
struct Exchange {
  Queued q;  // q.comm is not used: the communicator may be destroyed before this runs
  std::shared_ptr<Link> link;

  std::size_t bytes(std::size_t elements) const { return elements * size_of(q.type); }
  /// What rank r sends rank 0.
  std::size_t sent_by(int r) const {
    switch (q.kind) {
      case broadcast: return r == q.root ? bytes(q.count) : 0;
      case reduce_scatter: return bytes(q.count * std::size_t(link->nranks));
      default: return bytes(q.count);
    }
  }
  /// What each rank receives.
  std::size_t received() const { return q.kind == all_gather ? bytes(q.count * std::size_t(link->nranks)) : bytes(q.count); }

  [[noreturn]] void lost(int peer, Io io, const Header& h) const {
    const std::string call = kind_names[q.kind] + std::string(" (collective ") + std::to_string(h.seq) + ")";
    const std::string me = "rank " + std::to_string(link->rank);
    if (io == Io::timed_out) {
      fake_cuda::explain((me + " waited 2 minutes for rank " + std::to_string(peer) + " in " + call +
                          "; on GPUs this is a hang")
                             .c_str());
      std::abort();
    }
    link->broken = true;
    link->cut();  // the other ranks fail too instead of waiting for this one
    const std::string why = link->aborted ? "its communicator was aborted"
                                          : "rank " + std::to_string(peer) + " is gone (it exited, failed or aborted)";
    fake_cuda::explain(("NCCL across processes: " + me + " lost " + call + ": " + why).c_str());
    throw std::runtime_error(std::string(kind_names[q.kind]) + ": " + why);
  }

  void operator()() const {
    Link& l = *link;
    std::lock_guard lk(l.m);
    const Header mine{l.next++, q.count, q.kind, q.op, q.type, q.root};
    if (l.broken) {
      fake_cuda::explain(("NCCL across processes: " + std::string(kind_names[q.kind]) + " on rank " +
                          std::to_string(l.rank) + " after its communicator failed")
                             .c_str());
      throw std::runtime_error(std::string(kind_names[q.kind]) + ": the communicator failed before");
    }
    const auto deadline = [] { return Clock::now() + hang_limit; };
    if (l.rank != 0) {
      const int fd = l.fds[0];
      Io io = send_all(fd, &mine, sizeof mine, deadline());
      if (io == Io::ok) io = send_all(fd, q.from, sent_by(l.rank), deadline());
      if (io == Io::ok) io = recv_all(fd, q.to, received(), deadline());
      if (io != Io::ok) lost(0, io, mine);
      return;
    }
    std::vector<std::vector<unsigned char>> data(std::size_t(l.nranks));
    const auto* own = static_cast<const unsigned char*>(q.from);
    data[0].assign(own, own + sent_by(0));
    for (int r = 1; r < l.nranks; ++r) {
      const int fd = l.fds[std::size_t(r)];
      Header theirs{};
      if (const Io io = recv_all(fd, &theirs, sizeof theirs, deadline()); io != Io::ok) lost(r, io, mine);
      if (!(theirs == mine)) {
        // A real NCCL would hang or mix up the buffers.
        fake_cuda::explain(("NCCL across processes: the ranks disagree: rank 0 runs " + describe(mine) + ", rank " +
                            std::to_string(r) + " runs " + describe(theirs))
                               .c_str());
        std::abort();
      }
      data[std::size_t(r)].resize(sent_by(r));
      if (const Io io = recv_all(fd, data[std::size_t(r)].data(), sent_by(r), deadline()); io != Io::ok) lost(r, io, mine);
    }
    std::vector<unsigned char> result;  // what every rank gets, or (reduce_scatter) the blocks of all
    switch (q.kind) {
      case all_reduce:
      case reduce_scatter:
        result.resize(sent_by(0));
        reduce_as(q.type, q.op, data, result.size() / size_of(q.type), result.data());
        break;
      case broadcast: result = data[std::size_t(q.root)]; break;
      case all_gather:
        for (const auto& d : data) result.insert(result.end(), d.begin(), d.end());
        break;
    }
    const std::size_t block = received();
    const auto part = [&](int r) { return result.data() + (q.kind == reduce_scatter ? std::size_t(r) * block : 0); };
    for (int r = 1; r < l.nranks; ++r)
      if (const Io io = send_all(l.fds[std::size_t(r)], part(r), block, deadline()); io != Io::ok) lost(r, io, mine);
    if (block > 0) std::memcpy(q.to, part(0), block);
  }
};

ncclResult_t launch_across(const Queued& q) {
  const std::shared_ptr<Link> link = q.comm->link;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(link->device);  // as NCCL does for its launch
  const cudaError_t status = fake_cuda::launch(q.stream, Exchange{q, link}, kind_names[q.kind]);
  cudaSetDevice(previous);
  return status == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t launch_any(const Queued& q) { return q.comm->link ? launch_across(q) : launch(q); }

/// Checks a collective's arguments, then queues it in the open group or launches it.
ncclResult_t collective(const Queued& q) {
  const char* name = kind_names[q.kind];
  const auto fail = [&](ncclResult_t status, const std::string& why) {
    fake_cuda::explain((std::string(name) + ": " + why).c_str());
    if (group.depth > 0 && group.failed == ncclSuccess) group.failed = status;
    return status;
  };
  const ncclComm_t comm = q.comm;
  if (!comm) return fail(ncclInvalidArgument, "no communicator");
  if (comm->deferred)
    return fail(ncclInvalidUsage, "a call before ncclCommGetAsyncError said the last one (ncclInProgress) ended");
  if (comm->link && comm->link->joining != ncclSuccess)
    return fail(ncclInvalidUsage, "a communicator that has not joined (ncclCommGetAsyncError did not say ncclSuccess)");
  if (q.type != ncclFloat32 && q.type != ncclFloat64 && q.type != ncclInt32 && q.type != ncclInt64)
    return fail(ncclInvalidArgument, "a type the stand-in does not model (float32, float64, int32 and int64 only)");
  const bool reduces = q.kind == all_reduce || q.kind == reduce_scatter;
  if (!comm->link) {
    if (q.kind != all_reduce || q.op != ncclSum)
      return fail(ncclInvalidArgument, "ncclCommInitAll's communicators only sum in the stand-in");
  } else if (reduces && (q.op < ncclSum || q.op > ncclAvg)) {
    return fail(ncclInvalidArgument, "an operation other than sum, prod, max, min and avg");
  }
  const int ranks = comm->link ? comm->link->nranks : int(comm->clique->devices.size());
  if (q.kind == broadcast && (q.root < 0 || q.root >= ranks))
    return fail(ncclInvalidArgument, "root " + std::to_string(q.root) + " of " + std::to_string(ranks) + " ranks");
  const int device = comm->link ? comm->link->device : comm->clique->devices[std::size_t(comm->rank)];
  if (fake_cuda::device_of(q.stream) != device)
    return fail(ncclInvalidArgument, "on a stream of another device than its communicator's");
  const std::size_t each = q.count * size_of(q.type), all = each * std::size_t(ranks);
  std::size_t in = each, out = each;
  if (q.kind == all_gather) out = all;
  if (q.kind == reduce_scatter) in = all;
  if (q.kind == broadcast && comm->rank != q.root) in = 0;  // read on the root only
  if ((in > 0 && fake_cuda::device_memory_of(q.from, in) != device) ||
      (out > 0 && fake_cuda::device_memory_of(q.to, out) != device))
    return fail(ncclInvalidArgument, "a buffer that is not its communicator's device memory");
  if (group.depth > 0) {
    group.parts.push_back(q);
    return ncclSuccess;
  }
  if (!comm->link && comm->clique->devices.size() > 1)
    return fail(ncclInvalidUsage, "over several GPUs from one thread outside ncclGroupStart/End");
  if (!comm->blocking) {
    // Work put on the stream before the query that launches this would run
    // ahead of the collective: what NCCL's rule forbids, made visible.
    comm->deferred = [q] { return launch_any(q); };
    comm->stuck = fake_cuda::take_fault(name) == fake_cuda::Fault::hang;
    return ncclInProgress;
  }
  return launch_any(q);
}

ncclResult_t release(ncclComm_t comm, bool abort) {
  if (!comm) return ncclSuccess;
  if (comm->link && abort) {
    comm->link->aborted = true;
    comm->link->cut();  // a collective blocked on a socket returns (and fails)
  }
  delete comm;  // the sockets close with the last collective that holds them
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || ndev <= 0) return ncclInvalidArgument;
  auto clique = std::make_shared<Clique>();
  for (int r = 0; r < ndev; ++r) {
    const int d = devlist ? devlist[r] : r;
    if (d < 0 || d >= devices || std::set<int>(clique->devices.begin(), clique->devices.end()).count(d))
      return ncclInvalidArgument;
    clique->devices.push_back(d);
  }
  for (int r = 0; r < ndev; ++r) {
    fake_cuda::make_context(clique->devices[std::size_t(r)]);  // each rank's resources live on its GPU
    comms[r] = new ncclComm{clique, r};
  }
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  static std::atomic<unsigned> counter{0};
  static const unsigned long long salt = std::random_device{}();  // another boot's process of the same pid differs
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "deft-fake-nccl-%ld-%u-%llx", long(::getpid()), counter++, salt);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
    return refuse(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                           std::to_string(nranks) + " ranks (or no communicator to set)");
  *comm = nullptr;
  Address a;
  if (!address_of(id, a)) return refuse(ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId");
  const std::string name(id.internal, strnlen(id.internal, sizeof id.internal));
  const fake_cuda::Fault fault = fake_cuda::take_fault("ncclCommInitRank");
  if (fault == fake_cuda::Fault::fail)
    return refuse(ncclSystemError, "ncclCommInitRank: rank " + std::to_string(rank) + " failed as its test asked");
  const bool blocking = !config || config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT: NCCL's default, blocking
  if (fault == fake_cuda::Fault::hang && blocking)
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  int device = 0;
  cudaGetDevice(&device);
  fake_cuda::make_context(device);  // the communicator's resources live on its GPU
  auto link = std::make_shared<Link>(rank, nranks, device);
  const auto join = [link, a, name] {
    if (link->nranks == 1) return ncclSuccess;
    return link->rank == 0 ? accept_ranks(*link, a, name) : join_rank0(*link, a, name);
  };
  if (blocking) {
    if (const ncclResult_t status = join()) return status;
  } else {
    // Joins on a thread of its own, as NCCL's non-blocking init does; the
    // thread holds the link, so an aborted communicator may go first.
    link->joining = ncclInProgress;
    if (fault != fake_cuda::Fault::hang) std::thread([link, join] { link->joining = join(); }).detach();
  }
  *comm = new ncclComm{nullptr, rank, 0, link, blocking};
  return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm, false); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, true); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->link ? comm->link->nranks : int(comm->clique->devices.size());
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return ncclInvalidArgument;
  *device = comm->link ? comm->link->device : comm->clique->devices[std::size_t(comm->rank)];
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (!comm || !error) return ncclInvalidArgument;
  if (comm->link && comm->link->joining != ncclSuccess) {
    *error = comm->link->joining;
    return ncclSuccess;
  }
  if (comm->stuck) {
    *error = ncclInProgress;
    return ncclSuccess;
  }
  if (comm->deferred) {
    const ncclResult_t launched = std::exchange(comm->deferred, nullptr)();
    if (launched != ncclSuccess) {
      *error = launched;
      return ncclSuccess;
    }
  }
  *error = comm->link && comm->link->broken ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  if (group.depth++ == 0) fake_cuda::collective_group(true);
  return ncclSuccess;
}

// The outermost end launches the group's parts, or abandons them all after
// a failed call in the group.
ncclResult_t ncclGroupEnd(void) {
  if (group.depth == 0) return ncclInvalidUsage;
  if (--group.depth > 0) return ncclSuccess;
  std::vector<Queued> parts;
  parts.swap(group.parts);
  ncclResult_t status = std::exchange(group.failed, ncclSuccess);
  if (status == ncclSuccess)
    for (const Queued& q : parts)
      if ((status = launch_any(q)) != ncclSuccess) break;
  fake_cuda::collective_group(false);
  return status;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective({comm, sendbuff, recvbuff, count, datatype, stream, all_reduce, op, 0});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective({comm, sendbuff, recvbuff, count, datatype, stream, broadcast, ncclSum, root});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective({comm, sendbuff, recvbuff, sendcount, datatype, stream, all_gather, ncclSum, 0});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective({comm, sendbuff, recvbuff, recvcount, datatype, stream, reduce_scatter, op, 0});
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: break;
  }
  return "unknown result code";
}

}  // extern "C"
