// Selecting and joining along an axis: slice, concat, stack and one_hot.
// A slice is a view when its elements are contiguous in the source (along
// the first axis that is not 1, with step 1), otherwise a copy; concat and stack record
// one task that copies every part into its block of the result. Gradients
// flow back through each (autograd/indexing.hpp).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../core/config.hpp"
#include "../eval/executor.hpp"
#include "creation.hpp"
#include "elementwise.hpp"
#include "../tensor.hpp"

namespace deft {
namespace detail {

/// How an axis splits a row-major shape: `outer` runs of the axis, each of
/// `extent` steps of `inner` contiguous elements.
struct AxisBlocks {
  std::int64_t outer = 1, extent = 1, inner = 1;
  AxisBlocks(const Shape& s, int axis) : extent(s[axis]) {
    for (int d = 0; d < axis; ++d) outer *= s[d];
    for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  }
};

template <class T>
struct ConcatKernel {
  std::vector<Leaf<T>> parts;
  std::int64_t outer, inner, total;  // total: the result's extent along the axis
  void operator()(Buffer& b) const {
    on_device(b.device, [&](auto ex) {
      T* out = b.as<T>();
      std::int64_t at = 0;
      for (const Leaf<T>& p : parts) {
        const std::int64_t width = p.extent.size() / (outer ? outer : 1);
        if (outer) ex.copy_rows(outer, width, p.source->template as<const T>() + p.offset, width, out + at, total * inner);
        at += width;
      }
    });
  }
};

template <class T>
Tensor<T> concat_tensors(std::span<const Tensor<T>> parts, int axis_in, const char* op) {
  if (parts.empty()) raise(op, ": no tensors given");
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (!parts[i]) raise<std::logic_error>(op, ": tensor ", i, " is an empty handle");
  const Shape& first = parts[0].shape();
  if (first.rank() == 0) raise(op, ": cannot join scalars (shape ()) along an axis; stack them instead");
  const int axis = normalize_axis(axis_in, first.rank(), op);
  Shape out = first;
  out[axis] = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Shape& s = parts[i].shape();
    bool same = s.rank() == first.rank();
    for (int d = 0; same && d < s.rank(); ++d) same = d == axis || s[d] == first[d];
    if (!same)
      raise(op, ": tensor ", i, " has shape ", s.to_string(), " but tensor 0 has shape ", first.to_string(),
            "; every extent but axis ", axis, "'s must match");
    if (!(parts[i].device() == parts[0].device()))
      raise(op, ": tensor ", i, " is on ", parts[i].device(), " but tensor 0 is on ", parts[0].device());
    out[axis] += s[axis];
  }
  const AxisBlocks blocks(out, axis);
  std::vector<Leaf<T>> leaves;
  leaves.reserve(parts.size());
  bool tracked = false;
  for (const Tensor<T>& p : parts) {
    leaves.push_back(p.leaf());
    tracked = tracked || leaves.back().grad;
  }
  auto result = record_new<T>(op, out, parts[0].device(), ConcatKernel<T>{leaves, blocks.outer, blocks.inner, out[axis]},
                              [&](Task& t) {
                                for (const Leaf<T>& l : leaves) t.add_input(l.buffer);
                              });
  if (autograd::is_recording() && tracked) autograd::detail::track_concat(result, leaves, axis);
  return result;
}

/// An index as T; one outside [0, bound) fails the task on the CPU. A GPU
/// kernel cannot throw: there it becomes NaN (never a finite, wrong value).
/// (At namespace scope: nvcc cannot launch kernels on private member types.)
template <class T>
struct IndexCheck {
  std::int64_t bound;
  const char* what;  // names the index in the error: "one_hot: index"
  DEFT_HD T operator()(std::int64_t i) const {
    if (i < 0 || i >= bound) {
#if defined(__CUDA_ARCH__)
      return std::numeric_limits<T>::quiet_NaN();
#else
      throw std::out_of_range(std::string("deft: ") + what + " " + std::to_string(i) + " is outside [0, " +
                              std::to_string(bound) + ")");
#endif
    }
    return T(i);
  }
};

}  // namespace detail

namespace detail {

/// Elements [begin, end) along axis `a` (in range): a view when the extents
/// before `a` are all 1, else one copying task; gradients flow back to x.
template <class T>
Tensor<T> slice_range(const Tensor<T>& x, int a, std::int64_t begin, std::int64_t end) {
  const Shape& s = x.shape();
  const AxisBlocks blocks(s, a);
  Shape out = s;
  out[a] = end - begin;
  const std::vector<std::int64_t> dims(out.begin(), out.end());
  if (blocks.outer == 1) return x.reshape({s[a], blocks.inner}).rows(begin, end).reshape(dims);
  auto l = x.leaf();
  const std::int64_t width = (end - begin) * blocks.inner, pitch = s[a] * blocks.inner;
  auto result = record_new<T>(
      "slice", out, l.device(),
      [l, rows = blocks.outer, width, pitch, from = begin * blocks.inner](Buffer& b) {
        on_device(b.device, [&](auto ex) {
          ex.copy_rows(rows, width, l.source->template as<const T>() + l.offset + from, pitch, b.as<T>(), width);
        });
      },
      [&](Task& t) { t.add_input(l.buffer); });
  if (autograd::is_recording() && l.grad) autograd::detail::track_slice(result, l, a, begin);
  return result;
}

}  // namespace detail

/// Every `step`-th element of [begin, end) along `axis`, as numpy's
/// x[:, begin:end:step] for axis 1. Negative axis, begin and end count from
/// the end (-1: the last). With step 1, a view sharing x's storage when the
/// extents before `axis` are all 1 (rows(), for axis 0), otherwise a copy;
/// a larger step copies. Gradients flow back to x either way.
/// std::invalid_argument for a range outside the axis, end < begin (after
/// counting from the end), or a step below 1.
template <class T>
Tensor<T> slice(const Tensor<T>& x, int axis, std::int64_t begin, std::int64_t end, std::int64_t step = 1) {
  if (!x) detail::raise<std::logic_error>("slice: an empty handle");
  const Shape& s = x.shape();
  if (s.rank() == 0) detail::raise("slice: a scalar tensor has no axis to slice");
  const int a = normalize_axis(axis, s.rank(), "slice");
  const std::int64_t b = begin < 0 ? begin + s[a] : begin, e = end < 0 ? end + s[a] : end;
  if (b < 0 || e < b || e > s[a])
    detail::raise("slice: [", begin, ", ", end, ") along axis ", a, " is out of range for shape ", s.to_string(),
                  begin < 0 || end < 0 ? " (negative bounds count from the end)" : "");
  if (step < 1) detail::raise("slice: step ", step, " along axis ", a, "; a step must be at least 1");
  const std::int64_t n = (e - b + step - 1) / step;
  if (step == 1 || n <= 1) return detail::slice_range(x, a, b, step == 1 ? e : b + n);
  // The range padded with zeros to n * step, split into (n, step) along the
  // axis, and the first of each step kept: pieces whose gradients exist.
  Tensor<T> range = detail::slice_range(x, a, b, e);
  if (const std::int64_t pad = n * step - (e - b); pad > 0) {
    Shape padding = range.shape();
    padding[a] = pad;
    const Tensor<T> parts[] = {range, zeros<T>(padding, x.device())};
    range = detail::concat_tensors(std::span<const Tensor<T>>(parts), a, "slice");
  }
  std::vector<std::int64_t> split(s.begin(), s.end());
  split[std::size_t(a)] = step;
  split.insert(split.begin() + a, n);
  std::vector<std::int64_t> dims(s.begin(), s.end());
  dims[std::size_t(a)] = n;
  return detail::slice_range(range.reshape(split), a + 1, 0, 1).reshape(dims);
}

/// The tensors joined along `axis` (numpy's concatenate): every extent but
/// that axis's must match, and all must be on one device. One task copies
/// them into the result; each part's gradient is its slice of the result's.
template <class T>
Tensor<T> concat(std::span<const Tensor<T>> parts, int axis = 0) {
  return detail::concat_tensors(parts, axis, "concat");
}
/// concat of a list: `concat({a, b}, 1)`.
template <class T>
Tensor<T> concat(std::initializer_list<Tensor<T>> parts, int axis = 0) {
  return concat(std::span<const Tensor<T>>(parts.begin(), parts.size()), axis);
}
/// concat of a vector of tensors.
template <class T>
Tensor<T> concat(const std::vector<Tensor<T>>& parts, int axis = 0) {
  return concat(std::span<const Tensor<T>>(parts), axis);
}

/// The tensors, all of one shape, joined along a new axis at `axis`
/// (0..rank, negative counts from the end): stack of n (3, 4) tensors along
/// 1 has shape (3, n, 4).
template <class T>
Tensor<T> stack(std::span<const Tensor<T>> parts, int axis = 0) {
  if (parts.empty()) detail::raise("stack: no tensors given");
  if (!parts[0]) detail::raise<std::logic_error>("stack: tensor 0 is an empty handle");
  const Shape& first = parts[0].shape();
  const int a = normalize_axis(axis, first.rank() + 1, "stack");
  std::vector<std::int64_t> dims(first.begin(), first.end());
  dims.insert(dims.begin() + a, 1);
  std::vector<Tensor<T>> views;
  views.reserve(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (!parts[i]) detail::raise<std::logic_error>("stack: tensor ", i, " is an empty handle");
    if (!(parts[i].shape() == first))
      detail::raise("stack: tensor ", i, " has shape ", parts[i].shape().to_string(), " but tensor 0 has shape ",
                    first.to_string(), "; stacked tensors must have one shape");
    views.push_back(parts[i].reshape(dims));
  }
  return detail::concat_tensors(std::span<const Tensor<T>>(views), a, "stack");
}
/// stack of a list: `stack({a, b}, 0)`.
template <class T>
Tensor<T> stack(std::initializer_list<Tensor<T>> parts, int axis = 0) {
  return stack(std::span<const Tensor<T>>(parts.begin(), parts.size()), axis);
}
/// stack of a vector of tensors.
template <class T>
Tensor<T> stack(const std::vector<Tensor<T>>& parts, int axis = 0) {
  return stack(std::span<const Tensor<T>>(parts), axis);
}

/// 1 at each index's position along a new last axis of `depth`, 0
/// elsewhere: shape indices.shape() + (depth). An index outside [0, depth)
/// fails the task (its sync point throws std::out_of_range naming it); on a
/// GPU that row is NaN.
template <class T = float>
Tensor<T> one_hot(const Tensor<std::int64_t>& indices, std::int64_t depth) {
  if (depth <= 0) detail::raise("one_hot: depth must be positive, got ", depth);
  std::vector<std::int64_t> with_axis(indices.shape().begin(), indices.shape().end());
  std::vector<std::int64_t> classes(with_axis.size() + 1, 1);
  with_axis.push_back(1);
  classes.back() = depth;
  const detail::IndexCheck<T> check{depth, "one_hot: index"};
  const Tensor<T> at = detail::eval_untracked(map(check, indices.reshape(with_axis)));
  // + at * 0: a NaN index (on a GPU) makes the whole row NaN.
  return (arange<T>(T(0), T(depth), T(1), indices.device()).reshape(classes) == at) + at * T(0);
}

}  // namespace deft
