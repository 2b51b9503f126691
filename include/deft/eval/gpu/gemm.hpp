// GPU products of integers, which cuBLAS has no routine for (float and
// double go through cuBLAS, eval/gpu/blas.hpp; eval/cpu/gemm.hpp is the CPU's).
#pragma once
#include <cstdint>

#include "../../core/config.hpp"
#include "../../expr/ops.hpp"
#include "elementwise.hpp"

namespace deft::detail::gpu {

/// c[i, j] = sum over p of op(a)[i, p] * op(b)[p, j], one thread per element
/// (integer products, which cuBLAS has no routine for; wrapping arithmetic).
template <class T>
struct NaiveProduct {
  const T *a, *b;
  std::int64_t n, k;
  std::int64_t a_row, a_col, b_row, b_col;  // strides of op(a) and op(b)
  DEFT_HD T operator()(std::int64_t e) const {
    const std::int64_t i = e / n, j = e % n;
    T sum = T(0);
    for (std::int64_t p = 0; p < k; ++p) sum = Add{}(sum, Mul{}(a[i * a_row + p * a_col], b[p * b_row + j * b_col]));
    return sum;
  }
};

template <class Policy, class T>
void naive_gemm(const Policy& policy, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c,
                bool trans_a, bool trans_b) {
  NaiveProduct<T> f{a, b, n, k, trans_a ? 1 : k, trans_a ? m : 1, trans_b ? 1 : n, trans_b ? k : 1};
  for_each_output(policy, m * n, f, c);
}

}  // namespace deft::detail::gpu
