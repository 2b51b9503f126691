// CPU matrix product C = A * B (row-major, contiguous): B is packed into
// panels of NR columns (a block of them in L2), A into panels of MR rows (one
// in L1 at a time), and a register-blocked xsimd micro-kernel accumulates an
// MR x NR tile with FMAs (12 x 2 vectors on AVX-512/NEON, 6 x 2 on AVX2).
// Rows of C are split evenly across the workers. With DEFT_BLAS defined (and
// cblas.h on the include path) float and double products call cblas instead.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "../../engine/engine.hpp"
#include "../../core/thresholds.hpp"
#include "elementwise.hpp"
#include "simd.hpp"

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#if defined(DEFT_BLAS) && DEFT_BLAS
// Matrix products go to the system BLAS (cblas) instead of deft's kernel.
#include <cblas.h>
#endif

namespace deft::detail::cpu {

template <class T>
struct AlignedScratch {
  explicit AlignedScratch(std::size_t n)
      : p(static_cast<T*>(std::aligned_alloc(thresholds::alignment, aligned_size(n * sizeof(T), thresholds::alignment)))) {
    if (!p) throw std::bad_alloc();
  }
  ~AlignedScratch() { std::free(p); }
  AlignedScratch(const AlignedScratch&) = delete;
  AlignedScratch& operator=(const AlignedScratch&) = delete;
  T* p;
};

/// Vector registers of the ISA the kernels are compiled for (sets the register tile).
inline constexpr int simd_registers =
#if defined(__AVX512F__) || defined(__aarch64__) || defined(__ARM_NEON)
    32;
#else
    16;
#endif

/// dst[q * ldd + i] = src[i * lds + q] for i, q in [0, 4): a 4 x 4 block of
/// floats transposed in registers. Packing across a panel's rows this way,
/// and whole panels of B along them through vectors, took the packing from
/// about 9 % of a one-thread 2000-cubed product's time to 5 % (perf), where
/// it went element by element and through short memcpys.
#if defined(__SSE2__)
inline void transpose4(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
  __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + lds), r2 = _mm_loadu_ps(src + 2 * lds),
         r3 = _mm_loadu_ps(src + 3 * lds);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(dst, r0);
  _mm_storeu_ps(dst + ldd, r1);
  _mm_storeu_ps(dst + 2 * ldd, r2);
  _mm_storeu_ps(dst + 3 * ldd, r3);
}
/// The same for a 2 x 4 block: dst[q * ldd + i] = src[i * lds + q] for i in
/// [0, 2), q in [0, 4). With it the 6-row panels of AVX2 (4 + 2 rows) pack
/// through registers too; element by element, packing A took 3 % of a
/// one-thread 2000-cubed product's time there (perf).
inline void transpose2x4(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
  const __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + lds);
  const __m128 lo = _mm_unpacklo_ps(r0, r1), hi = _mm_unpackhi_ps(r0, r1);
  _mm_storel_pi(reinterpret_cast<__m64*>(dst), lo);
  _mm_storeh_pi(reinterpret_cast<__m64*>(dst + ldd), lo);
  _mm_storel_pi(reinterpret_cast<__m64*>(dst + 2 * ldd), hi);
  _mm_storeh_pi(reinterpret_cast<__m64*>(dst + 3 * ldd), hi);
}
inline constexpr bool has_transpose4 = true;
#else
inline void transpose4(const float*, std::int64_t, float*, std::int64_t) {}
inline void transpose2x4(const float*, std::int64_t, float*, std::int64_t) {}
inline constexpr bool has_transpose4 = false;
#endif

/// One core's L2 cache in bytes (thresholds::default_l2_bytes where the
/// system does not say).
inline std::int64_t l2_cache_bytes() {
  static const std::int64_t bytes = [] {
    long n = 0;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    n = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return n > 0 ? std::int64_t(n) : thresholds::default_l2_bytes;
  }();
  return bytes;
}

template <class T>
struct GemmKernel {
  using B = simd_batch<T>;
  static constexpr std::int64_t W = B::size;
  static constexpr std::int64_t MR = thresholds::gemm_mr_for(simd_registers);
  static constexpr int NV = thresholds::gemm_nr_vectors;
  static constexpr std::int64_t NR = NV * W;

  // Packs rows [0, mc) x depth [0, kc) of op(A) into MR-row panels, zero
  // padded. `a` points at element (0, 0) of the block; element (i, p) is
  // a[i * lda + p], or a[p * lda + i] when A is read transposed.
  static void pack_a(const T* a, std::int64_t lda, bool trans, std::int64_t mc, std::int64_t kc, T* dst) {
    for (std::int64_t i0 = 0; i0 < mc; i0 += MR, dst += MR * kc) {
      const std::int64_t rows = std::min(MR, mc - i0);
      if (trans) {
        for (std::int64_t p = 0; p < kc; ++p) {
          std::memcpy(dst + p * MR, a + p * lda + i0, rows * sizeof(T));
          std::fill(dst + p * MR + rows, dst + (p + 1) * MR, T(0));
        }
        continue;
      }
      std::int64_t p = 0;
      if constexpr (std::is_same_v<T, float> && has_transpose4 && MR % 2 == 0) {
        if (rows == MR)
          for (; p + 4 <= kc; p += 4) {
            std::int64_t r = 0;
            for (; r + 4 <= MR; r += 4) transpose4(a + (i0 + r) * lda + p, lda, dst + p * MR + r, MR);
            if constexpr (MR % 4 != 0) transpose2x4(a + (i0 + r) * lda + p, lda, dst + p * MR + r, MR);
          }
      }
      for (; p < kc; ++p) {
        for (std::int64_t r = 0; r < rows; ++r) dst[p * MR + r] = a[(i0 + r) * lda + p];
        for (std::int64_t r = rows; r < MR; ++r) dst[p * MR + r] = T(0);
      }
    }
  }
  // Packs depth [0, kc) x columns [0, nc) of op(B) into NR-column panels,
  // zero padded; element (p, j) is b[p * ldb + j], or b[j * ldb + p] when B
  // is read transposed.
  static void pack_b(const T* b, std::int64_t ldb, bool trans, std::int64_t kc, std::int64_t nc, T* dst) {
    for (std::int64_t j0 = 0; j0 < nc; j0 += NR, dst += NR * kc) {
      const std::int64_t cols = std::min(NR, nc - j0);
      if (trans) {
        std::int64_t c = 0, p4 = 0;
        if constexpr (std::is_same_v<T, float> && has_transpose4) {
          p4 = kc / 4 * 4;
          for (; c + 4 <= cols; c += 4)
            for (std::int64_t p = 0; p < p4; p += 4) transpose4(b + (j0 + c) * ldb + p, ldb, dst + p * NR + c, NR);
          for (std::int64_t cc = 0; cc < c; ++cc)  // the depth's last kc % 4 of those columns
            for (std::int64_t p = p4; p < kc; ++p) dst[p * NR + cc] = b[(j0 + cc) * ldb + p];
        }
        for (; c < cols; ++c) {
          const T* src = b + (j0 + c) * ldb;
          for (std::int64_t p = 0; p < kc; ++p) dst[p * NR + c] = src[p];
        }
        for (std::int64_t p = 0; p < kc; ++p) std::fill(dst + p * NR + cols, dst + (p + 1) * NR, T(0));
        continue;
      }
      if (cols == NR) {  // whole panels through vectors: a memcpy of NR elements compiled to a slow `rep movs`
        for (std::int64_t p = 0; p < kc; ++p)
          for (int v = 0; v < NV; ++v) B::load_unaligned(b + p * ldb + j0 + v * W).store_aligned(dst + p * NR + v * W);
        continue;
      }
      for (std::int64_t p = 0; p < kc; ++p) {
        std::memcpy(dst + p * NR, b + p * ldb + j0, cols * sizeof(T));
        std::fill(dst + p * NR + cols, dst + (p + 1) * NR, T(0));
      }
    }
  }

  // C[0:mr, 0:nr] (+)= Ap * Bp over kc: MR x NV accumulators in registers.
  static void micro(std::int64_t kc, const T* __restrict ap, const T* __restrict bp, T* c, std::int64_t ldc,
                    bool accumulate, std::int64_t mr, std::int64_t nr) {
#if defined(__GNUC__)
    for (int r = 0; r < MR; ++r) __builtin_prefetch(c + r * ldc, 1);  // C's tile arrives while we compute
#endif
    B acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = B(T(0));
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC unroll 4
#endif
    for (std::int64_t k = 0; k < kc; ++k) {
      B bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = B::load_aligned(bp + v * W);
      for (int r = 0; r < MR; ++r) {
        const B a(ap[r]);
        for (int v = 0; v < NV; ++v) acc[r][v] = xsimd::fma(a, bv[v], acc[r][v]);
      }
      ap += MR;
      bp += NR;
    }
    if (mr == MR && nr == NR) {
      for (int r = 0; r < MR; ++r) {
        T* row = c + r * ldc;
        for (int v = 0; v < NV; ++v) {
          if (accumulate) (acc[r][v] + B::load_unaligned(row + v * W)).store_unaligned(row + v * W);
          else acc[r][v].store_unaligned(row + v * W);
        }
      }
      return;
    }
    alignas(64) T tile[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v].store_aligned(tile[r] + v * W);
    for (std::int64_t r = 0; r < mr; ++r)
      for (std::int64_t j = 0; j < nr; ++j) c[r * ldc + j] = accumulate ? c[r * ldc + j] + tile[r][j] : tile[r][j];
  }

  static std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

  // Loop order (BLIS): n in blocks of nc, k in blocks of kc (B block packed
  // once, shared by all threads, in L2), rows split evenly across threads;
  // each thread packs its rows of A in MR-row panels, and every A panel (L1)
  // sweeps the whole B block. Every element of C sees the same k blocking
  // whatever the thread count, so results do not depend on it. With
  // `accumulate`, C += op(A) * op(B).
  static void run(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, bool ta, const T* b, bool tb, T* c,
                  bool accumulate = false) {
    Engine& eng = Engine::get();
    const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
    // Where element (i, p) of op(A) and (p, j) of op(B) live.
    auto a_at = [&](std::int64_t i, std::int64_t p) { return ta ? a + p * lda + i : a + i * lda + p; };
    auto b_at = [&](std::int64_t p, std::int64_t j) { return tb ? b + j * ldb + p : b + p * ldb + j; };
    const std::int64_t kc_len = ceil_div(k, ceil_div(k, thresholds::gemm_kc));
    const std::int64_t nc_len = ceil_div(ceil_div(n, ceil_div(n, thresholds::gemm_nc)), NR) * NR;
    std::int64_t threads = 1;
    if (m * n * k >= thresholds::gemm_parallel_min_work)
      threads = std::min<std::int64_t>(eng.parallelism(), ceil_div(m, MR));
    const std::int64_t mc_len = std::min(thresholds::gemm_mc, ceil_div(ceil_div(m, threads), MR) * MR);
    AlignedScratch<T> bpack(std::size_t(kc_len) * std::size_t(std::min(nc_len, ceil_div(n, NR) * NR)));
    AlignedScratch<T> apack(std::size_t(threads) * std::size_t(mc_len) * std::size_t(kc_len));
    // Rows [row_begin(t), row_begin(t + 1)) go to thread t, in whole MR panels.
    auto row_begin = [&](std::int64_t t) { return std::min(m, ceil_div(m * t / threads, MR) * MR); };
    for (std::int64_t jc = 0; jc < n; jc += nc_len) {
      const std::int64_t nc = std::min(nc_len, n - jc);
      const std::int64_t panels = ceil_div(nc, NR);
      for (std::int64_t pc = 0; pc < k; pc += kc_len) {
        const std::int64_t kc = std::min(kc_len, k - pc);
        auto pack_part = [&](std::int64_t t) {
          const std::int64_t p0 = panels * t / threads, p1 = panels * (t + 1) / threads;
          if (p1 > p0) pack_b(b_at(pc, jc + p0 * NR), ldb, tb, kc, std::min(nc, p1 * NR) - p0 * NR, bpack.p + p0 * NR * kc);
        };
        eng.parallel_for(threads, pack_part);
        auto body = [&](std::int64_t t) {
          T* ap = apack.p + std::size_t(t) * std::size_t(mc_len) * std::size_t(kc_len);
          for (std::int64_t ic = row_begin(t), end = row_begin(t + 1); ic < end; ic += mc_len) {
            const std::int64_t mc = std::min(mc_len, end - ic);
            pack_a(a_at(ic, pc), lda, ta, mc, kc, ap);
            for (std::int64_t ir = 0; ir < mc; ir += MR)
              for (std::int64_t jr = 0; jr < nc; jr += NR)
                micro(kc, ap + ir * kc, bpack.p + jr * kc, c + (ic + ir) * n + jc + jr, n, accumulate || pc > 0,
                      std::min(MR, mc - ir), std::min(NR, nc - jr));
          }
        };
        eng.parallel_for(threads, body);
      }
    }
  }
};

/// c[0, V*W) = sum over p of a[p] * b[p * ldb + (0 .. V*W)], V vectors of c
/// held in registers (the few-row product).
template <int V, class T>
inline void gemv_strip(std::int64_t k, const T* a, const T* b, std::int64_t ldb, T* c) {
  using B = simd_batch<T>;
  constexpr std::int64_t W = B::size;
  B acc[V];
  for (int v = 0; v < V; ++v) acc[v] = B(T(0));
  for (std::int64_t p = 0; p < k; ++p) {
    const B av(a[p]);
    const T* bp = b + p * ldb;
    for (int v = 0; v < V; ++v) acc[v] = xsimd::fma(av, B::load_unaligned(bp + v * W), acc[v]);
  }
  for (int v = 0; v < V; ++v) acc[v].store_unaligned(c + v * W);
}

/// sum over p of a[p] * b[p * stride]: a row times a column of a row-major
/// B. Vector accumulators over p, so that a narrow product (a layer with 2
/// outputs) is not one chain of k dependent scalar multiply-adds.
template <class T>
inline T strided_dot(std::int64_t k, const T* a, const T* b, std::int64_t stride) {
  using B = simd_batch<T>;
  constexpr std::int64_t W = B::size;
  alignas(thresholds::alignment) T column[W];
  B acc(T(0));
  std::int64_t p = 0;
  for (; p + W <= k; p += W) {
    B bp;
    if (stride == 1) {
      bp = B::load_unaligned(b + p);
    } else {
      for (std::int64_t q = 0; q < W; ++q) column[q] = b[(p + q) * stride];
      bp = B::load_aligned(column);
    }
    acc = xsimd::fma(B::load_unaligned(a + p), bp, acc);
  }
  T sum = xsimd::hadd(acc);
  for (; p < k; ++p) sum += a[p] * b[p * stride];
  return sum;
}

/// C (m x n) = op(A) * op(B), row-major and contiguous, where op(A) is m x k
/// and op(B) is k x n. With trans_a, A is stored k x m and read transposed
/// (likewise B, stored n x k): the packing reads either layout, so gradients
/// such as dY * Wᵀ need no transposed copy.
template <class T>
inline void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool trans_a = false,
                 bool trans_b = false) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, T(0));
    return;
  }
  if (m == 1) trans_a = false;  // a single row or column is the same memory either way
  if (n == 1) trans_b = false;
#if defined(DEFT_BLAS) && DEFT_BLAS
  // cblas takes int extents; larger products stay on deft's kernel.
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int lda = int(trans_a ? m : k), ldb = int(trans_b ? k : n);
  if (m > int_max || n > int_max || k > int_max || m * n > int_max || m * k > int_max || k * n > int_max) {
  } else if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), 1.0f, a, lda, b, ldb, 0.0f, c, int(n));
    return;
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, ta, tb, int(m), int(n), int(k), 1.0, a, lda, b, ldb, 0.0, c, int(n));
    return;
  }
#endif
  if constexpr (std::is_floating_point_v<T>) {
    if (m >= thresholds::gemm_min_rows_packed && n > 1) {
      GemmKernel<T>::run(m, n, k, a, trans_a, b, trans_b, c);
      return;
    }
  }
  if (trans_a || trans_b) {
    // The matrix-vector, few-row and integer paths read plain layouts; these
    // products are small, so one transposed copy costs little.
    auto plain = [](const T* src, std::int64_t rows, std::int64_t cols) {  // src is cols x rows
      std::vector<T> out(std::size_t(rows * cols));
      for (std::int64_t j = 0; j < cols; ++j)
        for (std::int64_t i = 0; i < rows; ++i) out[std::size_t(i * cols + j)] = src[j * rows + i];
      return out;
    };
    const std::vector<T> pa = trans_a ? plain(a, m, k) : std::vector<T>();
    const std::vector<T> pb = trans_b ? plain(b, k, n) : std::vector<T>();
    gemm(m, n, k, trans_a ? pa.data() : a, trans_b ? pb.data() : b, c);
    return;
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (n == 1) {  // matrix-vector: one dot product per row
      parallel_range(m, k, 1, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) c[i] = strided_dot(k, a + i * k, b, 1);
      });
      return;
    }
    // A few rows (a batch-1 layer): packing B would cost more than the
    // product. A strip of up to 16 vectors of a row of C stays in registers
    // while B is read row by row, a contiguous run per row: independent
    // accumulators hide the FMA latency and the prefetcher sees one stream.
    // Every element sums over p in order, whatever the strip or the thread.
    // A column costs 2 element-ops per multiply-add (B's element is read
    // once). Below parallel_min_work the columns are split only when B would
    // not stay in one core's L2 (thresholds::gemm_few_rows_l2_share): then
    // each thread keeps its half of B in its own L2 from call to call.
    constexpr std::int64_t W = simd_batch<T>::size;
    constexpr int wide = simd_registers >= 32 ? 16 : 8;
    const auto columns = [&](std::int64_t j0, std::int64_t j1) {
      for (std::int64_t i = 0; i < m; ++i) {
        const T* arow = a + i * k;
        T* crow = c + i * n;
        std::int64_t j = j0;
        for (; j + wide * W <= j1; j += wide * W) gemv_strip<wide>(k, arow, b + j, n, crow + j);
        if constexpr (wide > 8)
          for (; j + 8 * W <= j1; j += 8 * W) gemv_strip<8>(k, arow, b + j, n, crow + j);
        for (; j + 4 * W <= j1; j += 4 * W) gemv_strip<4>(k, arow, b + j, n, crow + j);
        for (; j + W <= j1; j += W) gemv_strip<1>(k, arow, b + j, n, crow + j);
        for (; j < j1; ++j) crow[j] = strided_dot(k, arow, b + j, n);
      }
    };
    const bool b_fits_l2 = k * n * std::int64_t(sizeof(T)) <= l2_cache_bytes() / thresholds::gemm_few_rows_l2_share;
    if (b_fits_l2 && 2 * m * k * n < thresholds::parallel_min_work) columns(0, n);
    else parallel_range(n, 2 * m * k, n >= 4 * wide * W ? wide * W : 4 * W, columns);
    return;
  }
  // Integers: c[i, :] = sum_p a[i, p] * b[p, :].
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
