// deft::nn against naive double loops on random inputs.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <deft/engine/graph_dump.hpp>
#include <deft/nn.hpp>

#include "nn_support.hpp"

using namespace deft;
using nn_test::mentions;
using nn_test::temp_file;

namespace {

/// x (n, k) times w (k, m) plus b (m), in double.
std::vector<double> affine(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                           int n, int k, int m) {
  std::vector<double> y(std::size_t(n) * m);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      double s = b.empty() ? 0.0 : b[j];
      for (int p = 0; p < k; ++p) s += double(x[i * k + p]) * w[p * m + j];
      y[i * m + j] = s;
    }
  return y;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(layers)

BOOST_AUTO_TEST_CASE(dense_infers_its_input_size_and_computes_relu_of_xw_plus_b) {
  random::seed(1);
  nn::Dense layer(7, nn::Act::relu);
  layer.initialize(nn::init::uniform(0.5));
  BOOST_CHECK_THROW(layer.weight().data(), std::logic_error);  // no shape before the first input
  const Tensor<float> x = random::normal<float>(0, 1, {5, 2, 3});  // flattened to (5, 6)
  const auto y = layer(x).to_vector();
  BOOST_TEST(layer.weight().shape() == (Shape{6, 7}));
  const auto ref = affine(x.to_vector(), layer.weight().data().to_vector(), layer.bias().data().to_vector(), 5, 6, 7);
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST(std::abs(y[i] - std::max(ref[i], 0.0)) <= 1e-5);
  BOOST_CHECK_EXCEPTION(layer(random::normal<float>(0, 1, {5, 4})), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "6 input features") && mentions(e, "(5, 4)"); });
}

// Outside autograd a Dense layer records one task: the product with the bias
// and activation applied to its output in place (record_product's epilogue).
// Inside autograd::record it takes the tracked two-task path; both must
// agree with the double reference, for every activation, with and without
// a (nonzero) bias, at batch 1 and at a batch the packed GEMM serves.
BOOST_AUTO_TEST_CASE(dense_is_one_task_outside_autograd_for_every_activation) {
  random::seed(11);
  const nn::Act acts[] = {nn::Act::none, nn::Act::relu, nn::Act::sigmoid, nn::Act::tanh, nn::Act::softrelu};
  auto apply = [](nn::Act a, double v) {
    switch (a) {
      case nn::Act::relu: return std::max(v, 0.0);
      case nn::Act::sigmoid: return 1.0 / (1.0 + std::exp(-v));
      case nn::Act::tanh: return std::tanh(v);
      case nn::Act::softrelu: return std::log1p(std::exp(v));
      case nn::Act::none: break;
    }
    return v;
  };
  for (const int batch : {1, 37})
    for (const nn::Act act : acts)
      for (const bool use_bias : {true, false}) {
        nn::Dense layer(9, act, use_bias);
        layer.initialize(nn::init::uniform(0.5));
        const Tensor<float> x = random::normal<float>(0, 1, {batch, 6});
        (void)layer(x);  // infers the weight's shape
        if (use_bias) layer.bias().data() = random::normal<float>(0, 1, {9});
        wait_all();
        engine::reset_stats();
        const Tensor<float> y = layer(x);
        y.wait_to_read();
        BOOST_TEST(engine::stats().tasks_recorded == 1u);
        Tensor<float> tracked;
        {
          autograd::record rec;
          tracked = layer(x);
        }
        const auto ref = affine(x.to_vector(), layer.weight().data().to_vector(),
                                use_bias ? layer.bias().data().to_vector() : std::vector<float>(), batch, 6, 9);
        const auto fused = y.to_vector(), two_tasks = tracked.to_vector();
        for (std::size_t i = 0; i < ref.size(); ++i) {
          const double want = apply(act, ref[i]);
          BOOST_TEST(std::abs(fused[i] - want) <= 1e-5 + 1e-5 * std::abs(want));
          BOOST_TEST(std::abs(two_tasks[i] - want) <= 1e-5 + 1e-5 * std::abs(want));
        }
      }
}

// softrelu is log(1 + e^x): x itself where e^x alone would overflow, with
// the gradient sigmoid(x), finite everywhere.
BOOST_AUTO_TEST_CASE(softrelu_stays_finite_for_large_inputs) {
  const std::vector<float> v = {100.0f, -100.0f, 0.5f, 20.0f, 25.0f, -3.0f, 88.0f, 95.0f, 0.0f};
  Tensor<float> x(v, {std::int64_t(v.size())});
  x.attach_grad();
  nn::Activation act(nn::Act::softrelu);
  Tensor<float> y;
  {
    autograd::record rec;
    y = act(x);
    y.backward();
  }
  const auto out = y.to_vector(), g = x.grad().to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double t = v[i], want = t > 0 ? t + std::log1p(std::exp(-t)) : std::log1p(std::exp(t));
    const double dwant = 1 / (1 + std::exp(-t));
    BOOST_TEST(std::abs(out[i] - want) <= 1e-6 * std::max(1.0, want), "softrelu(" << t << ") = " << out[i]);
    BOOST_TEST(std::abs(g[i] - dwant) <= 1e-6, "softrelu'(" << t << ") = " << g[i]);
  }
}

// A first call that conv2d refuses (NHWC given for NCHW) leaves the weight
// undrawn: the right input still works afterwards. Later, another channel
// count is refused naming the layer.
BOOST_AUTO_TEST_CASE(conv2d_layer_draws_its_weight_only_for_a_valid_call) {
  nn::Conv2D c(4, 5);
  c.initialize();
  BOOST_CHECK_THROW(c(ones<float>({2, 28, 28, 1})), std::invalid_argument);
  BOOST_TEST(!c.weight().initialized());
  BOOST_TEST(c(ones<float>({2, 1, 28, 28})).shape() == (Shape{2, 4, 24, 24}));
  BOOST_CHECK_EXCEPTION(c(ones<float>({2, 3, 28, 28})), std::invalid_argument, [&](const std::invalid_argument& e) {
    return mentions(e, c.name()) && mentions(e, "built for 1 input channels") && mentions(e, "(2, 3, 28, 28)");
  });
  BOOST_CHECK_THROW(nn::Conv2D(4, 3, 0), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Conv2D(4, 3, 1, -1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(sequential_chains_and_collects_parameters_in_order) {
  nn::Sequential net;
  auto d1 = std::make_shared<nn::Dense>(4, nn::Act::tanh);
  auto d2 = std::make_shared<nn::Dense>(2);
  net.add(std::make_shared<nn::Flatten>(), d1, d2);
  BOOST_CHECK_EXCEPTION(net(ones<float>({3, 5})), std::logic_error,
                        [](const std::logic_error& e) { return mentions(e, "initialize()"); });
  net.initialize();
  const Tensor<float> x = random::uniform<float>(-1, 1, {3, 5});
  const auto y = net(x).to_vector();
  const auto params = net.collect_params();
  BOOST_REQUIRE_EQUAL(params.size(), 4u);
  BOOST_TEST(params[0]->name() == d1->name() + ".weight");
  BOOST_TEST(params[3]->name() == d2->name() + ".bias");
  auto h = affine(x.to_vector(), d1->weight().data().to_vector(), d1->bias().data().to_vector(), 3, 5, 4);
  std::vector<float> hf(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) hf[i] = float(std::tanh(h[i]));
  const auto ref = affine(hf, d2->weight().data().to_vector(), d2->bias().data().to_vector(), 3, 4, 2);
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST(std::abs(y[i] - ref[i]) <= 1e-5);
  // Biases start at zero; Xavier weights lie within sqrt(6 / (in + out)).
  for (float b : d1->bias().data().to_vector()) BOOST_TEST(b == 0.0f);
  for (float w : d1->weight().data().to_vector()) BOOST_TEST(std::abs(w) <= std::sqrt(6.0 / 9.0));
}

// Dropout zeroes about `rate` of the elements and scales the rest while
// recording, passes the gradient through the kept ones only, and is the
// identity outside a recording.
BOOST_AUTO_TEST_CASE(dropout_masks_while_recording_only) {
  random::seed(21);
  const float rate = 0.3f;
  nn::Dropout drop(rate);
  const std::int64_t n = 20000;
  Tensor<float> x = random::uniform<float>(1, 2, {n / 100, 100});  // no zeros of its own
  x.attach_grad();
  Tensor<float> y;
  {
    autograd::record rec;
    y = drop(x);
    sum(y * 3.0f).backward();
  }
  const auto xv = x.to_vector(), yv = y.to_vector(), gv = x.grad().to_vector();
  std::int64_t zeros = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const bool dropped = yv[i] == 0.0f;
    zeros += dropped;
    const double scale = dropped ? 0.0 : 1.0 / (1.0 - rate);
    BOOST_TEST(std::abs(yv[i] - xv[i] * scale) <= 1e-6 * xv[i] * scale);
    BOOST_TEST(std::abs(gv[i] - 3.0 * scale) <= 1e-6 * 3.0 * scale);
  }
  // Binomial(20000, 0.3): a standard deviation of 65 zeros; 400 is over 6.
  BOOST_TEST(std::abs(double(zeros) - rate * n) < 400.0, zeros << " of " << n << " dropped");
  const auto same = drop(x).to_vector();  // not recording: the identity
  for (std::size_t i = 0; i < xv.size(); ++i) BOOST_TEST(same[i] == xv[i]);
  BOOST_CHECK_EXCEPTION(nn::Dropout(1.0f), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "rate") && mentions(e, "1"); });
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(losses)

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_matches_a_double_reference_with_its_gradient) {
  random::seed(2);
  const int n = 6, c = 5;
  Tensor<float> scores = random::normal<float>(0, 3, {n, c});
  scores = scores + 40.0f;  // large scores: the stable form must not overflow
  const Tensor<std::int64_t> labels({0, 4, 2, 2, 1, 3}, {n});
  scores.attach_grad();
  Tensor<float> loss;
  {
    autograd::record rec;
    loss = nn::SoftmaxCrossEntropyLoss{}(scores, labels);
    loss.backward();
  }
  const auto s = scores.to_vector(), l = loss.to_vector(), g = scores.grad().to_vector();
  const auto y = labels.to_vector();
  for (int i = 0; i < n; ++i) {
    double m = -1e300, z = 0;
    for (int j = 0; j < c; ++j) m = std::max(m, double(s[i * c + j]));
    for (int j = 0; j < c; ++j) z += std::exp(double(s[i * c + j]) - m);
    const double ref = std::log(z) + m - s[i * c + y[i]];
    BOOST_TEST(std::abs(l[i] - ref) <= 1e-4);
    for (int j = 0; j < c; ++j) {
      const double p = std::exp(double(s[i * c + j]) - m) / z;
      BOOST_TEST(std::abs(g[i * c + j] - (p - (j == y[i] ? 1.0 : 0.0))) <= 1e-5);
    }
  }
}

// The fused gradient scales each row by its own upstream gradient (a
// weighted loss), and reaches scores computed from a variable.
BOOST_AUTO_TEST_CASE(softmax_cross_entropy_gradient_follows_a_weighted_head) {
  random::seed(5);
  const int n = 7, c = 4;
  Tensor<float> w = random::normal<float>(0, 2, {n, c});
  const Tensor<std::int64_t> labels({3, 0, 1, 1, 2, 0, 3}, {n});
  const Tensor<float> head = random::uniform<float>(-1, 2, {n});
  w.attach_grad();
  {
    autograd::record rec;
    nn::SoftmaxCrossEntropyLoss{}(w * 2.0f - 1.0f, labels).backward(head);
  }
  const auto s = w.to_vector(), g = w.grad().to_vector(), h = head.to_vector();
  const auto y = labels.to_vector();
  for (int i = 0; i < n; ++i) {
    double z = 0;
    for (int j = 0; j < c; ++j) z += std::exp(2.0 * s[i * c + j] - 1.0);
    for (int j = 0; j < c; ++j) {
      const double p = std::exp(2.0 * s[i * c + j] - 1.0) / z;
      const double want = 2.0 * h[i] * (p - (j == y[i] ? 1.0 : 0.0));
      BOOST_TEST(std::abs(g[i * c + j] - want) <= 1e-5, "row " << i << " class " << j << ": " << g[i * c + j]);
    }
  }
}

// A class scored -inf (masked out) has probability 0: the loss and the
// gradient stay finite, as a double reference says.
BOOST_AUTO_TEST_CASE(softmax_cross_entropy_with_a_masked_class) {
  const float inf = INFINITY;
  Tensor<float> scores({0.0f, -inf, 1.0f, 2.0f, 0.5f, -inf}, {2, 3});
  const Tensor<std::int64_t> labels({0, 1}, {2});
  scores.attach_grad();
  Tensor<float> loss;
  {
    autograd::record rec;
    loss = nn::SoftmaxCrossEntropyLoss{}(scores, labels);
    loss.backward();
  }
  const auto l = loss.to_vector(), g = scores.grad().to_vector();
  BOOST_TEST(std::abs(l[0] - std::log(1 + std::exp(1.0))) <= 1e-6);
  BOOST_TEST(std::abs(l[1] - (std::log(std::exp(2.0) + std::exp(0.5)) - 0.5)) <= 1e-6);
  const double z0 = 1 + std::exp(1.0), z1 = std::exp(2.0) + std::exp(0.5);
  const double want[] = {1 / z0 - 1, 0, std::exp(1.0) / z0, std::exp(2.0) / z1, std::exp(0.5) / z1 - 1, 0};
  for (int i = 0; i < 6; ++i) BOOST_TEST(std::abs(g[i] - want[i]) <= 1e-6, "gradient " << i << ": " << g[i]);
}

BOOST_AUTO_TEST_CASE(an_out_of_range_label_fails_at_the_sync_point) {
  const Tensor<float> scores = ones<float>({2, 3});
  const Tensor<std::int64_t> labels({1, 3}, {2});
  Tensor<float> l = nn::SoftmaxCrossEntropyLoss{}(scores, labels);  // recorded: the labels are not read yet
  BOOST_CHECK_EXCEPTION(l.to_vector(), std::out_of_range,
                        [](const std::out_of_range& e) { return mentions(e, "label 3") && mentions(e, "[0, 3)"); });
  BOOST_CHECK_THROW(nn::SoftmaxCrossEntropyLoss{}(scores, Tensor<std::int64_t>({1, 2, 0}, {3})), std::invalid_argument);
  try { wait_all(); } catch (...) {}
}

BOOST_AUTO_TEST_CASE(l2_loss_is_half_the_squared_error_averaged_per_sample) {
  random::seed(3);
  const Tensor<float> pred = random::normal<float>(0, 1, {4, 3}), label = random::normal<float>(0, 1, {4, 3});
  const auto l = nn::L2Loss{}(pred, label).to_vector();
  const auto p = pred.to_vector(), y = label.to_vector();
  BOOST_REQUIRE_EQUAL(l.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    double s = 0;
    for (int j = 0; j < 3; ++j) s += 0.5 * (double(p[i * 3 + j]) - y[i * 3 + j]) * (double(p[i * 3 + j]) - y[i * 3 + j]);
    BOOST_TEST(std::abs(l[i] - s / 3) <= 1e-6);
  }
  BOOST_CHECK_THROW(nn::L2Loss{}(pred, ones<float>({5})), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(accuracy_counts_rows_whose_argmax_is_the_label) {
  const Tensor<float> scores({0.1f, 0.9f, 0.8f, 0.2f, 0.3f, 0.7f}, {3, 2});
  BOOST_TEST(nn::accuracy(scores, Tensor<std::int64_t>({1, 0, 0}, {3})).item() == 2.0f / 3.0f);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(optimizers)

// SGD with momentum (Gluon's form), Adam, and Nesterov momentum in
// PyTorch's form (buf = mu * buf + g; w -= lr * (g + mu * buf)).
BOOST_AUTO_TEST_CASE(sgd_with_momentum_nesterov_and_adam_follow_their_formulas) {
  random::seed(4);
  for (int which = 0; which < 3; ++which) {
    nn::Dense layer(3);
    layer.initialize();
    const Tensor<float> x = random::normal<float>(0, 1, {8, 4});
    (void)layer(x).to_vector();
    std::vector<nn::Parameter*> params = layer.collect_params();
    nn::Trainer trainer(params, which == 0   ? std::variant<nn::SGD, nn::Adam>(nn::SGD{0.1f, 0.9f, 0.01f})
                                : which == 1 ? std::variant<nn::SGD, nn::Adam>(nn::Adam{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f})
                                             : std::variant<nn::SGD, nn::Adam>(nn::SGD{0.1f, 0.9f, 0.01f, true}));
    const auto w0 = params[0]->data().to_vector();
    std::vector<double> w(w0.begin(), w0.end());
    nn_test::ReferenceUpdate reference{which == 0   ? nn_test::ReferenceUpdate::sgd
                                       : which == 1 ? nn_test::ReferenceUpdate::adam
                                                    : nn_test::ReferenceUpdate::nesterov};
    reference.decay = which == 1 ? 0.0 : 0.01;
    for (int step = 1; step <= 3; ++step) {
      {
        autograd::record rec;
        Tensor<float> l = sum(layer(x) * layer(x));
        l.backward();
      }
      const auto g = params[0]->grad().to_vector();
      trainer.step(8);
      reference.apply(w, g, 8.0, which == 1 ? 0.01 : 0.1, step);
      const auto now = params[0]->data().to_vector();
      for (std::size_t i = 0; i < w.size(); ++i) {
        BOOST_TEST(std::abs(now[i] - w[i]) <= 1e-5 * std::max(1.0, std::abs(w[i])));
        w[i] = now[i];  // follow deft's float values
      }
    }
  }
}

// Adam's two epsilon placements and AdamW's decoupled weight decay against
// a double loop of their formulas (PyTorch's for after_correction and AdamW).
// A large epsilon makes the placements differ by far more than the tolerance.
BOOST_AUTO_TEST_CASE(adam_epsilon_placements_and_adamw_follow_their_formulas) {
  const float lr = 0.02f, eps = 1e-3f, wd = 0.05f;
  std::vector<std::vector<double>> finals;
  for (int config = 0; config < 4; ++config) {
    const bool decoupled = config >= 2, after = config % 2 == 1;
    nn::Adam opt{lr, 0.9f, 0.999f, eps, wd, decoupled, after ? nn::AdamEpsilon::after_correction : nn::AdamEpsilon::before_correction};
    if (config == 3) {  // adamw() is this configuration with PyTorch's defaults for the rest
      const nn::Adam torch_like = nn::adamw(lr, wd);
      BOOST_TEST((torch_like.decoupled_weight_decay && torch_like.epsilon_at == nn::AdamEpsilon::after_correction &&
                  torch_like.epsilon == 1e-8f && torch_like.beta1 == 0.9f && torch_like.beta2 == 0.999f));
    }
    random::seed(5);
    nn::Dense layer(3);
    layer.initialize();
    const Tensor<float> x = random::normal<float>(0, 1, {8, 4});
    (void)layer(x).to_vector();
    std::vector<nn::Parameter*> params = layer.collect_params();
    nn::Trainer trainer(params, opt);
    const auto w0 = params[0]->data().to_vector();
    std::vector<double> w(w0.begin(), w0.end()), m(w.size(), 0.0), v(w.size(), 0.0);
    for (int step = 1; step <= 4; ++step) {
      {
        autograd::record rec;
        Tensor<float> l = sum(layer(x) * layer(x)) * 0.01f;
        l.backward();
      }
      const auto g = params[0]->grad().to_vector();
      trainer.step(8);
      const double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.999, step);
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double gi = g[i] / 8.0 + (decoupled ? 0.0 : wd * w[i]);
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.999 * v[i] + 0.001 * gi * gi;
        const double update = after ? lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps)
                                    : lr * std::sqrt(c2) / c1 * m[i] / (std::sqrt(v[i]) + eps);
        w[i] -= update + (decoupled ? lr * wd * w[i] : 0.0);
      }
      const auto now = params[0]->data().to_vector();
      BOOST_TEST_CONTEXT("configuration " << config << ", step " << step) {
        for (std::size_t i = 0; i < w.size(); ++i) {
          BOOST_TEST(std::abs(now[i] - w[i]) <= 1e-5 * std::max(1.0, std::abs(w[i])));
          w[i] = now[i];  // follow deft's float values
        }
      }
    }
    finals.push_back(w);
  }
  // Each option changes the result (by about 0.05 here), so a placement or a
  // decay that was ignored would fail.
  const auto differ = [&](int a, int b) {
    double most = 0;
    for (std::size_t i = 0; i < finals[a].size(); ++i) most = std::max(most, std::abs(finals[a][i] - finals[b][i]));
    return most;
  };
  BOOST_TEST(differ(0, 1) > 1e-2);
  BOOST_TEST(differ(0, 2) > 1e-2);
  BOOST_TEST(differ(2, 3) > 1e-2);
}

BOOST_AUTO_TEST_CASE(misuse_is_reported) {
  nn::Dense layer(2);
  layer.initialize();
  nn::Trainer trainer(layer.collect_params(), nn::SGD{});
  BOOST_CHECK_EXCEPTION(trainer.step(4), std::logic_error, [](const std::logic_error& e) { return mentions(e, "no value yet"); });
  BOOST_CHECK_THROW(trainer.step(0), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Trainer(layer.collect_params(), nn::SGD{-1.0f}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Trainer(layer.collect_params(), nn::SGD{std::nanf("")}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::Trainer(layer.collect_params(), nn::Adam{INFINITY}), std::invalid_argument);
  BOOST_CHECK_EXCEPTION(nn::Trainer(layer.collect_params(), nn::SGD{0.1f, 0.0f, 0.0f, true}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "Nesterov"); });
  BOOST_CHECK_THROW(trainer.set_learning_rate(std::nanf("")), std::invalid_argument);
  BOOST_TEST(trainer.learning_rate() == nn::SGD{}.learning_rate);
  auto twice = layer.collect_params();
  twice.push_back(twice.front());
  BOOST_CHECK_EXCEPTION(nn::Trainer(twice, nn::SGD{}), std::invalid_argument, [&](const std::invalid_argument& e) {
    return mentions(e, "'" + twice.front()->name() + "' is listed twice");
  });
}

// reset_devices() moves a parameter's copies; momentum and Adam's moments
// move with them: the steps after the move are those of a twin that never
// moved (to the bit: the same kernels on the same host).
BOOST_AUTO_TEST_CASE(optimizer_state_follows_the_parameters_devices) {
  for (int which = 0; which < 2; ++which) {
    random::seed(8);
    nn::Dense moved(3), twin(3);
    moved.initialize();
    twin.initialize();
    const Tensor<float> x = random::normal<float>(0, 1, {6, 4});
    (void)moved(x), (void)twin(x);
    twin.weight().set_data(moved.weight().data().clone());
    twin.bias().set_data(moved.bias().data().clone());
    const auto opt = which == 0 ? std::variant<nn::SGD, nn::Adam>(nn::SGD{0.1f, 0.9f})
                                : std::variant<nn::SGD, nn::Adam>(nn::Adam{0.01f});
    nn::Trainer t_moved(moved.collect_params(), opt), t_twin(twin.collect_params(), opt);
    auto step = [&](nn::Dense& net, nn::Trainer& t, Device d) {
      const Tensor<float> xd = x.to(d);
      {
        autograd::record rec;
        Tensor<float> l = sum(net(xd) * net(xd));
        l.backward();
      }
      t.step(6);
    };
    auto check = [&](Device d) {
      BOOST_TEST_CONTEXT((which == 0 ? "SGD" : "Adam") << ", the copy on " << d)
      BOOST_TEST(moved.weight().data(d).to_vector() == twin.weight().data().to_vector(), boost::test_tools::per_element());
      BOOST_TEST_CONTEXT((which == 0 ? "SGD" : "Adam") << ", the copy on " << d)
      BOOST_TEST(moved.bias().data(d).to_vector() == twin.bias().data().to_vector(), boost::test_tools::per_element());
    };
    step(moved, t_moved, cpu(0));
    step(twin, t_twin, cpu(0));
    for (auto* p : moved.collect_params()) p->reset_devices({cpu(1)});  // as many copies, elsewhere
    step(moved, t_moved, cpu(1));
    step(twin, t_twin, cpu(0));
    check(cpu(1));
    for (auto* p : moved.collect_params()) p->reset_devices({cpu(0), cpu(1)});  // one more copy
    step(moved, t_moved, cpu(0));
    step(twin, t_twin, cpu(0));
    check(cpu(0));
    check(cpu(1));
  }
}

// A block added twice shares its parameters (Gluon's weight sharing): they
// are collected, updated and saved once.
BOOST_AUTO_TEST_CASE(a_block_added_twice_shares_its_parameters) {
  random::seed(9);
  auto d = std::make_shared<nn::Dense>(4, nn::Act::tanh);
  nn::Sequential net;
  net.add(d, d);
  net.initialize();
  const Tensor<float> x = random::normal<float>(0, 1, {5, 4});
  const auto y = net(x).to_vector();
  const auto params = net.collect_params();
  BOOST_REQUIRE_EQUAL(params.size(), 2u);
  BOOST_TEST(params[0] == &d->weight());
  BOOST_TEST(params[1] == &d->bias());
  const auto w = d->weight().data().to_vector(), b = d->bias().data().to_vector();
  auto h = affine(x.to_vector(), w, b, 5, 4, 4);
  std::vector<float> hf(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) hf[i] = float(std::tanh(h[i]));
  const auto ref = affine(hf, w, b, 5, 4, 4);
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST(std::abs(y[i] - std::tanh(ref[i])) <= 1e-5);

  nn::Trainer trainer(params, nn::SGD{0.1f});
  {
    autograd::record rec;
    Tensor<float> l = sum(net(x));
    l.backward();
  }
  const auto g = d->weight().grad().to_vector();
  trainer.step(5);
  const auto w1 = d->weight().data().to_vector();
  for (std::size_t i = 0; i < w.size(); ++i) BOOST_TEST(std::abs(w1[i] - (w[i] - 0.1 * g[i] / 5)) <= 1e-6);

  const auto file = temp_file("shared.bin");
  nn::save_parameters(net, file);
  d->weight().set_data(zeros<float>({4, 4}));
  nn::load_parameters(net, file);
  BOOST_TEST(d->weight().data().to_vector() == w1, boost::test_tools::per_element());
  std::filesystem::remove(file);
}

// A step uses only gradients backward() wrote since the last step: a second
// step without a backward, or a parameter the loss did not use, is refused
// by name before anything changes, and ignore_stale_grad leaves those
// parameters as they are while the used ones take their step.
BOOST_AUTO_TEST_CASE(a_stale_gradient_is_refused_or_ignored) {
  random::seed(6);
  nn::Dense used(3), unused(3);
  used.initialize();
  unused.initialize();
  const Tensor<float> x = random::normal<float>(0, 1, {5, 4});
  (void)unused(x).to_vector();  // gives it a value, outside recording: no gradient
  std::vector<nn::Parameter*> params = used.collect_params();
  for (auto* p : unused.collect_params()) params.push_back(p);
  nn::Trainer trainer(params, nn::SGD{0.1f, 0.9f});
  auto values = [&] {
    std::vector<std::vector<float>> v;
    for (auto* p : params) v.push_back(p->data().to_vector());
    return v;
  };
  auto backward = [&] {
    autograd::record rec;
    sum(used(x) * used(x)).backward();
  };
  backward();
  const auto before = values();
  const std::string unused_weight = unused.collect_params()[0]->name();
  BOOST_CHECK_EXCEPTION(trainer.step(5), std::logic_error, [&](const std::logic_error& e) {
    return mentions(e, "'" + unused_weight + "'") && mentions(e, "ignore_stale_grad") && mentions(e, "cpu(0)");
  });
  BOOST_TEST(trainer.steps() == 0);
  BOOST_TEST((values() == before));  // refused before anything was recorded

  trainer.step(5, true);
  BOOST_TEST(trainer.steps() == 1);
  auto after = values();
  for (std::size_t i = 0; i < params.size(); ++i) {
    BOOST_TEST_CONTEXT(params[i]->name()) {
      const bool is_used = i < used.collect_params().size();
      BOOST_TEST((after[i] != before[i]) == is_used);
    }
  }
  // The used gradients went into that step: a second one without a backward is stale too.
  BOOST_CHECK_EXCEPTION(trainer.step(5, false), std::logic_error,
                        [&](const std::logic_error& e) { return mentions(e, "'" + used.collect_params()[0]->name() + "'"); });
  trainer.step(5, true);  // nothing fresh: nothing moves
  BOOST_TEST((values() == after));
  BOOST_TEST(trainer.steps() == 2);
}

// Adam's bias correction counts each parameter's own updates (Gluon's
// rule): a layer left out of the first two steps (ignore_stale_grad) takes
// its first update at step 3 with the correction of a first step, while the
// other layer's is that of a third; against a double loop with a count per
// parameter, and again when the two share a count once more.
BOOST_AUTO_TEST_CASE(adam_counts_each_parameters_own_updates) {
  random::seed(11);
  nn::Dense early(3), late(2);
  early.initialize();
  late.initialize();
  const Tensor<float> x = random::normal<float>(0, 1, {6, 4});
  (void)early(x).to_vector();
  (void)late(x).to_vector();
  std::vector<nn::Parameter*> params = early.collect_params();
  for (auto* p : late.collect_params()) params.push_back(p);
  const nn::Adam adam{.learning_rate = 0.05f};
  nn::Trainer trainer(params, adam);
  struct Reference {
    std::vector<double> w, m, v;
    int count = 0;
  };
  std::vector<Reference> ref;
  for (auto* p : params) {
    const auto w = p->data().to_vector();
    ref.push_back({{w.begin(), w.end()}, std::vector<double>(w.size()), std::vector<double>(w.size())});
  }
  for (int step = 1; step <= 5; ++step) {
    const bool late_used = step >= 3;
    {
      autograd::record rec;
      Tensor<float> l = sum(early(x) * early(x));
      if (late_used) l = l + sum(late(x) * late(x));
      l.backward();
    }
    std::vector<std::vector<float>> grads;
    for (auto* p : params) grads.push_back(p->grad().to_vector());
    trainer.step(6, /*ignore_stale_grad=*/true);
    for (std::size_t k = 0; k < params.size(); ++k) {
      BOOST_TEST_CONTEXT("step " << step << ", " << params[k]->name()) {
        Reference& r = ref[k];
        const bool updated = k < early.collect_params().size() || late_used;
        if (updated) {
          const int t = ++r.count;
          const double lr = 0.05 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
          for (std::size_t i = 0; i < r.w.size(); ++i) {
            const double g = grads[k][i] / 6.0;
            r.m[i] = 0.9 * r.m[i] + 0.1 * g;
            r.v[i] = 0.999 * r.v[i] + 0.001 * g * g;
            r.w[i] -= lr * r.m[i] / (std::sqrt(r.v[i]) + 1e-8);
          }
        }
        const auto now = params[k]->data().to_vector();
        for (std::size_t i = 0; i < now.size(); ++i) {
          BOOST_TEST(std::abs(now[i] - r.w[i]) <= 1e-5 * std::max(1.0, std::abs(r.w[i])));
          r.w[i] = now[i];  // follow deft's float values
        }
      }
    }
  }
}

// step() is allreduce_grads() then update(): the halves, called one by one,
// give the same bits, and out of order they are refused.
BOOST_AUTO_TEST_CASE(step_is_allreduce_grads_then_update) {
  random::seed(7);
  const Tensor<float> x = random::normal<float>(0, 1, {6, 4});
  std::vector<std::vector<float>> trained[2];
  for (int halves = 0; halves < 2; ++halves) {
    random::seed(8);
    nn::Dense layer(3);
    layer.initialize(nn::init::xavier(), {cpu(0), cpu(1)});
    (void)layer(x).to_vector();
    nn::Trainer trainer(layer.collect_params(), nn::Adam{.learning_rate = 0.05f});
    if (halves) BOOST_CHECK_EXCEPTION(trainer.update(6), std::logic_error, [](const std::logic_error& e) {
        return mentions(e, "allreduce_grads() first");
      });
    for (int step = 0; step < 3; ++step) {
      {
        autograd::record rec;
        sum(layer(x.rows(0, 2)) * layer(x.rows(0, 2))).backward();
        sum(layer(x.rows(2, 6).to(cpu(1))) * layer(x.rows(2, 6).to(cpu(1)))).backward();
      }
      if (halves) {
        trainer.allreduce_grads();
        BOOST_CHECK_EXCEPTION(trainer.allreduce_grads(), std::logic_error,
                              [](const std::logic_error& e) { return mentions(e, "summed already"); });
        trainer.update(6);
      } else {
        trainer.step(6);
      }
    }
    BOOST_TEST(trainer.steps() == 3);
    for (auto* p : layer.collect_params())
      for (const Device d : {cpu(0), cpu(1)}) trained[halves].push_back(p->data(d).to_vector());
  }
  BOOST_TEST_REQUIRE(trained[0].size() == trained[1].size());
  for (std::size_t i = 0; i < trained[0].size(); ++i)
    BOOST_TEST(trained[0][i] == trained[1][i], boost::test_tools::per_element());
}

// clip_global_norm against a double-precision loop, on arrays on two
// devices: the norm, the scaled values, the arrays left alone when their
// norm is below the bound, and its refusals.
BOOST_AUTO_TEST_CASE(clip_global_norm_scales_by_the_norm_of_all_arrays) {
  random::seed(9);
  auto draw = [] {
    return std::vector<Tensor<float>>{random::normal<float>(0, 2, {7, 5}), random::normal<float>(0, 2, {9}).to(cpu(1)),
                                      random::normal<float>(0, 2, {3, 2, 2})};
  };
  std::vector<Tensor<float>> arrays = draw();
  std::vector<std::vector<float>> before;
  double squares = 0;
  for (const auto& a : arrays) {
    before.push_back(a.to_vector());
    for (const float v : before.back()) squares += double(v) * v;
  }
  const double norm = std::sqrt(squares);
  BOOST_TEST_REQUIRE(norm > 3.0);
  const Tensor<float> got = nn::clip_global_norm(arrays, 3.0f);
  BOOST_TEST(got.device() == cpu(0));
  BOOST_TEST(std::abs(got.item() - norm) <= 1e-5 * norm);
  const double scale = 3.0 / (norm + 1e-6);
  double after = 0;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const auto now = arrays[i].to_vector();
    for (std::size_t k = 0; k < now.size(); ++k) {
      BOOST_TEST(std::abs(now[k] - before[i][k] * scale) <= 1e-5 * std::max(1.0, std::abs(before[i][k] * scale)));
      after += double(now[k]) * now[k];
    }
  }
  BOOST_TEST(std::abs(std::sqrt(after) - 3.0) <= 1e-4);
  // Below the bound nothing changes, bit for bit.
  const auto clipped = arrays[0].to_vector();
  BOOST_TEST(nn::clip_global_norm(arrays, 100.0f).item() <= 3.0001f);
  BOOST_TEST(arrays[0].to_vector() == clipped, boost::test_tools::per_element());

  std::vector<Tensor<float>> none;
  BOOST_CHECK_EXCEPTION(nn::clip_global_norm(none, 1.0f), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "no arrays"); });
  for (const float bad : {0.0f, -1.0f, std::nanf(""), INFINITY})
    BOOST_CHECK_EXCEPTION(nn::clip_global_norm(arrays, bad), std::invalid_argument,
                          [](const std::invalid_argument& e) { return mentions(e, "max_norm"); });
  BOOST_TEST(arrays[0].to_vector() == clipped, boost::test_tools::per_element());  // refused before any change

  // Squares beyond float's range (exploding gradients): the norm is inf and
  // the arrays become NaN, as documented, rather than silently zero.
  std::vector<Tensor<float>> exploded{Tensor<float>({1e20f, -1e20f}, {2}), Tensor<float>({0.5f}, {1}, cpu(1))};
  BOOST_TEST(std::isinf(nn::clip_global_norm(exploded, 1.0f).item()));
  for (const auto& a : exploded)
    for (float v : a.to_vector()) BOOST_TEST(std::isnan(v));
}

// Arrays spread over two devices, interleaved: each device sums its own
// arrays' squares and gets the scale once, so the clipping copies one value
// each way between the devices however many arrays there are (a copy is a
// task named "to" in the pending graph).
BOOST_AUTO_TEST_CASE(clip_global_norm_copies_once_per_device) {
  random::seed(10);
  std::vector<Tensor<float>> arrays;
  std::vector<std::vector<float>> before;
  double squares = 0;
  for (int i = 0; i < 6; ++i) {
    arrays.push_back(random::normal<float>(0, 1, {5, 3}, i % 3 == 0 ? cpu(0) : cpu(1)));
    before.push_back(arrays.back().to_vector());
    for (const float v : before.back()) squares += double(v) * v;
  }
  const std::string graph = temp_file("clip.dot").string();
  const engine::Mode mode = engine::mode();
  engine::set_mode(engine::Mode::deferred);  // the work stays pending until the dump
  const Tensor<float> norm = nn::clip_global_norm(arrays, 1.0f);
  BOOST_TEST_REQUIRE(engine::dump_graph(graph) > 0);
  engine::set_mode(mode);
  std::ifstream in(graph);
  const std::string dot((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t copies = 0;
  for (std::size_t at = dot.find("label=\"to\\n"); at != std::string::npos; at = dot.find("label=\"to\\n", at + 1)) ++copies;
  BOOST_TEST(copies == 2u);  // cpu(1)'s squares to cpu(0), the scale back
  std::filesystem::remove(graph);
  // The values are those of the norm of all arrays together.
  BOOST_TEST(std::abs(norm.item() - std::sqrt(squares)) <= 1e-5 * std::sqrt(squares));
  const double scale = 1.0 / (std::sqrt(squares) + 1e-6);
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const auto now = arrays[i].to_vector();
    for (std::size_t k = 0; k < now.size(); ++k)
      BOOST_TEST(std::abs(now[k] - before[i][k] * scale) <= 1e-5 * std::max(1.0, std::abs(before[i][k] * scale)));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(parameter_files)

BOOST_AUTO_TEST_CASE(save_and_load_round_trip_and_reject_bad_files) {
  random::seed(5);
  auto make = [] {
    auto net = std::make_shared<nn::Sequential>();
    net->add(std::make_shared<nn::Dense>(3, nn::Act::relu), std::make_shared<nn::Dense>(2));
    net->initialize();
    return net;
  };
  auto a = make();
  const Tensor<float> x = random::normal<float>(0, 1, {4, 5});
  const auto ya = (*a)(x).to_vector();
  const auto file = temp_file("params.bin");
  nn::save_parameters(*a, file);
  // The writes are atomic: a temporary file beside the target, renamed over
  // it. A second save replaces the first and leaves no temporary file; one
  // that cannot replace its target (a directory) says so and leaves it.
  nn::save_parameters(*a, file);
  const auto temporary = [](std::filesystem::path p) { return p += ".tmp-" + std::to_string(::getpid()); };
  BOOST_TEST(!std::filesystem::exists(temporary(file)));
  const auto directory = temp_file("a_directory");
  std::filesystem::create_directory(directory);
  BOOST_CHECK_EXCEPTION(nn::save_parameters(*a, directory), std::runtime_error, [&](const std::runtime_error& e) {
    return mentions(e, "save_parameters: cannot replace " + directory.string());
  });
  BOOST_TEST(std::filesystem::is_directory(directory));
  BOOST_TEST(!std::filesystem::exists(temporary(directory)));
  std::filesystem::remove(directory);

  // Parameters are matched by their paths in the network ("0.weight"), not
  // by the blocks' names: a second network built the same way (dense2,
  // dense3) loads the file before its first forward and computes the same.
  auto b = make();
  nn::load_parameters(*b, file);
  const auto from_b = (*b)(x).to_vector();
  for (std::size_t i = 0; i < ya.size(); ++i) BOOST_TEST(from_b[i] == ya[i]);
  // Networks of another structure: a parameter the file lacks, or one it has too many.
  auto three = std::make_shared<nn::Sequential>();
  three->add(std::make_shared<nn::Dense>(3, nn::Act::relu), std::make_shared<nn::Dense>(2), std::make_shared<nn::Dense>(2));
  three->initialize();
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*three, file), std::runtime_error, [&](const std::runtime_error& e) {
    return mentions(e, file.string() + " has no parameter '2.weight' (dense");
  });
  auto one = std::make_shared<nn::Sequential>();
  one->add(std::make_shared<nn::Dense>(3, nn::Act::relu));
  one->initialize();
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*one, file), std::runtime_error, [&](const std::runtime_error& e) {
    return mentions(e, "has parameter '1.bias', which the network does not have");
  });
  // A nested network's paths go through each level: "0.1.weight".
  auto nested = std::make_shared<nn::Sequential>();
  nested->add(make());
  const auto paths = nested->named_params();
  BOOST_TEST_REQUIRE(paths.size() == 4u);
  BOOST_TEST(paths[2].path == "0.1.weight");
  BOOST_TEST(paths[2].parameter->name().ends_with(".weight"));

  nn::load_parameters(*a, file);  // same network: values equal afterwards
  const auto yb = (*a)(x).to_vector();
  for (std::size_t i = 0; i < ya.size(); ++i) BOOST_TEST(ya[i] == yb[i]);

  auto bytes = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }();
  const auto bad = temp_file("bad.bin");
  auto write = [&](const std::vector<char>& b) {
    std::ofstream out(bad, std::ios::binary | std::ios::trunc);
    out.write(b.data(), std::streamsize(b.size()));
  };
  write(std::vector<char>(bytes.begin(), bytes.end() - 7));
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*a, bad), std::runtime_error,
                        [](const std::runtime_error& e) { return mentions(e, "truncated"); });
  auto wrong = bytes;
  wrong[0] = 'X';
  write(wrong);
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*a, bad), std::runtime_error,
                        [](const std::runtime_error& e) { return mentions(e, "not a deft parameter file"); });
  auto extra = bytes;
  extra.push_back(0);
  write(extra);
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*a, bad), std::runtime_error,
                        [](const std::runtime_error& e) { return mentions(e, "trailing bytes"); });
  // Extents that claim more values than the file holds: refused before
  // anything is allocated for them (4 TiB, or more than 64 bits count).
  // One parameter 'bigw' with extents `dims` and a single value.
  const auto huge_of = [&](const std::vector<std::int64_t>& dims) {
    std::vector<char> huge(bytes.begin(), bytes.begin() + 12);  // magic and byte-order mark
    auto put = [&](const auto& v) {
      const char* c = reinterpret_cast<const char*>(&v);
      huge.insert(huge.end(), c, c + sizeof v);
    };
    put(std::uint64_t(1));
    put(std::uint32_t(4));
    huge.insert(huge.end(), {'b', 'i', 'g', 'w'});
    put(std::uint32_t(dims.size()));
    for (const auto e : dims) put(e);
    put(1.0f);
    return huge;
  };
  for (const std::vector<std::int64_t>& dims : {std::vector<std::int64_t>{std::int64_t(1) << 40},
                                                std::vector<std::int64_t>{std::int64_t(1) << 40, std::int64_t(1) << 40}}) {
    write(huge_of(dims));
    const bool countable = dims.size() == 1;
    BOOST_CHECK_EXCEPTION(nn::load_parameters(*a, bad), std::runtime_error, [&](const std::runtime_error& e) {
      return mentions(e, bad.string()) && mentions(e, "'bigw'") &&
             (countable ? mentions(e, "truncated") && mentions(e, "holds only 1 more values")
                        : mentions(e, "corrupt") && mentions(e, "more values than fit in memory"));
    });
  }
  // A stream that cannot seek (a named pipe, `<(zcat params.gz)`) loads too;
  // there its extents cannot be checked against the length first, so memory
  // grows only as values arrive: 2^40 claimed values, one sent, fail as
  // truncated (not by asking for 4 TiB).
  const auto fifo = temp_file("params.fifo");
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto through_fifo = [&](const std::vector<char>& sent) {
    std::thread writer([&] {
      std::ofstream out(fifo, std::ios::binary);
      out.write(sent.data(), std::streamsize(sent.size()));
    });
    try {
      nn::load_parameters(*a, fifo);
    } catch (...) {
      writer.join();
      throw;
    }
    writer.join();
  };
  BOOST_CHECK_NO_THROW(through_fifo(bytes));
  BOOST_CHECK_EXCEPTION(through_fifo(huge_of({std::int64_t(1) << 40})), std::runtime_error,
                        [&](const std::runtime_error& e) {
                          return mentions(e, fifo.string()) && mentions(e, "truncated") && mentions(e, "'bigw'");
                        });
  std::filesystem::remove(fifo);
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*a, temp_file("missing.bin")), std::runtime_error,
                        [](const std::runtime_error& e) { return mentions(e, "missing.bin: no such file"); });
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*a, std::filesystem::temp_directory_path()), std::runtime_error,
                        [](const std::runtime_error& e) { return mentions(e, "is a directory"); });
  // Nothing changed by the failed loads.
  const auto yc = (*a)(x).to_vector();
  for (std::size_t i = 0; i < ya.size(); ++i) BOOST_TEST(ya[i] == yc[i]);
  std::filesystem::remove(file);
  std::filesystem::remove(bad);
}

namespace {
// A block with two parameters of the same name (a custom block's mistake).
class Twins : public nn::Block {
 public:
  Twins() : Block("twins") {
    add_parameter("w");
    add_parameter("w");
  }
  Tensor<float> forward(const Tensor<float>& x) override { return x; }
};

// A block of a fixed name with one parameter "w" of shape (2,).
class Fixed : public nn::Block {
 public:
  explicit Fixed(const std::string& name) : Block(name) { add_parameter("w", {2}); }
  Tensor<float> forward(const Tensor<float>& x) override { return x; }
};

// Writes a parameter file of the given (key, value) entries, as
// save_parameters would (keys as given: paths, or the global names of
// deft's earlier format).
void write_parameter_file(const std::filesystem::path& file, const std::vector<std::pair<std::string, Tensor<float>>>& entries) {
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  f.write("DEFTPRM1", 8);
  auto put = [&](const auto& v) { f.write(reinterpret_cast<const char*>(&v), sizeof v); };
  put(std::uint32_t(0x01020304));
  put(std::uint64_t(entries.size()));
  for (const auto& [key, value] : entries) {
    put(std::uint32_t(key.size()));
    f.write(key.data(), std::streamsize(key.size()));
    put(std::uint32_t(value.rank()));
    for (int d = 0; d < value.rank(); ++d) put(std::int64_t(value.shape()[d]));
    const auto v = value.to_vector();
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  }
  BOOST_REQUIRE_MESSAGE(f.flush(), "could not write " << file);
}
}  // namespace

// A file names each parameter once: a block with two parameters of one
// name (one path) can be neither saved (the file would not load) nor loaded
// into (both would get one value), and the save writes no file.
BOOST_AUTO_TEST_CASE(parameters_of_the_same_name_are_refused) {
  Twins twins;
  twins.initialize();
  const auto file = temp_file("twins.bin");
  std::filesystem::remove(file);
  BOOST_CHECK_EXCEPTION(nn::save_parameters(twins, file), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "two parameters named 'twins.w'"); });
  BOOST_TEST(!std::filesystem::exists(file));
  BOOST_CHECK_EXCEPTION(nn::load_parameters(twins, file), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "two parameters named 'twins.w'"); });
}

// Files of global names (deft's earlier format): one that lacks an entry names
// the entry it lacks; two blocks of one fixed name, which paths tell apart,
// cannot be told apart by such a file and are refused, not given one value.
BOOST_AUTO_TEST_CASE(files_of_global_names_name_what_they_lack_or_cannot_tell_apart) {
  const auto file = temp_file("global.bin");
  nn::Sequential pair;
  pair.add(std::make_shared<Fixed>("enc"), std::make_shared<Fixed>("dec"));
  const Tensor<float> a({1.0f, 2.0f}, {2}), b({3.0f, 4.0f}, {2});
  write_parameter_file(file, {{"enc.w", a}});
  BOOST_CHECK_EXCEPTION(nn::load_parameters(pair, file), std::runtime_error,
                        [&](const std::runtime_error& e) { return mentions(e, file.string() + " has no parameter 'dec.w'"); });
  write_parameter_file(file, {{"enc.w", a}, {"dec.w", b}});
  nn::load_parameters(pair, file);
  const auto params = pair.collect_params();
  BOOST_TEST((params[0]->data().to_vector() == std::vector<float>{1, 2}));
  BOOST_TEST((params[1]->data().to_vector() == std::vector<float>{3, 4}));
  nn::Sequential same;
  same.add(std::make_shared<Fixed>("enc"), std::make_shared<Fixed>("enc"));
  write_parameter_file(file, {{"enc.w", a}});
  BOOST_CHECK_EXCEPTION(nn::load_parameters(same, file), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "has two named 'enc.w'"); });
  // By path they differ: saved and loaded like any network.
  for (auto* p : same.collect_params()) p->set_data(b);
  nn::save_parameters(same, file);
  for (auto* p : same.collect_params()) p->set_data(a);
  nn::load_parameters(same, file);
  for (auto* p : same.collect_params()) BOOST_TEST((p->data().to_vector() == std::vector<float>{3, 4}));
  std::filesystem::remove(file);
}

// Building a network and loading its parameters before any forward pass
// (to predict with saved weights): the extents a layer knows without an
// input are checked at load; the ones the first input decides are checked by
// that forward, and until then another file may still replace them.
BOOST_AUTO_TEST_CASE(loading_before_the_first_forward_checks_the_declared_extents) {
  random::seed(12);
  struct Mlp {
    std::shared_ptr<nn::Sequential> net = std::make_shared<nn::Sequential>();
    std::shared_ptr<nn::Dense> hidden = std::make_shared<nn::Dense>(3, nn::Act::relu);
    std::shared_ptr<nn::Dense> out = std::make_shared<nn::Dense>(2);
    Mlp() {
      net->add(hidden, out);
      net->initialize();
    }
  };
  const Mlp trained;
  const auto& t_hidden = trained.hidden;
  const auto& t_out = trained.out;
  const Tensor<float> x = random::normal<float>(0, 1, {4, 5});
  const auto expected = (*trained.net)(x).to_vector();
  const Mlp fresh;  // other names, no values yet
  const auto& net = fresh.net;
  const auto& hidden = fresh.hidden;
  const auto& out = fresh.out;
  // A file for `net` holding `trained`'s values, with the hidden layer's
  // weight as given. Its entries carry the global names ("dense6.weight"),
  // deft's earlier format: still matched.
  const auto file = temp_file("early.bin");
  auto write = [&](const Tensor<float>& hidden_weight) {
    write_parameter_file(file, {{hidden->weight().name(), hidden_weight},
                                {hidden->bias().name(), t_hidden->bias().data()},
                                {out->weight().name(), t_out->weight().data()},
                                {out->bias().name(), t_out->bias().data()}});
  };
  // 4 units where the layer has 3: refused at load, naming both shapes.
  write(random::normal<float>(0, 1, {5, 4}));
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*net, file), std::runtime_error, [&](const std::runtime_error& e) {
    return mentions(e, "'" + hidden->weight().name() + "' has shape (?, 3) (? is inferred from the first input)") &&
           mentions(e, "(5, 4) in " + file.string());
  });
  BOOST_TEST(!hidden->weight().initialized());  // nothing loaded
  // 7 input features where the data has 5: loads, and the forward says so.
  write(random::normal<float>(0, 1, {7, 3}));
  nn::load_parameters(*net, file);
  BOOST_CHECK_EXCEPTION((*net)(x), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "was built for 7 input features"); });
  // The right file still loads after that, and gives the trained outputs.
  write(t_hidden->weight().data());
  nn::load_parameters(*net, file);
  const auto got = (*net)(x).to_vector();
  for (std::size_t i = 0; i < expected.size(); ++i) BOOST_TEST(got[i] == expected[i]);
  // Now the forward has fixed every shape: a file of other input features is refused.
  write(random::normal<float>(0, 1, {7, 3}));
  BOOST_CHECK_EXCEPTION(nn::load_parameters(*net, file), std::runtime_error,
                        [&](const std::runtime_error& e) { return mentions(e, "has shape (5, 3) in the network but (7, 3)"); });
  // A Conv2D's declared extents: channels and kernel, its input channels inferred.
  nn::Conv2D conv(6, {3, 5});
  conv.initialize();
  BOOST_CHECK_EXCEPTION(conv.weight().set_data(random::normal<float>(0, 1, {6, 2, 5, 3})), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "has shape (6, ?, 3, 5)"); });
  BOOST_CHECK_EXCEPTION(conv.bias().set_data(random::normal<float>(0, 1, {6, 1})), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "has shape (6,)"); });
  BOOST_CHECK_NO_THROW(conv.weight().set_data(random::normal<float>(0, 1, {6, 2, 3, 5})));
  std::filesystem::remove(file);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(learning)

BOOST_AUTO_TEST_CASE(an_mlp_learns_a_nonlinear_rule) {
  // Two Gaussian clouds per class arranged as XOR: not linearly separable.
  random::seed(6);
  const int n = 512;
  const auto pts = random::normal<float>(0, 0.35, {n, 2}).to_vector();
  std::vector<float> xs(std::size_t(n) * 2);
  std::vector<std::int64_t> ys(n);
  for (int i = 0; i < n; ++i) {
    const int q = i % 4;
    const float cx = (q & 1) ? 1.0f : -1.0f, cy = (q & 2) ? 1.0f : -1.0f;
    xs[2 * i] = cx + pts[2 * i];
    xs[2 * i + 1] = cy + pts[2 * i + 1];
    ys[i] = (q == 0 || q == 3) ? 0 : 1;
  }
  const Tensor<float> x(xs, {n, 2});
  const Tensor<std::int64_t> y(ys, {n});
  nn::Sequential net;
  net.add(std::make_shared<nn::Dense>(16, nn::Act::tanh), std::make_shared<nn::Dense>(2));
  net.initialize();
  nn::Trainer trainer(net.collect_params(), nn::Adam{0.05f});
  const nn::SoftmaxCrossEntropyLoss loss;
  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor<float> l;
    {
      autograd::record rec;
      l = loss(net(x), y);
      l.backward();
    }
    trainer.step(n);
    if (step == 0) first = mean(l).item();
    last = mean(l).item();
  }
  const float acc = nn::accuracy(net(x), y).item();
  BOOST_TEST_MESSAGE("loss " << first << " -> " << last << ", accuracy " << acc);
  BOOST_TEST(last < 0.3f * first);
  BOOST_TEST(acc >= 0.95f);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hybridize)

namespace {
std::shared_ptr<nn::Sequential> seeds_net() {  // the seeds' 512 -> 256 -> 128 -> 2
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Dense>(256, nn::Act::relu), std::make_shared<nn::Dense>(128, nn::Act::relu),
           std::make_shared<nn::Dense>(2));
  net->initialize();
  return net;
}
}  // namespace

// A forward traced while its work ran as it was recorded (synchronous
// mode; in deferred mode a bound on pending work does the same): the
// replay still orders each layer after the one before it.
BOOST_AUTO_TEST_CASE(a_forward_traced_while_its_work_ran_replays_in_order) {
  random::seed(60);
  auto net = seeds_net();
  const Tensor<float> x1 = random::normal<float>(0, 1, {1, 512}), x2 = random::normal<float>(0, 1, {1, 512});
  const auto r1 = (*net)(x1).to_vector(), r2 = (*net)(x2).to_vector();
  net->hybridize();
  const auto mode = engine::mode();
  engine::set_mode(engine::Mode::synchronous);
  const auto traced = (*net)(x1).to_vector();  // traced, each task run as it is recorded
  engine::set_mode(engine::Mode::deferred);
  const auto replayed = (*net)(x2).to_vector();
  engine::set_mode(mode);
  BOOST_TEST(net->traces() == 1);
  BOOST_TEST(traced == r1, boost::test_tools::per_element());
  BOOST_TEST(replayed == r2, boost::test_tools::per_element());
}

// A layer added after tracing is part of the next call: every traced graph
// retraces (Gluon clears its cached graph in register_child).
BOOST_AUTO_TEST_CASE(a_layer_added_after_tracing_runs) {
  nn::Sequential net;
  net.add(std::make_shared<nn::Dense>(4));
  net.initialize();
  const Tensor<float> x = ones<float>({2, 3});
  (void)net(x).to_vector();  // deferred initialization runs untraced
  net.hybridize();
  (void)net(x).to_vector();
  BOOST_TEST(net.traces() == 1);
  net.add(std::make_shared<nn::Dense>(2));
  net.initialize();
  BOOST_TEST(net(x).shape() == (Shape{2, 2}));  // the new layer's initialization, untraced
  BOOST_TEST(net(x).shape() == (Shape{2, 2}));
  BOOST_TEST(net.traces() == 2);
}

// Two threads call one hybridized network from its very first call: the
// deferred initialization draws each weight once, and the traced graphs
// (one per input shape) take turns, each call getting its own output.
BOOST_AUTO_TEST_CASE(a_hybridized_block_called_from_two_threads) {
  random::seed(61);
  auto net = seeds_net();
  net->hybridize();
  const std::vector<Tensor<float>> inputs = {
      random::normal<float>(0, 1, {1, 512}), random::normal<float>(0, 1, {3, 512}),
      random::normal<float>(0, 1, {1, 512}), random::normal<float>(0, 1, {3, 512})};
  const int calls = 40;
  std::vector<std::vector<Tensor<float>>> outs(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < calls; ++i) outs[t].push_back((*net)(inputs[2 * (i % 2) + t]));
    });
  for (auto& th : threads) th.join();
  net->hybridize(false);
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < calls; ++i) {
      const auto want = (*net)(inputs[2 * (i % 2) + t]).to_vector();
      const auto got = outs[t][i].to_vector();
      BOOST_TEST_REQUIRE(got.size() == want.size());
      for (std::size_t j = 0; j < got.size(); ++j) BOOST_TEST(got[j] == want[j], "thread " << t << " call " << i);
    }
  BOOST_TEST(net->traces() == 2);  // one per input shape
}

// The same for a plain block: the first calls, from two threads at once,
// draw each weight once and both use it.
BOOST_AUTO_TEST_CASE(a_plain_block_first_called_from_two_threads) {
  for (int round = 0; round < 10; ++round) {
    random::seed(62 + round);
    auto net = seeds_net();
    const std::vector<Tensor<float>> inputs = {random::normal<float>(0, 1, {2, 512}),
                                               random::normal<float>(0, 1, {2, 512})};
    std::vector<Tensor<float>> outs(2);
    std::thread other([&] { outs[1] = (*net)(inputs[1]); });
    outs[0] = (*net)(inputs[0]);
    other.join();
    for (int t = 0; t < 2; ++t) {
      const auto want = (*net)(inputs[t]).to_vector(), got = outs[t].to_vector();
      for (std::size_t j = 0; j < got.size(); ++j) BOOST_TEST(got[j] == want[j], "round " << round << " thread " << t);
    }
  }
}

BOOST_AUTO_TEST_CASE(replays_equal_the_imperative_results_and_retrace_when_needed) {
  random::seed(8);
  auto net = seeds_net();
  const Tensor<float> x1 = random::normal<float>(0, 1, {1, 512}), x2 = random::normal<float>(0, 1, {1, 512});
  const auto r1 = (*net)(x1).to_vector(), r2 = (*net)(x2).to_vector();
  net->hybridize();
  std::vector<Tensor<float>> outs;
  for (int i = 0; i < 6; ++i) outs.push_back((*net)(i % 2 ? x2 : x1));  // no sync between calls
  for (int i = 0; i < 6; ++i) {
    const auto v = outs[i].to_vector();
    const auto& ref = i % 2 ? r2 : r1;
    for (int j = 0; j < 2; ++j) BOOST_TEST(v[j] == ref[j]);  // same kernels, same order: same bits
  }
  BOOST_TEST(net->traces() == 1);
  // A chain of layers replays as one task: the input's refill, then each
  // Dense layer's product, bias and activation; the last writes a new
  // buffer, which the caller gets without a copy.
  deft::wait_all();
  engine::reset_stats();
  const Tensor<float> y = (*net)(x1);
  BOOST_TEST(engine::stats().tasks_recorded == 1u);
  const auto yv = y.to_vector();
  for (int j = 0; j < 2; ++j) BOOST_TEST(yv[j] == r1[j]);
  // A forward whose result nobody kept is skipped: its one task has no reader.
  engine::reset_stats();
  for (int i = 0; i < 5; ++i) (void)(*net)(i % 2 ? x2 : x1);
  const auto kept = (*net)(x2).to_vector();
  BOOST_TEST(engine::stats().tasks_discarded == 5u);
  BOOST_TEST(engine::stats().tasks_run == 1u);
  for (int j = 0; j < 2; ++j) BOOST_TEST(kept[j] == r2[j]);
  // A new input shape is traced too, and kept beside the first: shapes in
  // turn replay.
  const Tensor<float> xb = random::normal<float>(0, 1, {3, 512});
  const auto yb = (*net)(xb).to_vector();
  for (int i = 0; i < 4; ++i) {
    const auto again = (*net)(i % 2 ? xb : x1).to_vector();
    BOOST_TEST(again == (i % 2 ? yb : r1), boost::test_tools::per_element());
  }
  BOOST_TEST(net->traces() == 2);
  net->hybridize(false);
  const auto yb_ref = (*net)(xb).to_vector();
  for (std::size_t j = 0; j < yb.size(); ++j) BOOST_TEST(yb[j] == yb_ref[j]);
  // With room for one shape, each change of shape traces again.
  net->hybridize(true, {.shapes = 1});
  for (int i = 0; i < 4; ++i) {
    const auto again = (*net)(i % 2 ? xb : x1).to_vector();
    BOOST_TEST(again == (i % 2 ? yb : r1), boost::test_tools::per_element());
  }
  BOOST_TEST(net->traces() == 6);
  BOOST_CHECK_EXCEPTION(net->hybridize(true, {.shapes = 0}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return std::string(e.what()).find("shapes is 0") != std::string::npos; });
  // A parameter update (a new version of the weights) traces again.
  net->hybridize();
  (void)(*net)(x1).to_vector();
  const auto traced = net->traces();
  nn::Trainer trainer(net->collect_params(), nn::SGD{0.5f});
  {
    autograd::record rec;  // hybridized blocks run imperatively while recording
    Tensor<float> l = sum((*net)(x1));
    l.backward();
  }
  trainer.step(1);
  const auto after = (*net)(x1).to_vector();
  BOOST_TEST(net->traces() == traced + 1);
  net->hybridize(false);
  const auto after_ref = (*net)(x1).to_vector();
  for (int j = 0; j < 2; ++j) BOOST_TEST(after[j] == after_ref[j]);
  BOOST_TEST(after[0] != r1[0]);
}

namespace {
// trunk -> two heads -> their sum: the heads read one value, so each is a
// chain of its own (they may run in parallel) after the trunk's.
struct Heads : nn::Block {
  std::shared_ptr<nn::Dense> trunk = std::make_shared<nn::Dense>(16, nn::Act::relu);
  std::shared_ptr<nn::Dense> h1 = std::make_shared<nn::Dense>(8, nn::Act::tanh), h2 = std::make_shared<nn::Dense>(8);
  Heads() : nn::Block("heads") {
    add_child(trunk);
    add_child(h1);
    add_child(h2);
  }
  Tensor<float> forward(const Tensor<float>& x) override {
    const Tensor<float> t = (*trunk)(x);
    return (*h1)(t) + (*h2)(t);
  }
};
// Two layers reading the input, multiplied: no chain waits for the other.
struct Twins : nn::Block {
  std::shared_ptr<nn::Dense> a = std::make_shared<nn::Dense>(8, nn::Act::sigmoid), b = std::make_shared<nn::Dense>(8);
  Twins() : nn::Block("twins") {
    add_child(a);
    add_child(b);
  }
  Tensor<float> forward(const Tensor<float>& x) override { return (*a)(x) * (*b)(x); }
};

// Replays of `net` without a sync between calls equal its imperative
// results bit for bit, and one replay records `tasks` tasks.
void check_replays(nn::Block& net, std::uint64_t tasks) {
  const Tensor<float> x1 = random::normal<float>(0, 1, {3, 12}), x2 = random::normal<float>(0, 1, {3, 12});
  net.initialize();
  const auto r1 = net(x1).to_vector(), r2 = net(x2).to_vector();
  net.hybridize();
  std::vector<Tensor<float>> outs;
  for (int i = 0; i < 6; ++i) outs.push_back(net(i % 2 ? x2 : x1));
  for (int i = 0; i < 6; ++i) {
    const auto v = outs[i].to_vector();
    const auto& ref = i % 2 ? r2 : r1;
    BOOST_TEST_REQUIRE(v.size() == ref.size());
    for (std::size_t j = 0; j < v.size(); ++j) BOOST_TEST(v[j] == ref[j]);
  }
  BOOST_TEST(net.traces() == 1);
  deft::wait_all();
  engine::reset_stats();
  const auto y = net(x2).to_vector();
  BOOST_TEST(engine::stats().tasks_recorded == tasks);
  for (std::size_t j = 0; j < y.size(); ++j) BOOST_TEST(y[j] == r2[j]);
}
}  // namespace

BOOST_AUTO_TEST_CASE(branches_replay_as_tasks_of_their_own) {
  random::seed(21);
  Heads heads;
  check_replays(heads, 4);  // refill and trunk; head 1; head 2; the sum
  Twins twins;
  check_replays(twins, 4);  // the refill (both layers wait for it); a; b; the product
}

BOOST_AUTO_TEST_CASE(a_failed_input_fails_the_replay_and_the_next_one_recovers) {
  random::seed(22);
  auto net = seeds_net();
  const Tensor<float> x = random::normal<float>(0, 1, {1, 512});
  const auto ref = (*net)(x).to_vector();
  net->hybridize();
  (void)(*net)(x).to_vector();  // traced
  const Tensor<float> bad = deft::map([](float) -> float { throw std::runtime_error("bad sample"); }, x);
  const Tensor<float> y = (*net)(bad);
  BOOST_CHECK_EXCEPTION(y.to_vector(), std::runtime_error,
                        [](const std::runtime_error& e) { return mentions(e, "bad sample"); });
  const auto again = (*net)(x).to_vector();
  for (int j = 0; j < 2; ++j) BOOST_TEST(again[j] == ref[j]);
  BOOST_TEST(net->traces() == 1);
  BOOST_CHECK_THROW(deft::wait_all(), std::runtime_error);  // the failure is reported once more there, then cleared
  deft::wait_all();
}

BOOST_AUTO_TEST_CASE(a_forward_that_reads_values_cannot_be_traced) {
  struct Peeking : nn::Block {
    Peeking() : nn::Block("peeking") {}
    Tensor<float> forward(const Tensor<float>& x) override {
      if (sum(x).item() > 0) return x * 2.0f;  // branching on data: the seeds' `if` exercise
      return x;
    }
  };
  Peeking block;
  const Tensor<float> x = ones<float>({2, 2});
  BOOST_TEST(block(x).to_vector()[0] == 2.0f);  // imperative: fine
  block.hybridize();
  BOOST_CHECK_EXCEPTION(block(x), std::logic_error,
                        [](const std::logic_error& e) { return mentions(e, "hybridized forward"); });
  BOOST_TEST(!detail::active_trace());  // the failed trace left nothing behind
  block.hybridize(false);
  BOOST_TEST(block(x).to_vector()[0] == 2.0f);
}

namespace {
// x * 2 + noise, and a draw nobody reads (it still takes a call number).
class Noisy : public nn::Block {
 public:
  Noisy() : Block("noisy") {}
  Tensor<float> forward(const Tensor<float>& x) override {
    (void)random::normal<float>(0, 1, x.shape());
    return x * 2.0f + random::uniform<float>(-1, 1, x.shape());
  }
};
}  // namespace

// A replay draws new random numbers each time, those the imperative forward
// would have drawn after the same seed, and leaves the generator where the
// imperative calls would have left it.
BOOST_AUTO_TEST_CASE(random_steps_draw_what_the_imperative_forward_would) {
  random::seed(31);
  const Tensor<float> x = random::normal<float>(0, 1, {4, 6});
  auto run = [&](bool hybridized) {
    Noisy block;
    block.hybridize(hybridized);
    random::seed(32);
    std::vector<Tensor<float>> outs;
    for (int i = 0; i < 5; ++i) outs.push_back(block(x));  // no sync between calls
    outs.push_back(random::uniform<float>(0, 1, {3}));   // the generator after them
    std::vector<std::vector<float>> values;
    for (auto& o : outs) values.push_back(o.to_vector());
    BOOST_TEST(block.traces() == (hybridized ? 1 : 0));
    return values;
  };
  const auto plain = run(false), hybrid = run(true);
  for (std::size_t i = 0; i < plain.size(); ++i)
    for (std::size_t j = 0; j < plain[i].size(); ++j) BOOST_TEST(hybrid[i][j] == plain[i][j], "call " << i << "[" << j << "]");
  BOOST_TEST((hybrid[3] != hybrid[4]));  // two replays, two draws
}

BOOST_AUTO_TEST_SUITE_END()
