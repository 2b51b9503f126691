// Graphviz DOT of the pending task graph: the tasks recorded and not yet
// handed to the workers, and the edges "input task -> task that reads it".
// A recorded task may wait for one already submitted or done; those appear
// once, dashed, as the graph's boundary (their own inputs are not followed:
// a worker may be clearing them).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../core/dtype.hpp"
#include "engine.hpp"
#include "profiler.hpp"

namespace deft {
template <Element T>
class Tensor;
}  // namespace deft

namespace deft::detail {

class GraphDump {
 public:
  /// Adds `root` and every recorded task it needs (call under the engine's lock).
  void walk(const std::shared_ptr<Task>& root, bool is_target) {
    std::vector<std::shared_ptr<Task>> stack{root};
    if (is_target) targets_.push_back(root.get());
    while (!stack.empty()) {
      auto t = std::move(stack.back());
      stack.pop_back();
      if (!t || index_.count(t.get())) continue;
      index_.emplace(t.get(), nodes_.size());
      const bool pending = t->state.load(std::memory_order_acquire) == Task::State::recorded;
      nodes_.push_back(t);
      if (!pending) continue;
      for (const auto& d : t->deps) {
        edges_.emplace_back(d.get(), t.get());
        stack.push_back(d);
      }
    }
  }

  std::size_t nodes() const { return nodes_.size(); }

  /// The DOT text. Must be called while the tasks are still held (this object holds them).
  std::string dot() const {
    std::string out = "digraph deft_tasks {\n  rankdir=LR;\n  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n";
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const Task& t = *nodes_[i];
      const auto state = t.state.load(std::memory_order_acquire);
      std::string label;
      json_escape(label, t.name);  // also a valid DOT string body
      label += "\\n" + bytes_text(t.bytes);
      const char* note = state == Task::State::recorded    ? ""
                         : state == Task::State::submitted ? "\\n(submitted)"
                         : state == Task::State::done      ? "\\n(done)"
                                                           : "\\n(cancelled)";
      char id[32];
      std::snprintf(id, sizeof id, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(&t)));
      out += "  t" + std::to_string(i) + " [label=\"" + label + note + "\", tooltip=\"task " + id + "\"";
      if (state != Task::State::recorded) out += ", style=\"rounded,dashed\"";
      for (const Task* target : targets_)
        if (target == &t) out += ", penwidth=2";
      out += "];\n";
    }
    for (const auto& [from, to] : edges_)
      out += "  t" + std::to_string(index_.at(from)) + " -> t" + std::to_string(index_.at(to)) + ";\n";
    out += "}\n";
    return out;
  }

  /// Writes dot() to `path`; std::runtime_error naming the file when that fails.
  void write(const std::string& path, const char* who) const {
    const auto text = dot();
    auto f = open_for_writing(path, who);
    f << text;
    f.flush();
    if (!f) raise<std::runtime_error>(who, ": writing '", path, "' failed: ", std::strerror(errno));
  }

 private:
  static std::string bytes_text(std::size_t b) {
    char buf[32];
    if (b < 10 * 1024) std::snprintf(buf, sizeof buf, "%zu B", b);
    else if (b < 10 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%zu KiB", b / 1024);
    else std::snprintf(buf, sizeof buf, "%zu MiB", b >> 20);
    return buf;
  }

  std::vector<std::shared_ptr<Task>> nodes_;  // held, so released only after the engine's lock
  std::unordered_map<const Task*, std::size_t> index_;
  std::vector<std::pair<const Task*, const Task*>> edges_;
  std::vector<const Task*> targets_;
};

}  // namespace deft::detail

namespace deft::engine {

/// Writes every pending (recorded, not yet submitted) task and its inputs as a
/// Graphviz DOT graph to `path`; returns the number of nodes. Nothing runs:
/// this is no sync point. std::runtime_error naming the file when it cannot
/// be written. Render with `dot -Tpng path -o graph.png`.
inline std::size_t dump_graph(const std::string& path) {
  detail::GraphDump g;
  detail::Engine::get().inspect_recorded([&](const std::vector<std::weak_ptr<detail::Task>>& recorded) {
    for (const auto& w : recorded)
      if (auto t = w.lock(); t && t->state.load(std::memory_order_acquire) == detail::Task::State::recorded)
        g.walk(t, false);
  });
  g.write(path, "engine::dump_graph");
  return g.nodes();
}

}  // namespace deft::engine

namespace deft {

/// Writes the pending work that `t`'s value still needs as Graphviz DOT (the
/// task producing `t` drawn bold); returns the number of nodes, 0 when `t` is
/// already computed (the file then holds an empty graph). No sync point.
template <Element T>
std::size_t dump_graph(const Tensor<T>& t, const std::string& path) {
  const auto buffer = t.leaf().buffer;  // also rejects an empty handle
  detail::GraphDump g;
  detail::Engine::get().inspect_recorded([&](const auto&) {
    if (buffer->producer && !buffer->producer->finished()) g.walk(buffer->producer, true);
  });
  g.write(path, "dump_graph");
  return g.nodes();
}

}  // namespace deft
