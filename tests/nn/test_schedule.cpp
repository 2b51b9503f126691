// Learning-rate schedules: the multipliers against their formulas, on the
// host and mapped over the count a device keeps, and a scheduled Trainer's
// updates against a double loop of SGD and Adam at those rates.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <deft/nn.hpp>

#include "nn_support.hpp"

using namespace deft;
using nn_test::mentions;

namespace {

// The multipliers as PyTorch documents them, written out for update t.
double step_formula(std::int64_t t, std::int64_t every, double gamma) { return std::pow(gamma, double(t / every)); }
double cosine_formula(std::int64_t t, std::int64_t total, double final_ratio) {
  const double u = double(std::min(t, total));
  return final_ratio + (1 - final_ratio) * (1 + std::cos(std::numbers::pi * u / double(total))) / 2;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(schedules)

BOOST_AUTO_TEST_CASE(multipliers_follow_their_formulas_on_the_host_and_the_device) {
  struct Case {
    const char* name;
    nn::LRSchedule schedule;
    double (*want)(std::int64_t);
  };
  const Case cases[] = {
      {"constant", nn::schedule::constant(), [](std::int64_t) { return 1.0; }},
      {"step", nn::schedule::step(3, 0.5), [](std::int64_t t) { return step_formula(t, 3, 0.5); }},
      {"cosine", nn::schedule::cosine(10, 0.05), [](std::int64_t t) { return cosine_formula(t, 10, 0.05); }},
      {"warm-up then cosine", nn::schedule::warmup(4, nn::schedule::cosine(10)),
       [](std::int64_t t) { return t < 4 ? double(t + 1) / 4 : cosine_formula(t - 4, 10, 0); }},
      {"warm-up then step", nn::schedule::warmup(2, nn::schedule::step(5, 0.1)),
       [](std::int64_t t) { return t < 2 ? double(t + 1) / 2 : step_formula(t - 2, 5, 0.1); }},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      for (std::int64_t t = 0; t < 20; ++t) {
        const double want = c.want(t);
        BOOST_TEST(std::abs(c.schedule.multiplier(t) - want) <= 1e-15, "host, update " << t);
        // As Trainer computes it on a device: the function mapped over a 0-d count.
        const double device = Tensor<float>(map(deft::detail::ScheduledRate{c.schedule, 1.0}, full<double>(Shape{}, double(t)))).item();
        BOOST_TEST(std::abs(device - want) <= 1e-7 * want, "device, update " << t << ": " << device << " vs " << want);
      }
    }
  }
  BOOST_CHECK_EXCEPTION(nn::schedule::step(0, 0.5), std::invalid_argument, [](const auto& e) { return mentions(e, "period"); });
  BOOST_CHECK_EXCEPTION(nn::schedule::step(2, 0.0), std::invalid_argument, [](const auto& e) { return mentions(e, "factor"); });
  BOOST_CHECK_EXCEPTION(nn::schedule::cosine(0), std::invalid_argument, [](const auto& e) { return mentions(e, "length"); });
  BOOST_CHECK_EXCEPTION(nn::schedule::cosine(5, 1.5), std::invalid_argument, [](const auto& e) { return mentions(e, "1.5"); });
  BOOST_CHECK_EXCEPTION(nn::schedule::warmup(-1), std::invalid_argument, [](const auto& e) { return mentions(e, "-1"); });
}

// SGD with momentum and Adam under a schedule, against a double loop whose
// rate at update t is the base rate times the formula's multiplier.
BOOST_AUTO_TEST_CASE(a_scheduled_trainer_updates_at_the_scheduled_rate) {
  random::seed(5);
  for (int which = 0; which < 2; ++which) {
    BOOST_TEST_CONTEXT((which == 0 ? "SGD" : "Adam")) {
      nn::Dense layer(3);
      layer.initialize();
      const Tensor<float> x = random::normal<float>(0, 1, {8, 4});
      (void)layer(x).to_vector();
      std::vector<nn::Parameter*> params = layer.collect_params();
      const float base = which == 0 ? 0.1f : 0.01f;
      nn::Trainer trainer(params, which == 0 ? std::variant<nn::SGD, nn::Adam>(nn::SGD{base, 0.9f})
                                             : std::variant<nn::SGD, nn::Adam>(nn::Adam{base}));
      trainer.set_schedule(nn::schedule::warmup(2, nn::schedule::cosine(3, 0.1)));
      const auto w0 = params[0]->data().to_vector();
      std::vector<double> w(w0.begin(), w0.end());
      nn_test::ReferenceUpdate reference{which == 0 ? nn_test::ReferenceUpdate::sgd : nn_test::ReferenceUpdate::adam};
      for (int t = 0; t < 7; ++t) {
        const double lr = double(base) * (t < 2 ? double(t + 1) / 2 : cosine_formula(t - 2, 3, 0.1));
        BOOST_TEST(std::abs(trainer.scheduled_learning_rate() - lr) <= 1e-7 * lr);
        {
          autograd::record rec;
          Tensor<float> l = sum(layer(x) * layer(x));
          l.backward();
        }
        const auto g = params[0]->grad().to_vector();
        trainer.step(8);
        reference.apply(w, g, 8.0, lr, t + 1);
        const auto now = params[0]->data().to_vector();
        for (std::size_t i = 0; i < w.size(); ++i) {
          BOOST_TEST(std::abs(now[i] - w[i]) <= 1e-5 * std::max(1.0, std::abs(w[i])), "update " << t << " [" << i << "]");
          w[i] = now[i];  // follow deft's float values
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
