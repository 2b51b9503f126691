// A fuzz program: plain data describing a sequence of statements over a few
// named float32 tensor slots. The generator builds one from a random source,
// the reference interpreter and the deft runner execute it, the shrinker edits
// it. Nothing here depends on deft.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace fz {

using i64 = std::int64_t;
using Dims = std::vector<i64>;

/// Number of tensor slots (t0..t5) a program works on.
inline constexpr int kSlots = 6;

// --- random sources ------------------------------------------------------------

/// Where the generator's decisions come from: a seeded PRNG for CI runs, the
/// fuzzer's bytes for libFuzzer. Values derived from a source are deterministic.
struct Source {
  virtual ~Source() = default;
  virtual std::uint64_t next() = 0;
  /// Uniform in [0, n) (n >= 1).
  std::uint64_t below(std::uint64_t n) { return n <= 1 ? 0 : next() % n; }
  int pick(int n) { return int(below(std::uint64_t(n))); }
  /// True with probability p.
  bool chance(double p) { return double(next() >> 11) * 0x1p-53 < p; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (double(next() >> 11) * 0x1p-53); }
};

/// SplitMix64: tiny, good enough, and reproducible everywhere.
struct SeededSource : Source {
  std::uint64_t state;
  explicit SeededSource(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() override {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

/// Reads decisions from a byte string (libFuzzer input); zeros once exhausted,
/// so every input, however short, is a valid program.
struct ByteSource : Source {
  const std::uint8_t* p;
  std::size_t n, i = 0;
  ByteSource(const std::uint8_t* data, std::size_t size) : p(data), n(size) {}
  std::uint64_t next() override {
    std::uint64_t v = 0;
    for (int k = 0; k < 4; ++k) v = (v << 8) | (i < n ? p[i++] : 0);  // 4 bytes a decision: inputs stay short
    return v * 0x9e3779b97f4a7c15ull ^ (v >> 7);
  }
};

// --- operations ------------------------------------------------------------------

// Every elementwise function of include/deft/ops/elementwise.hpp. cast_i32 is
// cast<float>(cast<int32_t>(x)): a float slot can only hold float values.
enum class UOp : std::uint8_t { neg, abs, exp, log, sqrt, tanh, sigmoid, relu, cast_i32 };
inline constexpr int kUOps = 9;
enum class BOp : std::uint8_t { add, sub, mul, div, lt, le, gt, ge, eq, ne, maximum, minimum, pow };
inline constexpr int kBOps = 13;
enum class Red : std::uint8_t { sum, mean, max, min, norm, argmax };
inline constexpr int kReds = 6;

inline const char* name(UOp u) {
  static const char* n[] = {"-", "deft::abs", "deft::exp", "deft::log", "deft::sqrt", "deft::tanh", "deft::sigmoid", "deft::relu", "cast_i32"};
  return n[int(u)];
}
inline const char* name(BOp b) {
  static const char* n[] = {"+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "deft::maximum", "deft::minimum", "deft::pow"};
  return n[int(b)];
}
inline bool infix(BOp b) { return int(b) <= int(BOp::ne); }
inline bool is_comparison(BOp b) { return int(b) >= int(BOp::lt) && int(b) <= int(BOp::ne); }
inline const char* name(Red r) {
  static const char* n[] = {"deft::sum", "deft::mean", "deft::max", "deft::min", "deft::norm", "deft::argmax"};
  return n[int(r)];
}

// --- programs ----------------------------------------------------------------------

/// An expression tree. Leaves: a slot, a fresh tensor, a plain number.
struct Node {
  enum Kind : std::uint8_t { slot, fresh, scalar, unary, binary, select } kind = scalar;
  int index = 0;             // slot: which one (t0..t5)
  Dims shape;                // fresh: its shape
  std::uint64_t vseed = 0;   // fresh: seeds its values (see fresh_values)
  std::uint8_t style = 0;    // fresh: value distribution
  bool filled = false;       // fresh: deft::full(shape, value) (a deferred task) instead of from values
  float value = 0;           // scalar, or the fill value
  bool cut = false;          // evaluate this subtree as its own task even where its parent could fuse it
  UOp u{};
  BOp b{};
  std::vector<Node> kids;    // unary: 1, binary: 2, select: 3 (cond, a, b)

  bool leaf() const { return kind == slot || kind == fresh || kind == scalar; }
  int depth() const {
    int d = 0;
    for (const auto& k : kids) d = std::max(d, k.depth());
    return leaf() ? 0 : d + 1;
  }
  int count() const {
    int c = 1;
    for (const auto& k : kids) c += k.count();
    return c;
  }
};

struct Stmt {
  enum Kind : std::uint8_t {
    bind,          // t[dst] = tree                      (rebinds; in place when t[dst] is the only handle)
    compound,      // t[dst] op= tree                    (in place, visible through shared handles and views)
    share,         // t[dst] = t[src]                    (both handles share storage)
    rows_view,     // t[dst] = t[src].rows(lo, hi)
    reshape_view,  // t[dst] = t[src].reshape(dims)
    assign,        // t[dst].assign(tree)                (whole storage of the handle, tree broadcast)
    assign_rows,   // t[dst].rows(lo, hi).assign(tree)
    clone,         // t[dst] = t[src].clone()
    drop,          // t[dst] = Tensor<float>()
    reduce,        // t[dst] = red(tree[, axis, keepdims])  (argmax: cast<float>(argmax(...)))
    dot,           // t[dst] = deft::dot(tree, tree2)
    transpose,     // t[dst] = deft::transpose(tree)
    wait,          // t[dst].wait_to_read(), then its values are checked
    to_vector,     // t[dst].to_vector() checked
    item,          // t[dst].item() checked (one-element tensors)
    wait_all,      // deft::wait_all(), then t[dst] is checked
    invalid,       // a statement deft must refuse with std::invalid_argument (see `bad`)
  } kind = wait;
  int dst = 0, src = 0;
  BOp op = BOp::add;  // compound: add, sub, mul, div
  Node tree, tree2;
  i64 lo = 0, hi = 0;  // rows
  Dims dims;           // reshape (may hold one -1)
  Red red = Red::sum;
  bool all = true;     // reduce over all elements, else over `axis`
  int axis = 0;
  bool keepdims = false;
  // invalid: which mistake. 0: bind of tree (shapes do not broadcast), 1: rows out of range,
  // 2: reshape to a wrong size, 3: item() of a tensor that is not one element,
  // 4: compound with a right side that broadcasts beyond the target, 5: reduce with a bad axis,
  // 6: dot of mismatched operands
  int bad = 0;
};

struct Program {
  std::uint64_t seed = 0;
  int workers = 1;
  bool synchronous = false;
  std::vector<Stmt> stmts;
};

// --- shapes and values -------------------------------------------------------------

inline i64 numel(const Dims& d) {
  i64 n = 1;
  for (i64 x : d) n *= x;
  return n;
}

inline std::string dims_str(const Dims& d, const char* open = "{", const char* close = "}") {
  std::string s = open;
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + close;
}

/// numpy broadcasting, written independently of deft. False when incompatible.
inline bool broadcast(const Dims& a, const Dims& b, Dims& out) {
  const std::size_t r = std::max(a.size(), b.size());
  out.assign(r, 1);
  for (std::size_t i = 0; i < r; ++i) {
    const long ia = long(i) - long(r - a.size()), ib = long(i) - long(r - b.size());
    const i64 da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out[i] = da == 1 ? db : da;
  }
  return true;
}

/// True when `a` broadcasts to exactly `target`.
inline bool broadcasts_to(const Dims& a, const Dims& target) {
  Dims o;
  return broadcast(a, target, o) && o == target;
}

/// The values of a fresh leaf: a function of (vseed, style, count) only, so the
/// shrinker may change a shape and the program stays well defined.
inline std::vector<float> fresh_values(const Node& n) {
  const i64 count = numel(n.shape);
  std::vector<float> v(std::size_t(count > 0 ? count : 0));
  if (n.filled) {
    for (auto& x : v) x = n.value;
    return v;
  }
  SeededSource g(n.vseed);
  constexpr float inf = std::numeric_limits<float>::infinity();
  static const float specials[] = {0.f, -0.f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1e30f, -1e30f,
                                   1e-40f, 88.5f, -100.f, 1.f, -1.f, 0.5f, 3e38f};
  for (auto& x : v) {
    switch (n.style) {
      case 0: x = float(int(g.below(7)) - 3); break;                          // small integers: exact arithmetic, ties
      case 1: x = float(g.uniform(-2, 2)); break;                             // ordinary values
      case 2: x = float(g.uniform(0.125, 4)); break;                          // positive: log, sqrt, pow
      case 3: x = g.chance(0.25) ? specials[g.below(std::size(specials))] : float(g.uniform(-3, 3)); break;
      default: x = float((g.chance(0.5) ? -1 : 1) * std::ldexp(g.uniform(1, 2), int(g.below(61)) - 30)); break;
    }
  }
  return v;
}
inline constexpr int kStyles = 5;

}  // namespace fz
