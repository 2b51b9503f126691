// Shape: a small, trivially copyable list of extents (rank <= max_rank), and numpy broadcasting.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "config.hpp"
#include "error.hpp"

namespace deft {

/// The most extents a Shape holds.
inline constexpr int max_rank = 8;

namespace detail {
/// Extents as numpy writes a shape: "(2, 3)", "(3,)", "()"; a negative
/// extent (one not known yet) as "?".
inline std::string extents_text(std::span<const std::int64_t> dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + (dims[i] < 0 ? std::string("?") : std::to_string(dims[i]));
  if (dims.size() == 1) s += ",";
  return s + ")";
}
}  // namespace detail

/// The extents of a tensor, outermost first, rank 0 to max_rank; `{2, 3}` is 2 rows of 3.
class Shape {
 public:
  constexpr Shape() = default;
  /// The extents given; std::invalid_argument for a negative extent or more than max_rank of them.
  Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  /// As above, from a span of extents.
  explicit Shape(std::span<const std::int64_t> dims) { assign(dims.begin(), dims.end()); }
  /// As above, from a vector of extents.
  explicit Shape(const std::vector<std::int64_t>& dims) { assign(dims.begin(), dims.end()); }

  /// Number of extents (0 for a scalar).
  DEFT_HD constexpr int rank() const { return rank_; }
  /// Extent i (unchecked), outermost first.
  DEFT_HD constexpr std::int64_t operator[](int i) const { return dims_[i]; }
  /// Extent i (unchecked), writable.
  DEFT_HD constexpr std::int64_t& operator[](int i) { return dims_[i]; }
  /// The extents as a range: `for (auto d : shape)`.
  const std::int64_t* begin() const { return dims_.data(); }
  /// End of the range of extents.
  const std::int64_t* end() const { return dims_.data() + rank_; }

  /// Number of elements (1 for a rank-0 shape).
  DEFT_HD constexpr std::int64_t size() const {
    // Unsigned: with an extent 0 the partial products before it may exceed
    // 64 bits ((2^62, 3, 0)); wrapping still ends at the exact count.
    std::uint64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= std::uint64_t(dims_[i]);
    return std::int64_t(n);
  }

  /// Appends an innermost extent; std::invalid_argument past max_rank or for a negative extent.
  void push_back(std::int64_t d) {
    if (rank_ == max_rank) detail::raise("shape rank exceeds the maximum of ", max_rank);
    check_extent(d);
    dims_[rank_++] = d;
  }

  /// The shape without axis `axis` (or with it set to 1 when keep is true).
  Shape without(int axis, bool keep = false) const {
    Shape s;
    for (int i = 0; i < rank_; ++i) {
      if (i != axis) s.push_back(dims_[i]);
      else if (keep) s.push_back(1);
    }
    // (0, 2^62, 4) has 0 elements, (2^62, 4) too many. Like the constructor,
    // this also refuses (2^62, 4, 0): products of leading extents must fit.
    if (dims_[axis] == 0) s.check_size();
    return s;
  }

  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }

  /// "(2, 3)" as numpy writes shapes; "()" for a scalar.
  std::string to_string() const { return detail::extents_text(std::span(dims_.data(), std::size_t(rank_))); }
  friend std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

 private:
  template <class It>
  void assign(It first, It last) {
    for (; first != last; ++first) push_back(*first);
    check_size();
  }
  static void check_extent(std::int64_t d) {
    if (d < 0) detail::raise("negative extent ", d, " in a shape");
  }
  void check_size() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) {
      if (dims_[i] != 0 && n > std::numeric_limits<std::int64_t>::max() / dims_[i])
        detail::raise<std::length_error>("shape ", to_string(), " has more elements than fit in 64 bits");
      n *= dims_[i];
    }
  }

  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

/// Row-major strides of a contiguous tensor of shape s.
inline std::array<std::int64_t, max_rank> contiguous_strides(const Shape& s) {
  std::array<std::int64_t, max_rank> st{};
  std::int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

namespace detail {
/// broadcast_shapes when the shapes differ and neither is a scalar.
DEFT_NOINLINE inline Shape broadcast_distinct_shapes(const Shape& a, const Shape& b, const char* what) {
  const int r = a.rank() > b.rank() ? a.rank() : b.rank();
  std::array<std::int64_t, max_rank> out{};
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      detail::raise("cannot broadcast ", what, " of shapes ", a.to_string(), " and ", b.to_string());
    out[i] = da == 1 ? db : da;
  }
  return Shape(std::span<const std::int64_t>(out.data(), r));
}
}  // namespace detail

/// numpy broadcasting of two shapes; throws std::invalid_argument naming both.
/// The common cases (equal shapes, a scalar) inline: one runs per node built.
DEFT_ALWAYS_INLINE inline Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what = "operands") {
  if (a == b || b.rank() == 0) return a;
  if (a.rank() == 0) return b;
  return detail::broadcast_distinct_shapes(a, b, what);
}

namespace detail {
/// Geometry of a reduction along one axis: the shape seen as outer x len x
/// inner, where len is the axis (every device's reductions use it).
struct AxisSplit {
  std::int64_t outer = 1, len = 1, inner = 1;
  AxisSplit(const Shape& s, int axis) {
    for (int d = 0; d < s.rank(); ++d) (d < axis ? outer : d == axis ? len : inner) *= s[d];
  }
  /// [outer, len, inner] given directly.
  AxisSplit(std::int64_t outer_, std::int64_t len_, std::int64_t inner_) : outer(outer_), len(len_), inner(inner_) {}
};
}  // namespace detail

/// Normalises a possibly negative axis for a tensor of rank r.
inline int normalize_axis(int axis, int rank, const char* op) {
  if (axis < -rank || axis >= rank)
    detail::raise(op, ": axis ", axis, " is out of range for a tensor of rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

}  // namespace deft
