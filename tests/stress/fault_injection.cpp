// Fault injection: random programs run while an installed host allocator
// fails every Nth allocation and some statements apply a function that throws.
// Checked: a sync point rethrows exactly when the value it reads depends on a
// failed task (the model tracks which values do), values that do not depend on
// one are right, every failure is counted as exactly one failed task, nothing
// leaks, nothing hangs, and the engine computes correctly afterwards.
// DEFT_FAULT_PROGRAMS sets the number of programs.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "../common.hpp"
#include "stress_support.hpp"

namespace {

using deft::Tensor;
using Values = std::vector<double>;

struct InjectedFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Fails every `every`-th allocation (0: none) by throwing std::bad_alloc.
class FailingAllocator final : public deft::engine::HostAllocator {
 public:
  explicit FailingAllocator(std::uint64_t every) : every_(every) {}
  void* allocate(std::size_t bytes, std::size_t alignment) override {
    if (every_ && ++count_ % every_ == 0) {
      ++failed_;
      throw std::bad_alloc();
    }
    return base_.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept override {
    base_.deallocate(p, bytes, alignment);
  }
  std::uint64_t failed() const { return failed_.load(); }

 private:
  deft::engine::DefaultHostAllocator base_;
  std::uint64_t every_;
  std::atomic<std::uint64_t> count_{0}, failed_{0};
};

/// Which statements' functions threw (a task fails once however many of its
/// parallel chunks throw).
struct ThrowLog {
  std::mutex m;
  std::set<int> statements;
  void add(int s) {
    std::lock_guard lk(m);
    statements.insert(s);
  }
};

/// The function of `map` statements: v/2 + 1/4, or a throw when `fail`.
struct HalfPlusQuarter {
  bool fail;
  int statement;
  ThrowLog* log;
  float operator()(float v) const {
    if (fail) {
      log->add(statement);
      throw InjectedFault("injected fault in statement " + std::to_string(statement));
    }
    return v * 0.5f + 0.25f;
  }
};

/// The model of one storage: its values, and whether reading it must fail
/// (it depends on a throwing statement) or may fail (it may depend on a
/// failed allocation).
struct Model {
  Values v;
  bool must_fail = false;
  bool may_fail = false;
};
struct ModelSlot {
  Tensor<float> t;
  std::shared_ptr<Model> m;
};

struct Figures {
  std::uint64_t programs = 0, statements = 0, alloc_faults = 0, ctor_faults = 0, throwing_statements = 0;
  std::uint64_t syncs_threw = 0, syncs_checked = 0;
};

class Program {
 public:
  Program(std::uint64_t seed, Figures& fig) : rng_(seed), fig_(fig) {
    const std::int64_t sizes[] = {1, 7, 300, 70'000};  // the last crosses the parallel threshold
    n_ = sizes[rng_() % 4];
    const std::uint64_t every[] = {0, 0, 3, 5, 11, 40};  // one program in three without allocation faults
    every_ = every[rng_() % 6];
  }

  void run() {
    for (int i = 0; i < 6; ++i) slots_.push_back(fresh());
    auto alloc = std::make_shared<FailingAllocator>(every_);
    auto previous = deft::engine::set_host_allocator(alloc);
    const std::int64_t base_failed = std::int64_t(deft::engine::stats().tasks_failed);
    const int statements = 40;
    for (int s = 0; s < statements; ++s) step(s);
    // A final read of everything, then the allocator goes back.
    for (auto& slot : slots_) sync(slot, "final read");
    try {
      deft::wait_all();
    } catch (const InjectedFault&) {
    } catch (const std::bad_alloc&) {
    }
    deft::wait_all();  // a failure is reported once
    deft::engine::set_host_allocator(previous);
    // Each failure is one failed task: a failed allocation inside a task (not
    // in a constructor, which throws at once), or a statement whose function threw.
    const std::int64_t failed = std::int64_t(deft::engine::stats().tasks_failed) - base_failed;
    const std::int64_t in_tasks = std::int64_t(alloc->failed() - ctor_failures_);
    BOOST_TEST(failed == in_tasks + std::int64_t(throws_.statements.size()),
               "failed tasks " << failed << " vs " << in_tasks << " allocation faults in tasks and "
                               << throws_.statements.size() << " throwing statements");
    fig_.alloc_faults += alloc->failed();
    fig_.ctor_faults += ctor_failures_;
    fig_.throwing_statements += throws_.statements.size();
    fig_.statements += statements;
    ++fig_.programs;
  }

 private:
  ModelSlot fresh() {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> v(std::size_t(n_), 0.f);
    for (auto& x : v) x = u(rng_);
    return ModelSlot{Tensor<float>(v, {n_}), std::make_shared<Model>(Model{Values(v.begin(), v.end())})};
  }

  // A new model computed from inputs: it fails if any input must fail.
  static std::shared_ptr<Model> derived(Values v, std::initializer_list<const Model*> inputs) {
    auto m = std::make_shared<Model>(Model{std::move(v)});
    for (auto* in : inputs) {
      m->must_fail |= in->must_fail;
      m->may_fail |= in->may_fail;
    }
    return m;
  }

  // Any statement that runs a task may hit a failing allocation.
  void may_fail(Model& m) const { m.may_fail |= every_ != 0; }

  void step(int s) {
    ModelSlot& k = slots_[rng_() % slots_.size()];
    const ModelSlot& i = slots_[rng_() % slots_.size()];
    const ModelSlot& j = slots_[rng_() % slots_.size()];
    const std::size_t n = std::size_t(n_);
    switch (rng_() % 9) {
      case 0: case 1: {  // the mean of two tensors
        Values v(n);
        for (std::size_t e = 0; e < n; ++e) v[e] = (i.m->v[e] + j.m->v[e]) * 0.5;
        auto m = derived(std::move(v), {i.m.get(), j.m.get()});
        k.t = (i.t + j.t) * 0.5f;
        k.m = m;
        may_fail(*k.m);
        break;
      }
      case 2: case 3: {  // a user function, which throws in one statement in four
        const bool fail = rng_() % 4 == 0;
        Values v(n);
        for (std::size_t e = 0; e < n; ++e) v[e] = i.m->v[e] * 0.5 + 0.25;
        auto m = derived(std::move(v), {i.m.get()});
        m->must_fail |= fail;
        k.t = deft::map(HalfPlusQuarter{fail, s, &throws_}, i.t);
        k.m = m;
        may_fail(*k.m);
        break;
      }
      case 4: {  // in place: a failed input poisons the storage for every handle
        const Model in = *i.m;
        k.t -= i.t * 0.5f;
        for (std::size_t e = 0; e < n; ++e) k.m->v[e] -= in.v[e] * 0.5;
        k.m->must_fail |= in.must_fail;
        k.m->may_fail |= in.may_fail;
        may_fail(*k.m);
        break;
      }
      case 5: {  // a reduction feeding an elementwise op
        double total = 0;
        for (double x : j.m->v) total += std::abs(x);
        Values v(n);
        for (std::size_t e = 0; e < n; ++e) v[e] = i.m->v[e] - total / double(n);
        auto m = derived(std::move(v), {i.m.get(), j.m.get()});
        k.t = i.t - deft::mean(deft::abs(j.t));
        k.m = m;
        may_fail(*k.m);
        break;
      }
      case 6:  // another handle on the same storage
        k = i;
        break;
      case 7:  // a fresh tensor (allocated at once: may throw here)
        try {
          k = fresh();
        } catch (const std::bad_alloc&) {
          ++ctor_failures_;
        }
        break;
      default:
        sync(slots_[rng_() % slots_.size()], "to_vector");
        break;
    }
  }

  void sync(ModelSlot& s, const char* where) {
    try {
      const auto got = s.t.to_vector();
      ++fig_.syncs_checked;
      BOOST_TEST(!s.m->must_fail, where << " returned a value that depends on a throwing statement");
      const double tol = 1e-5 * (1 + double(n_) * 1e-3);
      for (std::size_t e = 0; e < got.size(); ++e)
        if (std::abs(double(got[e]) - s.m->v[e]) > tol) {
          BOOST_ERROR(where << ": element " << e << " is " << got[e] << ", expected " << s.m->v[e]);
          break;
        }
    } catch (const InjectedFault&) {
      ++fig_.syncs_threw;
      BOOST_TEST(s.m->must_fail, where << " rethrew a function's fault for a value that does not depend on it");
    } catch (const std::bad_alloc&) {
      ++fig_.syncs_threw;
      BOOST_TEST(s.m->may_fail, where << " rethrew an allocation failure where no allocation could fail");
    }
  }

  std::mt19937_64 rng_;
  Figures& fig_;
  std::int64_t n_ = 1;
  std::uint64_t every_ = 0;
  std::vector<ModelSlot> slots_;
  ThrowLog throws_;
  std::uint64_t ctor_failures_ = 0;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(fault_injection)

BOOST_FIXTURE_TEST_CASE(failing_allocations_and_throwing_tasks, dt::DeferredFixture) {
  const auto programs = stress::env_count("DEFT_FAULT_PROGRAMS", 2000);
  const auto seed = stress::env_seed(1);
  Figures fig;
  const std::size_t allocated_before = deft::engine::stats().bytes_allocated;
  {
    stress::Watchdog dog("fault injection", std::chrono::seconds(stress::env_count("DEFT_STRESS_TIMEOUT", 600)));
    for (std::int64_t p = 0; p < programs; ++p) {
      BOOST_TEST_CONTEXT("program seed " << seed * 100000 + p) {
        if (p % 3 == 1) deft::engine::set_num_workers(int(1 + p % 4));
        Program(seed * 100000 + std::uint64_t(p), fig).run();
      }
    }
  }
  deft::wait_all();
  // Nothing leaked: every buffer and every task is gone with its handles.
  const auto s = deft::engine::stats();
  BOOST_TEST(s.bytes_allocated == allocated_before, s);
  BOOST_TEST(s.tasks_pending == 0u, s);
  BOOST_TEST(s.tasks_run + s.tasks_discarded + s.tasks_failed + s.tasks_skipped == s.tasks_recorded, s);
  BOOST_TEST(fig.alloc_faults > 0u);
  BOOST_TEST(fig.throwing_statements > 0u);
  BOOST_TEST(fig.syncs_threw > 0u);
  // The engine keeps working: a computation after all the faults is right.
  Tensor<float> a = deft::arange<float>(0, 1000, 1);
  Tensor<float> b = deft::sum(a * 2.f);
  BOOST_TEST(b.item() == 999000.f);
  std::cout << "fault injection: " << fig.programs << " programs, " << fig.statements << " statements, "
            << fig.alloc_faults << " allocation faults (" << fig.ctor_faults << " of them in constructors) and " << fig.throwing_statements
            << " throwing statements injected; " << fig.syncs_threw << " sync points rethrew, " << fig.syncs_checked
            << " returned checked values; " << s << "\n";
}

BOOST_AUTO_TEST_SUITE_END()
