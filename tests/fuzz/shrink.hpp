// Greedy shrinking of a failing program: drop statements, replace subtrees by
// one of their children, shrink extents, simplify values and engine settings,
// keeping each edit while the program still fails (a mismatch, not merely an
// invalid program).
#pragma once
#include <functional>
#include <map>
#include <vector>

#include "program.hpp"

namespace fz {

namespace shrink_detail {

/// Calls f(node) for every node of every tree of the program, in a fixed order.
template <class F>
void for_each_node(Program& p, F&& f) {
  std::function<void(Node&)> walk = [&](Node& n) {
    f(n);
    for (auto& k : n.kids) walk(k);
  };
  for (auto& s : p.stmts) {
    walk(s.tree);
    walk(s.tree2);
  }
}

inline Node* nth_node(Program& p, int i) {
  Node* hit = nullptr;
  int k = 0;
  for_each_node(p, [&](Node& n) {
    if (k++ == i) hit = &n;
  });
  return hit;
}

inline int node_count(Program& p) {
  int k = 0;
  for_each_node(p, [&](Node&) { ++k; });
  return k;
}

}  // namespace shrink_detail

/// The smallest program found that still fails. `fails` runs a candidate.
inline Program shrink(Program p, const std::function<bool(const Program&)>& fails, int budget = 4000) {
  using namespace shrink_detail;
  int tries = 0;
  auto attempt = [&](const Program& q) {
    if (tries >= budget) return false;
    ++tries;
    return fails(q);
  };
  for (bool progress = true; progress && tries < budget;) {
    progress = false;
    // 1. Drop statements (from the end: later ones depend on earlier ones).
    for (int i = int(p.stmts.size()) - 1; i >= 0; --i) {
      Program q = p;
      q.stmts.erase(q.stmts.begin() + i);
      if (attempt(q)) p = std::move(q), progress = true;
    }
    // 2. Replace a node by one of its children; un-cut nodes.
    for (int i = 0; i < node_count(p); ++i) {
      const Node* n = nth_node(p, i);
      for (std::size_t k = 0; n && k < n->kids.size(); ++k) {
        Program q = p;
        Node* m = nth_node(q, i);
        Node kid = m->kids[k];
        *m = std::move(kid);
        if (attempt(q)) {
          p = std::move(q);
          progress = true;
          break;
        }
      }
      n = nth_node(p, i);
      if (n && n->cut) {
        Program q = p;
        nth_node(q, i)->cut = false;
        if (attempt(q)) p = std::move(q), progress = true;
      }
    }
    // 3. Simpler values in fresh leaves: small integers, or one repeated value.
    for (int i = 0; i < node_count(p); ++i) {
      const Node* n = nth_node(p, i);
      if (!n || n->kind != Node::fresh || n->filled || n->style == 0) continue;
      Program q = p;
      nth_node(q, i)->style = 0;
      if (attempt(q)) p = std::move(q), progress = true;
    }
    // 4. Shrink extents: one extent value at a time, everywhere it appears.
    std::map<i64, int> extents;
    for_each_node(p, [&](Node& n) {
      for (i64 x : n.shape) extents[x]++;
    });
    for (auto& s : p.stmts)
      for (i64 x : s.dims) extents[x]++;
    for (auto it = extents.rbegin(); it != extents.rend(); ++it) {
      const i64 from = it->first;
      if (from <= 1) continue;
      for (i64 to : {i64(1), i64(2), from / 2}) {
        if (to >= from || to < 1) continue;
        Program q = p;
        for_each_node(q, [&](Node& n) {
          for (auto& x : n.shape)
            if (x == from) x = to;
        });
        for (auto& s : q.stmts) {
          for (auto& x : s.dims)
            if (x == from) x = to;
          s.hi = std::min(s.hi, to);
          s.lo = std::min(s.lo, s.hi);
        }
        if (attempt(q)) {
          p = std::move(q);
          progress = true;
          break;
        }
      }
    }
    // 5. Simpler engine settings.
    if (p.workers != 1) {
      Program q = p;
      q.workers = 1;
      if (attempt(q)) p = std::move(q), progress = true;
    }
  }
  return p;
}

}  // namespace fz
