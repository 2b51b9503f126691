// Learning-rate schedules. Update t (0 for the first) uses the optimizer's
// learning_rate times multiplier(t). Trainer evaluates the multiplier on
// each device from a step count it keeps there, as data: a TrainStep's
// replays advance it like step() does, so a schedule never traces again.
// The same scalar function serves the host and the devices.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "../core/config.hpp"
#include "../core/error.hpp"

namespace deft::nn {

/// A multiplier of the learning rate per update: a linear warm-up, then
/// step decay, cosine decay or neither. Build one with schedule::step,
/// schedule::cosine and schedule::warmup.
///
/// Every form is one formula, m(u) = (a + b * cos(c * min(u, cap))) * gamma^floor(u / every)
/// of the updates u since the warm-up.
struct LRSchedule {
  std::int64_t warmup = 0;  ///< updates of linear warm-up first: update t < warmup uses (t + 1) / warmup
  double a = 1;  ///< the multiplier's constant term
  double b = 0;  ///< the cosine's amplitude
  double c = 0;  ///< the cosine's frequency, per update
  double cap = 0;          ///< the update after which a cosine stays at its final value
  double gamma = 1;        ///< step decay's factor
  std::int64_t every = 1;  ///< step decay's period, in updates

  /// The multiplier of update t (an integer), in double: on the host, and
  /// on each device inside the step (where cos and pow may differ in the
  /// last bit).
  DEFT_HD double multiplier(double t) const {
    using std::cos, std::floor, std::fmin, std::pow;
    if (t < double(warmup)) return (t + 1) / double(warmup);
    const double u = t - double(warmup);
    return (a + b * cos(c * fmin(u, cap))) * pow(gamma, floor(u / double(every)));
  }
  /// Whether every update uses the base rate (no schedule).
  bool is_constant() const { return warmup == 0 && b == 0 && gamma == 1; }
};

namespace schedule {

/// The base rate throughout.
inline LRSchedule constant() { return {}; }

/// gamma^floor(u / every) (PyTorch's StepLR, counted in updates).
inline LRSchedule step(std::int64_t every, double gamma) {
  if (every < 1) deft::detail::raise("schedule::step: the period must be at least 1 update, got ", every);
  if (!(gamma > 0) || !std::isfinite(gamma))
    deft::detail::raise("schedule::step: the factor must be positive and finite, got ", gamma);
  LRSchedule s;
  s.every = every;
  s.gamma = gamma;
  return s;
}

/// From 1 down to final_ratio over `total` updates along half a cosine,
/// then final_ratio (PyTorch's CosineAnnealingLR without restarts, with
/// eta_min = final_ratio * the base rate).
inline LRSchedule cosine(std::int64_t total, double final_ratio = 0) {
  if (total < 1) deft::detail::raise("schedule::cosine: the length must be at least 1 update, got ", total);
  if (!(final_ratio >= 0 && final_ratio <= 1))
    deft::detail::raise("schedule::cosine: the final ratio must be in [0, 1], got ", final_ratio);
  LRSchedule s;
  s.b = (1 - final_ratio) / 2;
  s.a = final_ratio + s.b;
  s.c = std::numbers::pi / double(total);
  s.cap = double(total);
  return s;
}

/// `steps` updates rising linearly to the base rate ((t + 1) / steps),
/// then `after`, counted from the end of the warm-up.
inline LRSchedule warmup(std::int64_t steps, LRSchedule after = constant()) {
  if (steps < 0) deft::detail::raise("schedule::warmup: the length must not be negative, got ", steps);
  after.warmup = steps;
  return after;
}

}  // namespace schedule
}  // namespace deft::nn

namespace deft::detail {
/// The rate of the update a 0-d tensor counts, as a float: what Trainer
/// maps that count to on each device (one scalar call, no vector kernel).
/// (At namespace scope: nvcc cannot launch kernels on private member types.)
struct ScheduledRate {
  nn::LRSchedule schedule;
  double base;
  DEFT_HD float operator()(double update) const { return float(schedule.multiplier(update) * base); }
};
}  // namespace deft::detail
