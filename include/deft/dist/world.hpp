// The process-wide set-up of deft::dist: init() joins the job and makes the
// world's MpiCommunicator, the default of every collective; rank, size,
// local rank and the default device; finalize(), also run at exit.
#pragma once
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>

#include "../core/device.hpp"
#include "../engine/api.hpp"
#include "collectives.hpp"
#include "mpi.hpp"

namespace deft::dist {

namespace detail {
struct World {
  std::shared_ptr<MpiCommunicator> comm;
  bool owns_mpi = false;  // deft called MPI_Init_thread, so finalize() calls MPI_Finalize
  int local_rank = 0, local_size = 1;
};
inline World& world_state() {
  static World w;
  return w;
}
inline void finalize_at_exit() noexcept;
}  // namespace detail

/// Joins the job: initializes MPI unless the program did (MPI_Init_thread,
/// asking for MPI_THREAD_MULTIPLE; MPI_THREAD_SERIALIZED is enough, as
/// deft's collectives make one MPI call at a time), and makes a communicator
/// over `comm` (by default MPI_COMM_WORLD) the default one of every
/// collective and of Trainer::set_communicator. finalize() runs at exit if
/// the program does not call it. std::logic_error when called twice;
/// dist::Error when MPI grants less than MPI_THREAD_SERIALIZED.
inline std::shared_ptr<MpiCommunicator> init(int* argc = nullptr, char*** argv = nullptr, Options options = {},
                                             MPI_Comm comm = MPI_COMM_WORLD) {
  auto& w = detail::world_state();
  if (w.comm) deft::detail::raise<std::logic_error>("dist::init: called twice (call dist::finalize() first)");
  int ready = 0, finalized = 0;
  MPI_Initialized(&ready);
  MPI_Finalized(&finalized);
  if (finalized) deft::detail::raise<std::logic_error>("dist::init: MPI was finalized already");
  int level = 0;
  if (!ready) {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level) != MPI_SUCCESS)
      deft::detail::raise<Error>("dist::init: MPI_Init_thread failed");
    w.owns_mpi = true;
    static const bool registered = std::atexit(detail::finalize_at_exit) == 0;
    (void)registered;
  } else {
    MPI_Query_thread(&level);
  }
  if (level < MPI_THREAD_SERIALIZED)
    deft::detail::raise<Error>("dist::init: MPI grants thread level ", level,
                               "; deft's collectives run on its worker threads and need MPI_THREAD_SERIALIZED or above");
  w.comm = std::make_shared<MpiCommunicator>(comm, options);
  if (options.extra_worker) engine::set_num_workers(engine::num_workers() + 1);
  MPI_Comm local;
  MPI_Comm_split_type(w.comm->comm(), MPI_COMM_TYPE_SHARED, w.comm->rank(), MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &w.local_rank);
  MPI_Comm_size(local, &w.local_size);
  MPI_Comm_free(&local);
  default_communicator() = w.comm;
  return w.comm;
}

/// Whether init() was called (and finalize() not yet).
inline bool initialized() { return detail::world_state().comm != nullptr; }

/// The communicator init() made; std::logic_error before init().
inline const std::shared_ptr<MpiCommunicator>& world() {
  const auto& c = detail::world_state().comm;
  if (!c) deft::detail::raise<std::logic_error>("dist: not initialized; call deft::dist::init() first");
  return c;
}
/// This process's rank in world() (0 before init()).
inline int rank() { return initialized() ? world()->rank() : 0; }
/// The number of ranks in world() (1 before init()).
inline int size() { return initialized() ? world()->size() : 1; }
/// This process's rank among the ranks on its host.
inline int local_rank() { return detail::world_state().local_rank; }
/// The number of ranks on this host.
inline int local_size() { return detail::world_state().local_size; }

/// The device this rank trains on: GPU local_rank() mod the GPU count when
/// this build has the CUDA backend and the host has GPUs, else the CPU.
inline Device default_device() {
  if (auto* gpus = deft::detail::gpu_backend(); gpus && gpus->device_count() > 0)
    return Device{DeviceType::gpu, local_rank() % gpus->device_count()};
  return Device{};
}

/// Leaves the job: runs the recorded work (every collective included),
/// releases deft's communicators and, if init() initialized MPI, calls
/// MPI_Finalize. Rethrows a failure of that work after finalizing.
inline void finalize() {
  auto& w = detail::world_state();
  if (!w.comm) return;
  std::exception_ptr failure;
  try {
    wait_all();
  } catch (...) {
    failure = std::current_exception();
  }
  if (default_communicator() == w.comm) default_communicator().reset();
  w.comm.reset();  // other holders (a Trainer) keep theirs; MPI_Finalize then frees its communicators
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (w.owns_mpi && !finalized) MPI_Finalize();
  w.owns_mpi = false;
  if (failure) std::rethrow_exception(failure);
}

inline void detail::finalize_at_exit() noexcept {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deft: dist: at exit: %s\n", e.what());
  }
}

}  // namespace deft::dist
