// Gradients of conv2d and pooling against central finite differences in
// double precision (loss = sum(op(...) * R) with fixed random R), the
// pooling ties, the weight gradient's block sums against a naive loop, and
// results that do not depend on the worker count.
#include "conv_support.hpp"

using namespace deft;
using namespace ct;

namespace {

// Small enough for finite differences on every element, and still covering
// strides, paddings, non-square kernels and batches split into blocks.
const std::vector<ConvCase> kGradCases = {
    {2, 3, 6, 5, 4, 3, 3, 1, 1, 0, 0},   // plain
    {2, 2, 7, 6, 3, 3, 2, 2, 1, 1, 0},   // stride (2, 1), padding (1, 0), non-square kernel
    {3, 2, 5, 5, 2, 5, 5, 1, 1, 2, 2},   // "same" 5x5
    {2, 2, 8, 9, 3, 2, 3, 3, 2, 2, 1},   // strides above the kernel, padding (2, 1)
    {2, 1, 4, 4, 2, 6, 6, 1, 1, 1, 1},   // kernel == padded input
    {10, 2, 4, 4, 3, 3, 3, 1, 1, 1, 1},  // 10 images in 5 blocks of 2
    {9, 1, 3, 5, 2, 2, 2, 1, 2, 0, 1},   // 9 images in blocks of 2, the last one short
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(gradients, Fixture)

BOOST_AUTO_TEST_CASE(conv2d_all_inputs_against_finite_differences) {
  random::seed(201);
  for (const auto& k : kGradCases) {
    Tensor<double> x = uniform<double>(k.x_shape()), w = uniform<double>(k.w_shape()), b = uniform<double>({k.o});
    const Tensor<double> r = uniform<double>(k.y_shape());  // fixed weights of the loss
    const Size2d s{k.sh, k.sw}, p{k.ph, k.pw};
    check_gradients({&x, &w, &b}, [&] { return Tensor<double>(sum(conv2d(x, w, b, s, p) * r)); }, "conv2d " + k.str());
    check_gradients({&x, &w}, [&] { return Tensor<double>(sum(conv2d(x, w, s, p) * r)); }, "conv2d no bias " + k.str());
  }
}

BOOST_AUTO_TEST_CASE(only_some_inputs_attached) {
  random::seed(202);
  const ConvCase k{2, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1};
  Tensor<double> x = uniform<double>(k.x_shape()), w = uniform<double>(k.w_shape()), b = uniform<double>({k.o});
  const Tensor<double> r = uniform<double>(k.y_shape());
  check_gradients({&w}, [&] { return Tensor<double>(sum(conv2d(x, w, b, 1, 1) * r)); }, "weight only");
  Tensor<double> x2 = uniform<double>(k.x_shape());
  check_gradients({&x2}, [&] { return Tensor<double>(sum(conv2d(x2, w, b, 1, 1) * r)); }, "input only");
  Tensor<double> b2 = uniform<double>({k.o});
  check_gradients({&b2}, [&] { return Tensor<double>(sum(conv2d(x, w, b2, 1, 1) * r)); }, "bias only");
  // nothing attached: no record on the result
  autograd::record rec;
  Tensor<double> y = conv2d(uniform<double>(k.x_shape()), uniform<double>(k.w_shape()));
  BOOST_TEST(!y.grad_meta());
}

BOOST_AUTO_TEST_CASE(through_expressions_and_chains) {
  random::seed(203);
  Tensor<double> x = uniform<double>({2, 2, 7, 7}), w1 = uniform<double>({3, 2, 3, 3}), b1 = uniform<double>({3});
  Tensor<double> w2 = uniform<double>({2, 3, 2, 2}), b2 = uniform<double>({2});
  const Tensor<double> r = uniform<double>({2, 2, 2, 2});
  // expression operands, a nonlinearity between two convolutions, pooling, and x used twice
  check_gradients({&x, &w1, &b1, &w2, &b2},
                  [&] {
                    Tensor<double> h = tanh(conv2d(x * 0.5, w1, b1 * 2.0, 1, 1));
                    Tensor<double> y = max_pool2d(conv2d(h, w2, b2), 2, 3);
                    return Tensor<double>(sum(y * r) + sum(x * x) * 0.1);
                  },
                  "conv -> tanh -> conv -> max_pool", 1e-5);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(pooling, Fixture)

BOOST_AUTO_TEST_CASE(gradients_against_finite_differences) {
  random::seed(204);
  for (const auto& k : kPoolCases) {
    Tensor<double> x = uniform<double>(k.x_shape());
    const Tensor<double> r = uniform<double>(k.y_shape());
    const Size2d ks{k.kh, k.kw}, ss{k.sh, k.sw};
    check_gradients({&x}, [&] { return Tensor<double>(sum(max_pool2d(x, ks, ss) * r)); }, "max_pool2d " + k.str());
    check_gradients({&x}, [&] { return Tensor<double>(sum(avg_pool2d(x, ks, ss) * r)); }, "avg_pool2d " + k.str());
    check_gradients({&x}, [&] { return Tensor<double>(sum(avg_pool2d(x * x, ks, ss) * r)); },
                    "avg_pool2d of an expression " + k.str());
  }
}

// Ties: the whole gradient of a window goes to its first maximum (row-major).
BOOST_AUTO_TEST_CASE(max_ties_go_to_the_first_maximum) {
  Tensor<double> x = ones<double>({1, 1, 4, 4});
  x.attach_grad();
  {
    autograd::record rec;
    Tensor<double> y = sum(max_pool2d(x, 2));
    y.backward();
  }
  const std::vector<double> want = {1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0};
  BOOST_TEST(x.grad().to_vector() == want, boost::test_tools::per_element());
  // overlapping windows (3x3, stride 1) on a constant plane: each window's top-left element
  Tensor<double> z = full<double>({1, 1, 4, 4}, 2.0);
  z.attach_grad();
  {
    autograd::record rec;
    Tensor<double> y = sum(max_pool2d(z, 3, 1) * Tensor<double>({1, 2, 3, 4}, {1, 1, 2, 2}));
    y.backward();
  }
  const std::vector<double> want2 = {1, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  BOOST_TEST(z.grad().to_vector() == want2, boost::test_tools::per_element());
  // a tie between a later pair: {0, 5, 5, 1} -> the 5 at index 1
  Tensor<double> t({0, 5, 5, 1}, {1, 1, 2, 2});
  t.attach_grad();
  {
    autograd::record rec;
    Tensor<double> y = sum(max_pool2d(t, 2) * 3.0);
    y.backward();
  }
  const std::vector<double> want3 = {0, 3, 0, 0};
  BOOST_TEST(t.grad().to_vector() == want3, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(avg_spreads_evenly) {
  Tensor<double> x = zeros<double>({1, 1, 3, 4});
  x.attach_grad();
  {
    autograd::record rec;
    // 2x2 windows at stride (1, 2): the middle row is in both rows of windows
    Tensor<double> y = sum(avg_pool2d(x, 2, {1, 2}) * Tensor<double>({4, 8, 12, 16}, {1, 1, 2, 2}));
    y.backward();
  }
  const std::vector<double> want = {1, 1, 2, 2, 4, 4, 6, 6, 3, 3, 4, 4};
  BOOST_TEST(x.grad().to_vector() == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(determinism, Fixture)

// The weight gradient sums per-block partials; with many blocks and a large
// weight they are grouped (several blocks per partial). Against a naive loop.
BOOST_AUTO_TEST_CASE(weight_gradient_with_grouped_partials) {
  random::seed(205);
  // K = 256*16*16 = 65536 and P = 1: one image per block, 40 blocks, and
  // O*K = 131072, so the partials are grouped two blocks each.
  const ConvCase k{40, 256, 16, 16, 2, 16, 16, 1, 1, 0, 0};
  Tensor<double> x = uniform<double>(k.x_shape()), w = uniform<double>(k.w_shape()), b = uniform<double>({k.o});
  const Tensor<double> r = uniform<double>(k.y_shape());
  w.attach_grad();
  b.attach_grad();
  {
    autograd::record rec;
    Tensor<double> loss = sum(conv2d(x, w, b) * r);
    loss.backward();
  }
  const auto xv = x.to_vector(), rv = r.to_vector();
  const i64 K = k.c * k.kh * k.kw;
  std::vector<double> want(std::size_t(k.o * K), 0.0), want_b(std::size_t(k.o), 0.0);
  for (i64 n = 0; n < k.n; ++n)
    for (i64 o = 0; o < k.o; ++o) {
      const double d = rv[std::size_t(n * k.o + o)];
      want_b[std::size_t(o)] += d;
      for (i64 q = 0; q < K; ++q) want[std::size_t(o * K + q)] += d * xv[std::size_t(n * K + q)];
    }
  check_close(w.grad().to_vector(), want, 1e-12, "grouped weight gradient");
  check_close(b.grad().to_vector(), want_b, 1e-12, "bias gradient");
}

// From 32 output channels and 32 taps the weight gradient's block products
// go through the packed GEMM (thresholds::conv_weight_packed_min): with
// padding and several output pixels, and with blocks summed two to a
// partial (O*K = 262144, 20 blocks of 8 images). Against a naive loop.
BOOST_AUTO_TEST_CASE(weight_gradient_of_many_channels) {
  random::seed(207);
  for (const ConvCase& k : {ConvCase{3, 4, 6, 5, 32, 3, 3, 1, 1, 1, 1}, ConvCase{160, 512, 4, 4, 32, 4, 4, 1, 1, 0, 0}}) {
    Tensor<double> x = uniform<double>(k.x_shape()), w = uniform<double>(k.w_shape());
    const Tensor<double> r = uniform<double>(k.y_shape());
    w.attach_grad();
    {
      autograd::record rec;
      Tensor<double> loss = sum(conv2d(x, w, 1, {k.ph, k.pw}) * r);
      loss.backward();
    }
    const auto xv = x.to_vector(), rv = r.to_vector();
    std::vector<double> want(std::size_t(k.o * k.c * k.kh * k.kw), 0.0);
    for (i64 n = 0; n < k.n; ++n)
      for (i64 o = 0; o < k.o; ++o)
        for (i64 oh = 0; oh < k.oh(); ++oh)
          for (i64 ow = 0; ow < k.ow(); ++ow) {
            const double d = rv[std::size_t(((n * k.o + o) * k.oh() + oh) * k.ow() + ow)];
            for (i64 c = 0; c < k.c; ++c)
              for (i64 i = 0; i < k.kh; ++i)
                for (i64 j = 0; j < k.kw; ++j) {
                  const i64 ih = oh * k.sh - k.ph + i, iw = ow * k.sw - k.pw + j;
                  if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                  want[std::size_t(((o * k.c + c) * k.kh + i) * k.kw + j)] +=
                      d * xv[std::size_t(((n * k.c + c) * k.h + ih) * k.w + iw)];
                }
          }
    check_close(w.grad().to_vector(), want, 1e-12, "weight gradient " + k.str());
  }
}

// Outputs and gradients are the same bits with 1, 2 and 3 workers.
BOOST_AUTO_TEST_CASE(same_bits_for_any_worker_count) {
  const int workers = engine::num_workers();
  auto run = [](int n) {
    engine::set_num_workers(n);
    random::seed(206);
    Tensor<float> x = uniform<float>({64, 3, 16, 16}), w = uniform<float>({8, 3, 5, 5}), b = uniform<float>({8});
    const Tensor<float> r = uniform<float>({64, 8, 8, 8});
    x.attach_grad();
    w.attach_grad();
    b.attach_grad();
    Tensor<float> y;
    {
      autograd::record rec;
      y = conv2d(x, w, b, 1, 2);
      Tensor<float> loss = sum(max_pool2d(y, 2) * r) + sum(avg_pool2d(y, 3, 2));
      loss.backward();
    }
    std::vector<std::vector<float>> out = {y.to_vector(), x.grad().to_vector(), w.grad().to_vector(),
                                           b.grad().to_vector()};
    return out;
  };
  const auto one = run(1), two = run(2), three = run(3);
  engine::set_num_workers(workers);
  for (std::size_t i = 0; i < one.size(); ++i) {
    BOOST_TEST_INFO("result " << i);
    BOOST_TEST((one[i] == two[i] && one[i] == three[i]));
  }
}

BOOST_AUTO_TEST_SUITE_END()
