// What tensor_checks.hpp and random_checks.hpp share: random inputs, an
// elementwise comparison, and the runner's count of lane races.
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <deft/deft.hpp>

namespace gpu_tensors {

using deft::Shape;
using deft::Tensor;
using i64 = std::int64_t;

template <class T = float>
std::vector<T> random_values(i64 n, unsigned seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> pick(lo, hi);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = T(pick(gen));
  return v;
}

template <class T>
void expect_near(const std::vector<T>& got, const std::vector<double>& want, double tol, const char* what) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= tol * std::max(1.0, std::abs(want[i]))))
      BOOST_FAIL(what << ": element " << i << " is " << got[i] << ", want " << want[i] << " (tolerance " << tol << ")");
}

/// The host and up to two GPUs: the devices a random program draws from.
inline std::vector<deft::Device> host_and_gpus() {
  std::vector<deft::Device> devices = {deft::cpu()};
  for (int g = 0; g < std::min(deft::num_gpus(), 2); ++g) devices.push_back(deft::gpu(g));
  return devices;
}

/// Lane races the runner's backend saw so far (the emulation's clock
/// checker; 0 where nothing checks). Each runner defines it.
long lane_races();

/// A random test's hold on the engine: each program picks its mode and
/// workers; the end of the test (a failed check too) puts back the mode and
/// worker count it found, then checks that the runner saw no new lane race.
class EngineForPrograms {
 public:
  EngineForPrograms() : mode_(deft::engine::mode()), workers_(deft::engine::num_workers()), races_(lane_races()) {}
  EngineForPrograms(const EngineForPrograms&) = delete;
  EngineForPrograms& operator=(const EngineForPrograms&) = delete;
  ~EngineForPrograms() {
    deft::engine::set_mode(mode_);
    deft::engine::set_num_workers(workers_);
    BOOST_TEST(lane_races() == races_);
  }
  /// The next program runs synchronously, or deferred on `workers` workers.
  void run_next(bool synchronous, int workers) {
    deft::engine::set_mode(synchronous ? deft::engine::Mode::synchronous : deft::engine::Mode::deferred);
    if (!synchronous) deft::engine::set_num_workers(workers);
  }

 private:
  deft::engine::Mode mode_;
  int workers_;
  long races_;
};

}  // namespace gpu_tensors
