// The seeds' memory experiment without a sync point: a training loop that
// never waits (10,000 steps of a two-layer MLP trained by hand-written
// backpropagation on a 256 x 64 batch). MXNet's engine queues every step and
// the process grows; deft's bounds make the recording thread wait instead, so
// the engine's unfinished bytes stay under the configured bound and the
// process's memory stays flat. DEFT_MEMORY_STEPS sets the number of steps.
#include <boost/test/unit_test.hpp>

#include <cmath>

#include "../common.hpp"
#include "stress_support.hpp"

namespace {

using deft::Tensor;

constexpr bool kAddressSanitizer = DEFT_ASAN != 0;

struct Mlp {
  Tensor<float> w1, b1, w2, b2;
};

/// One SGD step on the batch (x, y); returns the loss as a deferred scalar.
Tensor<float> train_step(Mlp& net, const Tensor<float>& x, const Tensor<float>& y, float lr) {
  const float n = float(x.shape()[0]);
  Tensor<float> pre = deft::matmul(x, net.w1) + net.b1;      // (256, 128)
  Tensor<float> h = deft::relu(pre);
  Tensor<float> out = deft::matmul(h, net.w2) + net.b2;      // (256, 1)
  Tensor<float> err = out - y;
  Tensor<float> loss = deft::sum(err * err) * (0.5f / n);
  Tensor<float> d_out = err * (1.f / n);
  Tensor<float> g_w2 = deft::matmul(deft::transpose(h), d_out);
  Tensor<float> g_b2 = deft::sum(d_out, 0);
  Tensor<float> d_h = deft::where(pre > 0.f, deft::matmul(d_out, deft::transpose(net.w2)), 0.f);
  Tensor<float> g_w1 = deft::matmul(deft::transpose(x), d_h);
  Tensor<float> g_b1 = deft::sum(d_h, 0);
  net.w1 -= g_w1 * lr;
  net.b1 -= g_b1 * lr;
  net.w2 -= g_w2 * lr;
  net.b2 -= g_b2 * lr;
  return loss;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(memory_bound)

BOOST_FIXTURE_TEST_CASE(training_loop_without_sync, dt::DeferredFixture) {
  const auto steps = stress::env_count("DEFT_MEMORY_STEPS", 10'000);
  deft::random::seed(42);
  // A teacher network makes the targets, so the loss can fall well below its start.
  Tensor<float> x = deft::random::normal<float>(0, 1, {256, 64});
  Tensor<float> teacher = deft::random::normal<float>(0, 0.2, {64, 1});
  Tensor<float> y = deft::tanh(deft::matmul(x, teacher));
  Mlp net{deft::random::normal<float>(0, 0.1, {64, 128}), deft::zeros<float>({128}),
          deft::random::normal<float>(0, 0.1, {128, 1}), deft::zeros<float>({1})};
  const float first_loss = train_step(net, x, y, 0.05f).item();
  deft::wait_all();
  const auto limits = deft::engine::limits();
  deft::engine::reset_stats();
  const std::size_t rss_before = stress::resident_bytes();
  Tensor<float> loss;
  {
    stress::Watchdog dog("training loop", std::chrono::seconds(stress::env_count("DEFT_STRESS_TIMEOUT", 600)));
    for (std::int64_t i = 0; i < steps; ++i) loss = train_step(net, x, y, 0.05f);  // no sync point
  }
  const auto during = deft::engine::stats();  // before anything waits
  const std::size_t rss_after_recording = stress::resident_bytes();
  const float last_loss = loss.item();
  const auto s = deft::engine::stats();
  const double mib = 1.0 / (1 << 20);
  const double growth = (double(rss_after_recording) - double(rss_before)) * mib;
  std::cout << "memory bound: " << steps << " steps without a sync point recorded " << s.tasks_recorded
            << " tasks; peak unfinished work " << s.peak_tasks_pending << " tasks / " << double(s.peak_bytes_pending) * mib
            << " MiB (bound " << limits.max_inflight_tasks + limits.max_recorded_tasks << " tasks / "
            << double(limits.max_inflight_bytes + limits.max_recorded_bytes) * mib << " MiB), "
            << s.backpressure_waits << " backpressure waits; process RSS " << double(rss_before) * mib << " -> "
            << double(rss_after_recording) * mib << " MiB (growth " << growth << " MiB); loss " << first_loss
            << " -> " << last_loss << "\n";
  BOOST_TEST(during.tasks_recorded >= std::uint64_t(steps) * 10u);
  BOOST_TEST(s.peak_tasks_pending <= limits.max_inflight_tasks + limits.max_recorded_tasks + 1, s);
  BOOST_TEST(s.peak_bytes_pending <= limits.max_inflight_bytes + limits.max_recorded_bytes, s);
  // Growth of the process: the bounded work in flight plus allocator slack; an
  // engine that queued every step would hold steps * ~300 KiB here. (Not under
  // AddressSanitizer, whose quarantine keeps up to 256 MiB of freed memory.)
  if (!kAddressSanitizer) BOOST_TEST(growth < 64.0, "RSS grew by " << growth << " MiB");
  BOOST_TEST(std::isfinite(last_loss));
  if (steps >= 1000) BOOST_TEST(last_loss < 0.5f * first_loss, "training did not progress: " << first_loss << " -> " << last_loss);
}

BOOST_AUTO_TEST_SUITE_END()
