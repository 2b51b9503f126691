// Kernel views: the trivially copyable form of an expression that a kernel
// receives (raw pointers and strides, no ownership). A view walks the output
// row by row: set_row() positions every leaf, then at(j) / batch<B>(j) read
// element j of the innermost dimension, where each leaf's stride is 0
// (broadcast) or 1 (contiguous).
#pragma once
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>
#include <functional>

#include "../core/config.hpp"
#include "../core/shape.hpp"
#include "ops.hpp"

namespace deft::detail {

/// A leaf of a row whose every leaf is contiguous (see dense_row()): one
/// pointer, so that a kernel keeps the whole view in registers.
template <class T>
struct DenseLeafView {
  using value_type = T;
  static constexpr bool simd = std::is_floating_point_v<T>;
  const T* row;
  DEFT_HD T at(std::int64_t j) const { return row[j]; }
  template <class B>
  DEFT_ALWAYS_INLINE B batch_dense(std::int64_t j) const { return B::load_unaligned(row + j); }
};

template <class T>
struct LeafView {
  using value_type = T;
  static constexpr bool simd = std::is_floating_point_v<T>;
  const T* data;
  const T* row;
  std::int64_t inner = 1;  // 0 when broadcast along the innermost dimension
  std::array<std::int64_t, max_rank> strides;

  DEFT_HD void set_row(const std::int64_t* idx, int outer) {
    std::int64_t off = 0;
    // To max_rank, not to outer: unrolled, idx and strides stay in a GPU thread's registers.
    DEFT_UNROLL
    for (int d = 0; d < max_rank; ++d)
      if (d < outer) off += idx[d] * strides[d];
    row = data + off;
  }
  DEFT_HD T at(std::int64_t j) const { return row[j * inner]; }
  template <class B>
  DEFT_ALWAYS_INLINE B batch(std::int64_t j) const { return inner ? B::load_unaligned(row + j) : B(*row); }
  /// Whether every leaf is contiguous along the innermost dimension.
  DEFT_HD bool dense() const { return inner == 1; }
  /// The current row as a view without strides, when dense() holds: its
  /// loads test no stride, and being small and local to the kernel it is not
  /// re-read from memory after each store to the output.
  DEFT_HD DenseLeafView<T> dense_row() const { return {row}; }
  template <class F>
  void for_each_leaf(F&& f) { f(*this); }
};

template <class T>
struct ConstantView {
  using value_type = T;
  static constexpr bool simd = std::is_floating_point_v<T>;
  T value;
  DEFT_HD void set_row(const std::int64_t*, int) {}
  DEFT_HD T at(std::int64_t) const { return value; }
  template <class B>
  DEFT_ALWAYS_INLINE B batch(std::int64_t) const { return B(value); }
  template <class B>
  DEFT_ALWAYS_INLINE B batch_dense(std::int64_t) const { return B(value); }
  DEFT_HD bool dense() const { return true; }
  DEFT_HD ConstantView dense_row() const { return *this; }
  template <class F>
  void for_each_leaf(F&&) {}
};

template <class Op, class A>
struct UnaryView {
  using value_type = typename A::value_type;
  static constexpr bool simd = A::simd;
  A a;
  DEFT_HD void set_row(const std::int64_t* idx, int outer) { a.set_row(idx, outer); }
  DEFT_HD value_type at(std::int64_t j) const { return Op{}(a.at(j)); }
  template <class B>
  DEFT_ALWAYS_INLINE B batch(std::int64_t j) const { return Op{}(a.template batch<B>(j)); }
  template <class B>
  DEFT_ALWAYS_INLINE B batch_dense(std::int64_t j) const { return Op{}(a.template batch_dense<B>(j)); }
  DEFT_HD bool dense() const { return a.dense(); }
  DEFT_HD auto dense_row() const { return UnaryView<Op, decltype(a.dense_row())>{a.dense_row()}; }
  template <class F>
  void for_each_leaf(F&& f) { a.for_each_leaf(f); }
};

template <class Op, class A, class B_>
struct BinaryView {
  using value_type = typename A::value_type;
  static constexpr bool simd = A::simd && B_::simd;
  A a;
  B_ b;
  DEFT_HD void set_row(const std::int64_t* idx, int outer) {
    a.set_row(idx, outer);
    b.set_row(idx, outer);
  }
  DEFT_HD value_type at(std::int64_t j) const { return Op{}(a.at(j), b.at(j)); }
  template <class B>
  DEFT_ALWAYS_INLINE B batch(std::int64_t j) const { return Op{}(a.template batch<B>(j), b.template batch<B>(j)); }
  template <class B>
  DEFT_ALWAYS_INLINE B batch_dense(std::int64_t j) const { return Op{}(a.template batch_dense<B>(j), b.template batch_dense<B>(j)); }
  DEFT_HD bool dense() const { return a.dense() && b.dense(); }
  DEFT_HD auto dense_row() const {
    return BinaryView<Op, decltype(a.dense_row()), decltype(b.dense_row())>{a.dense_row(), b.dense_row()};
  }
  template <class F>
  void for_each_leaf(F&& f) {
    a.for_each_leaf(f);
    b.for_each_leaf(f);
  }
};

template <class C, class A, class B_>
struct SelectView {
  using value_type = typename A::value_type;
  static constexpr bool simd = C::simd && A::simd && B_::simd;
  C c;
  A a;
  B_ b;
  DEFT_HD void set_row(const std::int64_t* idx, int outer) {
    c.set_row(idx, outer);
    a.set_row(idx, outer);
    b.set_row(idx, outer);
  }
  DEFT_HD value_type at(std::int64_t j) const { return Where{}(c.at(j), a.at(j), b.at(j)); }
  template <class B>
  DEFT_ALWAYS_INLINE B batch(std::int64_t j) const {
    return Where{}(c.template batch<B>(j), a.template batch<B>(j), b.template batch<B>(j));
  }
  template <class B>
  DEFT_ALWAYS_INLINE B batch_dense(std::int64_t j) const {
    return Where{}(c.template batch_dense<B>(j), a.template batch_dense<B>(j), b.template batch_dense<B>(j));
  }
  DEFT_HD bool dense() const { return c.dense() && a.dense() && b.dense(); }
  DEFT_HD auto dense_row() const {
    return SelectView<decltype(c.dense_row()), decltype(a.dense_row()), decltype(b.dense_row())>{
        c.dense_row(), a.dense_row(), b.dense_row()};
  }
  template <class F>
  void for_each_leaf(F&& f) {
    c.for_each_leaf(f);
    a.for_each_leaf(f);
    b.for_each_leaf(f);
  }
};

// Conversions change the lane count, so a cast evaluates element by element.
template <class U, class A>
struct CastView {
  using value_type = U;
  static constexpr bool simd = false;
  A a;
  DEFT_HD void set_row(const std::int64_t* idx, int outer) { a.set_row(idx, outer); }
  DEFT_HD U at(std::int64_t j) const { return convert<U>(a.at(j)); }
  template <class B>
  B batch(std::int64_t) const = delete;
  DEFT_HD bool dense() const { return false; }  // element by element anyway
  template <class F>
  void for_each_leaf(F&& f) { a.for_each_leaf(f); }
};

// A user's function sees one element at a time (it need not know xsimd).
template <class F, class A>
struct MapView {
  using value_type = std::remove_cvref_t<std::invoke_result_t<const F&, typename A::value_type>>;
  static constexpr bool simd = false;
  F f;
  A a;
  DEFT_HD void set_row(const std::int64_t* idx, int outer) { a.set_row(idx, outer); }
  DEFT_HD value_type at(std::int64_t j) const { return f(a.at(j)); }
  template <class B>
  B batch(std::int64_t) const = delete;
  DEFT_HD bool dense() const { return false; }  // element by element anyway
  template <class G>
  void for_each_leaf(G&& g) { a.for_each_leaf(g); }
};

/// What collapse() reads and rewrites of one leaf view.
struct LeafLayout {
  std::array<std::int64_t, max_rank>* strides;
  std::int64_t* inner;
};

/// collapse() on the leaves' layouts: one function for every expression type.
inline Shape collapse_layouts(LeafLayout* leaves, int n, const Shape& out) {
  // The common case, checked first because it is on every task's path:
  // every leaf reads all of `out` contiguously, which is one flat row.
  if (out.rank() > 0 && out.size() > 0) {
    const auto dense = contiguous_strides(out);
    bool flat = true;
    for (int l = 0; l < n; ++l)
      for (int d = 0; d < out.rank(); ++d)
        if (out[d] != 1 && (*leaves[l].strides)[d] != dense[d]) flat = false;
    if (flat) {
      for (int l = 0; l < n; ++l) {
        *leaves[l].strides = {};
        (*leaves[l].strides)[0] = 1;
        *leaves[l].inner = 1;
      }
      return Shape{out.size()};
    }
  }
  // Drop unit dimensions.
  std::array<int, max_rank> keep{};
  int r = 0;
  for (int d = 0; d < out.rank(); ++d)
    if (out[d] != 1) keep[r++] = d;
  std::array<std::int64_t, max_rank> ext{};
  for (int i = 0; i < r; ++i) ext[i] = out[keep[i]];
  for (int l = 0; l < n; ++l) {
    std::array<std::int64_t, max_rank> s{};
    for (int i = 0; i < r; ++i) s[i] = (*leaves[l].strides)[keep[i]];
    *leaves[l].strides = s;
  }
  // Merge dimension i into i-1 where stride[i-1] == stride[i] * ext[i] for all leaves.
  int m = 0;
  std::array<std::int64_t, max_rank> merged_ext{};
  std::array<int, max_rank> group_last{};  // last original dim of each merged group
  for (int i = 0; i < r; ++i) {
    bool can = m > 0;
    for (int l = 0; can && l < n; ++l)
      if ((*leaves[l].strides)[group_last[m - 1]] != (*leaves[l].strides)[i] * ext[i]) can = false;
    if (can) {
      merged_ext[m - 1] *= ext[i];
      group_last[m - 1] = i;
    } else {
      merged_ext[m] = ext[i];
      group_last[m++] = i;
    }
  }
  for (int l = 0; l < n; ++l) {
    std::array<std::int64_t, max_rank> s{};
    for (int i = 0; i < m; ++i) s[i] = (*leaves[l].strides)[group_last[i]];
    *leaves[l].strides = s;
    *leaves[l].inner = m > 0 ? s[m - 1] : 0;
  }
  return Shape(std::span<const std::int64_t>(merged_ext.data(), m));
}

/// The output shape with unit dimensions dropped and neighbours merged where
/// every leaf allows it; leaves' strides are rewritten to match. Afterwards
/// the innermost stride of every leaf is 0 or 1.
template <class View>
Shape collapse(View& v, const Shape& out) {
  int n = 0;
  v.for_each_leaf([&](auto&) { ++n; });
  std::array<LeafLayout, 16> few;  // no allocation for the usual expression
  std::vector<LeafLayout> many(n > int(few.size()) ? std::size_t(n) : 0);
  LeafLayout* leaves = many.empty() ? few.data() : many.data();
  int i = 0;
  v.for_each_leaf([&](auto& leaf) { leaves[i++] = LeafLayout{&leaf.strides, &leaf.inner}; });
  return collapse_layouts(leaves, n, out);
}

}  // namespace deft::detail
