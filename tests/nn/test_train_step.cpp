// nn::TrainStep (a hybridized training step) against the same step run
// plainly, and against a naive double-precision linear regression.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <deft/nn.hpp>

#include "nn_support.hpp"

using namespace deft;
using nn_test::mentions;

namespace {

using Optimizer = std::variant<nn::SGD, nn::Adam>;

std::shared_ptr<nn::Sequential> mlp(float dropout = 0.0f) {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Dense>(16, nn::Act::relu));
  if (dropout > 0.0f) net->add(std::make_shared<nn::Dropout>(dropout));
  net->add(std::make_shared<nn::Dense>(5));
  net->initialize(nn::init::normal(0.3f));
  return net;
}

// Two networks with the same parameters, one trained by a TrainStep and one
// by the plain step, each with its own trainer.
struct Twins {
  std::shared_ptr<nn::Sequential> hybrid, plain;
  std::unique_ptr<nn::Trainer> hybrid_trainer, plain_trainer;
  Twins(const Tensor<float>& x, Optimizer opt, float dropout = 0.0f) : hybrid(mlp(dropout)), plain(mlp(dropout)) {
    (void)hybrid->forward(x).to_vector();  // deferred initialization
    (void)plain->forward(x).to_vector();
    const auto a = hybrid->collect_params(), b = plain->collect_params();
    for (std::size_t i = 0; i < a.size(); ++i) b[i]->set_data(a[i]->data().clone());
    hybrid_trainer = std::make_unique<nn::Trainer>(a, opt);
    plain_trainer = std::make_unique<nn::Trainer>(b, opt);
  }
  // The loss per sample and the scores.
  std::pair<Tensor<float>, Tensor<float>> plain_step(const Tensor<float>& x, const Tensor<std::int64_t>& y) {
    Tensor<float> l, scores;
    {
      autograd::record rec;
      scores = (*plain)(x);
      l = nn::SoftmaxCrossEntropyLoss()(scores, y);
      l.backward();
    }
    plain_trainer->step(x.shape()[0]);
    return {l, scores};
  }
  void expect_same_parameters(double tol) {
    const auto a = hybrid->collect_params(), b = plain->collect_params();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto va = a[i]->data().to_vector(), vb = b[i]->data().to_vector();
      for (std::size_t k = 0; k < va.size(); ++k)
        BOOST_TEST(std::abs(double(va[k]) - vb[k]) <= tol * std::max(1.0, std::abs(double(vb[k]))),
                   a[i]->name() << "[" << k << "]: " << va[k] << " vs " << vb[k]);
    }
  }
};

Tensor<std::int64_t> labels(std::int64_t n, std::int64_t classes) {
  static std::mt19937 draw(7);
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& l : v) l = std::int64_t(draw() % std::uint32_t(classes));
  return Tensor<std::int64_t>(v, {n});
}

void expect_close(const Tensor<float>& got, const Tensor<float>& want, double tol) {
  const auto g = got.to_vector(), w = want.to_vector();
  BOOST_TEST_REQUIRE(g.size() == w.size());
  for (std::size_t k = 0; k < g.size(); ++k)
    BOOST_TEST(std::abs(double(g[k]) - w[k]) <= tol * std::max(1.0, std::abs(double(w[k]))),
               "[" << k << "]: " << g[k] << " vs " << w[k]);
}

// Each step's loss and scores from a TrainStep against the plain step's.
void expect_same_outputs(const std::vector<nn::TrainStep<nn::SoftmaxCrossEntropyLoss>::Output>& hybrid,
                         const std::vector<std::pair<Tensor<float>, Tensor<float>>>& plain, double tol) {
  BOOST_TEST_REQUIRE(hybrid.size() == plain.size());
  for (std::size_t i = 0; i < hybrid.size(); ++i) {
    BOOST_TEST_CONTEXT("step " << i) {
      expect_close(hybrid[i].loss, plain[i].first, tol);
      expect_close(hybrid[i].scores, plain[i].second, tol);
    }
  }
}

// Batches of the given numbers of samples: 8 features, labels among 5 classes.
struct Batches {
  std::vector<Tensor<float>> xs;
  std::vector<Tensor<std::int64_t>> ys;
  explicit Batches(const std::vector<std::int64_t>& rows) {
    for (std::int64_t r : rows) xs.push_back(random::normal<float>(0, 1, {r, 8})), ys.push_back(labels(r, 5));
  }
  Batches(int count, std::int64_t rows) : Batches(std::vector<std::int64_t>(std::size_t(count), rows)) {}
};

// What a TrainStep and the plain twin's steps returned, batch by batch.
struct TwinRuns {
  std::vector<nn::TrainStep<nn::SoftmaxCrossEntropyLoss>::Output> hybrid;
  std::vector<std::pair<Tensor<float>, Tensor<float>>> plain;
  // Batch i through both.
  void step(nn::TrainStep<nn::SoftmaxCrossEntropyLoss>& hybrid_step, Twins& twins, const Batches& b, std::size_t i) {
    hybrid.push_back(hybrid_step(b.xs[i], b.ys[i]));
    plain.push_back(twins.plain_step(b.xs[i], b.ys[i]));
  }
  void expect_same(double tol) const { expect_same_outputs(hybrid, plain, tol); }
};

// Batches of the given rows split over cpu(0) and cpu(1), and two networks
// on both devices with the same parameters, each with an SGD trainer.
struct DataParallelTwins {
  const std::vector<Device> two = {cpu(0), cpu(1)};
  std::vector<std::vector<Tensor<float>>> xs;
  std::vector<std::vector<Tensor<std::int64_t>>> ys;
  std::shared_ptr<nn::Sequential> hybrid = mlp(), plain = mlp();
  std::vector<nn::Parameter*> a, b;  // hybrid's and plain's parameters
  std::unique_ptr<nn::Trainer> hybrid_trainer, plain_trainer;
  DataParallelTwins(const std::vector<std::int64_t>& rows, float learning_rate) {
    for (std::int64_t r : rows) {
      xs.push_back(split_and_load(random::normal<float>(0, 1, {r, 8}), two));
      ys.push_back(split_and_load(labels(r, 5), two));
    }
    hybrid->initialize(nn::init::normal(0.3f), two);
    plain->initialize(nn::init::normal(0.3f), two);
    (void)(*hybrid)(xs[0][0]).to_vector();  // deferred initialization
    (void)(*plain)(xs[0][0]).to_vector();
    a = hybrid->collect_params();
    b = plain->collect_params();
    for (std::size_t i = 0; i < a.size(); ++i) b[i]->set_data(a[i]->data().clone());
    hybrid_trainer = std::make_unique<nn::Trainer>(a, nn::SGD{learning_rate, 0.9f});
    plain_trainer = std::make_unique<nn::Trainer>(b, nn::SGD{learning_rate, 0.9f});
  }
  // Both devices' parameters within 1e-5 of the plain twin's, and every
  // device holding the same bits after the allreduce.
  void expect_same_parameters() {
    for (std::size_t i = 0; i < a.size(); ++i) {
      BOOST_TEST_CONTEXT(a[i]->name()) {
        for (Device d : two) expect_close(a[i]->data(d), b[i]->data(d), 1e-5);
        BOOST_TEST(a[i]->data(cpu(1)).to_vector() == a[i]->data(cpu(0)).to_vector(), boost::test_tools::per_element());
      }
    }
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(train_step)

// Replays must do what the plain step does, for every optimizer, and the
// losses and scores they returned must stay readable after later replays ran.
BOOST_AUTO_TEST_CASE(replays_match_the_plain_step) {
  const std::vector<Optimizer> optimizers = {nn::SGD{0.1f}, nn::SGD{0.05f, 0.9f, 0.01f},
                                             nn::Adam{0.01f, 0.9f, 0.999f, 1e-8f, 0.001f}};
  for (std::size_t which = 0; which < optimizers.size(); ++which) {
    BOOST_TEST_CONTEXT("optimizer " << which) {
      random::seed(40 + which);
      const Batches b(7, 12);
      Twins twins(b.xs[0], optimizers[which]);
      nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
      TwinRuns runs;
      for (std::size_t i = 0; i < 7; ++i) runs.step(step, twins, b, i);
      BOOST_TEST(step.traces() == 1);
      BOOST_TEST(step.replays() == 5);
      // A replay records the label refill and a few chain tasks (the
      // input's refill runs in the first, small backward steps and updates
      // join chains, the scores are copied out inside theirs): 8 here at
      // most, against 35-45 for the plain step.
      wait_all();
      const auto before = engine::stats().tasks_recorded;
      runs.hybrid.push_back(step(b.xs[6], b.ys[6]));
      const auto replayed = engine::stats().tasks_recorded - before;
      runs.plain.push_back(twins.plain_step(b.xs[6], b.ys[6]));
      const auto plain_tasks = engine::stats().tasks_recorded - before - replayed;
      BOOST_TEST(replayed <= 8u);
      BOOST_TEST(3 * replayed < plain_tasks, replayed << " tasks per replay, " << plain_tasks << " per plain step");
      BOOST_TEST(twins.hybrid_trainer->steps() == 8);
      runs.expect_same(1e-5);
      twins.expect_same_parameters(1e-5);
    }
  }
}

// Linear regression, L2 loss and SGD against a double-precision loop that
// follows deft's float weights after each step.
BOOST_AUTO_TEST_CASE(linear_regression_follows_the_sgd_formula) {
  random::seed(47);
  const int n = 16, k = 6;
  nn::Dense layer(1);
  layer.initialize(nn::init::normal(0.5f));
  const Tensor<float> x0 = random::normal<float>(0, 1, {n, k});
  (void)layer(x0).to_vector();
  nn::Trainer trainer(layer.collect_params(), nn::SGD{0.05f});
  nn::TrainStep step(layer, nn::L2Loss(), trainer);
  auto w = layer.collect_params()[0]->data().to_vector();
  auto b = layer.collect_params()[1]->data().to_vector();
  for (int s = 0; s < 6; ++s) {
    const Tensor<float> x = random::normal<float>(0, 1, {n, k});
    const Tensor<float> y = random::normal<float>(0, 1, {n});
    const auto xv = x.to_vector(), yv = y.to_vector();
    const auto [loss_tensor, scores_tensor] = step(x, y);
    const auto loss = loss_tensor.to_vector(), scores = scores_tensor.to_vector();
    BOOST_TEST_REQUIRE(scores.size() == std::size_t(n));
    std::vector<double> gw(k, 0.0);
    double gb = 0.0;
    for (int i = 0; i < n; ++i) {
      double pred = b[0];
      for (int j = 0; j < k; ++j) pred += double(xv[i * k + j]) * w[j];
      BOOST_TEST(std::abs(scores[i] - pred) <= 1e-5 * std::max(1.0, std::abs(pred)));  // before the update
      const double d = pred - yv[i];
      BOOST_TEST(std::abs(loss[i] - 0.5 * d * d) <= 1e-5 * std::max(1.0, 0.5 * d * d));
      for (int j = 0; j < k; ++j) gw[j] += d * xv[i * k + j];
      gb += d;
    }
    const auto w_now = layer.collect_params()[0]->data().to_vector();
    const auto b_now = layer.collect_params()[1]->data().to_vector();
    for (int j = 0; j < k; ++j) {
      const double expected = w[j] - 0.05 * gw[j] / n;
      BOOST_TEST(std::abs(w_now[j] - expected) <= 1e-5 * std::max(1.0, std::abs(expected)));
    }
    BOOST_TEST(std::abs(b_now[0] - (b[0] - 0.05 * gb / n)) <= 1e-5);
    w = w_now;
    b = b_now;
  }
  BOOST_TEST(step.replays() == 4);
}

// A new batch shape is traced beside the first; a changed learning rate or
// parameter storage traces again. The training still matches the plain step.
BOOST_AUTO_TEST_CASE(traces_again_when_what_it_baked_in_changes) {
  random::seed(48);
  const Tensor<float> x = random::normal<float>(0, 1, {12, 8}), x_small = random::normal<float>(0, 1, {5, 8});
  const auto y = labels(12, 5), y_small = labels(5, 5);
  Twins twins(x, nn::SGD{0.1f, 0.5f});
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
  auto both = [&](const Tensor<float>& xi, const Tensor<std::int64_t>& yi) {
    (void)step(xi, yi);
    (void)twins.plain_step(xi, yi);
  };
  for (int i = 0; i < 3; ++i) both(x, y);
  BOOST_TEST(step.traces() == 1);
  both(x_small, y_small);  // another shape: traced for it
  both(x_small, y_small);
  both(x, y);  // the first shape's trace is still there
  BOOST_TEST(step.traces() == 2);
  BOOST_TEST(step.replays() == 3);
  twins.hybrid_trainer->set_learning_rate(0.02f);
  twins.plain_trainer->set_learning_rate(0.02f);
  both(x_small, y_small);  // both traces baked in the old rate
  both(x, y);
  BOOST_TEST(step.traces() == 4);
  auto* p = twins.hybrid->collect_params()[0];
  const Tensor<float> reset = random::normal<float>(0, 0.3f, p->data().shape());
  p->set_data(reset.clone());
  twins.plain->collect_params()[0]->set_data(reset.clone());
  both(x_small, y_small);  // new storage: traced again
  both(x_small, y_small);
  both(x_small, y_small);
  BOOST_TEST(step.traces() == 5);
  BOOST_TEST(step.replays() == 5);
  twins.expect_same_parameters(1e-5);
}

// A schedule changes the rate every update without tracing again: the
// rate is data the replayed step computes. Changing the schedule traces
// once more. Replays equal the plain steps under the same schedule.
BOOST_AUTO_TEST_CASE(a_schedule_replays_without_tracing_again) {
  const std::vector<Optimizer> optimizers = {nn::SGD{0.1f, 0.9f, 0.0f, true}, nn::adamw(0.01f)};
  for (std::size_t which = 0; which < optimizers.size(); ++which) {
    BOOST_TEST_CONTEXT("optimizer " << which) {
      random::seed(60 + which);
      const Batches b(9, 12);
      Twins twins(b.xs[0], optimizers[which]);
      for (nn::Trainer* t : {twins.hybrid_trainer.get(), twins.plain_trainer.get()})
        t->set_schedule(nn::schedule::warmup(2, nn::schedule::cosine(4, 0.1)));
      nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
      TwinRuns runs;
      for (std::size_t i = 0; i < 7; ++i) runs.step(step, twins, b, i);
      BOOST_TEST(step.traces() == 1);
      BOOST_TEST(step.replays() == 5);
      for (nn::Trainer* t : {twins.hybrid_trainer.get(), twins.plain_trainer.get()})
        t->set_schedule(nn::schedule::step(1, 0.5));
      for (std::size_t i = 7; i < 9; ++i) runs.step(step, twins, b, i);
      BOOST_TEST(step.traces() == 2);
      runs.expect_same(0);
      twins.expect_same_parameters(0);
    }
  }
}

// The epochs' pattern: full batches and a shorter last one, recorded without
// a sync between steps. Each shape is traced once; a replay of one shape
// runs after the other shape's replay it follows (both write the same state).
BOOST_AUTO_TEST_CASE(an_epochs_last_shorter_batch_keeps_its_own_trace) {
  random::seed(52);
  const Batches b({12, 12, 12, 5});
  Twins twins(b.xs[0], nn::Adam{0.01f});
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
  TwinRuns runs;
  for (int epoch = 0; epoch < 3; ++epoch)
    for (std::size_t i = 0; i < 4; ++i) runs.step(step, twins, b, i);
  BOOST_TEST(step.traces() == 2);
  BOOST_TEST(step.replays() == 9);
  runs.expect_same(1e-5);
  twins.expect_same_parameters(1e-5);
}

// With room for two traces, three shapes in turn drop the least recently
// used trace each time. A dropped trace no longer holds the state: a pending
// reader must still be seen (the counts at rest lose the dropped trace's
// share), so each snapshot keeps the value from before its step.
BOOST_AUTO_TEST_CASE(a_dropped_trace_leaves_pending_readers_seen) {
  random::seed(53);
  const Batches b({12, 5, 7});
  Twins twins(b.xs[0], nn::SGD{0.1f, 0.9f});
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer, {.shapes = 2});
  std::vector<Tensor<float>> snapshots, expected;
  const std::vector<std::size_t> order = {0, 0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2};
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (i >= 5) {  // from the first call that drops a trace on
      snapshots.push_back(twins.hybrid->collect_params()[0]->data() * 1.0f);
      expected.push_back(twins.plain->collect_params()[0]->data().clone());
    }
    (void)step(b.xs[order[i]], b.ys[order[i]]);
    (void)twins.plain_step(b.xs[order[i]], b.ys[order[i]]);
  }
  // 1 plain call; each shape change traces (the shape needed was dropped),
  // the call after it replays; no plain step falls in between.
  BOOST_TEST(step.traces() == 6);
  BOOST_TEST(step.replays() == 6);
  for (std::size_t i = 0; i < snapshots.size(); ++i)
    BOOST_TEST_CONTEXT("snapshot " << i) { expect_close(snapshots[i], expected[i], 1e-5); }
  twins.expect_same_parameters(1e-5);
}

// A reader recorded before a replay sees the value from before it, as with
// the plain step's copy-on-write.
BOOST_AUTO_TEST_CASE(a_pending_reader_keeps_the_value_it_read) {
  random::seed(49);
  const Tensor<float> x = random::normal<float>(0, 1, {12, 8});
  const auto y = labels(12, 5);
  Twins twins(x, nn::SGD{0.1f, 0.9f});
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
  std::vector<Tensor<float>> snapshots, expected;
  for (int i = 0; i < 8; ++i) {
    snapshots.push_back(twins.hybrid->collect_params()[0]->data() * 1.0f);
    expected.push_back(twins.plain->collect_params()[0]->data().clone());
    (void)step(x, y);
    (void)twins.plain_step(x, y);
  }
  // Each call ran the pending snapshot first, then traced or replayed: no
  // plain step after the first (its new storage would make the next call
  // trace again).
  BOOST_TEST(step.traces() == 1);
  BOOST_TEST(step.replays() == 6);
  for (int i = 0; i < 8; ++i) {
    const auto s = snapshots[i].to_vector(), e = expected[i].to_vector();
    for (std::size_t k = 0; k < s.size(); ++k) BOOST_TEST(std::abs(s[k] - e[k]) <= 1e-5f * std::max(1.0f, std::abs(e[k])));
  }
  twins.expect_same_parameters(1e-5);
}

// A bad label fails the step that read it and every step after it (the
// state is failed, as with the plain step); earlier losses stay readable.
BOOST_AUTO_TEST_CASE(a_failed_replay_fails_the_steps_after_it) {
  random::seed(50);
  const Tensor<float> x = random::normal<float>(0, 1, {12, 8});
  const auto y = labels(12, 5);
  auto bad = y.to_vector();
  bad[3] = 7;
  const Tensor<std::int64_t> y_bad(bad, {12});
  Twins twins(x, nn::SGD{0.1f});
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
  std::vector<Tensor<float>> good;
  for (int i = 0; i < 4; ++i) good.push_back(step(x, y).loss), (void)twins.plain_step(x, y);
  BOOST_TEST(step.replays() == 2);
  Tensor<float> failed = step(x, y_bad).loss;
  BOOST_CHECK_EXCEPTION((void)failed.to_vector(), std::exception,
                        [](const std::exception& e) { return mentions(e, "label"); });
  for (int i = 0; i < 3; ++i) {
    Tensor<float> later = step(x, y).loss;
    BOOST_CHECK_THROW((void)later.to_vector(), std::exception);
  }
  BOOST_CHECK_THROW((void)twins.hybrid->collect_params()[0]->data().to_vector(), std::exception);
  for (int i = 0; i < 4; ++i) BOOST_TEST(good[i].to_vector().size() == 12u);
  try {
    wait_all();
  } catch (const std::exception&) {  // the failure is reported once more here
  }
}

// Reading values a replay's chain wrote besides its own output (the
// scores, then the parameters) while the chain is still recorded: with a
// bound of one or two recorded tasks, a flush lands inside the replay, and
// the read runs the chain itself. It must write the chain's own buffers,
// not the one read (which took the chain's last step once).
BOOST_AUTO_TEST_CASE(reading_a_replays_other_buffers_runs_it_into_its_own) {
  for (const std::size_t bound : {1u, 2u}) {
    BOOST_TEST_CONTEXT("max_recorded_tasks " << bound) {
      random::seed(56);
      const Tensor<float> x = random::normal<float>(0, 1, {4, 8});
      const auto y = labels(4, 5);
      Twins twins(x, nn::SGD{0.1f, 0.9f});
      const auto limits = engine::limits();
      auto tight = limits;
      tight.max_recorded_tasks = bound;
      engine::set_limits(tight);
      nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
      for (int i = 0; i < 5; ++i) {
        const auto out = step(x, y);
        const auto scores = out.scores.to_vector();  // scores first, then every parameter, then the loss
        std::vector<std::vector<float>> params;
        for (auto* p : twins.hybrid->collect_params()) params.push_back(p->data().to_vector());
        const auto loss = out.loss.to_vector();
        const auto [plain_loss, plain_scores] = twins.plain_step(x, y);
        BOOST_TEST_CONTEXT("step " << i) {
          expect_close(Tensor<float>(scores, out.scores.shape()), plain_scores, 1e-5);
          expect_close(Tensor<float>(loss, out.loss.shape()), plain_loss, 1e-5);
          const auto b = twins.plain->collect_params();
          for (std::size_t k = 0; k < b.size(); ++k) expect_close(Tensor<float>(params[k], b[k]->shape()), b[k]->data(), 1e-5);
        }
      }
      BOOST_TEST(step.replays() >= 3);
      engine::set_limits(limits);
    }
  }
}

// A value recorded after a replay failed, reading a buffer its chain wrote
// (a parameter), inherits the failure like a plain read of it does.
BOOST_AUTO_TEST_CASE(a_value_recorded_after_a_failed_replay_inherits_its_failure) {
  random::seed(57);
  const Tensor<float> x = random::normal<float>(0, 1, {4, 8});
  const Tensor<std::int64_t> good(std::vector<std::int64_t>{0, 1, 2, 3}, {4}), bad(std::vector<std::int64_t>{0, 1, 2, 99}, {4});
  Twins twins(x, nn::SGD{0.1f});
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
  for (int i = 0; i < 3; ++i) (void)step(x, good).loss.to_vector();
  (void)step(x, bad);
  BOOST_TEST(step.replays() == 2);
  BOOST_CHECK_THROW(wait_all(), std::exception);
  const Tensor<float>& w = twins.hybrid->collect_params()[0]->data();
  BOOST_CHECK_EXCEPTION((void)w.to_vector(), std::exception, [](const std::exception& e) { return mentions(e, "label 99"); });
  const Tensor<float> derived = w * 1.0f;  // recorded after the failure
  BOOST_CHECK_EXCEPTION((void)derived.to_vector(), std::exception,
                        [](const std::exception& e) { return mentions(e, "label 99"); });
  try {
    wait_all();
  } catch (const std::exception&) {  // reported once more here
  }
}

// A replay whose input failed runs none of its chains. What it hands out in
// buffers of its own (the scores and losses copied out inside a chain) was
// never written: reading them must raise the input's error.
BOOST_AUTO_TEST_CASE(a_failed_input_fails_what_the_replay_hands_out) {
  random::seed(55);
  const Tensor<float> x = random::normal<float>(0, 1, {12, 8});
  const auto y = labels(12, 5);
  auto bad = y.to_vector();
  bad[0] = -1;
  const Tensor<float> failed_loss = nn::SoftmaxCrossEntropyLoss()(random::normal<float>(0, 1, {12, 5}), Tensor<std::int64_t>(bad, {12}));
  const Tensor<float> x_failed = x + failed_loss.reshape({12, 1});
  Twins twins(x, nn::SGD{0.1f});
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
  for (int i = 0; i < 3; ++i) (void)step(x, y);
  const auto [loss, scores] = step(x_failed, y);
  BOOST_TEST(step.replays() == 2);
  BOOST_CHECK_EXCEPTION((void)loss.to_vector(), std::exception, [](const std::exception& e) { return mentions(e, "label"); });
  BOOST_CHECK_EXCEPTION((void)scores.to_vector(), std::exception, [](const std::exception& e) { return mentions(e, "label"); });
  try {
    wait_all();
  } catch (const std::exception&) {  // reported once more here
  }
}

// With dropout, each replay draws a new mask, the one the plain step would
// have drawn after the same seed: the same losses, scores and weights.
BOOST_AUTO_TEST_CASE(dropout_draws_a_new_mask_in_each_replay) {
  random::seed(51);
  const Batches b(6, 12);
  Twins twins(b.xs[0], nn::SGD{0.1f, 0.9f}, 0.5f);
  nn::TrainStep step(*twins.hybrid, nn::SoftmaxCrossEntropyLoss(), *twins.hybrid_trainer);
  // The twins draw from one generator: the same seed before each's steps.
  random::seed(52);
  std::vector<nn::TrainStep<nn::SoftmaxCrossEntropyLoss>::Output> hybrid;
  for (int i = 0; i < 6; ++i) hybrid.push_back(step(b.xs[i % 2], b.ys[i % 2]));
  const auto after_hybrid = random::uniform<float>(0, 1, {4}).to_vector();
  BOOST_TEST(step.replays() == 4);
  random::seed(52);
  std::vector<std::pair<Tensor<float>, Tensor<float>>> plain;
  for (int i = 0; i < 6; ++i) plain.push_back(twins.plain_step(b.xs[i % 2], b.ys[i % 2]));
  const auto after_plain = random::uniform<float>(0, 1, {4}).to_vector();
  expect_same_outputs(hybrid, plain, 1e-5);
  // Steps 2 and 4 replay on the same batch and weights that moved a little:
  // a fixed mask would give nearly the same scores, a new one does not.
  const auto s2 = hybrid[2].scores.to_vector(), s4 = hybrid[4].scores.to_vector();
  double moved = 0;
  for (std::size_t k = 0; k < s2.size(); ++k) moved = std::max(moved, double(std::abs(s2[k] - s4[k])));
  BOOST_TEST(moved > 0.1, "largest score change " << moved);
  for (std::size_t k = 0; k < after_plain.size(); ++k) BOOST_TEST(after_hybrid[k] == after_plain[k]);
  twins.expect_same_parameters(1e-5);
}

namespace {
// A Dense layer that also keeps a copy of its weight, made by a slow user
// function while the rest of the step runs (a chain of its own in a
// replay, which nothing in the step reads). The update of the weight, in
// place in a replay, must wait for that copy: the backward does not read
// the weight, so nothing else orders the two.
class SlowWeightReader : public nn::Block {
 public:
  std::shared_ptr<nn::Dense> dense = std::make_shared<nn::Dense>(5);
  Tensor<float> weight_seen;  // the weight this step's forward read
  SlowWeightReader() : nn::Block("slow_weight_reader") { add_child(dense); }
  Tensor<float> forward(const Tensor<float>& x) override {
    Tensor<float> scores = (*dense)(x);
    autograd::pause untracked;
    weight_seen = deft::map(
        [](float w) {
          std::this_thread::sleep_for(std::chrono::microseconds(500));
          return w;
        },
        dense->weight().data());
    return scores;
  }
};
}  // namespace

// The steps of a replay that write the trainer's state in place wait for
// the steps that read the value they overwrite.
BOOST_AUTO_TEST_CASE(an_update_waits_for_the_reads_of_the_value_it_overwrites) {
  random::seed(53);
  const Batches b(5, 12);
  SlowWeightReader hybrid, plain;
  hybrid.initialize(nn::init::normal(0.3f));
  plain.initialize(nn::init::normal(0.3f));
  (void)hybrid(b.xs[0]).to_vector();  // deferred initialization
  (void)plain(b.xs[0]).to_vector();
  const auto a = hybrid.collect_params(), c = plain.collect_params();
  for (std::size_t i = 0; i < a.size(); ++i) c[i]->set_data(a[i]->data().clone());
  nn::Trainer hybrid_trainer(a, nn::SGD{0.5f}), plain_trainer(c, nn::SGD{0.5f});
  nn::TrainStep step(hybrid, nn::SoftmaxCrossEntropyLoss(), hybrid_trainer);
  for (std::size_t i = 0; i < b.xs.size(); ++i) {
    BOOST_TEST_CONTEXT("step " << i) {
      const auto replayed = step(b.xs[i], b.ys[i]);
      Tensor<float> l, scores;
      {
        autograd::record rec;
        scores = plain(b.xs[i]);
        l = nn::SoftmaxCrossEntropyLoss()(scores, b.ys[i]);
        l.backward();
      }
      plain_trainer.step(12);
      expect_close(replayed.loss, l, 1e-5);
      expect_close(hybrid.weight_seen, plain.weight_seen, 1e-6);  // the weight before this step's update
    }
  }
  BOOST_TEST(step.traces() == 1);
  BOOST_TEST(step.replays() == 3);
  for (std::size_t i = 0; i < a.size(); ++i) BOOST_TEST_CONTEXT(a[i]->name()) expect_close(a[i]->data(), c[i]->data(), 1e-5);
}

// Data parallelism on two (logical CPU) devices: each part's forward and
// backward, the gradients' allreduce and the update, traced whole and
// replayed, against the same loop written out on a twin network; epochs of
// two full batches and a shorter one, without a sync between steps.
BOOST_AUTO_TEST_CASE(data_parallel_replays_match_the_plain_step) {
  random::seed(54);
  const std::vector<std::int64_t> rows = {12, 12, 5};
  DataParallelTwins twins(rows, 0.1f);
  auto& [two, xs, ys, hybrid, plain, a, b, hybrid_trainer, plain_trainer] = twins;
  nn::TrainStep step(*hybrid, nn::SoftmaxCrossEntropyLoss(), *hybrid_trainer);
  std::vector<std::vector<nn::TrainStep<nn::SoftmaxCrossEntropyLoss>::Output>> got;
  std::vector<std::vector<std::pair<Tensor<float>, Tensor<float>>>> want;
  for (int epoch = 0; epoch < 3; ++epoch)
    for (std::size_t s = 0; s < rows.size(); ++s) {
      got.push_back(step(xs[s], ys[s]));
      want.emplace_back(2);
      {
        autograd::record rec;
        for (std::size_t d = 0; d < 2; ++d) {
          Tensor<float> scores = (*plain)(xs[s][d]);
          Tensor<float> l = nn::SoftmaxCrossEntropyLoss()(scores, ys[s][d]);
          l.backward();
          want.back()[d] = {l.detach(), scores.detach()};
        }
      }
      plain_trainer->step(rows[s]);
    }
  BOOST_TEST(step.traces() == 2);
  BOOST_TEST(step.replays() == 6);
  for (std::size_t i = 0; i < got.size(); ++i)
    for (std::size_t d = 0; d < 2; ++d) {
      BOOST_TEST_CONTEXT("step " << i << ", part " << d) {
        BOOST_TEST(got[i][d].loss.device() == two[d]);
        BOOST_TEST(got[i][d].scores.device() == two[d]);
        expect_close(got[i][d].loss, want[i][d].first, 1e-5);
        expect_close(got[i][d].scores, want[i][d].second, 1e-5);
      }
    }
  twins.expect_same_parameters();
}

// An epoch's last batch of one row goes to cpu(0) alone: its trace (a part
// fewer) must sum cpu(0)'s gradient only, not cpu(1)'s from the batch
// before, in every replay. Against one device trained on the whole batches.
BOOST_AUTO_TEST_CASE(a_batch_on_fewer_devices_replays_without_the_old_gradient) {
  random::seed(55);
  const std::vector<Device> two = {cpu(0), cpu(1)};
  const std::vector<std::int64_t> rows = {10, 10, 1};
  std::vector<Tensor<float>> x;
  std::vector<Tensor<std::int64_t>> y;
  for (std::int64_t r : rows) {
    x.push_back(random::normal<float>(0, 1, {r, 8}));
    y.push_back(labels(r, 5));
  }
  auto hybrid = mlp(), plain = mlp();
  hybrid->initialize(nn::init::normal(0.3f), two);
  (void)(*hybrid)(x[0]).to_vector();  // deferred initialization
  (void)(*plain)(x[0]).to_vector();
  const auto a = hybrid->collect_params(), b = plain->collect_params();
  for (std::size_t i = 0; i < a.size(); ++i) b[i]->set_data(a[i]->data().clone());
  nn::Trainer hybrid_trainer(a, nn::SGD{0.1f, 0.9f}), plain_trainer(b, nn::SGD{0.1f, 0.9f});
  nn::TrainStep step(*hybrid, nn::SoftmaxCrossEntropyLoss(), hybrid_trainer);
  for (int epoch = 0; epoch < 3; ++epoch)
    for (std::size_t s = 0; s < rows.size(); ++s) {
      const std::vector<Device> used(two.begin(), two.begin() + std::min<std::int64_t>(rows[s], 2));
      const auto got = step(split_and_load(x[s], used), split_and_load(y[s], used));
      BOOST_TEST_REQUIRE(got.size() == used.size());
      {
        autograd::record rec;
        nn::SoftmaxCrossEntropyLoss()((*plain)(x[s]), y[s]).backward();
      }
      plain_trainer.step(rows[s]);
      BOOST_TEST_CONTEXT("epoch " << epoch << ", batch " << s) {
        for (std::size_t i = 0; i < a.size(); ++i)
          for (Device d : two) expect_close(a[i]->data(d), b[i]->data(), 1e-5);
      }
    }
  BOOST_TEST(step.traces() == 2);
  BOOST_TEST(step.replays() == 6);
}

// Clipping the summed gradients inside the trace: on two devices and two
// batch shapes, the replays train as the plain step written out with
// allreduce_grads, clip_global_norm and update, and the copies stay equal.
BOOST_AUTO_TEST_CASE(clipped_gradients_replay_like_the_written_out_step) {
  random::seed(56);
  const std::vector<std::int64_t> rows = {12, 12, 6};
  DataParallelTwins twins(rows, 0.5f);
  auto& [two, xs, ys, hybrid, plain, a, b, hybrid_trainer, plain_trainer] = twins;
  nn::TrainStep step(*hybrid, nn::SoftmaxCrossEntropyLoss(), *hybrid_trainer);
  constexpr float max_norm = 0.2f;
  step.set_max_grad_norm(max_norm);
  BOOST_TEST(step.max_grad_norm() == max_norm);
  BOOST_TEST(!step.grad_norm());  // no step yet
  int clipped = 0;
  std::vector<Tensor<float>> norms;  // each step's, as the TrainStep handed it out
  std::vector<float> read;           // their values, read at once
  for (int epoch = 0; epoch < 3; ++epoch)
    for (std::size_t s = 0; s < rows.size(); ++s) {
      (void)step(xs[s], ys[s]);
      const Tensor<float> traced_norm = step.grad_norm();
      {
        autograd::record rec;
        for (std::size_t d = 0; d < 2; ++d) nn::SoftmaxCrossEntropyLoss()((*plain)(xs[s][d]), ys[s][d]).backward();
      }
      plain_trainer->allreduce_grads();
      const float norm = nn::clip_global_norm(b, max_norm).item();
      clipped += norm > max_norm;
      plain_trainer->update(rows[s]);
      // The step hands out the norm it clipped by: the plain loop's, on the first device.
      BOOST_TEST(traced_norm.device() == two[0]);
      read.push_back(traced_norm.item());
      BOOST_TEST(read.back() == norm, boost::test_tools::tolerance(1e-5f));
      norms.push_back(traced_norm);
    }
  // Each call's norm has its own storage: later replays did not overwrite it.
  for (std::size_t k = 0; k < norms.size(); ++k) BOOST_TEST(norms[k].item() == read[k]);
  BOOST_TEST(clipped >= 5);  // the bound is met often enough to matter
  BOOST_TEST(step.traces() == 2);
  BOOST_TEST(step.replays() == 6);
  twins.expect_same_parameters();
  BOOST_CHECK_THROW(step.set_max_grad_norm(-1.0f), std::invalid_argument);
  BOOST_CHECK_THROW(step.set_max_grad_norm(std::nanf("")), std::invalid_argument);
  step.set_max_grad_norm(0.0f);  // no clipping: no norm
  (void)step(xs[0], ys[0]);
  BOOST_TEST(!step.grad_norm());
}

BOOST_AUTO_TEST_CASE(misuse_is_reported) {
  auto net = mlp();
  nn::Trainer trainer(net->collect_params(), nn::SGD{});
  nn::TrainStep step(*net, nn::SoftmaxCrossEntropyLoss(), trainer);
  net->hybridize();
  BOOST_CHECK_EXCEPTION(step(random::normal<float>(0, 1, {4, 8}), labels(4, 5)), std::logic_error,
                        [](const std::logic_error& e) { return mentions(e, "hybridized"); });
  BOOST_CHECK_EXCEPTION(nn::TrainStep(*net, nn::SoftmaxCrossEntropyLoss(), trainer, {.shapes = 0}),
                        std::invalid_argument, [](const std::invalid_argument& e) { return mentions(e, "shapes is 0"); });
  net->hybridize(false);
  BOOST_CHECK_EXCEPTION(step(std::vector<Tensor<float>>{random::normal<float>(0, 1, {4, 8})}, {}),
                        std::invalid_argument, [](const std::invalid_argument& e) { return mentions(e, "1 input parts and 0 label parts"); });
}

BOOST_AUTO_TEST_SUITE_END()
