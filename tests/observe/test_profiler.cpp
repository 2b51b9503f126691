// engine::trace_to / trace_stop / ScopedTrace: the Chrome trace holds one
// slice per task that ran, one lane per thread that ran tasks, and nothing
// recorded before or after the traced region.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "json.hpp"
#include "support.hpp"

#include <deft/engine/profiler.hpp>

using namespace deft;

namespace {

struct Trace {
  std::vector<json::Value> slices;      // "ph": "X", "cat": "task"
  std::vector<json::Value> helps;       // "ph": "X", "cat": "help"
  std::map<int, std::string> lanes;     // tid -> thread_name
  double dropped = -1;
};

Trace read_trace(const std::string& path) {
  const auto doc = json::parse(obs::slurp(path));
  Trace t;
  for (const auto& e : doc["traceEvents"].arr()) {
    const auto& ph = e["ph"].str();
    if (ph == "X" && e["cat"].str() == "task") t.slices.push_back(e);
    else if (ph == "X") {
      BOOST_TEST(e["cat"].str() == "help");
      t.helps.push_back(e);
    }
    else if (ph == "M" && e["name"].str() == "thread_name") {
      const int tid = int(e["tid"].num());
      BOOST_TEST(t.lanes.count(tid) == 0u, "two names for lane " << tid);
      t.lanes[tid] = e["args"]["name"].str();
    }
  }
  t.dropped = doc["otherData"]["dropped_slices"].num();
  return t;
}

/// The seeds' auto-parallel shape of work: independent products, an elementwise
/// expression over two of them, a reduction. Returns the results (kept alive).
std::vector<Tensor<float>> some_work() {
  auto x = random::uniform<float>(-1.0, 1.0, {96, 96});
  std::vector<Tensor<float>> ys;
  for (int i = 0; i < 6; ++i) ys.push_back(dot(x, x));
  ys.push_back(ys[0] * ys[1] + 2);
  ys.push_back(sum(ys.back()));
  return ys;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(profiler)

BOOST_FIXTURE_TEST_CASE(every_task_that_ran_has_one_slice, obs::Clean) {
  engine::set_num_workers(2);
  const auto path = obs::scratch("every_task.json");
  engine::trace_to(path);
  BOOST_TEST(engine::tracing());
  auto ys = some_work();
  wait_all();
  const std::size_t written = engine::trace_stop();
  BOOST_TEST(!engine::tracing());
  const auto ran = engine::stats().tasks_run;
  const auto t = read_trace(path);
  BOOST_TEST(t.slices.size() == ran);
  BOOST_TEST(written == ran);
  BOOST_TEST(t.dropped == 0.0);
  // 1 uniform + 6 dot + 1 elementwise + 1 sum: by name, with their output sizes.
  std::multiset<std::string> names;
  for (const auto& s : t.slices) {
    names.insert(s["name"].str());
    BOOST_TEST(s["ts"].num() >= 0.0);
    BOOST_TEST(s["dur"].num() >= 0.0);
    BOOST_TEST(s["args"]["status"].str() == "ok");
    BOOST_TEST(s["cat"].str() == "task");
    if (s["name"].str() == "dot") BOOST_TEST(s["args"]["bytes"].num() == 96.0 * 96 * 4);
    if (s["name"].str() == "sum") BOOST_TEST(s["args"]["bytes"].num() == 4.0);
  }
  BOOST_TEST(names.count("dot") == 6u);
  BOOST_TEST(names.count("elementwise") == 1u);
  BOOST_TEST(names.count("sum") == 1u);
  BOOST_TEST(ran == 9u);
  // The elementwise task waited for two products; the products for the random input.
  for (const auto& s : t.slices)
    if (s["name"].str() == "elementwise") BOOST_TEST(s["args"]["deps"].num() == 2.0);
}

BOOST_FIXTURE_TEST_CASE(lanes_are_the_threads_that_ran_tasks, obs::Clean) {
  engine::set_num_workers(2);
  const auto path = obs::scratch("lanes.json");
  engine::trace_to(path);
  for (int round = 0; round < 4; ++round) {
    auto ys = some_work();
    wait_all();
  }
  engine::trace_stop();
  const auto t = read_trace(path);
  std::map<int, std::vector<std::pair<double, double>>> by_lane;
  for (const auto* group : {&t.slices, &t.helps})
    for (const auto& s : *group) by_lane[int(s["tid"].num())].emplace_back(s["ts"].num(), s["ts"].num() + s["dur"].num());
  // Exactly the lanes that hold slices are named, and each name says which thread it is.
  BOOST_TEST(by_lane.size() == t.lanes.size());
  std::set<std::string> distinct;
  for (const auto& [tid, name] : t.lanes) {
    BOOST_TEST(by_lane.count(tid) == 1u, "lane " << tid << " (" << name << ") has no slice");
    distinct.insert(name);
    if (name.rfind("worker ", 0) == 0) {
      const int index = std::atoi(name.c_str() + 7);
      BOOST_TEST((index >= 0 && index < engine::num_workers()), name);
    } else {
      BOOST_TEST(name.rfind("caller thread ", 0) == 0, name);
    }
  }
  BOOST_TEST(distinct.size() == t.lanes.size());
  BOOST_TEST(t.lanes.size() <= std::size_t(engine::num_workers()) + 1);  // the workers and this thread
  // One thread runs one task (or helps one) at a time: slices on a lane never overlap.
  for (auto& [tid, spans] : by_lane) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i)
      BOOST_TEST(spans[i].first >= spans[i - 1].second - 1e-3, "overlap on lane " << tid);
  }
}

BOOST_FIXTURE_TEST_CASE(help_slices_lie_inside_the_task_they_help, obs::Clean) {
  // Products big enough to be split into row blocks that idle workers take.
  engine::set_num_workers(2);
  auto x = random::uniform<float>(-1.0, 1.0, {512, 512});
  x.wait_to_read();
  const auto path = obs::scratch("help.json");
  engine::trace_to(path);
  for (int round = 0; round < 3; ++round) {
    Tensor<float> y = dot(x, x);
    y.wait_to_read();
  }
  engine::trace_stop();
  const auto t = read_trace(path);
  BOOST_TEST(t.slices.size() == 3u);
  std::map<double, const json::Value*> by_id;
  for (const auto& s : t.slices) BOOST_TEST(by_id.emplace(s["args"]["task"].num(), &s).second, "task ids repeat");
  BOOST_TEST_MESSAGE(t.helps.size() << " help slices");
  for (const auto& h : t.helps) {
    const auto it = by_id.find(h["args"]["helps"].num());
    BOOST_REQUIRE_MESSAGE(it != by_id.end(), "a help slice names no traced task");
    const auto& owner = *it->second;
    BOOST_TEST(h["name"].str() == owner["name"].str() + " (help)");
    BOOST_TEST(h["tid"].num() != owner["tid"].num());  // help comes from another thread
    BOOST_TEST(h["ts"].num() >= owner["ts"].num() - 1e-3);
    BOOST_TEST(h["ts"].num() + h["dur"].num() <= owner["ts"].num() + owner["dur"].num() + 1e-3);
  }
}

BOOST_FIXTURE_TEST_CASE(a_scoped_trace_leaves_a_later_trace_alone, obs::Clean) {
  const auto first = obs::scratch("first.json"), second = obs::scratch("second.json");
  {
    engine::ScopedTrace trace(first);
    engine::trace_stop();      // stopped early by hand
    engine::trace_to(second);  // a new trace the scope does not own
  }
  BOOST_TEST(engine::tracing());
  Tensor<float> c = ones({4}) + 1;
  c.wait_to_read();
  BOOST_TEST(engine::trace_stop() == 2u);
  BOOST_TEST(read_trace(second).slices.size() == 2u);
}

BOOST_FIXTURE_TEST_CASE(only_the_traced_region_is_recorded, obs::Clean) {
  auto before = some_work();
  wait_all();  // ran before tracing: not in any trace
  const auto empty = obs::scratch("empty.json");
  engine::trace_to(empty);
  BOOST_TEST(engine::trace_stop() == 0u);
  BOOST_TEST(read_trace(empty).slices.empty());
  BOOST_TEST(read_trace(empty).lanes.empty());

  const auto path = obs::scratch("region.json");
  engine::trace_to(path);
  auto a = full<float>({1000}, 2.0f);
  Tensor<float> b = a * a + 1;
  b.wait_to_read();
  engine::trace_stop();
  auto after = some_work();  // runs after the stop: not in the file
  wait_all();
  const auto t = read_trace(path);
  BOOST_REQUIRE(t.slices.size() == 2u);
  std::set<std::string> names{t.slices[0]["name"].str(), t.slices[1]["name"].str()};
  BOOST_TEST((names == std::set<std::string>{"full", "elementwise"}));
  for (const auto& s : t.slices) BOOST_TEST(s["args"]["bytes"].num() == 4000.0);
}

BOOST_FIXTURE_TEST_CASE(a_failed_task_is_a_slice_marked_failed, obs::Clean) {
  const auto path = obs::scratch("failed.json");
  engine::trace_to(path);
  // 2^45 floats (128 TiB): recorded fine, the allocation fails when it runs.
  auto huge = zeros<float>({std::int64_t(1) << 45});
  BOOST_CHECK_THROW(huge.wait_to_read(), std::bad_alloc);
  BOOST_CHECK_THROW(wait_all(), std::bad_alloc);
  engine::trace_stop();
  const auto t = read_trace(path);
  BOOST_REQUIRE(t.slices.size() == 1u);
  BOOST_TEST(t.slices[0]["name"].str() == "full");
  BOOST_TEST(t.slices[0]["args"]["status"].str() == "failed");
}

BOOST_FIXTURE_TEST_CASE(scoped_trace_writes_when_it_ends, obs::Clean) {
  const auto path = obs::scratch("scoped.json");
  {
    engine::ScopedTrace trace(path);
    BOOST_TEST(engine::tracing());
    Tensor<float> c = ones({4}) * 3;
    c.wait_to_read();
  }
  BOOST_TEST(!engine::tracing());
  BOOST_TEST(read_trace(path).slices.size() == 2u);
}

BOOST_FIXTURE_TEST_CASE(misuse_gives_clear_errors, obs::Clean) {
  const std::string bad = "/nonexistent-deft-dir/trace.json";
  OBS_REQUIRE_ERROR_NAMING(engine::trace_to(bad), bad);
  BOOST_TEST(!engine::tracing());
  BOOST_CHECK_THROW(engine::trace_stop(), std::logic_error);
  const auto path = obs::scratch("twice.json");
  engine::trace_to(path);
  BOOST_CHECK_THROW(engine::trace_to(obs::scratch("other.json")), std::logic_error);
  BOOST_TEST(engine::tracing());  // the first trace goes on
  engine::trace_stop();
}

BOOST_FIXTURE_TEST_CASE(a_trace_left_running_is_written_at_exit, obs::Clean) {
  // A child process starts a trace and returns from main without stopping it.
  const auto path = obs::scratch("at_exit.json");
  const std::string self = boost::unit_test::framework::master_test_suite().argv[0];
  const std::string cmd = "DEFT_OBSERVE_CHILD_TRACE='" + path + "' '" + self + "' --run_test=profiler_child";
  BOOST_REQUIRE(std::system(cmd.c_str()) == 0);
  const auto t = read_trace(path);
  BOOST_TEST(t.slices.size() == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

// The child of the test above; disabled, so only an explicit --run_test runs it.
BOOST_AUTO_TEST_SUITE(profiler_child, *boost::unit_test::disabled())
BOOST_AUTO_TEST_CASE(start_a_trace_and_exit) {
  const char* path = std::getenv("DEFT_OBSERVE_CHILD_TRACE");
  BOOST_REQUIRE_MESSAGE(path, "set DEFT_OBSERVE_CHILD_TRACE to the trace file");
  engine::trace_to(path);
  Tensor<float> c = ones({8}) + 1;
  c.wait_to_read();  // two tasks ran; the file is written by the exit hook
}
BOOST_AUTO_TEST_SUITE_END()
