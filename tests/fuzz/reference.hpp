// The reference interpreter: runs a program eagerly in double precision with
// its own broadcasting, reductions and products (naive loops, nothing shared
// with deft). Every element carries a value v and an error bound e: how far
// deft's float32 result may be from v. An element is "unknown" when float32
// evaluation could legitimately give a different kind of answer (a divisor
// interval containing 0, a comparison whose operands' intervals overlap, a
// domain boundary, overflow near FLT_MAX); unknown elements are not compared.
//
// Bounds: an op's output bound is the largest |f(corner) - f(v)| over the
// corners of its inputs' intervals [v - e, v + e] (the functions used are
// monotone in each argument on the intervals where they are evaluated, or
// 1-Lipschitz) plus the op's own rounding: 1 ulp for + - * / sqrt (0 when
// the inputs are exact and the result is representable: IEEE rounds
// correctly), 8-16 ulp for exp log tanh sigmoid pow (xsimd), an absolute
// 2^-126 for possibly flushed subnormals. Sums add n * 2^-24 * sum|v_i|.
// deft passes when |deft - v| <= kTolerance * e; exact elements (e == 0),
// NaN and infinities must match exactly.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "program.hpp"

namespace fz::ref {

inline constexpr double kTolerance = 4.0;

struct Val {
  double v = 0, e = 0;
  bool unk = false;
};

/// A statement the reference finds invalid (bad shapes, ranges, axes).
struct Invalid : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline constexpr double kU = 0x1p-24;  // float's unit roundoff
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline Val unknown() { return {0, 0, true}; }
inline Val exact(double v) { return {v, 0, false}; }

/// Identical results: NaN equals NaN, +0 and -0 differ.
inline bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

/// An op's own rounding. `correct`: the float op rounds once, so exact inputs
/// and a representable result give an exact answer (also under FMA contraction).
struct Rounding {
  double ulps;
  double tiny;  // absolute term for results in (or flushed from) the subnormal range
  bool correct;
};
inline constexpr Rounding kExactOp{0, 0, true};        // neg, abs, maximum, minimum, select
inline constexpr Rounding kBasic{1, 0x1p-149, true};    // + - * / sqrt
inline constexpr Rounding kTransc{8, 0x1p-126, false};  // exp log tanh (xsimd polynomials)
inline constexpr Rounding kComposite{16, 0x1p-126, false};  // sigmoid = 1 / (1 + exp(-x))

/// Finishes a result r computed from the centre values with propagated bound ep.
inline Val finish(double r, double ep, Rounding rd) {
  if (std::isnan(r) || std::isinf(r)) return exact(r);  // callers made sure these are certain
  if (ep == 0 && rd.correct && double(float(r)) == r) return exact(r);
  const double a = std::abs(r);
  const double e = ep + rd.ulps * kU * a + (a < 0x1p-120 ? rd.tiny : 0);
  if (a - e >= 0x1p128) return exact(std::copysign(kInf, r));  // float certainly overflows
  if (a + e >= double(FLT_MAX)) return unknown();               // might or might not
  return {r, e};
}

/// f of one interval (f monotone or 1-Lipschitz).
template <class F>
Val map1(const Val& a, F f, Rounding rd) {
  if (a.unk) return unknown();
  const double r = f(a.v);
  if (a.e == 0) return finish(r, 0, rd);
  const double c0 = f(a.v - a.e), c1 = f(a.v + a.e);
  if (!std::isfinite(r) || !std::isfinite(c0) || !std::isfinite(c1))
    return same(r, c0) && same(r, c1) ? exact(r) : unknown();
  return finish(r, std::max(std::abs(c0 - r), std::abs(c1 - r)), rd);
}

/// f of two intervals (f monotone in each argument over the box, or bilinear).
template <class F>
Val map2(const Val& a, const Val& b, F f, Rounding rd) {
  if (a.unk || b.unk) return unknown();
  const double r = f(a.v, b.v);
  if (a.e == 0 && b.e == 0) return finish(r, 0, rd);
  double ep = 0;
  bool finite = std::isfinite(r), all_same = true;
  for (int i = 0; i < 4; ++i) {
    const double c = f(a.v + (i & 1 ? a.e : -a.e), b.v + (i & 2 ? b.e : -b.e));
    finite = finite && std::isfinite(c);
    all_same = all_same && same(c, r);
    if (std::isfinite(c) && std::isfinite(r)) ep = std::max(ep, std::abs(c - r));
  }
  if (!finite) return all_same ? exact(r) : unknown();
  return finish(r, ep, rd);
}

inline bool contains_zero(const Val& a) { return a.v - a.e <= 0 && a.v + a.e >= 0; }

// --- elementwise ops, mirroring include/deft/expr/ops.hpp -----------------------------

inline Val unary(UOp op, const Val& a) {
  switch (op) {
    case UOp::neg: return map1(a, [](double x) { return -x; }, kExactOp);
    case UOp::abs: return map1(a, [](double x) { return std::abs(x); }, kExactOp);
    case UOp::relu:  // maximum(x, 0): NaN propagates; max(-0, 0) is +0
      return map1(a, [](double x) { return (x > 0 || std::isnan(x)) ? x : 0.0; }, kExactOp);
    case UOp::exp:  // deft recomputes lanes near over- and underflow with std::exp (seed 18350)
      return map1(a, [](double x) { return std::exp(x); }, kTransc);
    case UOp::log:
      if (!a.unk && a.e > 0 && a.v - a.e <= 0) return unknown();  // domain boundary inside the interval
      return map1(a, [](double x) { return std::log(x); }, kTransc);
    case UOp::sqrt:
      if (!a.unk && a.e > 0 && a.v - a.e < 0) return unknown();
      return map1(a, [](double x) { return std::sqrt(x); }, kBasic);
    case UOp::tanh: return map1(a, [](double x) { return std::tanh(x); }, kTransc);
    case UOp::sigmoid: return map1(a, [](double x) { return 1 / (1 + std::exp(-x)); }, kComposite);
    case UOp::cast_i32: {
      // float -> int32 (NaN -> 0, saturating, truncating), then int32 -> float.
      if (a.unk) return unknown();
      auto conv = [](double x) -> double {
        if (std::isnan(x)) return 0;
        if (x <= -2147483648.0) return -2147483648.0;
        if (x >= 2147483648.0) return 2147483647.0;  // float(INT32_MAX) is 2^31
        return std::trunc(x);
      };
      const double r = conv(a.v);
      if (a.e > 0 && (conv(a.v - a.e) != r || conv(a.v + a.e) != r)) return unknown();
      return exact(double(float(std::int32_t(r))));
    }
  }
  return unknown();
}

/// a op b for comparisons: certain only when the intervals decide it.
inline Val compare(BOp op, const Val& a, const Val& b) {
  if (a.unk || b.unk) return unknown();
  if (std::isnan(a.v) || std::isnan(b.v)) return exact(op == BOp::ne ? 1 : 0);
  const double alo = a.v - a.e, ahi = a.v + a.e, blo = b.v - b.e, bhi = b.v + b.e;
  const bool exact_pair = a.e == 0 && b.e == 0;
  auto decide = [](bool certainly_true, bool certainly_false) { return certainly_true ? exact(1) : certainly_false ? exact(0) : unknown(); };
  switch (op) {
    case BOp::lt: return decide(ahi < blo, alo >= bhi);
    case BOp::le: return decide(ahi <= blo, alo > bhi);
    case BOp::gt: return decide(alo > bhi, ahi <= blo);
    case BOp::ge: return decide(alo >= bhi, ahi < blo);
    case BOp::eq: return decide(exact_pair && a.v == b.v, ahi < blo || alo > bhi);
    case BOp::ne: return decide(ahi < blo || alo > bhi, exact_pair && a.v == b.v);
    default: return unknown();
  }
}

inline Val binary(BOp op, const Val& a, const Val& b) {
  if (is_comparison(op)) return compare(op, a, b);
  if (a.unk || b.unk) return unknown();
  switch (op) {
    case BOp::add: return map2(a, b, [](double x, double y) { return x + y; }, kBasic);
    case BOp::sub: return map2(a, b, [](double x, double y) { return x - y; }, kBasic);
    case BOp::mul: return map2(a, b, [](double x, double y) { return x * y; }, kBasic);
    case BOp::div:
      if (contains_zero(b) && !(b.e == 0 && a.e == 0)) {
        // x / [interval around 0]: unknown, except an exact zero divisor with a
        // numerator of certain sign (and a finite one, or the sign could flip).
        if (b.e > 0 || contains_zero(a) || std::isnan(a.v)) return unknown();
      }
      return map2(a, b, [](double x, double y) { return x / y; }, kBasic);
    case BOp::maximum:  // choose((a > b) | isnan(a), a, b)
      return map2(a, b, [](double x, double y) { return (x > y || std::isnan(x)) ? x : y; }, kExactOp);
    case BOp::minimum:
      return map2(a, b, [](double x, double y) { return (x < y || std::isnan(x)) ? x : y; }, kExactOp);
    case BOp::pow: {
      // Compared on (0, inf) bases with finite exponents, and on exact inputs
      // with a base <= 0; not with inf or NaN operands.
      if (!std::isfinite(a.v) || !std::isfinite(b.v)) return unknown();
      const bool positive = a.v - a.e > 0;
      if (!positive && !(a.e == 0 && b.e == 0 && a.v <= 0)) return unknown();
      Val r = map2(a, b, [](double x, double y) { return std::pow(x, y); }, kTransc);
      if (a.v == 0) return r;  // numpy: 0^0 = 1, 0^y = 0 (y > 0) or inf (y < 0), exactly
      if (r.unk || !std::isfinite(r.v) || r.v == 0) return r;
      // exp(y * log|x|) in float: the product's rounding scales with |y log|x||.
      const double amp = std::abs(b.v * std::log(std::abs(a.v))) + 16;
      return finish(r.v, r.e + amp * kU * std::abs(r.v), {0, 0x1p-126, false});
    }
    default: return unknown();
  }
}

inline Val select(const Val& c, const Val& a, const Val& b) {
  if (c.unk) return unknown();
  if (std::isnan(c.v)) return a;  // NaN != 0
  if (c.e > 0 && contains_zero(c)) return unknown();
  return c.v != 0 ? a : b;
}

// --- tensors -------------------------------------------------------------------------

/// A value: shape plus row-major elements.
struct Value {
  Dims shape;
  std::vector<Val> data;
};

/// For every element of `out`, the row-major index into an operand of shape
/// `in` that broadcasts to it (right-aligned; size-1 extents repeat).
inline std::vector<i64> broadcast_index(const Dims& in, const Dims& out) {
  const i64 n = numel(out);
  std::vector<i64> idx(std::size_t(std::max<i64>(n, 0)));
  const std::size_t lead = out.size() - in.size();
  std::vector<i64> pos(out.size(), 0);
  for (i64 i = 0; i < n; ++i) {
    i64 off = 0;
    for (std::size_t d = 0; d < in.size(); ++d) off = off * in[d] + (in[d] == 1 ? 0 : pos[lead + d]);
    idx[std::size_t(i)] = off;
    for (long d = long(out.size()) - 1; d >= 0; --d) {
      if (++pos[d] < out[d]) break;
      pos[d] = 0;
    }
  }
  return idx;
}

/// Sum with deft's float accumulation in any order; mean divides by n.
inline Val sum_of(const std::vector<Val>& xs, bool mean) {
  bool nan = false, pinf = false, ninf = false, ints = true;
  double s = 0, sabs = 0, se = 0;
  for (const Val& x : xs) {
    if (x.unk) return unknown();
    if (std::isnan(x.v)) nan = true;
    else if (std::isinf(x.v)) (x.v > 0 ? pinf : ninf) = true;
    else {
      s += x.v;
      sabs += std::abs(x.v);
      se += x.e;
      ints = ints && x.e == 0 && x.v == std::trunc(x.v);
    }
  }
  if (sabs + se >= double(FLT_MAX) / 4) return unknown();  // a partial sum could overflow
  Val r;
  if (nan || (pinf && ninf)) r = exact(kNaN);
  else if (pinf || ninf) r = exact(pinf ? kInf : -kInf);
  else if (ints && sabs <= 0x1p24) r = exact(s);  // every partial sum is an exact float
  else r = {s, se + double(xs.size() + 1) * kU * sabs, false};
  if (!mean) return r;
  if (xs.empty()) return exact(kNaN);
  return binary(BOp::div, r, exact(double(xs.size())));
}

inline Val norm_of(const std::vector<Val>& xs) {
  std::vector<Val> sq(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) sq[i] = map1(xs[i], [](double x) { return x * x; }, kBasic);
  return unary(UOp::sqrt, sum_of(sq, false));
}

inline Val extreme_of(const std::vector<Val>& xs, bool is_max) {
  for (const Val& x : xs) {
    if (x.unk) return unknown();
    if (std::isnan(x.v)) return exact(kNaN);  // maximum/minimum propagate NaN
  }
  auto better = [is_max](double a, double b) { return is_max ? std::max(a, b) : std::min(a, b); };
  double r = is_max ? -kInf : kInf, upper = r, lower = r;
  for (const Val& x : xs) {
    r = better(r, x.v);
    upper = better(upper, x.v + x.e);
    lower = better(lower, x.v - x.e);
  }
  if (!std::isfinite(r)) return exact(r);
  return {r, std::max(std::abs(upper - r), std::abs(r - lower)), false};
}

/// Index of the first largest element (the first NaN wins), when certain.
inline Val argmax_of(const std::vector<Val>& xs) {
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].unk) return unknown();
    if (std::isnan(xs[i].v)) return exact(double(i));
  }
  std::size_t w = 0;
  for (std::size_t i = 1; i < xs.size(); ++i)
    if (xs[i].v > xs[w].v) w = i;
  const double wlo = xs[w].v - xs[w].e;
  for (std::size_t j = 0; j < xs.size(); ++j) {
    if (j == w) continue;
    const double jhi = xs[j].v + xs[j].e;
    if (j < w ? !(wlo > jhi) : !(wlo >= jhi)) return unknown();
  }
  return exact(double(w));
}

inline Val reduce_vals(Red r, const std::vector<Val>& xs) {
  switch (r) {
    case Red::sum: return sum_of(xs, false);
    case Red::mean: return sum_of(xs, true);
    case Red::norm: return norm_of(xs);
    case Red::max: return extreme_of(xs, true);
    case Red::min: return extreme_of(xs, false);
    case Red::argmax: return argmax_of(xs);
  }
  return unknown();
}

inline bool needs_elements(Red r) { return r == Red::max || r == Red::min || r == Red::argmax; }

/// Over all elements (a 0-d result: deft's whole reductions have no keepdims) or one axis.
inline Value reduce(Red r, const Value& x, bool all, int axis, bool keepdims) {
  Value out;
  const int rank = int(x.shape.size());
  if (all) {
    if (needs_elements(r) && x.data.empty()) throw Invalid("reduction of an empty tensor");
    out.data.push_back(reduce_vals(r, x.data));
    return out;
  }
  if (axis < -rank || axis >= rank) throw Invalid("axis out of range");
  if (axis < 0) axis += rank;
  i64 outer = 1, len = x.shape[axis], inner = 1;
  for (int d = 0; d < rank; ++d) {
    if (d < axis) outer *= x.shape[d];
    if (d > axis) inner *= x.shape[d];
    if (d != axis) out.shape.push_back(x.shape[d]);
    else if (keepdims) out.shape.push_back(1);
  }
  if (needs_elements(r) && len == 0) throw Invalid("reduction over an empty axis");
  std::vector<Val> line(static_cast<std::size_t>(len));
  for (i64 o = 0; o < outer; ++o)
    for (i64 i = 0; i < inner; ++i) {
      for (i64 j = 0; j < len; ++j) line[j] = x.data[std::size_t((o * len + j) * inner + i)];
      out.data.push_back(reduce_vals(r, line));
    }
  return out;
}

/// numpy dot for ranks 1-2 and deft's batched rank 3 (see ops/linalg.hpp's doc).
inline Value dot(const Value& a, const Value& b) {
  const std::size_t ra = a.shape.size(), rb = b.shape.size();
  if (ra == 0 || rb == 0 || ra > 3 || rb > 3 || (ra < 3 && rb == 3)) throw Invalid("dot: unsupported ranks");
  const i64 k = a.shape[ra - 1], kb = rb == 1 ? b.shape[0] : b.shape[rb - 2];
  if (k != kb) throw Invalid("dot: inner extents differ");
  const i64 m = ra >= 2 ? a.shape[ra - 2] : 1, n = rb >= 2 ? b.shape[rb - 1] : 1;
  const i64 batch = ra == 3 ? a.shape[0] : 1;
  if (rb == 3 && b.shape[0] != batch) throw Invalid("dot: batch extents differ");
  Value c;
  if (ra == 3) c.shape.push_back(batch);
  if (ra >= 2) c.shape.push_back(m);
  if (rb >= 2) c.shape.push_back(n);
  std::vector<Val> terms(static_cast<std::size_t>(k));
  for (i64 p = 0; p < batch; ++p)
    for (i64 i = 0; i < m; ++i)
      for (i64 j = 0; j < n; ++j) {
        bool overflow = false;
        for (i64 q = 0; q < k; ++q) {
          const Val& x = a.data[std::size_t((p * m + i) * k + q)];
          const Val& y = b.data[std::size_t(((rb == 3 ? p : 0) * k + q) * n + j)];
          terms[q] = binary(BOp::mul, x, y);
          // A finite product past FLT_MAX is inf when rounded alone, but an FMA
          // adds it to the sum unrounded (inf + -inf or -inf: order-dependent).
          overflow = overflow || (std::isfinite(x.v) && std::isfinite(y.v) && std::abs(x.v * y.v) >= double(FLT_MAX) / 4);
        }
        c.data.push_back(overflow ? unknown() : sum_of(terms, false));
      }
  return c;
}

inline Value transpose(const Value& x) {
  Value out;
  out.shape.assign(x.shape.rbegin(), x.shape.rend());
  const int r = int(x.shape.size());
  std::vector<i64> pos(r, 0);
  out.data.resize(x.data.size());
  const i64 n = numel(x.shape);
  for (i64 i = 0; i < n; ++i) {  // i walks x in row-major order
    i64 o = 0;
    for (int d = r - 1; d >= 0; --d) o = o * out.shape[r - 1 - d] + pos[d];
    out.data[std::size_t(o)] = x.data[std::size_t(i)];
    for (int d = r - 1; d >= 0; --d) {
      if (++pos[d] < x.shape[d]) break;
      pos[d] = 0;
    }
  }
  return out;
}

// --- the interpreter ------------------------------------------------------------------

struct Storage {
  std::vector<Val> data;
};
/// A handle: shared storage, an offset and a shape (views are contiguous ranges).
struct Slot {
  std::shared_ptr<Storage> st;
  i64 off = 0;
  Dims shape;
  bool live() const { return bool(st); }
};

inline bool valid_reshape(const Dims& from, Dims dims, Dims& out) {
  i64 known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1 && infer < 0) infer = int(i);
    else if (dims[i] < 0) return false;
    else known *= dims[i];
  }
  const i64 size = numel(from);
  if (infer >= 0) {
    if (known == 0 || size % known != 0) return false;
    dims[infer] = size / known;
  }
  if (dims.size() > 8 || numel(dims) != size) return false;
  out = dims;
  return true;
}

class Interpreter {
 public:
  Slot slots[kSlots];

  Value read(int s) const {
    const Slot& sl = live(s);
    Value v;
    v.shape = sl.shape;
    const auto b = sl.st->data.begin() + sl.off;
    v.data.assign(b, b + numel(sl.shape));
    return v;
  }

  const Slot& live(int s) const {
    if (s < 0 || s >= kSlots || !slots[s].live()) throw Invalid("use of an empty slot t" + std::to_string(s));
    return slots[s];
  }

  Value eval(const Node& n) const {
    switch (n.kind) {
      case Node::slot: return read(n.index);
      case Node::scalar: return {{}, {exact(double(n.value))}};
      case Node::fresh: {
        Value v{n.shape, {}};
        for (float x : fresh_values(n)) v.data.push_back(exact(double(x)));
        return v;
      }
      case Node::unary: {
        Value v = eval(n.kids.at(0));
        for (auto& x : v.data) x = unary(n.u, x);
        return v;
      }
      case Node::binary: {
        const Value a = eval(n.kids.at(0)), b = eval(n.kids.at(1));
        Value out;
        if (!broadcast(a.shape, b.shape, out.shape)) throw Invalid("binary: shapes do not broadcast");
        const auto ia = broadcast_index(a.shape, out.shape), ib = broadcast_index(b.shape, out.shape);
        out.data.resize(ia.size());
        for (std::size_t i = 0; i < ia.size(); ++i) out.data[i] = binary(n.b, a.data[ia[i]], b.data[ib[i]]);
        return out;
      }
      case Node::select: {
        const Value c = eval(n.kids.at(0)), a = eval(n.kids.at(1)), b = eval(n.kids.at(2));
        Dims ab;
        Value out;
        if (!broadcast(a.shape, b.shape, ab) || !broadcast(c.shape, ab, out.shape)) throw Invalid("where: shapes do not broadcast");
        const auto ic = broadcast_index(c.shape, out.shape), ia = broadcast_index(a.shape, out.shape),
                   ib = broadcast_index(b.shape, out.shape);
        out.data.resize(ic.size());
        for (std::size_t i = 0; i < ic.size(); ++i) out.data[i] = select(c.data[ic[i]], a.data[ia[i]], b.data[ib[i]]);
        return out;
      }
    }
    throw Invalid("bad node");
  }

  /// Runs one statement; throws Invalid (before changing anything) when it is not valid.
  void exec(const Stmt& s) {
    switch (s.kind) {
      case Stmt::bind: {
        if (s.tree.kind == Node::scalar) throw Invalid("bind of a plain number");
        if (s.tree.kind == Node::slot) {  // `t = u` copies the handle: both share storage
          slots[s.dst] = live(s.tree.index);
          return;
        }
        Value v = eval(s.tree);
        bind_new(s.dst, std::move(v));
        return;
      }
      case Stmt::compound: {
        const Slot& d = live(s.dst);
        const Value v = eval(s.tree);
        if (!broadcasts_to(v.shape, d.shape)) throw Invalid("compound: right side does not broadcast to the target");
        const auto idx = broadcast_index(v.shape, d.shape);
        for (std::size_t i = 0; i < idx.size(); ++i) {
          Val& x = d.st->data[std::size_t(d.off) + i];
          x = binary(s.op, x, v.data[idx[i]]);
        }
        return;
      }
      case Stmt::share: slots[s.dst] = live(s.src); return;
      case Stmt::rows_view: slots[s.dst] = rows(live(s.src), s.lo, s.hi); return;
      case Stmt::reshape_view: {
        Slot v = live(s.src);
        if (!valid_reshape(v.shape, s.dims, v.shape)) throw Invalid("reshape: bad extents");
        slots[s.dst] = v;
        return;
      }
      case Stmt::assign: write(live(s.dst), s.tree); return;
      case Stmt::assign_rows: write(rows(live(s.dst), s.lo, s.hi), s.tree); return;
      case Stmt::clone: bind_new(s.dst, read(s.src)); return;
      case Stmt::drop: slots[s.dst] = Slot{}; return;
      case Stmt::reduce: bind_new(s.dst, reduce(s.red, eval(s.tree), s.all, s.axis, s.keepdims)); return;
      case Stmt::dot: bind_new(s.dst, dot(eval(s.tree), eval(s.tree2))); return;
      case Stmt::transpose: bind_new(s.dst, transpose(eval(s.tree))); return;
      case Stmt::wait:
      case Stmt::to_vector:
      case Stmt::wait_all: live(s.dst); return;
      case Stmt::item:
        if (numel(live(s.dst).shape) != 1) throw Invalid("item of a tensor that is not one element");
        return;
      case Stmt::invalid: {
        // The mistake must be one: on a copy, the wrapped statement must throw.
        Interpreter copy = *this;
        try {
          copy.exec(invalid_body(s));
        } catch (const Invalid&) {
          return;
        }
        throw Invalid("the statement meant to be invalid is valid");
      }
    }
  }

  /// The statement an `invalid` one wraps.
  static Stmt invalid_body(const Stmt& s) {
    static const Stmt::Kind kinds[] = {Stmt::bind, Stmt::rows_view, Stmt::reshape_view, Stmt::item,
                                       Stmt::compound, Stmt::reduce, Stmt::dot};
    Stmt b = s;
    b.kind = kinds[s.bad % 7];
    return b;
  }

 private:
  static Slot rows(const Slot& s, i64 lo, i64 hi) {
    if (s.shape.empty() || lo < 0 || hi < lo || hi > s.shape[0]) throw Invalid("rows: out of range");
    Slot v = s;
    v.off += lo * (s.shape[0] ? numel(s.shape) / s.shape[0] : 0);
    v.shape[0] = hi - lo;
    return v;
  }
  void write(const Slot& d, const Node& tree) {
    if (tree.kind == Node::scalar) throw Invalid("assign of a plain number");
    const Value v = eval(tree);
    if (!broadcasts_to(v.shape, d.shape)) throw Invalid("assign: value does not broadcast to the target");
    const auto idx = broadcast_index(v.shape, d.shape);
    for (std::size_t i = 0; i < idx.size(); ++i) d.st->data[std::size_t(d.off) + i] = v.data[idx[i]];
  }
  void bind_new(int dst, Value v) {
    Slot s;
    s.st = std::make_shared<Storage>();
    s.st->data = std::move(v.data);
    s.shape = std::move(v.shape);
    slots[dst] = std::move(s);
  }
};

}  // namespace fz::ref
