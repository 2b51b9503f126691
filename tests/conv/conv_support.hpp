// Shared by the convolution tests: naive double-precision references,
// central finite differences, an engine fixture and error checks.
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <deft/deft.hpp>

namespace ct {

using deft::Shape;
using deft::Tensor;
using i64 = std::int64_t;

/// Drains the engine (swallowing an earlier test's failure) around each test.
struct Fixture {
  Fixture() { settle(); }
  ~Fixture() { settle(); }
  static void settle() {
    try {
      deft::wait_all();
    } catch (...) {
    }
  }
};

/// One convolution: input (n, c, h, w), weight (o, c, kh, kw), stride, padding.
struct ConvCase {
  i64 n, c, h, w, o, kh, kw, sh, sw, ph, pw;
  i64 oh() const { return (h + 2 * ph - kh) / sh + 1; }
  i64 ow() const { return (w + 2 * pw - kw) / sw + 1; }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {o, c, kh, kw}; }
  Shape y_shape() const { return {n, o, oh(), ow()}; }
  std::string str() const {
    return "x " + x_shape().to_string() + " w " + w_shape().to_string() + " stride (" + std::to_string(sh) + ", " +
           std::to_string(sw) + ") padding (" + std::to_string(ph) + ", " + std::to_string(pw) + ")";
  }
};

/// The forward cases: batch > 1, C > 1, O > 1, non-square inputs and kernels,
/// strides above, at and below the kernel, paddings, a kernel covering the
/// whole padded input, and batches that split into several image blocks.
inline const std::vector<ConvCase> kConvCases = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0},    // plain
    {3, 2, 9, 8, 5, 3, 2, 2, 1, 1, 0},    // non-square kernel, stride (2, 1), padding (1, 0)
    {2, 1, 5, 5, 3, 5, 5, 1, 1, 2, 2},    // "same" 5x5
    {1, 4, 10, 7, 2, 1, 1, 1, 1, 0, 0},   // 1x1 kernel
    {2, 3, 11, 13, 4, 4, 3, 3, 2, 2, 1},  // stride (3, 2), padding (2, 1)
    {2, 2, 4, 4, 3, 6, 6, 1, 1, 1, 1},    // kernel == padded input: 1x1 output
    {2, 2, 9, 9, 2, 2, 2, 3, 3, 0, 0},    // stride larger than the kernel (skipped pixels)
    {2, 2, 5, 6, 3, 3, 3, 1, 2, 3, 2},    // padding larger than half the kernel (all-zero windows)
    {37, 2, 6, 5, 3, 3, 3, 1, 1, 1, 1},   // many images: several blocks, the last one short
    {4, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2},  // LeNet conv1
    {3, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0}, // LeNet conv2
};

/// y = conv(x, w) + b in double, and for each output Σ|x·w| + |b| (its scale).
inline std::vector<double> ref_conv(const ConvCase& k, const std::vector<double>& x, const std::vector<double>& w,
                                    const std::vector<double>* b, std::vector<double>* scale = nullptr) {
  const i64 OH = k.oh(), OW = k.ow();
  std::vector<double> y(std::size_t(k.n * k.o * OH * OW));
  if (scale) scale->assign(y.size(), 0.0);
  for (i64 n = 0; n < k.n; ++n)
    for (i64 o = 0; o < k.o; ++o)
      for (i64 oh = 0; oh < OH; ++oh)
        for (i64 ow = 0; ow < OW; ++ow) {
          double s = b ? (*b)[o] : 0.0, m = b ? std::abs((*b)[o]) : 0.0;
          for (i64 c = 0; c < k.c; ++c)
            for (i64 i = 0; i < k.kh; ++i)
              for (i64 j = 0; j < k.kw; ++j) {
                const i64 ih = oh * k.sh - k.ph + i, iw = ow * k.sw - k.pw + j;
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                const double t = x[((n * k.c + c) * k.h + ih) * k.w + iw] * w[((o * k.c + c) * k.kh + i) * k.kw + j];
                s += t;
                m += std::abs(t);
              }
          const std::size_t at = std::size_t(((n * k.o + o) * OH + oh) * OW + ow);
          y[at] = s;
          if (scale) (*scale)[at] = m;
        }
  return y;
}

/// One pooling: input (n, c, h, w), window (kh, kw), stride (sh, sw).
struct PoolCase {
  i64 n, c, h, w, kh, kw, sh, sw;
  i64 oh() const { return (h - kh) / sh + 1; }
  i64 ow() const { return (w - kw) / sw + 1; }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape y_shape() const { return {n, c, oh(), ow()}; }
  std::string str() const {
    return "x " + x_shape().to_string() + " kernel (" + std::to_string(kh) + ", " + std::to_string(kw) + ") stride (" +
           std::to_string(sh) + ", " + std::to_string(sw) + ")";
  }
};

inline const std::vector<PoolCase> kPoolCases = {
    {2, 3, 8, 6, 2, 2, 2, 2},   // LeNet's 2x2
    {2, 2, 7, 9, 3, 2, 3, 2},   // non-square, leftover rows and columns
    {1, 3, 6, 6, 3, 3, 1, 1},   // overlapping windows
    {3, 2, 5, 4, 5, 4, 1, 1},   // the window is the whole plane
    {2, 1, 9, 10, 2, 3, 4, 3},  // stride larger than the window
};

inline std::vector<double> ref_pool(const PoolCase& k, const std::vector<double>& x, bool max) {
  const i64 OH = k.oh(), OW = k.ow();
  std::vector<double> y(std::size_t(k.n * k.c * OH * OW));
  for (i64 p = 0; p < k.n * k.c; ++p)
    for (i64 oh = 0; oh < OH; ++oh)
      for (i64 ow = 0; ow < OW; ++ow) {
        double best = -std::numeric_limits<double>::infinity(), s = 0;
        for (i64 i = 0; i < k.kh; ++i)
          for (i64 j = 0; j < k.kw; ++j) {
            const double v = x[(p * k.h + oh * k.sh + i) * k.w + ow * k.sw + j];
            best = std::max(best, v);
            s += v;
          }
        y[std::size_t((p * OH + oh) * OW + ow)] = max ? best : s / double(k.kh * k.kw);
      }
  return y;
}

template <class T>
Tensor<T> uniform(const Shape& s, double lo = -1, double hi = 1) {
  return deft::random::uniform<T>(T(lo), T(hi), s);
}

template <class T>
std::vector<double> doubles(const Tensor<T>& t) {
  const auto v = t.to_vector();
  return std::vector<double>(v.begin(), v.end());
}

/// |got - want| <= rel * (1 + scale) elementwise (scale defaults to |want|).
inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                        const std::string& what, const std::vector<double>* scale = nullptr) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double s = scale ? (*scale)[i] : std::abs(want[i]);
    const double err = std::abs(got[i] - want[i]) / (1 + s);
    if (!(err <= worst)) worst = err, at = i;  // NaN counts as the worst
  }
  BOOST_TEST_INFO(what << ": element " << at << " got " << (got.empty() ? 0 : got[at]) << " want "
                       << (want.empty() ? 0 : want[at]));
  BOOST_TEST(worst <= rel);
}

using Loss = std::function<Tensor<double>()>;

/// Records loss() (one element), back-propagates, and compares every
/// parameter's gradient with the central difference (loss(p+h) - loss(p-h)) / 2h:
/// |analytic - numeric| <= tol * max(1, |numeric|) for every element.
inline void check_gradients(const std::vector<Tensor<double>*>& params, const Loss& loss, const std::string& what,
                            double tol = 1e-6, double h = 1e-6) {
  for (auto* p : params) p->attach_grad();
  {
    deft::autograd::record rec;
    Tensor<double> y = loss();
    BOOST_REQUIRE_EQUAL(y.size(), 1);
    y.backward();
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    Tensor<double>& p = *params[k];
    const Tensor<double> original = p;
    const Shape shape = p.shape();
    const std::vector<double> analytic = p.grad().to_vector();
    const std::vector<double> v = p.to_vector();
    BOOST_REQUIRE_EQUAL(analytic.size(), v.size());
    double worst = 0, worst_num = 0;
    std::size_t worst_i = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      auto at = [&](double delta) {
        auto moved = v;
        moved[i] += delta;
        p = Tensor<double>(moved, shape);
        return loss().item();
      };
      const double numeric = (at(h) - at(-h)) / (2 * h);
      const double err = std::abs(analytic[i] - numeric) / std::max(1.0, std::abs(numeric));
      if (!(err <= worst)) worst = err, worst_i = i, worst_num = numeric;
    }
    p = original;
    BOOST_TEST_INFO(what << ": parameter " << k << " shape " << shape.to_string() << ", element " << worst_i
                         << " analytic " << analytic[worst_i] << " numeric " << worst_num);
    BOOST_TEST(worst <= tol);
  }
}

/// f() must throw exactly std::invalid_argument whose message starts with
/// `prefix` and contains every one of `parts`.
template <class F>
void expect_invalid(F&& f, const std::string& prefix, const std::vector<std::string>& parts) {
  try {
    f();
    BOOST_ERROR("no exception; expected \"" << prefix << "...\"");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    BOOST_TEST_INFO("message: " << m);
    BOOST_TEST(m.rfind(prefix, 0) == 0);
    for (const auto& part : parts) {
      BOOST_TEST_INFO("message: " << m << "; wanted: " << part);
      BOOST_TEST(m.find(part) != std::string::npos);
    }
  } catch (const std::exception& e) {
    BOOST_ERROR("wrong exception type, message: " << e.what());
  }
}

}  // namespace ct
