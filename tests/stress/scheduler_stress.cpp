// Scheduler stress: four user threads record random task graphs at once
// (private tensors, tensors shared between threads, in-place updates, views,
// handle copies and drops), with sync points at random moments. Every read is
// checked against an exact integer model of deft's semantics, every task must
// be run or discarded exactly once, and unfinished work must stay within the
// configured bounds. DEFT_STRESS_TASKS sets the number of tasks (CI: 1e6).
#include <boost/test/unit_test.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "../common.hpp"
#include "stress_support.hpp"

namespace {

using deft::Tensor;
using Ints = std::vector<std::int64_t>;
constexpr std::int64_t kWidth = 8;  // elements per tensor
constexpr int kSlots = 12;  // tensors per thread

// deft's integer arithmetic wraps around like unsigned arithmetic.
std::int64_t wrap_add(std::int64_t a, std::int64_t b) { return std::int64_t(std::uint64_t(a) + std::uint64_t(b)); }
std::int64_t wrap_sub(std::int64_t a, std::int64_t b) { return std::int64_t(std::uint64_t(a) - std::uint64_t(b)); }
std::int64_t wrap_mul(std::int64_t a, std::int64_t b) { return std::int64_t(std::uint64_t(a) * std::uint64_t(b)); }

/// A tensor handle and the model of its value. Handles that share storage
/// share the model vector, so in-place updates show through both, as in deft.
struct Slot {
  Tensor<std::int64_t> t;
  std::shared_ptr<Ints> model;
};

Slot fresh_slot(std::mt19937_64& rng) {
  Ints v(kWidth);
  for (auto& x : v) x = std::int64_t(rng() % 2001) - 1000;
  return Slot{Tensor<std::int64_t>(v, {kWidth}), std::make_shared<Ints>(v)};
}

template <class F>
Ints zip(const Ints& a, const Ints& b, F f) {
  Ints r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = f(a[i], b[i]);
  return r;
}

struct Shared {
  std::array<Tensor<std::int64_t>, 2> acc;  // every thread adds into these
  std::array<Ints, 2> initial;
};

struct ThreadResult {
  std::array<Ints, 2> added{Ints(kWidth, 0), Ints(kWidth, 0)};  // what this thread added to each accumulator
  std::int64_t checks = 0, statements = 0;
  std::string failure;  // first mismatch, empty when all reads were right
};

void check(ThreadResult& r, const Slot& s, const char* where) {
  ++r.checks;
  const Ints got = s.t.to_vector();
  if (got != *s.model && r.failure.empty()) {
    std::ostringstream os;
    os << where << ": read " << got[0] << ", " << got[1] << "... expected " << (*s.model)[0] << ", " << (*s.model)[1]
       << "...";
    r.failure = os.str();
  }
}

void user_thread(std::uint64_t seed, std::int64_t statements, Shared& shared, ThreadResult& r) {
  std::mt19937_64 rng(seed);
  std::vector<Slot> slots;
  for (int i = 0; i < kSlots; ++i) slots.push_back(fresh_slot(rng));
  auto pick = [&] { return std::size_t(rng() % kSlots); };
  for (std::int64_t n = 0; n < statements; ++n) {
    Slot& k = slots[pick()];
    const Slot& i = slots[pick()];
    const Slot& j = slots[pick()];
    switch (rng() % 16) {
      case 0: case 1: case 2:  // rebind: k may be i or j (an assignment aliasing its input)
        { Ints m = zip(*i.model, *j.model, wrap_add); k.t = i.t + j.t; k.model = std::make_shared<Ints>(std::move(m)); }
        break;
      case 3: case 4: {
        const std::int64_t c = std::int64_t(rng() % 7) - 3;
        Ints m = zip(*i.model, *j.model, [c](auto a, auto b) { return wrap_add(wrap_mul(a, c), b); });
        k.t = i.t * c + j.t;
        k.model = std::make_shared<Ints>(std::move(m));
        break;
      }
      case 5:
        { Ints m = zip(*i.model, *j.model, wrap_sub); k.t = i.t - j.t; k.model = std::make_shared<Ints>(std::move(m)); }
        break;
      case 6:
        { Ints m = zip(*i.model, *j.model, [](auto a, auto b) { return a > b ? a : b; });
          k.t = deft::where(i.t > j.t, i.t, j.t); k.model = std::make_shared<Ints>(std::move(m)); }
        break;
      case 7: case 8: {  // in place, seen by every handle sharing k's storage
        const Ints add = *i.model;
        k.t += i.t;
        *k.model = zip(*k.model, add, wrap_add);
        break;
      }
      case 9: {  // a reduction feeding an elementwise op (two tasks)
        std::int64_t total = 0;
        for (auto v : *j.model) total = wrap_add(total, v);
        Ints m(kWidth);
        for (std::int64_t e = 0; e < kWidth; ++e) m[e] = wrap_add((*i.model)[e], total);
        k.t = i.t + deft::sum(j.t);
        k.model = std::make_shared<Ints>(std::move(m));
        break;
      }
      case 10: {  // write through a view: rows [b, e) of k take rows [0, e-b) of i
        const std::int64_t b = std::int64_t(rng() % kWidth), e = b + 1 + std::int64_t(rng() % (kWidth - b));
        const Ints src = *i.model;
        k.t.rows(b, e).assign(i.t.rows(0, e - b));
        for (std::int64_t x = b; x < e; ++x) (*k.model)[x] = src[x - b];
        break;
      }
      case 11:  // another handle on the same storage
        k = i;
        break;
      case 12:  // drop the handle and start over
        k.t = Tensor<std::int64_t>();
        k = fresh_slot(rng);
        break;
      case 13: {  // add into a tensor every thread updates
        const int a = int(rng() % 2);
        shared.acc[a] += i.t;
        r.added[a] = zip(r.added[a], *i.model, wrap_add);
        break;
      }
      case 14:  // read a shared tensor: a dependency across threads with a known result
        { Ints m = *i.model; k.t = shared.acc[rng() % 2] * 0 + i.t; k.model = std::make_shared<Ints>(std::move(m)); }
        break;
      default:  // sync points at random moments
        if (rng() % 4 == 0) check(r, k, "to_vector");
        else if (rng() % 256 == 0) deft::wait_all();
        else if (rng() % 8 == 0) std::this_thread::yield();
        break;
    }
    ++r.statements;
  }
  for (const auto& s : slots) check(r, s, "final read");
}

struct StressFigures {
  std::uint64_t tasks = 0;
  double seconds = 0;
};

StressFigures run_stress(std::int64_t target_tasks, std::uint64_t seed, const deft::engine::Limits& limits) {
  const int kThreads = int(stress::env_count("DEFT_STRESS_THREADS", 4));
  dt::LimitsGuard guard(limits);
  deft::engine::reset_stats();
  const std::size_t allocated_before = deft::engine::stats().bytes_allocated;
  // About 0.875 tasks per statement (reductions record two; syncs, handle
  // copies and fresh tensors none): 1.2 statements per task reaches the target.
  const std::int64_t per_thread = target_tasks * 6 / 5 / kThreads;
  std::vector<ThreadResult> results(kThreads);
  const auto start = std::chrono::steady_clock::now();
  {
    std::mt19937_64 rng(seed);
    Shared shared;
    for (int a = 0; a < 2; ++a) {
      Slot s = fresh_slot(rng);
      shared.acc[a] = s.t;
      shared.initial[a] = *s.model;
    }
    {
      stress::Watchdog dog("scheduler stress", std::chrono::seconds(stress::env_count("DEFT_STRESS_TIMEOUT", 600)));
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back(user_thread, seed * 1000 + t, per_thread, std::ref(shared), std::ref(results[t]));
      for (auto& th : threads) th.join();
      deft::wait_all();
    }
    for (int a = 0; a < 2; ++a) {
      Ints expected = shared.initial[a];
      for (const auto& r : results) expected = zip(expected, r.added[a], wrap_add);
      BOOST_TEST((shared.acc[a].to_vector() == expected), "accumulator " << a << " lost or doubled an update");
    }
  }  // every handle is gone: all recorded work is run or discarded
  deft::wait_all();
  StressFigures fig;
  fig.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::int64_t checks = 0;
  for (const auto& r : results) {
    BOOST_TEST(r.failure.empty(), r.failure);
    checks += r.checks;
  }
  const auto s = deft::engine::stats();
  fig.tasks = s.tasks_recorded;
  BOOST_TEST(s.tasks_failed == 0u);
  BOOST_TEST(s.tasks_skipped == 0u);
  BOOST_TEST(s.tasks_run + s.tasks_discarded == s.tasks_recorded, "each task runs once or is discarded: " << s);
  BOOST_TEST(s.tasks_pending == 0u);
  BOOST_TEST(s.bytes_pending == 0u);
  BOOST_TEST(s.bytes_allocated == allocated_before, "tensor storage leaked: " << s);
  // Unfinished work never exceeded the bounds by more than what the
  // threads can add between a check and a wait (one statement each).
  const std::size_t slack_tasks = 2 * kThreads + 4;
  const std::size_t task_bytes = kWidth * sizeof(std::int64_t);
  BOOST_TEST(s.peak_tasks_pending <= limits.max_inflight_tasks + limits.max_recorded_tasks + slack_tasks, s);
  BOOST_TEST(s.peak_bytes_pending <= limits.max_inflight_bytes + limits.max_recorded_bytes + slack_tasks * task_bytes, s);
  std::cout << "scheduler stress: " << s.tasks_recorded << " tasks from " << kThreads << " threads in " << fig.seconds
            << " s (" << 1e9 * fig.seconds / double(s.tasks_recorded) << " ns/task), " << checks
            << " reads checked; " << s << "\n";
  return fig;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(scheduler_stress)

BOOST_FIXTURE_TEST_CASE(million_tasks_from_four_threads, dt::DeferredFixture) {
  const auto tasks = stress::env_count("DEFT_STRESS_TASKS", 1'000'000);
  const auto fig = run_stress(tasks, stress::env_seed(1), deft::engine::Limits{});
  BOOST_TEST(fig.tasks >= std::uint64_t(tasks));
}

// Tight bounds: recording threads flush and wait all the time.
BOOST_FIXTURE_TEST_CASE(under_tight_bounds, dt::DeferredFixture) {
  deft::engine::Limits tight;
  tight.max_recorded_tasks = 8;
  tight.max_recorded_bytes = 1024;
  tight.max_inflight_tasks = 32;
  tight.max_inflight_bytes = 4096;
  const auto tasks = stress::env_count("DEFT_STRESS_TASKS", 1'000'000) / 4;
  run_stress(tasks, stress::env_seed(1) + 7, tight);
}

BOOST_AUTO_TEST_SUITE_END()
