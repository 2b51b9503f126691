// Printing is a sync point: operator<< waits for the value, then writes it
// numpy-style (long dimensions summarised) with its dtype, shape and device.
#pragma once
#include <cmath>
#include <cstdint>
#include <ostream>
#include <type_traits>
#include <vector>

#include "../ops/elementwise.hpp"
#include "../tensor.hpp"

namespace deft {
namespace detail {

inline constexpr std::int64_t print_threshold = 1000;  // elements before summarising
inline constexpr std::int64_t print_edge = 3;          // items kept at each end when summarising

template <class T>
void print_values(std::ostream& os, const std::vector<T>& v, const Shape& s, int dim, std::int64_t offset, bool summarise) {
  if (dim == s.rank()) {
    // The stream's own format (std::setprecision applies), except NaN: one
    // computed at run time has its sign bit set on x86, which glibc prints
    // as "-nan", a sign NaN does not have.
    if constexpr (std::is_floating_point_v<T>)
      if (std::isnan(v[offset])) {
        os << "nan";
        return;
      }
    os << +v[offset];  // unary + prints int8-like types as numbers
    return;
  }
  const std::int64_t n = s[dim];
  std::int64_t stride = 1;
  for (int d = dim + 1; d < s.rank(); ++d) stride *= s[d];
  os << '[';
  const auto separate = [&](std::int64_t i) {
    if (i == 0) return;
    if (dim + 1 < s.rank()) os << ",\n" << std::string(dim + 1, ' ');
    else os << ", ";
  };
  for (std::int64_t i = 0; i < n; ++i) {
    separate(i);
    if (summarise && n > 2 * print_edge && i == print_edge) {
      os << "...";
      i = n - print_edge - 1;  // the loop's ++i lands on the first of the last print_edge items
      continue;
    }
    print_values(os, v, s, dim + 1, offset + i * stride, summarise);
  }
  os << ']';
}

}  // namespace detail

/// Prints the values numpy-style, then `<Tensor dtype shape @device>`; a sync point.
template <Element T>
std::ostream& operator<<(std::ostream& os, const Tensor<T>& t) {
  const auto values = t.to_vector();
  detail::print_values(os, values, t.shape(), 0, 0, t.size() > detail::print_threshold);
  return os << "\n<Tensor " << dtype_name_of<T> << ' ' << t.shape() << " @" << t.device() << '>';
}

/// Printing an expression evaluates it first.
template <Expression E>
std::ostream& operator<<(std::ostream& os, E&& e) {
  return os << eval(std::forward<E>(e));
}

}  // namespace deft
