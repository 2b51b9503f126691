// Build-wide macros: version and the host/device function marker.
#pragma once

#define DEFT_VERSION_MAJOR 0
#define DEFT_VERSION_MINOR 1
#define DEFT_VERSION_PATCH 0

// Functions that run inside kernels on either device carry DEFT_HD; under a
// plain C++ compiler it is empty so the CPU build needs no CUDA at all.
#if defined(__CUDACC__)
#define DEFT_HD __host__ __device__
#else
#define DEFT_HD
#endif

// A loop to unroll fully: over max_rank with a test of the rank inside, its
// indices are constants, so a GPU thread keeps the arrays it walks in
// registers instead of on its stack.
#if defined(__CUDACC__) || defined(__clang__)
#define DEFT_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define DEFT_UNROLL _Pragma("GCC unroll 8")
#else
#define DEFT_UNROLL
#endif

// The CPU's xsimd loops are compiled in every host pass, but not in nvcc's
// device pass: there their batches would reach the DEFT_HD operators, and
// nvcc rejects vector types in __device__ code, even code never called
// from a kernel. The device pass discards host functions' bodies anyway.
#if defined(__CUDA_ARCH__)
#define DEFT_CPU_SIMD 0
#else
#define DEFT_CPU_SIMD 1
#endif

// The SIMD reads of kernel views: one call per batch of every node of an
// expression tree, which GCC's inliner gives up on for deep trees (measured:
// a 7-node tree spent a third of its time in out-of-line batch calls).
#if defined(__GNUC__)
#define DEFT_ALWAYS_INLINE [[gnu::always_inline]]
#else
#define DEFT_ALWAYS_INLINE
#endif

// The rare path of a function that is called everywhere, kept out of line
// so that the common path stays small enough to inline at every call.
#if defined(__GNUC__)
#define DEFT_NOINLINE [[gnu::noinline]]
#elif defined(_MSC_VER)
#define DEFT_NOINLINE __declspec(noinline)
#else
#define DEFT_NOINLINE
#endif

// DEFT_ASAN: 1 when AddressSanitizer instruments this build (GCC and clang
// announce it differently), else 0. deft then poisons its own recycled
// memory, and the emulated GPUs hand out exact blocks, so that ASan sees
// what overruns.
#if !defined(DEFT_ASAN)
#if defined(__SANITIZE_ADDRESS__)
#define DEFT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DEFT_ASAN 1
#endif
#endif
#endif
#if !defined(DEFT_ASAN)
#define DEFT_ASAN 0
#endif

// Header-only by default: the runtime below the templates (the scheduler,
// its thread pool, tasks, buffers, the host memory cache, hybridize's
// traces and replays, and data/'s readers) is inline and compiled in every
// translation unit that uses it. With DEFT_SEPARATE_COMPILATION defined in
// every translation unit (CMake: link deft::compiled), those functions are
// only declared, and defined once, where deft/src.hpp is included.
// DEFT_DECL marks them; DEFT_DEFINE_RUNTIME says whether this translation
// unit compiles their bodies.
//
// nn (deft/nn.hpp) has a switch of its own, DEFT_DEFINE_NN, set where
// deft/nn_src.hpp is included: there its layers' key functions (so their
// vtables and forward passes), the layer templates' instances, the
// Trainer's steps, TrainStep's core, hybridized blocks' calls, parameter
// files and checkpoints are compiled, and nowhere else. Programs without nn need no
// such file.
#if defined(DEFT_SEPARATE_COMPILATION)
#define DEFT_DECL
#if defined(DEFT_BUILDING_RUNTIME)
#define DEFT_DEFINE_RUNTIME 1
#else
#define DEFT_DEFINE_RUNTIME 0
#endif
#if defined(DEFT_BUILDING_NN)
#define DEFT_DEFINE_NN 1
#else
#define DEFT_DEFINE_NN 0
#endif
#else
#define DEFT_DECL inline
#define DEFT_DEFINE_RUNTIME 1
#define DEFT_DEFINE_NN 1
#endif
