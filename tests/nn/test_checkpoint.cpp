// Checkpoints: a run saved and resumed computes the bits of the run that
// went straight on; a checkpoint that does not fit changes nothing.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

#include <deft/nn.hpp>

#include "nn_support.hpp"

using namespace deft;
using nn_test::mentions;
using nn_test::temp_file;

namespace {

// Convolution, BatchNorm (running statistics), Dropout (random draws) and Dense.
std::shared_ptr<nn::Sequential> make_net(std::int64_t classes = 3) {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2D>(4, 3, 1, 1, nn::Act::none, false), std::make_shared<nn::BatchNorm>(),
           std::make_shared<nn::Activation>(nn::Act::relu), std::make_shared<nn::GlobalAvgPool2D>(),
           std::make_shared<nn::Dropout>(0.3f), std::make_shared<nn::Dense>(classes));
  net->initialize(nn::init::kaiming());
  return net;
}

struct Batch {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};

std::vector<Batch> batches(int n) {
  random::seed(99);
  std::vector<Batch> out;
  for (int b = 0; b < n; ++b) {
    std::vector<std::int64_t> labels(6);
    for (int i = 0; i < 6; ++i) labels[std::size_t(i)] = (b + i) % 3;
    out.push_back({random::normal<float>(0.5, 2, {6, 2, 5, 5}), Tensor<std::int64_t>(labels, {6})});
  }
  return out;
}

void train(nn::Sequential& net, nn::Trainer& trainer, const std::vector<Batch>& data, int from, int to) {
  for (int b = from; b < to; ++b) {
    {
      autograd::record rec;
      nn::SoftmaxCrossEntropyLoss()(net(data[std::size_t(b)].x), data[std::size_t(b)].y).backward();
    }
    trainer.step(6);
  }
}

std::vector<std::vector<float>> values(nn::Sequential& net) {
  std::vector<std::vector<float>> out;
  for (nn::Parameter* p : net.collect_params()) out.push_back(p->data().to_vector());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoints)

BOOST_AUTO_TEST_CASE(a_resumed_run_computes_the_bits_of_the_straight_run) {
  const auto data = batches(5);
  const auto file = temp_file("resume.ckpt");
  // A schedule's count continues from the checkpoint's steps.
  const std::pair<std::variant<nn::SGD, nn::Adam>, nn::LRSchedule> runs[] = {
      {nn::SGD{0.05f, 0.9f, 1e-4f, true}, nn::schedule::warmup(2, nn::schedule::cosine(2, 0.2))},
      {nn::Adam{0.01f}, nn::schedule::step(2, 0.5)}};
  for (const auto& [optimizer, schedule] : runs) {
    random::seed(7);
    auto straight = make_net();
    nn::Trainer straight_trainer(straight->collect_params(), optimizer);
    straight_trainer.set_schedule(schedule);
    train(*straight, straight_trainer, data, 0, 5);

    random::seed(7);
    auto first = make_net();
    nn::Trainer first_trainer(first->collect_params(), optimizer);
    first_trainer.set_schedule(schedule);
    train(*first, first_trainer, data, 0, 3);
    nn::save_checkpoint(*first, first_trainer, file);

    random::seed(1234);  // another start, and other random draws since: the checkpoint restores them
    auto resumed = make_net();
    (void)random::normal<float>(0, 1, {10}).to_vector();
    nn::Trainer resumed_trainer(resumed->collect_params(), optimizer);
    resumed_trainer.set_schedule(schedule);
    nn::load_checkpoint(*resumed, resumed_trainer, file);
    BOOST_TEST(resumed_trainer.steps() == 3);
    train(*resumed, resumed_trainer, data, 3, 5);

    const auto want = values(*straight), got = values(*resumed);
    BOOST_TEST_REQUIRE(want.size() == got.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      BOOST_TEST(std::memcmp(want[i].data(), got[i].data(), want[i].size() * sizeof(float)) == 0,
                 straight->collect_params()[i]->name() << " differs");
  }
  std::filesystem::remove(file);
}

BOOST_AUTO_TEST_CASE(a_checkpoint_that_does_not_fit_changes_nothing) {
  const auto data = batches(2);
  const auto file = temp_file("other.ckpt");
  random::seed(8);
  auto other = make_net(5);  // another Dense layer
  nn::Trainer other_trainer(other->collect_params(), nn::SGD{0.1f, 0.9f});
  train(*other, other_trainer, data, 0, 1);
  nn::save_checkpoint(*other, other_trainer, file);

  auto net = make_net();
  nn::Trainer sgd(net->collect_params(), nn::SGD{0.1f, 0.9f});
  nn::Trainer adam(net->collect_params(), nn::Adam{0.01f});
  train(*net, sgd, data, 0, 2);
  const auto before = values(*net);
  BOOST_CHECK_EXCEPTION(nn::load_checkpoint(*net, sgd, file), std::runtime_error, [&](const auto& e) {
    return mentions(e, "load_checkpoint: parameter '5.weight'") && mentions(e, file.string());
  });
  nn::save_checkpoint(*net, sgd, file);
  BOOST_CHECK_EXCEPTION(nn::load_checkpoint(*net, adam, file), std::runtime_error,
                        [](const auto& e) { return mentions(e, "with SGD but this one uses Adam"); });
  const auto size = std::filesystem::file_size(file);
  std::filesystem::resize_file(file, size - 7);
  BOOST_CHECK_EXCEPTION(nn::load_checkpoint(*net, sgd, file), std::runtime_error,
                        [](const auto& e) { return mentions(e, "truncated"); });
  {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << "DEFTPRM1";
  }
  BOOST_CHECK_EXCEPTION(nn::load_checkpoint(*net, sgd, file), std::runtime_error,
                        [](const auto& e) { return mentions(e, "not a deft checkpoint"); });
  BOOST_TEST(values(*net) == before);
  BOOST_TEST(sgd.steps() == 2);
  std::filesystem::remove(file);
}

BOOST_AUTO_TEST_SUITE_END()
