// 2-D convolution and pooling over NCHW tensors (LeNet's layers): shape
// checks and plans, and the recorded tasks, forward and gradient. Each
// operation records one task, like dot, whose kernel is the executor's
// (eval/cpu/conv.hpp, eval/gpu/conv.hpp). Inside autograd::record the result
// gets a node (autograd/conv.hpp, through track_conv2d / track_pool2d) whose
// backward() records the gradient tasks defined here. See docs/conv.md.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "../autograd/meta.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../engine/engine.hpp"
#include "../eval/conv_geometry.hpp"
#include "../eval/executor.hpp"
#include "../tensor.hpp"
#include "linalg.hpp"

namespace deft {

/// A (height, width) pair: strides, paddings and pooling windows.
/// `2` means {2, 2}; `{2, 1}` is 2 along the height, 1 along the width.
struct Size2d {
  std::int64_t h = 0;  ///< along the height
  std::int64_t w = 0;  ///< along the width
  /// The same value along both axes.
  constexpr Size2d(std::int64_t both) : h(both), w(both) {}  // NOLINT: implicit on purpose, `max_pool2d(x, 2)`
  /// Height and width values.
  constexpr Size2d(std::int64_t height, std::int64_t width) : h(height), w(width) {}
  /// "(h, w)", for error messages.
  std::string to_string() const {
    std::string s = "(";  // appended piece by piece: GCC 12 warns (-Wrestrict) on "(" + std::to_string(...)
    s += std::to_string(h);
    s += ", ";
    s += std::to_string(w);
    s += ')';
    return s;
  }
};

namespace detail {



inline std::int64_t checked_padded(std::int64_t in, std::int64_t pad, const char* op, const Shape& x, Size2d padding) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(pad, std::int64_t(2), &r) || __builtin_add_overflow(in, r, &r))
    raise(op, ": padding ", padding.to_string(), " is too large for input shape ", x.to_string());
  return r;
}

/// Checks a convolution's shapes (before anything is recorded) and plans it.
inline ConvGeom plan_conv2d(const Shape& x, const Shape& w, const Shape* b, Size2d stride, Size2d padding) {
  if (x.rank() != 4) raise("conv2d: the input must have rank 4 (N, C, H, W), got shape ", x.to_string());
  if (w.rank() != 4) raise("conv2d: the weight must have rank 4 (O, C, KH, KW), got shape ", w.to_string());
  if (stride.h <= 0 || stride.w <= 0)
    raise("conv2d: the stride must be positive, got ", stride.to_string(), " (input shape ", x.to_string(),
          ", weight shape ", w.to_string(), ")");
  if (padding.h < 0 || padding.w < 0)
    raise("conv2d: the padding must be >= 0, got ", padding.to_string(), " (input shape ", x.to_string(),
          ", weight shape ", w.to_string(), ")");
  if (x[1] != w[1])
    raise("conv2d: the input has ", x[1], " channels (shape ", x.to_string(), ") but the weight expects ", w[1],
          " (shape ", w.to_string(), ")");
  if (w[2] == 0 || w[3] == 0) raise("conv2d: the kernel extents must be positive, got weight shape ", w.to_string());
  if (b && !(b->rank() == 1 && (*b)[0] == w[0]))
    raise("conv2d: the bias must have shape (", w[0], ",) for weight shape ", w.to_string(), ", got shape ",
          b->to_string());
  const std::int64_t hp = checked_padded(x[2], padding.h, "conv2d", x, padding);
  const std::int64_t wp = checked_padded(x[3], padding.w, "conv2d", x, padding);
  if (w[2] > hp || w[3] > wp)
    raise("conv2d: the kernel ", w[2], "x", w[3], " (weight shape ", w.to_string(), ") is larger than the padded input ",
          hp, "x", wp, " (input shape ", x.to_string(), ", padding ", padding.to_string(), ")");
  ConvGeom g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.kh = w[2], g.kw = w[3];
  g.sh = stride.h, g.sw = stride.w, g.ph = padding.h, g.pw = padding.w;
  g.oh = (hp - g.kh) / g.sh + 1;
  g.ow = (wp - g.kw) / g.sw + 1;
  (void)g.output().size();  // Shape checks that the element count fits
  return g;
}

inline PoolGeom plan_pool2d(const char* op, const Shape& x, Size2d kernel, Size2d stride) {
  if (x.rank() != 4) raise(op, ": the input must have rank 4 (N, C, H, W), got shape ", x.to_string());
  if (kernel.h <= 0 || kernel.w <= 0)
    raise(op, ": the kernel must be positive, got ", kernel.to_string(), " (input shape ", x.to_string(), ")");
  if (stride.h <= 0 || stride.w <= 0)
    raise(op, ": the stride must be positive, got ", stride.to_string(), " (input shape ", x.to_string(), ")");
  if (kernel.h > x[2] || kernel.w > x[3])
    raise(op, ": the kernel ", kernel.h, "x", kernel.w, " is larger than the input ", x[2], "x", x[3], " (input shape ",
          x.to_string(), ")");
  PoolGeom g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.kh = kernel.h, g.kw = kernel.w, g.sh = stride.h, g.sw = stride.w;
  g.oh = (g.h - g.kh) / g.sh + 1;
  g.ow = (g.w - g.kw) / g.sw + 1;
  return g;
}

template <class T>
const T* data_of(const Leaf<T>& l) { return l.source->template as<const T>() + l.offset; }

/// A leaf without its autograd record (what a kernel closure keeps).
template <class T>
Leaf<T> plain_leaf(const Leaf<T>& l) { return Leaf<T>(l.buffer, l.offset, l.extent); }


// --- recorded tasks (the forward ones and the untracked gradients) -------------

template <class T>
Tensor<T> record_conv2d(const Leaf<T>& x, const Leaf<T>& w, const Leaf<T>* b, const ConvGeom& g) {
  const bool has_bias = b != nullptr;
  require_backend(x.device(), "conv2d");
  return record_new<T>(
      "conv2d", g.output(), x.device(),
      [x = plain_leaf(x), w = plain_leaf(w), b = has_bias ? plain_leaf(*b) : Leaf<T>(), has_bias, g](Buffer& out) {
        on_device(out.device, [&](auto ex) {
          ex.conv2d_forward(g, data_of(x), data_of(w), has_bias ? data_of(b) : nullptr, out.as<T>());
        });
      },
      [&](Task& t) {
        t.add_input(x.buffer);
        t.add_input(w.buffer);
        if (b) t.add_input(b->buffer);
      });
}

/// A gradient task reading two leaves: kernel(ex, a's data, b's data, out).
template <class T, class Kernel>
Tensor<T> record_grad(const char* name, const Shape& shape, const Leaf<T>& a, const Leaf<T>& b, Kernel kernel) {
  require_backend(a.device(), name);
  return record_new<T>(
      name, shape, a.device(),
      [a = plain_leaf(a), b = plain_leaf(b), kernel](Buffer& out) {
        on_device(out.device, [&](auto ex) { kernel(ex, data_of(a), data_of(b), out.as<T>()); });
      },
      [&](Task& t) {
        t.add_input(a.buffer);
        t.add_input(b.buffer);
      });
}

template <class T>
Tensor<T> conv2d_grad_input(const Leaf<T>& dy, const Leaf<T>& w, const ConvGeom& g) {
  return record_grad<T>("conv2d_grad_input", g.input(), dy, w, [g](auto ex, const T* pdy, const T* pw, T* out) {
    ex.conv2d_backward_input(g, pdy, pw, out);
  });
}

template <class T>
Tensor<T> conv2d_grad_weight(const Leaf<T>& dy, const Leaf<T>& x, const ConvGeom& g) {
  return record_grad<T>("conv2d_grad_weight", g.weight(), dy, x, [g](auto ex, const T* pdy, const T* px, T* out) {
    ex.conv2d_backward_weight(g, pdy, px, out);
  });
}

template <class T>
Tensor<T> conv2d_grad_bias(const Leaf<T>& dy, const ConvGeom& g) {
  require_backend(dy.device(), "conv2d_grad_bias");
  return record_new<T>(
      "conv2d_grad_bias", Shape{g.o}, dy.device(),
      [dy = plain_leaf(dy), g](Buffer& out) {
        on_device(out.device, [&](auto ex) { ex.conv2d_backward_bias(g, data_of(dy), out.as<T>()); });
      },
      [&](Task& t) { t.add_input(dy.buffer); });
}

template <PoolKind Kind, class T>
Tensor<T> record_pool2d(const char* name, const Leaf<T>& x, const PoolGeom& g) {
  require_backend(x.device(), name);
  return record_new<T>(
      name, g.output(), x.device(),
      [x = plain_leaf(x), g](Buffer& out) {
        on_device(out.device, [&](auto ex) { ex.template pool2d_forward<Kind>(g, data_of(x), out.as<T>()); });
      },
      [&](Task& t) { t.add_input(x.buffer); });
}

template <PoolKind Kind, class T>
Tensor<T> pool2d_grad(const Leaf<T>& dy, const Leaf<T>& x, const PoolGeom& g) {
  constexpr bool reads_x = Kind == PoolKind::max;  // avg needs only the window geometry
  require_backend(dy.device(), "pool2d_grad");
  return record_new<T>(
      Kind == PoolKind::max ? "max_pool2d_grad" : "avg_pool2d_grad", g.input(), dy.device(),
      [dy = plain_leaf(dy), x = reads_x ? plain_leaf(x) : Leaf<T>(), g](Buffer& out) {
        on_device(out.device, [&](auto ex) {
          ex.template pool2d_backward<Kind>(g, data_of(dy), reads_x ? data_of(x) : nullptr, out.as<T>());
        });
      },
      [&](Task& t) {
        t.add_input(dy.buffer);
        if (reads_x) t.add_input(x.buffer);
      });
}

}  // namespace detail
}  // namespace deft

namespace deft {
namespace detail {

template <class T>
void require_conv_type() {
  static_assert(std::is_floating_point_v<T>, "deft: conv2d and pooling need float or double tensors");
}

/// B = std::nullptr_t: no bias.
template <class X, class W, class B>
auto conv2d_impl(X&& x, W&& w, B&& b, Size2d stride, Size2d padding) {
  constexpr bool has_bias = !std::is_same_v<std::remove_cvref_t<B>, std::nullptr_t>;
  auto plan = [&](const Shape& xs, const Shape& ws) {
    if constexpr (has_bias) {
      const Shape bs = as_expr(b).shape();
      return plan_conv2d(xs, ws, &bs, stride, padding);
    } else {
      return plan_conv2d(xs, ws, nullptr, stride, padding);
    }
  };
  {  // shapes and devices first: a bad convolution records nothing (not even its operands' evaluation)
    const auto ex = as_expr(x);
    const auto ew = as_expr(w);
    (void)plan(ex.shape(), ew.shape());
    (void)common_device(ex, ew, "conv2d");
    if constexpr (has_bias) (void)common_device(ex, as_expr(b), "conv2d");
  }
  auto lx = materialized_leaf(std::forward<X>(x));
  auto lw = materialized_leaf(std::forward<W>(w));
  using T = value_t<decltype(lx)>;
  require_conv_type<T>();
  static_assert(std::is_same_v<T, value_t<decltype(lw)>>,
                "deft: conv2d needs operands of one element type; use deft::cast<U>(x)");
  const ConvGeom g = plan(lx.shape(), lw.shape());
  if constexpr (has_bias) {
    auto lb = materialized_leaf(std::forward<B>(b));
    static_assert(std::is_same_v<T, value_t<decltype(lb)>>,
                  "deft: conv2d needs operands of one element type; use deft::cast<U>(x)");
    auto out = record_conv2d<T>(lx, lw, &lb, g);
    if (autograd::is_recording() && (lx.grad || lw.grad || lb.grad))
      autograd::detail::track_conv2d<T>(out, lx, lw, &lb, g);
    return out;
  } else {
    auto out = record_conv2d<T>(lx, lw, nullptr, g);
    if (autograd::is_recording() && (lx.grad || lw.grad))
      autograd::detail::track_conv2d<T>(out, lx, lw, nullptr, g);
    return out;
  }
}

template <PoolKind Kind, class X>
auto pool2d_impl(const char* name, X&& x, Size2d kernel, Size2d stride) {
  (void)plan_pool2d(name, as_expr(x).shape(), kernel, stride);  // before an expression operand is evaluated
  auto lx = materialized_leaf(std::forward<X>(x));
  using T = value_t<decltype(lx)>;
  require_conv_type<T>();
  const PoolGeom g = plan_pool2d(name, lx.shape(), kernel, stride);
  auto out = record_pool2d<Kind, T>(name, lx, g);
  if (autograd::is_recording() && lx.grad) autograd::detail::track_pool2d<Kind>(out, lx, g);
  return out;
}

}  // namespace detail

/// 2-D convolution (cross-correlation, as in every DL framework) of x (N, C, H, W)
/// with w (O, C, KH, KW) plus b (O): a new (N, O, OH, OW) tensor with
/// OH = (H + 2*padding.h - KH) / stride.h + 1 (likewise OW). Zero padding.
template <Operand X, Operand W, Operand B>
auto conv2d(X&& x, W&& w, B&& b, Size2d stride = {1, 1}, Size2d padding = {0, 0}) {
  return detail::conv2d_impl(std::forward<X>(x), std::forward<W>(w), std::forward<B>(b), stride, padding);
}
/// The same without a bias.
template <Operand X, Operand W>
auto conv2d(X&& x, W&& w, Size2d stride = {1, 1}, Size2d padding = {0, 0}) {
  return detail::conv2d_impl(std::forward<X>(x), std::forward<W>(w), nullptr, stride, padding);
}

/// Maximum over kernel.h x kernel.w windows of x (N, C, H, W), moved by
/// `stride` (default: the kernel, windows side by side); no padding.
template <Operand X>
auto max_pool2d(X&& x, Size2d kernel, Size2d stride) {
  return detail::pool2d_impl<detail::PoolKind::max>("max_pool2d", std::forward<X>(x), kernel, stride);
}
/// max_pool2d with the stride equal to the window.
template <Operand X>
auto max_pool2d(X&& x, Size2d kernel) { return max_pool2d(std::forward<X>(x), kernel, kernel); }

/// Mean over kernel.h x kernel.w windows (every window lies inside x).
template <Operand X>
auto avg_pool2d(X&& x, Size2d kernel, Size2d stride) {
  return detail::pool2d_impl<detail::PoolKind::avg>("avg_pool2d", std::forward<X>(x), kernel, stride);
}
/// avg_pool2d with the stride equal to the window.
template <Operand X>
auto avg_pool2d(X&& x, Size2d kernel) { return avg_pool2d(std::forward<X>(x), kernel, kernel); }

}  // namespace deft
