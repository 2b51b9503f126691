// The headers of the optional peers the elementwise, broadcast and reduce
// groups compare against (each present only when CMake found it).
#pragma once

#if DEFT_BENCH_HAVE_EIGEN
#define EIGEN_USE_THREADS
#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>
#endif
#if DEFT_BENCH_HAVE_XTENSOR
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>
#endif
