// The SIMD batch type of deft's CPU kernels: xsimd's batch for the best
// instruction set the compiler targets, with one exception below.
#pragma once
#include <xsimd/xsimd.hpp>

namespace deft::detail::cpu {

// GCC without optimization (-O0) defines some AVX-512BW intrinsics as macros
// whose casts reject the int batches that xsimd 8's select passes them (inside
// log, exp, pow...): "invalid cast ... to type '__v64qi'". A debug build with
// -march=native on an AVX-512 machine would not compile, so it uses AVX2
// batches; optimized builds and clang keep AVX-512.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE__) && defined(__AVX512BW__) && defined(__AVX2__)
using simd_arch = xsimd::avx2;
#else
using simd_arch = xsimd::default_arch;
#endif

template <class T>
using simd_batch = xsimd::batch<T, simd_arch>;

}  // namespace deft::detail::cpu
