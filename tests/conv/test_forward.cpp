// conv2d's forward pass against a naive double loop, every error of conv2d
// and the pooling functions, and the LeNet shapes.
#include "conv_support.hpp"

using namespace deft;
using namespace ct;

BOOST_FIXTURE_TEST_SUITE(forward, Fixture)

// float: |deft - reference| <= 1e-5 * (1 + Σ|x·w| + |b|) per output element,
// i.e. well within K rounding errors of 2^-24 for the K <= 150 terms summed.
// double: the same bound at 1e-13.
BOOST_AUTO_TEST_CASE(float_against_naive_loops) {
  random::seed(101);
  for (const auto& k : kConvCases) {
    Tensor<float> x = uniform<float>(k.x_shape()), w = uniform<float>(k.w_shape()), b = uniform<float>({k.o});
    const auto xv = doubles(x), wv = doubles(w), bv = doubles(b);
    std::vector<double> scale;
    const auto want = ref_conv(k, xv, wv, &bv, &scale);
    Tensor<float> y = conv2d(x, w, b, {k.sh, k.sw}, {k.ph, k.pw});
    BOOST_TEST(y.shape() == k.y_shape());
    check_close(doubles(y), want, 1e-5, "conv2d float " + k.str(), &scale);
    // without a bias
    std::vector<double> scale0;
    const auto want0 = ref_conv(k, xv, wv, nullptr, &scale0);
    check_close(doubles(conv2d(x, w, Size2d{k.sh, k.sw}, Size2d{k.ph, k.pw})), want0, 1e-5,
                "conv2d float, no bias " + k.str(), &scale0);
  }
}

BOOST_AUTO_TEST_CASE(double_against_naive_loops) {
  random::seed(102);
  for (const auto& k : kConvCases) {
    Tensor<double> x = uniform<double>(k.x_shape()), w = uniform<double>(k.w_shape()), b = uniform<double>({k.o});
    const auto xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
    std::vector<double> scale;
    const auto want = ref_conv(k, xv, wv, &bv, &scale);
    check_close(conv2d(x, w, b, {k.sh, k.sw}, {k.ph, k.pw}).to_vector(), want, 1e-13, "conv2d double " + k.str(),
                &scale);
  }
}

BOOST_AUTO_TEST_CASE(expression_operands_and_scalar_sizes) {
  random::seed(103);
  const ConvCase k{2, 3, 8, 7, 4, 3, 3, 2, 2, 1, 1};
  Tensor<double> x = uniform<double>(k.x_shape()), w = uniform<double>(k.w_shape()), b = uniform<double>({k.o});
  auto xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
  for (auto& v : xv) v = 2 * v + 1;
  for (auto& v : wv) v = std::exp(v);
  for (auto& v : bv) v = -v;
  std::vector<double> scale;
  const auto want = ref_conv(k, xv, wv, &bv, &scale);
  // expressions are evaluated first; `2` means {2, 2}
  check_close(conv2d(x * 2.0 + 1.0, exp(w), -b, 2, 1).to_vector(), want, 1e-13, "expression operands", &scale);
}

BOOST_AUTO_TEST_CASE(views_as_operands) {
  random::seed(104);
  const ConvCase k{3, 2, 6, 6, 3, 3, 3, 1, 1, 0, 0};
  Tensor<double> big = uniform<double>({5, 2, 6, 6}), w = uniform<double>(k.w_shape());
  Tensor<double> x = big.rows(1, 4);  // a view at an offset
  const auto xv = x.to_vector(), wv = w.to_vector();
  check_close(conv2d(x, w).to_vector(), ref_conv(k, xv, wv, nullptr), 1e-13, "rows view as input");
  Tensor<double> flat = uniform<double>({3 * 2 * 3 * 3});
  const auto fv = flat.to_vector();
  check_close(conv2d(x, flat.reshape({3, 2, 3, 3})).to_vector(), ref_conv(k, xv, fv, nullptr), 1e-13,
              "reshaped weight");
}

BOOST_AUTO_TEST_CASE(empty_batch_and_channels) {
  Tensor<float> x = zeros<float>({0, 3, 5, 5}), w = ones<float>({2, 3, 3, 3}), b = ones<float>({2});
  Tensor<float> y = conv2d(x, w, b);
  BOOST_TEST(y.shape() == (Shape{0, 2, 3, 3}));
  BOOST_TEST(y.to_vector().empty());
  // no input channels: every output is the bias
  Tensor<float> y2 = conv2d(zeros<float>({2, 0, 4, 4}), zeros<float>({2, 0, 3, 3}), full<float>({2}, 1.5f));
  BOOST_TEST(y2.shape() == (Shape{2, 2, 2, 2}));
  for (float v : y2.to_vector()) BOOST_TEST(v == 1.5f);
  // Empty outputs need no im2col scratch: a batch of 0 huge images, and no
  // output channels over a huge padded image (each would ask for terabytes).
  const std::int64_t big = std::int64_t(1) << 20;
  Tensor<float> none = conv2d(zeros<float>({0, 1, big, big}), ones<float>({1, 1, 1, 1}));
  BOOST_TEST(none.shape() == (Shape{0, 1, big, big}));
  BOOST_CHECK_NO_THROW(none.wait_to_read());
  Tensor<float> x1 = ones<float>({1, 1, 1, 1});
  x1.attach_grad();
  Tensor<float> no_channels;
  {
    autograd::record rec;
    no_channels = conv2d(x1, zeros<float>({0, 1, 1, 1}), 1, big);
    sum(no_channels).backward();
  }
  BOOST_TEST(no_channels.shape() == (Shape{1, 0, 2 * big + 1, 2 * big + 1}));
  BOOST_TEST(no_channels.to_vector().empty());
  BOOST_TEST(x1.grad().to_vector() == std::vector<float>{0.0f});  // no output reads x
}

// A stride and padding near 2^63 (the padded height still fits int64): the
// one output reads padding, without overflow on the way.
BOOST_AUTO_TEST_CASE(huge_stride_and_padding) {
  const std::int64_t s = std::numeric_limits<std::int64_t>::max(), p = (std::int64_t(1) << 62) - 1;
  Tensor<double> y = conv2d(ones<double>({1, 1, 1, 1}), ones<double>({1, 1, 1, 1}), full<double>({1}, 2.0), s, p);
  BOOST_TEST(y.shape() == (Shape{1, 1, 1, 1}));
  BOOST_TEST(y.to_vector() == std::vector<double>{2.0});
}

BOOST_AUTO_TEST_CASE(pooling_against_naive_loops) {
  random::seed(105);
  for (const auto& k : kPoolCases) {
    Tensor<float> x = uniform<float>(k.x_shape());
    const auto xv = doubles(x);
    Tensor<float> mx = max_pool2d(x, {k.kh, k.kw}, {k.sh, k.sw});
    Tensor<float> av = avg_pool2d(x, {k.kh, k.kw}, {k.sh, k.sw});
    BOOST_TEST(mx.shape() == k.y_shape());
    BOOST_TEST(av.shape() == k.y_shape());
    check_close(doubles(mx), ref_pool(k, xv, true), 0, "max_pool2d " + k.str());  // max is exact
    check_close(doubles(av), ref_pool(k, xv, false), 1e-6, "avg_pool2d " + k.str());
    Tensor<double> xd = uniform<double>(k.x_shape());
    const auto xdv = xd.to_vector();
    check_close(max_pool2d(xd, {k.kh, k.kw}, {k.sh, k.sw}).to_vector(), ref_pool(k, xdv, true), 0,
                "max_pool2d double " + k.str());
    check_close(avg_pool2d(xd, {k.kh, k.kw}, {k.sh, k.sw}).to_vector(), ref_pool(k, xdv, false), 1e-14,
                "avg_pool2d double " + k.str());
  }
  // the stride defaults to the kernel
  Tensor<float> x = uniform<float>({2, 2, 6, 4});
  BOOST_TEST(max_pool2d(x, 2).to_vector() == max_pool2d(x, {2, 2}, {2, 2}).to_vector());
  BOOST_TEST(avg_pool2d(x, {3, 2}).to_vector() == avg_pool2d(x, {3, 2}, {3, 2}).to_vector());
  BOOST_TEST(max_pool2d(x * 2.0f, 2).to_vector() == max_pool2d(Tensor<float>(x * 2.0f), 2).to_vector());
}

BOOST_AUTO_TEST_CASE(max_pool_propagates_nan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor<double> x({1, nan, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 4});
  const auto y = max_pool2d(x, 2).to_vector();  // windows {1, nan, 5, 6} and {3, 4, 7, 8}
  BOOST_TEST(std::isnan(y[0]));
  BOOST_TEST(y[1] == 8.0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(errors, Fixture)

BOOST_AUTO_TEST_CASE(conv2d_shapes) {
  Tensor<float> x = ones<float>({2, 3, 8, 8}), w = ones<float>({4, 3, 3, 3}), b = ones<float>({4});
  const std::string p = "deft: conv2d: ";
  expect_invalid([&] { conv2d(ones<float>({3, 8, 8}), w, b); }, p, {"input must have rank 4", "(3, 8, 8)"});
  expect_invalid([&] { conv2d(x, ones<float>({4, 27}), b); }, p, {"weight must have rank 4", "(4, 27)"});
  expect_invalid([&] { conv2d(x, ones<float>({4, 2, 3, 3}), b); }, p,
                 {"input has 3 channels", "(2, 3, 8, 8)", "weight expects 2", "(4, 2, 3, 3)"});
  expect_invalid([&] { conv2d(x, w, ones<float>({5})); }, p, {"bias must have shape (4,)", "(4, 3, 3, 3)", "(5,)"});
  expect_invalid([&] { conv2d(x, w, ones<float>({1, 4})); }, p, {"bias must have shape (4,)", "(1, 4)"});
  expect_invalid([&] { conv2d(x, ones<float>({4, 3, 0, 3}), b); }, p, {"kernel extents must be positive", "(4, 3, 0, 3)"});
  expect_invalid([&] { conv2d(x, ones<float>({4, 3, 9, 3}), b); }, p,
                 {"kernel 9x3", "larger than the padded input 8x8", "(2, 3, 8, 8)", "(4, 3, 9, 3)"});
  expect_invalid([&] { conv2d(x, ones<float>({4, 3, 3, 11}), b, 1, {0, 1}); }, p,
                 {"kernel 3x11", "padded input 8x10", "padding (0, 1)"});
  // the padding makes room for the kernel: accepted
  BOOST_TEST(conv2d(x, ones<float>({4, 3, 10, 10}), b, 1, 1).shape() == (Shape{2, 4, 1, 1}));
  expect_invalid([&] { conv2d(x, w, b, {0, 1}); }, p, {"stride must be positive", "(0, 1)", "(2, 3, 8, 8)"});
  expect_invalid([&] { conv2d(x, w, b, -2); }, p, {"stride must be positive", "(-2, -2)"});
  expect_invalid([&] { conv2d(x, w, b, 1, {0, -1}); }, p, {"padding must be >= 0", "(0, -1)", "(4, 3, 3, 3)"});
  expect_invalid([&] { conv2d(x, w, 0); }, p, {"stride must be positive"});  // the bias-free form checks too
  expect_invalid([&] { conv2d(x, w, b, 1, std::numeric_limits<std::int64_t>::max()); }, p, {"padding", "too large"});
}

BOOST_AUTO_TEST_CASE(pooling_shapes) {
  Tensor<float> x = ones<float>({2, 3, 6, 5});
  for (const std::string op : {"max_pool2d", "avg_pool2d"}) {
    auto pool = [&](const Tensor<float>& in, Size2d k, Size2d s) {
      return op == "max_pool2d" ? max_pool2d(in, k, s) : avg_pool2d(in, k, s);
    };
    const std::string p = "deft: " + op + ": ";
    expect_invalid([&] { pool(ones<float>({3, 6, 5}), 2, 2); }, p, {"input must have rank 4", "(3, 6, 5)"});
    expect_invalid([&] { pool(x, {0, 2}, 2); }, p, {"kernel must be positive", "(0, 2)", "(2, 3, 6, 5)"});
    expect_invalid([&] { pool(x, 2, {1, 0}); }, p, {"stride must be positive", "(1, 0)", "(2, 3, 6, 5)"});
    expect_invalid([&] { pool(x, {2, 6}, 1); }, p, {"kernel 2x6 is larger than the input 6x5", "(2, 3, 6, 5)"});
    expect_invalid([&] { pool(x, 7, 1); }, p, {"kernel 7x7"});
  }
  expect_invalid([&] { max_pool2d(x, -1); }, "deft: max_pool2d: ", {"kernel must be positive"});
}

// A bad call records nothing, not even the evaluation of an expression operand.
BOOST_AUTO_TEST_CASE(nothing_recorded_on_error) {
  Tensor<float> x = ones<float>({2, 3, 8, 8}), w = ones<float>({4, 2, 3, 3}), b = ones<float>({4});
  deft::wait_all();
  const auto before = engine::stats().tasks_recorded;
  expect_invalid([&] { conv2d(x * 2.0f, exp(w), b + 1.0f); }, "deft: conv2d: ", {"channels"});
  expect_invalid([&] { max_pool2d(x * 2.0f, 9); }, "deft: max_pool2d: ", {"larger"});
  expect_invalid([&] { avg_pool2d(x + 1.0f, 2, 0); }, "deft: avg_pool2d: ", {"stride"});
  BOOST_TEST(engine::stats().tasks_recorded == before);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(lenet, Fixture)

// (4, 1, 28, 28) -> conv 6@5x5 pad 2 -> max pool 2 -> conv 16@5x5 -> max pool 2 -> (4, 16, 5, 5),
// forward and backward, in float and in double.
template <class T>
void lenet_shapes() {
  random::seed(106);
  Tensor<T> x = uniform<T>({4, 1, 28, 28});
  Tensor<T> w1 = uniform<T>({6, 1, 5, 5}, -0.2, 0.2), b1 = uniform<T>({6}, -0.1, 0.1);
  Tensor<T> w2 = uniform<T>({16, 6, 5, 5}, -0.1, 0.1), b2 = uniform<T>({16}, -0.1, 0.1);
  for (auto* p : {&w1, &b1, &w2, &b2}) p->attach_grad();
  Tensor<T> c1, p1, c2, p2;
  {
    autograd::record rec;
    c1 = conv2d(x, w1, b1, 1, 2);
    p1 = max_pool2d(relu(c1), 2);
    c2 = conv2d(p1, w2, b2);
    p2 = max_pool2d(relu(c2), 2);
    Tensor<T> loss = sum(p2 * p2);
    loss.backward();
  }
  BOOST_TEST(c1.shape() == (Shape{4, 6, 28, 28}));
  BOOST_TEST(p1.shape() == (Shape{4, 6, 14, 14}));
  BOOST_TEST(c2.shape() == (Shape{4, 16, 10, 10}));
  BOOST_TEST(p2.shape() == (Shape{4, 16, 5, 5}));
  for (auto* p : {&w1, &b1, &w2, &b2}) {
    BOOST_TEST(p->grad().shape() == p->shape());
    const auto g = p->grad().to_vector();
    BOOST_TEST(std::all_of(g.begin(), g.end(), [](T v) { return std::isfinite(v); }));
    BOOST_TEST(std::any_of(g.begin(), g.end(), [](T v) { return v != T(0); }));
  }
}

BOOST_AUTO_TEST_CASE(shapes_float) { lenet_shapes<float>(); }
BOOST_AUTO_TEST_CASE(shapes_double) { lenet_shapes<double>(); }

BOOST_AUTO_TEST_SUITE_END()
