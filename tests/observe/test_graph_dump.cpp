// dump_graph: the pending task graph as Graphviz DOT, checked on the seeds'
// `c = a * b + 2` and a chain behind it; dumping is no sync point.
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>

#include "support.hpp"

using namespace deft;

namespace {

struct Dot {
  std::map<int, std::string> labels;  // node -> label
  std::set<int> bold, dashed;
  std::multiset<std::pair<int, int>> edges;
  /// Labels of the nodes with edges into `to`, sorted.
  std::multiset<std::string> inputs_of(int to) const {
    std::multiset<std::string> in;
    for (const auto& [a, b] : edges)
      if (b == to) in.insert(labels.at(a));
    return in;
  }
  int only(const std::string& label) const {
    int found = -1, count = 0;
    for (const auto& [id, l] : labels)
      if (l == label) found = id, ++count;
    BOOST_TEST(count == 1, "nodes labelled '" << label << "': " << count);
    return found;
  }
};

Dot read_dot(const std::string& path) {
  const auto text = obs::slurp(path);
  BOOST_TEST(text.rfind("digraph ", 0) == 0u);
  BOOST_TEST(text.find_last_of('}') != std::string::npos);
  Dot d;
  const std::regex node(R"re(^\s*t(\d+) \[label="([^"]*)"(.*)\];$)re");
  const std::regex edge(R"re(^\s*t(\d+) -> t(\d+);$)re");
  std::istringstream in(text);
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_match(line, m, node)) {
      const int id = std::stoi(m[1]);
      d.labels[id] = m[2];
      if (m[3].str().find("penwidth=2") != std::string::npos) d.bold.insert(id);
      if (m[3].str().find("dashed") != std::string::npos) d.dashed.insert(id);
    } else if (std::regex_match(line, m, edge)) {
      d.edges.emplace(std::stoi(m[1]), std::stoi(m[2]));
    }
  }
  for (const auto& [a, b] : d.edges) BOOST_TEST((d.labels.count(a) && d.labels.count(b)), "edge to an unknown node");
  return d;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(graph_dump)

BOOST_FIXTURE_TEST_CASE(the_seeds_c_equals_a_times_b_plus_2, obs::Clean) {
  auto a = ones({1, 2});
  auto b = ones({1, 2});
  Tensor<float> c = a * b + 2;  // one fused task reading a and b
  const auto path = obs::scratch("c.dot");
  BOOST_TEST(dump_graph(c, path) == 3u);
  BOOST_TEST(!c.is_ready());  // dumping ran nothing
  BOOST_TEST(engine::stats().tasks_run == 0u);
  const auto d = read_dot(path);
  BOOST_REQUIRE(d.labels.size() == 3u);
  const int out = d.only("elementwise\\n8 B");
  BOOST_TEST(d.edges.size() == 2u);
  BOOST_TEST((d.inputs_of(out) == std::multiset<std::string>{"full\\n8 B", "full\\n8 B"}));
  BOOST_TEST((d.bold == std::set<int>{out}));
  BOOST_TEST(d.dashed.empty());
  // The same values as always once it runs.
  BOOST_TEST((c.to_vector() == std::vector<float>{3, 3}));
  BOOST_TEST(dump_graph(c, path) == 0u);  // nothing pending any more
  BOOST_TEST(read_dot(path).labels.empty());
}

BOOST_FIXTURE_TEST_CASE(the_engine_dump_holds_every_pending_task, obs::Clean) {
  auto a = ones({1, 2});
  auto b = ones({1, 2});
  Tensor<float> c = a * b + 2;
  Tensor<float> d = sum(c * c);
  auto unrelated = full<float>({16}, 5.0f);
  const auto path = obs::scratch("engine.dot");
  BOOST_TEST(engine::dump_graph(path) == 5u);
  const auto g = read_dot(path);
  BOOST_REQUIRE(g.labels.size() == 5u);
  const int e = g.only("elementwise\\n8 B");
  const int s = g.only("sum\\n4 B");
  g.only("full\\n64 B");
  BOOST_TEST((g.inputs_of(s) == std::multiset<std::string>{"elementwise\\n8 B"}));
  BOOST_TEST(g.inputs_of(e).size() == 2u);
  BOOST_TEST(g.edges.size() == 3u);
  BOOST_TEST(g.bold.empty());  // no tensor was named
  // The tensor view shows only what d needs.
  BOOST_TEST(dump_graph(d, obs::scratch("d.dot")) == 4u);
  BOOST_TEST(engine::stats().tasks_run == 0u);
  BOOST_TEST(d.item() == 18.0f);
}

BOOST_FIXTURE_TEST_CASE(bad_paths_name_the_file, obs::Clean) {
  Tensor<float> c = ones({2}) + 1;
  const std::string bad = "/nonexistent-deft-dir/graph.dot";
  OBS_REQUIRE_ERROR_NAMING(dump_graph(c, bad), bad);
  OBS_REQUIRE_ERROR_NAMING(engine::dump_graph(bad), bad);
  BOOST_CHECK_THROW(dump_graph(Tensor<float>(), obs::scratch("empty.dot")), std::logic_error);
  BOOST_TEST((c.to_vector() == std::vector<float>{2, 2}));
}

BOOST_AUTO_TEST_SUITE_END()
