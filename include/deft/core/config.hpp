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

// SIMD evaluators are host-only: xsimd is never seen by device code.
#if !defined(__CUDA_ARCH__)
#define DEFT_HOST_SIMD 1
#else
#define DEFT_HOST_SIMD 0
#endif
