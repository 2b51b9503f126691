// Leaves main with deferred work in every state: recorded and never
// submitted, submitted by a small flush bound and possibly still running, a
// failed task nobody synced, and a tensor with static storage duration that is
// destroyed after the engine shut down. The process must exit with status 0,
// without crashing or hanging (CTest enforces a timeout).
#include <cstdio>
#include <stdexcept>
#include <vector>

#include <deft/deft.hpp>

namespace {
// Destroyed during static destruction, after the engine's atexit shutdown.
deft::Tensor<float> outlives_main;
}  // namespace

int main() {
  namespace engine = deft::engine;
  // Small bounds, so that the states below do not depend on the inputs' size:
  // the flush bound submits most of the work, and the in-flight bound makes
  // main wait while some of it runs (the failing task included).
  engine::set_limits(engine::Limits{.max_recorded_tasks = 4, .max_inflight_tasks = 2});

  // Inputs large enough that work is still running when main returns, and
  // small enough for the sanitizers at -O0; themselves deferred.
  const deft::Tensor<float> x = deft::random::uniform<float>(-1, 1, {1 << 20});
  const deft::Tensor<float> m = deft::random::normal<float>(0, 1, {400, 400});

  // Long elementwise chains; the flush bound submits most of them to the workers.
  std::vector<deft::Tensor<float>> pending;
  for (int i = 0; i < 6; ++i) pending.push_back(deft::exp(x * float(i) * 0.01f) + deft::tanh(x));
  // Products that are still running when main returns.
  for (int i = 0; i < 3; ++i) pending.push_back(deft::dot(m, m));
  // A failing task submitted by the bound, never synced.
  engine::set_limits(engine::Limits{.max_recorded_tasks = 1, .max_inflight_tasks = 2});
  pending.push_back(deft::detail::record_new<float>(
      "boom", deft::Shape{1 << 20}, deft::cpu(), [](deft::detail::Buffer&) { throw std::runtime_error("boom"); },
      [](deft::detail::Task&) {}));
  pending.push_back(pending.back() + 1);

  // Recorded, never submitted (below the bound).
  engine::set_limits(engine::Limits{});
  deft::Tensor<float> last = deft::sum(x * x);
  outlives_main = deft::dot(m, m) + 1;
  last += 1;

  std::puts("exit_pending: returning from main with work pending");
  return 0;
}
