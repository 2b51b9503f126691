// deft's runtime, compiled once. In the compiled mode every translation unit
// of a program defines DEFT_SEPARATE_COMPILATION and so only declares the
// runtime's functions (the scheduler, its thread pool, tasks, buffers, the
// host memory cache); exactly one .cpp defines them by including this
// header, first, before any other deft header. CMake does both for targets that link deft::compiled.
#pragma once

#if !defined(DEFT_SEPARATE_COMPILATION)
#error "deft/src.hpp: define DEFT_SEPARATE_COMPILATION in every translation unit of the program (CMake: link deft::compiled)"
#endif
#if defined(DEFT_VERSION_MAJOR)
#error "deft/src.hpp: include it before any other deft header, in a .cpp of its own"
#endif

#define DEFT_BUILDING_RUNTIME
// Every DEFT_DEFINE_RUNTIME section is in the engine (engine/, device/;
// replay.hpp and trace.hpp are hybridize's, which deft.hpp leaves out) but
// the CPU kernel of autograd's elementwise programs and the data readers
// (data/: files, gzip, Fashion-MNIST, the DataLoader).
#include "engine/engine.hpp"
#include "engine/replay.hpp"
#include "eval/cpu/program.hpp"
#include "data.hpp"
