// Initializers: how a parameter's first value is drawn from its shape. They
// draw from deft::random, so deft::random::seed(s) before the first forward
// call makes a network's initial weights reproducible (as mx.random.seed).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>

#include "../core/shape.hpp"
#include "../ops/creation.hpp"
#include "../ops/random.hpp"
#include "../tensor.hpp"

namespace deft::nn {

/// Makes a parameter's initial value for a shape.
using Initializer = std::function<Tensor<float>(const Shape&)>;

namespace init {

/// Fan-in and fan-out of a weight: (in, out) for a dense weight, (out, in,
/// kh, kw) for a convolution's (in * kh * kw, out * kh * kw).
inline std::pair<double, double> fans(const Shape& s) {
  if (s.rank() == 0) return {1, 1};
  if (s.rank() == 1) return {double(s[0]), double(s[0])};
  if (s.rank() == 2) return {double(s[0]), double(s[1])};
  double receptive = 1;
  for (int d = 2; d < s.rank(); ++d) receptive *= double(s[d]);
  return {double(s[1]) * receptive, double(s[0]) * receptive};
}

/// N(0, sigma^2) (Gluon's init.Normal; sigma 0.01 by default).
inline Initializer normal(double sigma = 0.01) {
  return [sigma](const Shape& s) { return random::normal<float>(0, sigma, s); };
}
/// U(-scale, scale) (Gluon's init.Uniform, MXNet's default scale 0.07).
inline Initializer uniform(double scale = 0.07) {
  return [scale](const Shape& s) { return random::uniform<float>(-scale, scale, s); };
}
/// Glorot/Xavier uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)).
inline Initializer xavier() {
  return [](const Shape& s) {
    const auto [in, out] = fans(s);
    const double a = std::sqrt(6.0 / (in + out));
    return random::uniform<float>(-a, a, s);
  };
}
/// He/Kaiming normal (He et al. 2015), for layers followed by a ReLU:
/// N(0, 2 / fan_in), fan_in = in * kh * kw (PyTorch's kaiming_normal_ with
/// its defaults; Gluon's MSRAPrelu with factor_type "in").
inline Initializer kaiming() {
  return [](const Shape& s) { return random::normal<float>(0, std::sqrt(2.0 / fans(s).first), s); };
}
/// Every element `value` (biases start at zero).
inline Initializer constant(float value) {
  return [value](const Shape& s) { return full<float>(s, value); };
}
inline Initializer zeros() { return constant(0.0f); }

}  // namespace init
}  // namespace deft::nn
