#!/usr/bin/env bash
# Builds deft's tests with sanitizers and runs all of them (CI runs both):
#   scripts/sanitize.sh address,undefined   # ASan + UBSan + LeakSanitizer
#   scripts/sanitize.sh thread              # TSan
# Built with clang (CXX overrides it), warnings as errors (DEFT_WERROR), at -O0: the instrumentation makes
# clang -O1 far slower to compile deft's kernels (ASan+UBSan:
# test_broadcasting.cpp 163 s at -O1, 35 s at -O0; TSan: test_engine.cpp 70 s
# and 28 s). The tests run slower at -O0 (ASan+UBSan about 2.4x; TSan up to
# 5x: all_suites_five_workers 27 s at -O1, 143 s at -O0), still far less than
# the compile time saved. TSan covers the concurrent code only. The
# stress, fault and fuzz sizes are reduced to fit CI; set the DEFT_* variables
# yourself for longer runs.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers="${1:?usage: scripts/sanitize.sh address,undefined|thread}"
build="build-${sanitizers//,/-}"

./scripts/setup.sh --sanitizers
# The ASan+UBSan build also compiles every example (the README's test command
# leaves them out): at -O0 that costs a fraction of the Release build's -O3,
# and the CUDA ones (nvcc, not instrumented) still prove that they compile.
# Their host code is built at -O0 without debug information (nvcc's
# train_fashion_mnist_gpu.cu: 126 s at -O0, 150 s at -O1), their device code
# unoptimized (-G: cicc took 118 s instead of 163 s over
# tests/gpu/test_random_device.cu).
# The tests across processes (deft::dist) are left out of both: Open MPI's
# libraries are not instrumented (TSan cannot see their synchronisation) and
# keep allocations to exit (LeakSanitizer reports them).
if [ "$sanitizers" = thread ]; then
  extra=(-DDEFT_BUILD_EXAMPLES=OFF -DDEFT_CUDA=OFF -DDEFT_DIST=OFF)
else
  extra=(-DDEFT_BUILD_EXAMPLES=ON "-DCMAKE_CUDA_FLAGS_DEBUG=-O0 -G" -DDEFT_DIST=OFF)
fi
# Ninja builds the targets listed below in parallel: CMake's Makefiles build
# a list of targets one after another, and each test runner is one
# translation unit (tests/CMakeLists.txt), so make -j2 would leave a core idle.
if [ -f "$build/CMakeCache.txt" ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build/CMakeCache.txt"; then
  rm -rf "$build"  # configured with another generator by an older version of this script
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="${CXX:-clang++}" -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O0 -g1" \
  -DDEFT_SANITIZE="$sanitizers" -DDEFT_WERROR=ON "${extra[@]}" >/dev/null
# TSan is for the concurrent code: the engine and its stress tests, the data
# loader's prefetch thread, the parallel kernels, hybridized replays and the
# profiler, the emulated GPUs' lanes (gpu_kernels_host, 50 s), and the real
# CUDA backend's streams on tests/gpu/fake_cuda's stand-in. The
# single-threaded proofs (fuzzing, bad input, gradient checks, convolutions,
# the gzip, IDX and Fashion-MNIST readers: 42 s of TSan at -O0) run under
# ASan+UBSan only.
# numerics_synchronous, all_suites_one_worker and all_suites_five_workers
# repeat the suites under other engine settings (minutes at -O0 ASan): the
# Release run covers those modes, and TSan runs the five-worker repeat for
# races. The bad_input_compile_* tests check what fails to compile, which
# the Release run does once.
targets=""
exclude='^(numerics_synchronous|all_suites_one_worker|all_suites_five_workers|bad_input_compile_.*)$'
if [ "$sanitizers" = thread ]; then
  targets="deft_tests exit_pending deft_stress deft_data_tests deft_nn_tests deft_observe_tests deft_gpu_kernels_host deft_gpu_backend_fake"
  # deft_tests' suites run once, inside all_suites_five_workers, except the
  # engine's: at -O0 each repeat of the numeric ones costs TSan minutes.
  exclude='^((numerics_synchronous|all_suites_one_worker|creation|random_numbers|printing|elementwise|elementwise_int|broadcasting|reductions|linalg|views|host_memory)$|fuzz_|bad_input_|autograd_|conv_|gpu_kernels$|data_(gzip|idx|fashion_mnist|fashion_mnist_real)$)'
fi
# shellcheck disable=SC2086
cmake --build "$build" -j2 ${targets:+--target $targets}

# One test asks for an impossible allocation on purpose and expects
# std::bad_alloc, which the sanitizers' allocators otherwise abort on.
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="allocator_may_return_null=1:halt_on_error=1:second_deadlock_stack=1"
# TSan is the point of the scheduler stress: it gets twice the ASan run's tasks
# (400,000; a million take about 95 s of the stage).
if [ "$sanitizers" = thread ]; then stress_tasks=400000; else stress_tasks=200000; fi
export DEFT_STRESS_TASKS="${DEFT_STRESS_TASKS:-$stress_tasks}"
export DEFT_FAULT_PROGRAMS="${DEFT_FAULT_PROGRAMS:-300}"
export DEFT_MEMORY_STEPS="${DEFT_MEMORY_STEPS:-300}"
export DEFT_FUZZ_PROGRAMS="${DEFT_FUZZ_PROGRAMS:-2000}"
export DEFT_FUZZ_GRADIENT_PROGRAMS="${DEFT_FUZZ_GRADIENT_PROGRAMS:-1000}"
# The package checks (label `package`: install, find_package, pkg-config,
# Conan) and the API reference check (label `docs`) test packaging and
# comments, not code: the Release run covers them.
ctest --test-dir "$build" --output-on-failure -j2 -LE '^(package|docs)$' ${exclude:+-E "$exclude"}
