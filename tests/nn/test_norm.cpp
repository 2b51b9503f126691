// Training and prediction modes, BatchNorm, global pooling and the ResNet
// pieces, against double-precision references on random inputs.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <deft/nn.hpp>

#include "batch_norm_reference.hpp"
#include "nn_support.hpp"

using namespace deft;
using nn_test::mentions;

namespace {

std::vector<double> doubles(const Tensor<float>& t) { return to_doubles(t.to_vector()); }

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  const std::string bad = first_mismatch(got, want, 0, tol);
  BOOST_TEST(bad.empty(), what << ", " << bad);
}

// A BatchNorm with random gamma and beta for `x`'s channels.
std::shared_ptr<nn::BatchNorm> random_batchnorm(const Tensor<float>& x, float momentum = 0.9f) {
  auto bn = std::make_shared<nn::BatchNorm>(momentum);
  bn->initialize();
  (void)(*bn)(x).to_vector();  // prediction mode: the parameters take their shapes
  const Shape c{x.shape()[1]};
  bn->gamma().set_data(random::uniform<float>(0.5, 1.5, c));
  bn->beta().set_data(random::normal<float>(0, 1, c));
  return bn;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(modes)

BOOST_AUTO_TEST_CASE(record_trains_pause_predicts_and_scopes_nest) {
  BOOST_TEST(!autograd::is_training());  // the default: prediction
  {
    autograd::record rec;
    BOOST_TEST(autograd::is_training());
    {
      autograd::predict_mode validating;
      BOOST_TEST(!autograd::is_training());
      BOOST_TEST(autograd::is_recording());
    }
    BOOST_TEST(autograd::is_training());
    {
      autograd::pause p;
      BOOST_TEST(!autograd::is_training());
      BOOST_TEST(!autograd::is_recording());
    }
    {
      autograd::pause p(true);
      BOOST_TEST(autograd::is_training());
    }
  }
  {
    autograd::record rec(false);
    BOOST_TEST(!autograd::is_training());
    BOOST_TEST(autograd::is_recording());
  }
  {
    autograd::train_mode training;
    BOOST_TEST(autograd::is_training());
    BOOST_TEST(!autograd::is_recording());
  }
  BOOST_TEST(!autograd::is_training());
}

BOOST_AUTO_TEST_CASE(dropout_follows_the_mode_not_the_recording) {
  random::seed(5);
  nn::Dropout drop(0.5f);
  const Tensor<float> x = random::uniform<float>(1, 2, {64, 64});
  const auto xv = x.to_vector();
  const auto zeros = [](const std::vector<float>& v) { return std::ranges::count(v, 0.0f); };
  {
    autograd::train_mode training;  // not recording: masks all the same
    BOOST_TEST(zeros(drop(x).to_vector()) > 1500);
  }
  {
    autograd::record rec;
    autograd::predict_mode validating;  // recording: the identity all the same
    const auto y = drop(x).to_vector();
    for (std::size_t i = 0; i < xv.size(); ++i) BOOST_TEST(y[i] == xv[i]);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(batch_norm)

BOOST_AUTO_TEST_CASE(training_normalizes_by_the_batch_and_differentiates_through_it) {
  random::seed(31);
  for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{9, 5}}) {
    const std::int64_t n = shape[0], c = shape[1], s = shape.size() / (n * c);
    const Tensor<float> x0 = random::normal<float>(2, 3, shape);  // off-centre: the mean matters
    auto bn = random_batchnorm(x0, 0.8f);
    Tensor<float> x = x0.clone();
    x.attach_grad();
    const Tensor<float> g = random::normal<float>(0, 1, shape);
    Tensor<float> y;
    {
      autograd::record rec;
      y = (*bn)(x);
      sum(y * g).backward();
    }
    const BatchNormReference ref(doubles(x0), doubles(g), doubles(bn->gamma().data()), doubles(bn->beta().data()), n,
                                 c, s, 1e-5, true);
    expect_close(y.to_vector(), ref.y, 2e-5, "y");
    expect_close(x.grad().to_vector(), ref.dx, 5e-4, "dx");
    expect_close(bn->gamma().grad().to_vector(), ref.dgamma, 1e-4, "dgamma");
    expect_close(bn->beta().grad().to_vector(), ref.dbeta, 1e-4, "dbeta");
    // running = 0.8 * running + 0.2 * batch, from zeros and ones.
    std::vector<double> mean(ref.mean), var(ref.var);
    for (auto& m : mean) m *= 0.2;
    for (auto& v : var) v = 0.8 + 0.2 * v;
    expect_close(bn->running_mean().data().to_vector(), mean, 1e-5, "running mean");
    expect_close(bn->running_var().data().to_vector(), var, 1e-5, "running var");
  }
}

BOOST_AUTO_TEST_CASE(prediction_normalizes_by_the_running_statistics) {
  random::seed(32);
  const Shape shape{3, 4, 7, 5};
  const Tensor<float> x0 = random::normal<float>(1, 2, shape);
  auto bn = random_batchnorm(x0);
  bn->running_mean().set_data(random::normal<float>(0, 1, {4}));
  bn->running_var().set_data(random::uniform<float>(0.5, 4, {4}));
  const Tensor<float> g = random::normal<float>(0, 1, shape);
  const BatchNormReference ref(doubles(x0), doubles(g), doubles(bn->gamma().data()), doubles(bn->beta().data()), 3, 4,
                               35, 1e-5, false, doubles(bn->running_mean().data()), doubles(bn->running_var().data()));
  expect_close((*bn)(x0).to_vector(), ref.y, 2e-5, "y outside record");
  bn->hybridize();
  for (int call = 0; call < 3; ++call) expect_close((*bn)(x0).to_vector(), ref.y, 2e-5, "y hybridized");
  // Recorded in prediction mode: the running statistics normalize, and stay.
  const auto running_mean = bn->running_mean().data().to_vector();
  Tensor<float> x = x0.clone();
  x.attach_grad();
  {
    autograd::record rec(false);
    Tensor<float> y = (*bn)(x);
    expect_close(y.to_vector(), ref.y, 2e-5, "y recorded");
    sum(y * g).backward();
  }
  expect_close(x.grad().to_vector(), ref.dx, 1e-5, "dx");
  expect_close(bn->gamma().grad().to_vector(), ref.dgamma, 1e-4, "dgamma");
  expect_close(bn->beta().grad().to_vector(), ref.dbeta, 1e-4, "dbeta");
  BOOST_TEST(bn->running_mean().data().to_vector() == running_mean);
}

BOOST_AUTO_TEST_CASE(running_statistics_are_state_that_files_keep_and_trainers_leave) {
  random::seed(33);
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Dense>(6), std::make_shared<nn::BatchNorm>(), std::make_shared<nn::Dense>(3));
  net->initialize();
  const Tensor<float> x = random::normal<float>(0, 1, {16, 4});
  const Tensor<std::int64_t> labels(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, {16});
  (void)(*net)(x).to_vector();
  nn::Trainer trainer(net->collect_params(), nn::SGD{0.1f, 0.9f});
  for (int step = 0; step < 3; ++step) {
    {
      autograd::record rec;
      nn::SoftmaxCrossEntropyLoss()((*net)(x), labels).backward();
    }
    trainer.step(16);  // the running statistics have no gradient, and that is no stale gradient
  }
  int state = 0;
  for (const nn::NamedParameter& p : net->named_params())
    if (!p.parameter->trainable()) {
      ++state;
      BOOST_TEST((p.path == "1.running_mean" || p.path == "1.running_var"), p.path);
    }
  BOOST_TEST(state == 2);
  const auto file = std::filesystem::temp_directory_path() / ("deft_norm_test_" + std::to_string(::getpid()));
  nn::save_parameters(*net, file);
  auto copy = std::make_shared<nn::Sequential>();
  copy->add(std::make_shared<nn::Dense>(6), std::make_shared<nn::BatchNorm>(), std::make_shared<nn::Dense>(3));
  nn::load_parameters(*copy, file);
  std::filesystem::remove(file);
  BOOST_TEST((*copy)(x).to_vector() == (*net)(x).to_vector());  // prediction: the running statistics came along
}

BOOST_AUTO_TEST_CASE(each_device_keeps_the_statistics_of_its_part) {
  random::seed(34);
  const std::vector<Device> devices{cpu(0), cpu(1)};
  nn::BatchNorm bn(0.5f);
  bn.initialize(nn::init::xavier(), devices);
  const Tensor<float> batch = random::normal<float>(3, 2, {10, 3});
  const auto parts = split_and_load(batch, devices);
  {
    autograd::record rec;
    for (const auto& part : parts) (void)bn(part).to_vector();
  }
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const auto v = parts[d].to_vector();
    std::vector<double> mean(3, 0.0);
    for (std::size_t i = 0; i < v.size(); ++i) mean[i % 3] += 0.5 * v[i] / 5.0;  // 0.5 * 0 + 0.5 * batch mean
    expect_close(bn.running_mean().data(devices[d]).to_vector(), mean, 1e-5, "device " + std::to_string(d));
  }
}

BOOST_AUTO_TEST_CASE(bad_input_is_named_before_anything_changes) {
  nn::BatchNorm bn;
  bn.initialize();
  BOOST_CHECK_EXCEPTION(bn(zeros<float>({2, 3, 4})), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "(2, 3, 4)") && mentions(e, "(batch, channels"); });
  (void)bn(ones<float>({2, 3})).to_vector();
  BOOST_CHECK_EXCEPTION(bn(zeros<float>({2, 5})), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "3 channels") && mentions(e, "(2, 5)"); });
  {
    autograd::record rec;
    BOOST_CHECK_EXCEPTION(bn(zeros<float>({1, 3})), std::invalid_argument,
                          [](const auto& e) { return mentions(e, "more than one value per channel"); });
  }
  BOOST_TEST(bn.running_mean().data().to_vector() == std::vector<float>(3, 0.0f));
  BOOST_CHECK_THROW(nn::BatchNorm(1.5f), std::invalid_argument);
  BOOST_CHECK_THROW(nn::BatchNorm(0.9f, 0.0f), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(a_train_step_updates_the_statistics_as_the_plain_step_does) {
  random::seed(35);
  auto make = [] {
    auto net = std::make_shared<nn::Sequential>();
    net->add(std::make_shared<nn::Conv2D>(4, 3, 1, 1, nn::Act::none, false), std::make_shared<nn::BatchNorm>(),
             std::make_shared<nn::Activation>(nn::Act::relu), std::make_shared<nn::GlobalAvgPool2D>(),
             std::make_shared<nn::Dense>(3));
    net->initialize(nn::init::kaiming());
    return net;
  };
  auto traced = make(), plain = make();
  const Tensor<float> x0 = random::normal<float>(0, 1, {6, 2, 5, 5});
  (void)(*traced)(x0).to_vector();
  (void)(*plain)(x0).to_vector();
  const auto a = traced->collect_params(), b = plain->collect_params();
  for (std::size_t i = 0; i < a.size(); ++i) b[i]->set_data(a[i]->data().clone());
  nn::Trainer traced_trainer(a, nn::SGD{0.05f, 0.9f}), plain_trainer(b, nn::SGD{0.05f, 0.9f});
  nn::TrainStep step(*traced, nn::SoftmaxCrossEntropyLoss(), traced_trainer);
  std::mt19937 draw(3);
  for (int k = 0; k < 6; ++k) {
    const Tensor<float> x = random::normal<float>(1, 2, {6, 2, 5, 5});
    std::vector<std::int64_t> y(6);
    for (auto& l : y) l = std::int64_t(draw() % 3);
    const Tensor<std::int64_t> labels(y, {6});
    (void)step(x, labels);
    {
      autograd::record rec;
      nn::SoftmaxCrossEntropyLoss()((*plain)(x), labels).backward();
    }
    plain_trainer.step(6);
  }
  BOOST_TEST(step.replays() >= 3);
  for (std::size_t i = 0; i < a.size(); ++i)
    expect_close(a[i]->data().to_vector(), doubles(b[i]->data()), 1e-4, a[i]->name());
  // Prediction after training: the statistics the steps left.
  expect_close((*traced)(x0).to_vector(), doubles((*plain)(x0)), 1e-4, "prediction");
}

// The same seed trained deferred, synchronously (each statement run as it
// is recorded) and as a TrainStep: the same bits, running statistics too.
BOOST_AUTO_TEST_CASE(deferred_synchronous_and_traced_training_agree_to_the_bit) {
  auto train = [](engine::Mode mode, bool traced) {
    const engine::Mode previous = engine::mode();
    engine::set_mode(mode);
    random::seed(36);
    auto net = std::make_shared<nn::Sequential>();
    net->add(std::make_shared<nn::Conv2D>(3, 3, 1, 1, nn::Act::none, false), std::make_shared<nn::BatchNorm>(),
             std::make_shared<nn::Activation>(nn::Act::relu), std::make_shared<nn::GlobalAvgPool2D>(),
             std::make_shared<nn::Dense>(2));
    net->initialize(nn::init::kaiming());
    const Tensor<float> x = random::normal<float>(1, 2, {4, 2, 6, 6});
    const Tensor<std::int64_t> y(std::vector<std::int64_t>{0, 1, 1, 0}, {4});
    (void)(*net)(x).to_vector();
    nn::Trainer trainer(net->collect_params(), nn::SGD{0.1f, 0.9f});
    nn::TrainStep step(*net, nn::SoftmaxCrossEntropyLoss(), trainer);
    for (int k = 0; k < 4; ++k) {
      if (traced) {
        (void)step(x * float(k + 1), y);
        continue;
      }
      {
        autograd::record rec;
        nn::SoftmaxCrossEntropyLoss()((*net)(x * float(k + 1)), y).backward();
      }
      trainer.step(4);
    }
    std::vector<float> all = (*net)(x).to_vector();
    for (nn::Parameter* p : net->collect_params())
      for (float v : p->data().to_vector()) all.push_back(v);
    engine::set_mode(previous);
    return all;
  };
  const auto deferred = train(engine::Mode::deferred, false);
  BOOST_TEST(train(engine::Mode::synchronous, false) == deferred, boost::test_tools::per_element());
  BOOST_TEST(train(engine::Mode::deferred, true) == deferred, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(resnet)

BOOST_AUTO_TEST_CASE(global_pools_reduce_each_plane_and_split_ties) {
  random::seed(41);
  Tensor<float> x = random::normal<float>(0, 1, {2, 3, 4, 5});
  x.attach_grad();
  Tensor<float> avg, top;
  {
    autograd::record rec;
    avg = nn::GlobalAvgPool2D()(x);
    top = nn::GlobalMaxPool2D()(x);
    sum(avg + top * 2.0f).backward();
  }
  BOOST_TEST(avg.shape() == (Shape{2, 3, 1, 1}));
  BOOST_TEST(top.shape() == (Shape{2, 3, 1, 1}));
  const auto xv = x.to_vector(), gv = x.grad().to_vector(), av = avg.to_vector(), tv = top.to_vector();
  for (std::size_t plane = 0; plane < 6; ++plane) {
    double mean = 0, best = -1e30;
    for (std::size_t k = 0; k < 20; ++k) mean += xv[plane * 20 + k] / 20.0, best = std::max(best, double(xv[plane * 20 + k]));
    BOOST_TEST(std::abs(av[plane] - mean) <= 1e-6);
    BOOST_TEST(tv[plane] == best);
    for (std::size_t k = 0; k < 20; ++k)
      BOOST_TEST(std::abs(gv[plane * 20 + k] - (1.0 / 20.0 + (xv[plane * 20 + k] == best ? 2.0 : 0.0))) <= 1e-6);
  }
  Tensor<float> flat = zeros<float>({1, 1, 2, 2});  // a four-way tie
  flat.attach_grad();
  {
    autograd::record rec;
    nn::GlobalMaxPool2D()(flat).backward();
  }
  for (float g : flat.grad().to_vector()) BOOST_TEST(g == 0.25f);
  BOOST_CHECK_EXCEPTION(nn::GlobalAvgPool2D()(zeros<float>({2, 3})), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "(2, 3)"); });
}

BOOST_AUTO_TEST_CASE(conv2d_without_bias_has_only_a_weight) {
  random::seed(42);
  nn::Conv2D with(3, 3, 1, 1), without(3, 3, 1, 1, nn::Act::none, false);
  with.initialize();
  without.initialize();
  const Tensor<float> x = random::normal<float>(0, 1, {2, 2, 6, 6});
  (void)with(x).to_vector();
  (void)without(x).to_vector();
  BOOST_TEST(without.collect_params().size() == 1u);
  BOOST_CHECK_THROW(without.bias(), std::logic_error);
  without.weight().set_data(with.weight().data().clone());
  with.bias().set_data(zeros<float>({3}));
  BOOST_TEST(without(x).to_vector() == with(x).to_vector());
}

BOOST_AUTO_TEST_CASE(kaiming_draws_with_the_fan_in_variance) {
  random::seed(43);
  const Tensor<float> w = nn::init::kaiming()(Shape{64, 32, 3, 3});  // fan_in 288
  const auto v = w.to_vector();
  double mean = 0, square = 0;
  for (float x : v) mean += x / double(v.size()), square += double(x) * x / double(v.size());
  const double sigma = std::sqrt(2.0 / 288.0);
  BOOST_TEST(std::abs(mean) <= 0.02 * sigma);
  BOOST_TEST(std::abs(std::sqrt(square - mean * mean) / sigma - 1.0) <= 0.02);  // 18432 draws: 0.5% standard error
}

BOOST_AUTO_TEST_CASE(resnet18_has_the_chapters_layers_and_trains) {
  random::seed(44);
  const std::int64_t width = 2, classes = 5;
  auto net = nn::resnet18(classes, width);
  net->initialize(nn::init::kaiming());
  const Tensor<float> x = random::normal<float>(0, 1, {4, 1, 12, 12});
  BOOST_TEST((*net)(x).shape() == (Shape{4, classes}));
  // The parameter count as the architecture gives it: the stem, four stages
  // of two Residual blocks (a 1x1 shortcut in the first block of the last
  // three), the Dense layer.
  std::int64_t expected = 9 * width + width + 4 * width;
  std::int64_t in = width;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t c = width << stage;
    for (int block = 0; block < 2; ++block) {
      expected += c * in * 9 + 4 * c + c * c * 9 + 4 * c;
      if (stage > 0 && block == 0) expected += c * in + c;
      in = c;
    }
  }
  expected += in * classes + classes;
  std::int64_t count = 0;
  for (nn::Parameter* p : net->collect_params()) count += p->shape().size();
  BOOST_TEST(count == expected);
  BOOST_CHECK_EXCEPTION(nn::resnet18(10, 0), std::invalid_argument, [](const auto& e) { return mentions(e, "width"); });
  nn::Residual mismatched(4);  // 2 channels in, 4 out, without the 1x1 shortcut
  mismatched.initialize();
  BOOST_CHECK_EXCEPTION(mismatched(zeros<float>({1, 2, 4, 4})), std::invalid_argument,
                        [](const auto& e) { return mentions(e, "use_1x1conv"); });
  // It learns: a few Adam steps on one batch lower its loss.
  nn::Trainer trainer(net->collect_params(), nn::Adam{0.01f});
  const Tensor<std::int64_t> labels(std::vector<std::int64_t>{0, 1, 2, 3}, {4});
  float first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    Tensor<float> loss;
    {
      autograd::record rec;
      loss = nn::SoftmaxCrossEntropyLoss()((*net)(x), labels);
      loss.backward();
    }
    trainer.step(4);
    (step == 0 ? first : last) = mean(loss).item();
  }
  BOOST_TEST(last < 0.5f * first, first << " -> " << last);
}

BOOST_AUTO_TEST_SUITE_END()
