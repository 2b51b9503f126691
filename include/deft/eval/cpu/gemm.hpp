// CPU matrix product C = A * B (row-major, contiguous): B is packed into
// panels of NR columns, A into panels of MR rows, and a register-blocked
// xsimd micro-kernel accumulates an MR x NR tile with FMAs. Blocks of rows
// of C run on different workers.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "../../engine/engine.hpp"
#include "../../engine/thresholds.hpp"
#include "elementwise.hpp"

namespace deft::detail::cpu {

template <class T>
struct AlignedScratch {
  explicit AlignedScratch(std::size_t n)
      : p(static_cast<T*>(std::aligned_alloc(thresholds::alignment,
                                             (n * sizeof(T) + thresholds::alignment - 1) / thresholds::alignment *
                                                 thresholds::alignment))) {
    if (!p) throw std::bad_alloc();
  }
  ~AlignedScratch() { std::free(p); }
  AlignedScratch(const AlignedScratch&) = delete;
  AlignedScratch& operator=(const AlignedScratch&) = delete;
  T* p;
};

template <class T>
struct GemmKernel {
  using B = xsimd::batch<T>;
  static constexpr std::int64_t W = B::size;
  static constexpr std::int64_t MR = thresholds::gemm_mr;
  static constexpr std::int64_t NR = 2 * W;

  // Packs rows [0, mc) x depth [0, kc) of A (leading dim lda) into MR-row panels, zero padded.
  static void pack_a(const T* a, std::int64_t lda, std::int64_t mc, std::int64_t kc, T* dst) {
    for (std::int64_t i0 = 0; i0 < mc; i0 += MR) {
      const std::int64_t rows = std::min(MR, mc - i0);
      for (std::int64_t k = 0; k < kc; ++k) {
        for (std::int64_t r = 0; r < rows; ++r) dst[r] = a[(i0 + r) * lda + k];
        for (std::int64_t r = rows; r < MR; ++r) dst[r] = T(0);
        dst += MR;
      }
    }
  }
  // Packs depth [0, kc) x columns [0, nc) of B (leading dim ldb) into NR-column panels, zero padded.
  static void pack_b(const T* b, std::int64_t ldb, std::int64_t kc, std::int64_t nc, T* dst) {
    for (std::int64_t j0 = 0; j0 < nc; j0 += NR) {
      const std::int64_t cols = std::min(NR, nc - j0);
      for (std::int64_t k = 0; k < kc; ++k) {
        const T* src = b + k * ldb + j0;
        if (cols == NR) std::memcpy(dst, src, NR * sizeof(T));
        else {
          std::memcpy(dst, src, cols * sizeof(T));
          std::fill(dst + cols, dst + NR, T(0));
        }
        dst += NR;
      }
    }
  }

  // C[0:mr, 0:nr] (+)= Ap * Bp over kc.
  static void micro(std::int64_t kc, const T* ap, const T* bp, T* c, std::int64_t ldc, bool accumulate, std::int64_t mr,
                    std::int64_t nr) {
    B acc[MR][2];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = B(T(0));
    for (std::int64_t k = 0; k < kc; ++k) {
      const B b0 = B::load_aligned(bp);
      const B b1 = B::load_aligned(bp + W);
      for (int r = 0; r < MR; ++r) {
        const B a(ap[r]);
        acc[r][0] = xsimd::fma(a, b0, acc[r][0]);
        acc[r][1] = xsimd::fma(a, b1, acc[r][1]);
      }
      ap += MR;
      bp += NR;
    }
    if (mr == MR && nr == NR) {
      for (int r = 0; r < MR; ++r) {
        T* row = c + r * ldc;
        if (accumulate) {
          (acc[r][0] + B::load_unaligned(row)).store_unaligned(row);
          (acc[r][1] + B::load_unaligned(row + W)).store_unaligned(row + W);
        } else {
          acc[r][0].store_unaligned(row);
          acc[r][1].store_unaligned(row + W);
        }
      }
      return;
    }
    alignas(64) T tile[MR][NR];
    for (int r = 0; r < MR; ++r) {
      acc[r][0].store_aligned(tile[r]);
      acc[r][1].store_aligned(tile[r] + W);
    }
    for (std::int64_t r = 0; r < mr; ++r)
      for (std::int64_t j = 0; j < nr; ++j) c[r * ldc + j] = accumulate ? c[r * ldc + j] + tile[r][j] : tile[r][j];
  }

  static void run(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c) {
    using thresholds::gemm_kc;
    using thresholds::gemm_mc;
    using thresholds::gemm_nc;
    Engine& eng = Engine::get();
    const std::int64_t nc_max = std::min<std::int64_t>(gemm_nc, (n + NR - 1) / NR * NR);
    AlignedScratch<T> bpack(std::size_t(gemm_kc) * nc_max);
    for (std::int64_t jc = 0; jc < n; jc += gemm_nc) {
      const std::int64_t nc = std::min(gemm_nc, n - jc);
      for (std::int64_t pc = 0; pc < k; pc += gemm_kc) {
        const std::int64_t kc = std::min(gemm_kc, k - pc);
        pack_b(b + pc * n + jc, n, kc, nc, bpack.p);
        const std::int64_t blocks = (m + gemm_mc - 1) / gemm_mc;
        const std::int64_t work = m * nc * kc;
        const std::int64_t chunks = std::min(blocks, thresholds::parallel_chunks(work, eng.parallelism()));
        auto body = [&](std::int64_t chunk) {
          AlignedScratch<T> apack(std::size_t(gemm_mc) * gemm_kc);
          for (std::int64_t blk = chunk; blk < blocks; blk += chunks) {
            const std::int64_t ic = blk * gemm_mc, mc = std::min(gemm_mc, m - ic);
            pack_a(a + ic * k + pc, k, mc, kc, apack.p);
            for (std::int64_t jr = 0; jr < nc; jr += NR)
              for (std::int64_t ir = 0; ir < mc; ir += MR)
                micro(kc, apack.p + ir * kc, bpack.p + jr * kc, c + (ic + ir) * n + jc + jr, n, pc > 0,
                      std::min(MR, mc - ir), std::min(NR, nc - jr));
          }
        };
        eng.parallel_for(chunks, body);
      }
    }
  }
};

/// C (m x n) = A (m x k) * B (k x n), all row-major and contiguous.
template <class T>
inline void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, T(0));
    return;
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (n == 1) {  // matrix-vector: one dot product per row
      parallel_range(m, k, 1, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) {
          using B = xsimd::batch<T>;
          const T* row = a + i * k;
          B acc(T(0));
          std::int64_t p = 0;
          for (; p + std::int64_t(B::size) <= k; p += std::int64_t(B::size)) acc = xsimd::fma(B::load_unaligned(row + p), B::load_unaligned(b + p), acc);
          T s = xsimd::hadd(acc);
          for (; p < k; ++p) s += row[p] * b[p];
          c[i] = s;
        }
      });
      return;
    }
    if (m >= 2) {
      GemmKernel<T>::run(m, n, k, a, b, c);
      return;
    }
  }
  // Integers, and a single row: c[i, :] = sum_p a[i, p] * b[p, :] (vectorised by the compiler).
  parallel_range(m * n, k, 64, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo / n; i * n < hi; ++i) {
      const std::int64_t j0 = std::max(lo, i * n) - i * n, j1 = std::min(hi, (i + 1) * n) - i * n;
      T* crow = c + i * n;
      std::fill(crow + j0, crow + j1, T(0));
      for (std::int64_t p = 0; p < k; ++p) {
        const T aip = a[i * k + p];
        const T* brow = b + p * n;
        for (std::int64_t j = j0; j < j1; ++j) crow[j] = Add{}(crow[j], Mul{}(aip, brow[j]));
      }
    }
  });
}

}  // namespace deft::detail::cpu
