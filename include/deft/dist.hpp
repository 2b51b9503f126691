// deft::dist: data-parallel training across processes and hosts over MPI
// (docs/distributed.md). The only deft header whose headers include <mpi.h>:
// link deft::dist (CMake), or compile with mpicxx.
//
//   auto world = deft::dist::init(&argc, &argv);
//   trainer.set_communicator(world);   // broadcast from rank 0, gradients summed across ranks
//   deft::dist::allreduce(t, deft::dist::ReduceOp::mean);
#pragma once

#include "deft.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"
#include "dist/mpi.hpp"
#include "dist/world.hpp"
