// Random programs over deft's public API. The generator tracks the shape of
// every slot so that, apart from one deliberate `invalid` statement, every
// statement is valid: the fuzzer tests numerics and aliasing, not error paths.
#pragma once
#include <algorithm>
#include <limits>
#include <vector>

#include "program.hpp"

namespace fz {

class Generator {
 public:
  explicit Generator(Source& src) : r_(src) {}

  Program program(std::uint64_t seed) {
    Program p;
    p.seed = seed;
    p.workers = 1 + r_.pick(5);
    p.synchronous = r_.chance(0.25);
    big_ = r_.chance(0.015);
    if (big_) big_shape_ = pick_big_shape();
    const int n = big_ ? 2 + r_.pick(5) : 2 + r_.pick(12);
    bool had_invalid = false;
    for (int i = 0; i < n; ++i) {
      Stmt s = statement(i == 0, had_invalid);
      had_invalid = had_invalid || s.kind == Stmt::invalid;
      p.stmts.push_back(std::move(s));
    }
    return p;
  }

 private:
  struct Info {
    bool live = false;
    Dims shape;
  };
  Source& r_;
  Info s_[kSlots];
  bool big_ = false;
  Dims big_shape_;

  // --- shapes --------------------------------------------------------------------------

  Dims pick_big_shape() {
    // Past the engine's parallel thresholds (thresholds.hpp: parallel_min_work
    // 2^19 element-ops, i.e. 2^18 elements of a one-op expression; reductions
    // cut at reduce_chunk elements).
    switch (r_.pick(4)) {
      case 0: return {i64(150000 + r_.pick(150000))};
      case 1: return {i64(600 + r_.pick(500)), 257};
      case 2: return {3, i64(300 + r_.pick(200)), 129};
      default: return {i64(270000 + r_.pick(100)), 1};
    }
  }

  Dims random_shape() {
    if (big_ && r_.chance(0.7)) return big_shape_;
    static const int ranks[] = {0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 4};
    static const i64 extents[] = {1, 1, 2, 2, 3, 3, 4, 5, 7, 8, 9, 16, 17, 33};
    const int rank = ranks[r_.pick(int(std::size(ranks)))];
    Dims d;
    for (int i = 0; i < rank; ++i) d.push_back(r_.chance(0.04) ? 0 : extents[r_.pick(int(std::size(extents)))]);
    while (numel(d) > 300)  // small programs: fast reference, many programs a second
      for (auto& x : d) x = std::max<i64>(1, x / 2);
    return d;
  }

  /// A shape that broadcasts to exactly `s`: a suffix, some extents set to 1.
  Dims sub_broadcast(const Dims& s) {
    std::size_t drop = r_.chance(0.3) ? r_.below(s.size() + 1) : 0;
    Dims d(s.begin() + long(drop), s.end());
    for (auto& x : d)
      if (r_.chance(0.25)) x = 1;
    return d;
  }

  Dims shape_of(const Node& n) const {
    switch (n.kind) {
      case Node::slot: return s_[n.index].shape;
      case Node::fresh: return n.shape;
      case Node::scalar: return {};
      case Node::unary: return shape_of(n.kids[0]);
      default: {
        Dims out = shape_of(n.kids[0]), tmp;
        for (std::size_t i = 1; i < n.kids.size(); ++i) {
          broadcast(out, shape_of(n.kids[i]), tmp);
          out = tmp;
        }
        return out;
      }
    }
  }

  int live_slot() {
    std::vector<int> v;
    for (int k = 0; k < kSlots; ++k)
      if (s_[k].live) v.push_back(k);
    return v.empty() ? -1 : v[r_.below(v.size())];
  }
  template <class Pred>
  int live_slot_if(Pred pred) {
    std::vector<int> v;
    for (int k = 0; k < kSlots; ++k)
      if (s_[k].live && pred(s_[k].shape)) v.push_back(k);
    return v.empty() ? -1 : v[r_.below(v.size())];
  }

  // --- trees ------------------------------------------------------------------------------

  float scalar_value() {
    if (r_.chance(0.04)) return r_.chance(0.5) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    static const float v[] = {0.f, 1.f, -1.f, 2.f, 0.5f, -2.5f, 3.f, 1e-3f, 100.f, 0.75f};
    return v[r_.pick(int(std::size(v)))];
  }

  int depth_budget() {
    static const int d[] = {0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6, 7, 8};
    const int x = d[r_.pick(int(std::size(d)))];
    return big_ ? std::min(x, 3) : x;
  }

  Node fresh(const Dims& shape) {
    Node n;
    n.kind = Node::fresh;
    n.shape = shape;
    n.vseed = r_.next();
    n.style = std::uint8_t(r_.pick(kStyles));
    if (r_.chance(0.12)) {
      n.filled = true;
      n.value = scalar_value();
    }
    return n;
  }

  /// A leaf whose shape broadcasts to `s` (equals it when `exact`). `prefer`:
  /// a slot to read when possible (so that assignments alias their inputs).
  Node leaf(const Dims& s, bool exact, int prefer) {
    if (!exact && r_.chance(0.15)) {
      Node n;
      n.kind = Node::scalar;
      n.value = scalar_value();
      return n;
    }
    auto fits = [&](const Dims& d) { return exact ? d == s : broadcasts_to(d, s); };
    int k = -1;
    if (prefer >= 0 && s_[prefer].live && fits(s_[prefer].shape) && r_.chance(0.5)) k = prefer;
    else if (r_.chance(0.5)) k = live_slot_if(fits);
    if (k >= 0) {
      Node n;
      n.kind = Node::slot;
      n.index = k;
      return n;
    }
    return fresh(exact ? s : sub_broadcast(s));
  }

  static Node wrap(UOp u, Node kid) {
    Node n;
    n.kind = Node::unary;
    n.u = u;
    n.kids.push_back(std::move(kid));
    return n;
  }

  /// A tree of depth <= depth whose shape broadcasts to `s` (equals it when `exact`).
  Node tree(const Dims& s, int depth, bool exact, int prefer) {
    if (depth <= 0 || r_.chance(0.2)) return leaf(s, exact, prefer);
    Node n;
    const int k = r_.pick(10);
    if (k < 4) {
      n.kind = Node::unary;
      n.u = UOp(r_.pick(kUOps));
      Node kid = tree(s, depth - 1, exact, prefer);
      if ((n.u == UOp::log || n.u == UOp::sqrt) && r_.chance(0.5)) kid = wrap(UOp::abs, std::move(kid));
      n.kids.push_back(std::move(kid));
    } else if (k < 9) {
      n.kind = Node::binary;
      n.b = BOp(r_.pick(kBOps));
      Node a = tree(s, depth - 1, exact, prefer);
      Node b;
      if (n.b == BOp::pow && r_.chance(0.6)) {
        static const float e[] = {2.f, 0.5f, 3.f, -1.f, 1.5f, 0.f};
        b.kind = Node::scalar;
        b.value = e[r_.pick(int(std::size(e)))];
        if (r_.chance(0.5)) a = wrap(UOp::abs, std::move(a));
      } else {
        b = tree(s, depth - 1, false, prefer);
      }
      if (a.kind == Node::scalar && b.kind == Node::scalar) b = fresh(sub_broadcast(s));
      n.kids.push_back(std::move(a));
      n.kids.push_back(std::move(b));
    } else {
      n.kind = Node::select;
      Node c;
      if (r_.chance(0.6)) {
        c.kind = Node::binary;
        c.b = BOp(int(BOp::lt) + r_.pick(6));
        c.kids.push_back(tree(s, depth - 2, false, prefer));
        c.kids.push_back(tree(s, depth - 2, false, prefer));
        if (c.kids[0].kind == Node::scalar && c.kids[1].kind == Node::scalar) c.kids[1] = fresh(sub_broadcast(s));
      } else {
        c = tree(s, depth - 1, false, prefer);
      }
      if (c.kind == Node::scalar) c = fresh(sub_broadcast(s));
      n.kids.push_back(std::move(c));
      n.kids.push_back(tree(s, depth - 1, exact, prefer));
      n.kids.push_back(tree(s, depth - 1, false, prefer));
    }
    n.cut = r_.chance(0.15);
    return n;
  }

  /// A tree that is an expression or tensor (never a plain number at the root).
  Node operand_tree(const Dims& s, int depth, bool exact, int prefer) {
    Node n = tree(s, depth, exact, prefer);
    if (n.kind == Node::scalar) n = fresh(exact ? s : sub_broadcast(s));
    return n;
  }

  // --- statements ---------------------------------------------------------------------------

  Stmt statement(bool first, bool had_invalid) {
    for (;;) {
      Stmt s;
      const int w = first ? 0 : r_.pick(100);
      const int live = live_slot();
      if (w < 22) {
        s.kind = Stmt::bind;
        s.dst = (live >= 0 && r_.chance(0.5)) ? live : r_.pick(kSlots);
        const Dims S = (s_[s.dst].live && r_.chance(0.6)) ? s_[s.dst].shape : random_shape();
        s.tree = operand_tree(S, depth_budget(), false, s.dst);
        s_[s.dst] = {true, shape_of(s.tree)};
        return s;
      }
      if (live < 0) continue;
      if (w < 34) {
        s.kind = Stmt::compound;
        s.dst = live;
        static const BOp ops[] = {BOp::add, BOp::sub, BOp::mul, BOp::div};
        s.op = ops[r_.pick(4)];
        s.tree = tree(s_[live].shape, std::min(depth_budget(), 3), false, live);
        return s;
      }
      if (w < 38) {
        s.kind = Stmt::share;
        s.src = live;
        s.dst = r_.pick(kSlots);
        s_[s.dst] = s_[s.src];
        return s;
      }
      if (w < 43 || (w < 48 && !s_[live].shape.empty())) {  // rows view or write through rows
        const int k = live_slot_if([](const Dims& d) { return !d.empty(); });
        if (k < 0) continue;
        const i64 d0 = s_[k].shape[0];
        s.lo = i64(r_.below(std::uint64_t(d0 + 1)));
        s.hi = s.lo + i64(r_.below(std::uint64_t(d0 - s.lo + 1)));
        Dims view = s_[k].shape;
        view[0] = s.hi - s.lo;
        if (w < 43) {
          s.kind = Stmt::rows_view;
          s.src = k;
          s.dst = r_.pick(kSlots);
          s_[s.dst] = {true, view};
        } else {
          s.kind = Stmt::assign_rows;
          s.dst = k;
          s.tree = operand_tree(view, depth_budget(), false, k);
        }
        return s;
      }
      if (w < 52) {
        s.kind = Stmt::reshape_view;
        s.src = live;
        s.dst = r_.pick(kSlots);
        s.dims = reshape_dims(s_[live].shape);
        Dims out = s.dims;
        const i64 n = numel(s_[live].shape);
        for (auto& x : out)
          if (x == -1) x = n / std::max<i64>(1, -numel(s.dims));
        s_[s.dst] = {true, out};
        return s;
      }
      if (w < 57) {
        s.kind = Stmt::assign;
        s.dst = live;
        s.tree = operand_tree(s_[live].shape, depth_budget(), false, live);
        return s;
      }
      if (w < 60) {
        s.kind = Stmt::clone;
        s.src = live;
        s.dst = r_.pick(kSlots);
        s_[s.dst] = s_[s.src];
        return s;
      }
      if (w < 63) {
        s.kind = Stmt::drop;
        s.dst = live;
        s_[s.dst] = {};
        return s;
      }
      if (w < 71) return reduce_stmt();
      if (w < 76) return dot_stmt();
      if (w < 79) {
        s.kind = Stmt::transpose;
        s.dst = r_.pick(kSlots);
        s.tree = operand_tree(random_shape(), std::min(depth_budget(), 2), true, -1);
        Dims d = shape_of(s.tree);
        std::reverse(d.begin(), d.end());
        s_[s.dst] = {true, d};
        return s;
      }
      if (w < 83) s.kind = Stmt::wait;
      else if (w < 90) s.kind = Stmt::to_vector;
      else if (w < 93) s.kind = Stmt::wait_all;
      else if (w < 97) {
        s.kind = Stmt::item;
        const int k = live_slot_if([](const Dims& d) { return numel(d) == 1; });
        if (k < 0) continue;
        s.dst = k;
        return s;
      } else {
        if (had_invalid || big_) continue;
        return invalid_stmt(live);
      }
      s.dst = live;
      return s;
    }
  }

  Dims reshape_dims(const Dims& d) {
    const i64 n = numel(d);
    Dims out;
    switch (r_.pick(5)) {
      case 0: out = {n}; break;
      case 1: out = {1, n}; break;
      case 2: out = {n, 1}; break;
      case 3:
        if (d.size() >= 2) {
          out.assign(d.begin(), d.end() - 2);
          out.push_back(d[d.size() - 2] * d.back());
        } else {
          out = {n};
        }
        break;
      default:
        if (n % 2 == 0 && n > 0) out = {2, n / 2};
        else if (n % 3 == 0 && n > 0) out = {n / 3, 3};
        else out = d;
    }
    if (n > 0 && !out.empty() && r_.chance(0.3)) out[r_.below(out.size())] = -1;
    return out;
  }

  Stmt reduce_stmt() {
    Stmt s;
    s.kind = Stmt::reduce;
    s.dst = r_.pick(kSlots);
    const int live = live_slot();
    const Dims S = (live >= 0 && r_.chance(0.5)) ? s_[live].shape : random_shape();
    s.tree = operand_tree(S, std::min(depth_budget(), 4), false, s.dst);
    const Dims T = shape_of(s.tree);
    s.red = Red(r_.pick(kReds));
    s.all = T.empty() || r_.chance(0.4);
    Dims out;
    if (!s.all) {
      const int rank = int(T.size());
      s.axis = r_.pick(2 * rank) - rank;
      s.keepdims = r_.chance(0.5);
      const int ax = s.axis < 0 ? s.axis + rank : s.axis;
      for (int d = 0; d < rank; ++d)
        if (d != ax) out.push_back(T[d]);
        else if (s.keepdims) out.push_back(1);
      if (T[ax] == 0 && (s.red == Red::max || s.red == Red::min || s.red == Red::argmax)) s.red = Red::sum;
    } else if (numel(T) == 0 && (s.red == Red::max || s.red == Red::min || s.red == Red::argmax)) {
      s.red = Red::sum;
    }
    s_[s.dst] = {true, out};
    return s;
  }

  Stmt dot_stmt() {
    Stmt s;
    s.kind = Stmt::dot;
    s.dst = r_.pick(kSlots);
    static const i64 ext[] = {1, 2, 3, 4, 5, 7, 8, 13, 17, 0};
    auto e = [&] { return ext[r_.pick(r_.chance(0.05) ? 10 : 9)]; };
    i64 m = e(), n = e(), k = e(), b = 1 + r_.pick(3);
    if (big_ || r_.chance(0.02)) {  // past the GEMM blocking (see gemm_* in core/thresholds.hpp)
      m = 90 + r_.pick(20);
      k = 250 + r_.pick(20);
      n = 1 + r_.pick(40);
    }
    Dims A, B, C;
    switch (r_.pick(6)) {
      case 0: A = {k}; B = {k}; break;
      case 1: A = {m, k}; B = {k, n}; C = {m, n}; break;
      case 2: A = {m, k}; B = {k}; C = {m}; break;
      case 3: A = {k}; B = {k, n}; C = {n}; break;
      case 4: A = {b, m, k}; B = {b, k, n}; C = {b, m, n}; break;
      default: A = {b, m, k}; B = {k, n}; C = {b, m, n}; break;
    }
    const int depth = big_ ? 1 : std::min(depth_budget(), 2);
    s.tree = operand_tree(A, depth, true, -1);
    s.tree2 = operand_tree(B, depth, true, -1);
    s_[s.dst] = {true, C};
    return s;
  }

  Stmt invalid_stmt(int live) {
    Stmt s;
    s.kind = Stmt::invalid;
    s.dst = live;
    s.src = live;
    const Dims& d = s_[live].shape;
    s.bad = r_.pick(7);
    const i64 a = 2 + r_.pick(4);
    switch (s.bad) {
      case 0:  // (a) + (a + 1) does not broadcast
        s.tree.kind = Node::binary;
        s.tree.b = BOp(r_.pick(kBOps));
        s.tree.kids = {fresh({a}), fresh({a + 1})};
        break;
      case 1:
        if (d.empty()) s.bad = 3;  // rows() of a scalar is refused as well, but keep the case simple
        else s.hi = d[0] + 1;
        break;
      case 2: s.dims = {numel(d) + 1}; break;
      case 3: break;
      case 4: {
        Dims bigger = d;
        bigger.insert(bigger.begin(), 2);
        s.op = BOp::add;
        s.tree = fresh(bigger);
        break;
      }
      case 5:
        s.red = Red::sum;
        s.all = false;
        s.axis = int(d.size()) + 1;
        s.tree.kind = Node::slot;
        s.tree.index = live;
        break;
      default:
        s.tree = fresh({a});
        s.tree2 = fresh({a + 1});
        break;
    }
    if (s.bad == 3 && numel(d) == 1) s.bad = 2, s.dims = {2};
    return s;
  }
};

}  // namespace fz
