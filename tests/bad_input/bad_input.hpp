// Helpers for the bad-input suites: exact exception-type checks with message
// substrings, a check that an error was raised at record time (nothing
// recorded, nothing run), and a witness that work recorded before a bad
// statement still reads correctly after it.
#pragma once
#include <functional>
#include <string>
#include <typeinfo>
#include <vector>

#include "../common.hpp"

namespace bad {

using namespace dt;
namespace engine = deft::engine;

/// Runs f; it must throw exactly E (not a type derived from it) whose what()
/// contains every part. Returns the message ("" when the check failed).
template <class E, class F>
std::string expect_throw(F&& f, const std::vector<std::string>& parts, const std::string& what) {
  try {
    f();
  } catch (const std::exception& e) {
    BOOST_TEST((typeid(e) == typeid(E)),
               what << ": threw " << typeid(e).name() << " ('" << e.what() << "'), expected " << typeid(E).name());
    const std::string msg = e.what();
    for (const auto& p : parts)
      BOOST_TEST(msg.find(p) != std::string::npos, what << ": message '" << msg << "' lacks '" << p << "'");
    return msg;
  } catch (...) {
    BOOST_ERROR(what << ": threw something that is not a std::exception");
    return "";
  }
  BOOST_ERROR(what << ": nothing thrown, expected " << typeid(E).name());
  return "";
}

/// As expect_throw, and the error comes from the statement itself: in
/// deferred mode nothing was recorded and nothing ran on its behalf.
template <class E, class F>
void expect_record_error(F&& f, const std::vector<std::string>& parts, const std::string& what) {
  const auto before = engine::stats();
  expect_throw<E>(std::forward<F>(f), parts, what);
  const auto after = engine::stats();
  BOOST_TEST(after.tasks_recorded == before.tasks_recorded, what << ": a task was recorded before the error");
  BOOST_TEST(after.tasks_run == before.tasks_run, what << ": work ran (a sync) before the error");
}

/// One row of a table of bad calls.
struct Case {
  std::string what;
  std::function<void()> call;
  std::vector<std::string> parts;  // substrings the message must contain
};

template <class E>
void run_table(const std::vector<Case>& cases) {
  for (const auto& c : cases) expect_record_error<E>(c.call, c.parts, c.what);
}

/// Work recorded (not yet run) before the bad statements of a test; check()
/// afterwards proves that it was neither lost nor corrupted and that the
/// engine still runs new work.
struct Witness {
  std::vector<float> xv{1, 2, 3, 4, 5, 6};
  Tensor<float> x = Tensor<float>(xv, Shape{2, 3});
  Tensor<float> ready = x * 2 + 1;           // run before the bad statements
  Tensor<float> pending = deft::exp(x) - x;  // still deferred when they happen
  Tensor<float> total = deft::sum(x, 1);
  Witness() { ready.wait_to_read(); }
  void check(const std::string& what) const {
    std::vector<double> r, p;
    for (float v : xv) {
      r.push_back(2.0 * v + 1);
      p.push_back(std::exp(double(v)) - v);
    }
    check_tensor(ready, {2, 3}, r, 0, 0, what + ": value computed before");
    check_tensor(pending, {2, 3}, p, 1e-6, 1e-6, what + ": value recorded before");
    check_tensor(total, {2}, {6, 15}, 0, 0, what + ": reduction recorded before");
    BOOST_CHECK_NO_THROW(deft::wait_all());
    const Tensor<float> fresh = deft::dot(x, deft::transpose(x)) + 0.5f;
    check_tensor(fresh, {2, 2}, {14.5, 32.5, 32.5, 77.5}, 0, 0, what + ": new work after");
  }
};

}  // namespace bad
