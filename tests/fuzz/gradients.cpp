// deft_fuzz_gradients: random differentiable programs in double precision,
// their gradients by backward() against finite differences of the same
// program. See docs/fuzzing.md.
//
//   deft_fuzz_gradients [--programs N] [--seed S]   N seeded programs (default 4000,
//                                                   or $DEFT_FUZZ_GRADIENT_PROGRAMS)
//   deft_fuzz_gradients --replay SEED               print one program and check it
//
// Two kinds of program, alternating:
// - smooth: continuous random inputs, any op (the kinks of relu, abs,
//   maximum, max... are met with probability 0). Every gradient element
//   must match the central difference.
// - ties: integer inputs in [-2, 2], one op with a kink applied to them
//   first (ties and zeros on purpose), then only smooth ops. deft's
//   gradient must be a subgradient: along each input element it lies
//   between the one-sided differences; after maximum, minimum or a max/min
//   reduction, also along the direction moving every input at once (a tie
//   stays a tie there), so a tie cannot hand out the upstream gradient twice.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <deft/deft.hpp>

#include "program.hpp"

namespace {

using deft::Shape;
using deft::Tensor;
using T = Tensor<double>;
using fz::i64;

enum class Op {
  // smooth everywhere (on the inputs these programs give them)
  neg, exp_tanh, log_sq, sqrt_sq, tanh, sigmoid, sin, cos, softmax, log_softmax, sum_axis, sum_all, mean_axis,
  mean_all, transpose, flatten, rows, slice, add, sub, mul, div, pow, dot_right, dot_left, concat, stack,
  // smooth away from zero (not after a kink)
  norm_axis, norm_all,
  // kinks
  relu, abs, maximum, minimum, max_axis, max_all, min_axis, min_all, clip, where_max,
};
constexpr int kSmooth = int(Op::stack) + 1, kAwayFromZero = int(Op::norm_all) + 1, kOps = int(Op::where_max) + 1;
const char* const kNames[] = {
    "-",         "exp∘tanh", "log(x²+1)", "sqrt(x²+½)", "tanh",     "sigmoid", "sin",     "cos",      "softmax",
    "log_softmax", "sum(axis)", "sum",     "mean(axis)", "mean",     "transpose", "reshape(-1)", "rows", "slice",
    "+",         "-",        "*",         "/(b²+1)",    "pow(b²+1, tanh a)", "dot(a, W)", "dot(W, a)", "concat", "stack",
    "norm(axis)", "norm",    "relu",      "abs",        "maximum",  "minimum", "max(axis)", "max",     "min(axis)",
    "min",       "clip(-1, 1)", "where(a > b, a, b)"};

// One statement: values[out] = op(values[a], values[b]) with its parameters.
struct Step {
  Op op;
  int a = 0, b = 0;
  int axis = 0;
  bool keepdims = false;
  i64 begin = 0, end = 0, step = 1;
  std::vector<int> perm;
  int weight = -1;  // dot's extra input
};

struct Program {
  std::vector<Shape> input_shapes;
  std::vector<Step> steps;
  Shape out_shape;
  bool ties = false;
};

bool broadcastable(const Shape& a, const Shape& b) {
  for (int i = 1; i <= std::min(a.rank(), b.rank()); ++i) {
    const i64 x = a[a.rank() - i], y = b[b.rank() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

Shape broadcast(const Shape& a, const Shape& b) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<i64> out(r);
  for (int i = 1; i <= r; ++i) {
    const i64 x = i <= a.rank() ? a[a.rank() - i] : 1, y = i <= b.rank() ? b[b.rank() - i] : 1;
    out[r - i] = x == 1 ? y : x;
  }
  return Shape(out);
}

// Runs the program on `inputs`; the same steps for every set of inputs.
struct Runner {
  const Program& p;
  // The second operand of a binary op, made broadcastable with a.
  static T partner(const T& a, const T& b) { return broadcastable(a.shape(), b.shape()) ? b : T(deft::sum(b)); }

  T run(const std::vector<T>& inputs) const {
    std::vector<T> v(inputs.begin(), inputs.begin() + std::ptrdiff_t(p.input_shapes.size() - count_weights()));
    for (const Step& s : p.steps) v.push_back(apply(s, v, inputs));
    return v.back();
  }
  std::size_t count_weights() const {
    return std::size_t(std::count_if(p.steps.begin(), p.steps.end(), [](const Step& s) { return s.weight >= 0; }));
  }
  static T apply(const Step& s, const std::vector<T>& v, const std::vector<T>& inputs) {
    const T& a = v[std::size_t(s.a)];
    const T& b = v[std::size_t(s.b)];
    switch (s.op) {
      case Op::neg: return -a;
      case Op::exp_tanh: return deft::exp(deft::tanh(a));
      case Op::log_sq: return deft::log(a * a + 1.0);
      case Op::sqrt_sq: return deft::sqrt(a * a + 0.5);
      case Op::tanh: return deft::tanh(a);
      case Op::sigmoid: return deft::sigmoid(a);
      case Op::sin: return deft::sin(a);
      case Op::cos: return deft::cos(a);
      case Op::softmax: return deft::softmax(a, s.axis);
      case Op::log_softmax: return deft::log_softmax(a, s.axis);
      case Op::sum_axis: return deft::sum(a, s.axis, s.keepdims);
      case Op::sum_all: return deft::sum(a);
      case Op::mean_axis: return deft::mean(a, s.axis, s.keepdims);
      case Op::mean_all: return deft::mean(a);
      case Op::transpose: return deft::transpose(a, s.perm);
      case Op::flatten: return a.reshape({-1});
      case Op::rows: return a.rows(s.begin, s.end);
      case Op::slice: return deft::slice(a, s.axis, s.begin, s.end, s.step);
      case Op::add: return a + partner(a, b);
      case Op::sub: return a - partner(a, b);
      case Op::mul: return a * partner(a, b);
      case Op::div: {
        const T d = partner(a, b);
        return a / (d * d + 1.0);
      }
      case Op::pow: {
        const T d = partner(a, b);
        return deft::pow(d * d + 1.0, deft::tanh(a));
      }
      case Op::dot_right: return deft::dot(a, inputs[std::size_t(s.weight)]);
      case Op::dot_left: return deft::dot(inputs[std::size_t(s.weight)], a);
      case Op::concat: return deft::concat({a, T(deft::slice(a, s.axis, 0, 1) * deft::sum(b))}, s.axis);
      case Op::stack: return deft::stack({a, T(a * deft::sum(b))}, s.axis);
      case Op::norm_axis: return deft::norm(a, s.axis, s.keepdims);
      case Op::norm_all: return deft::norm(a);
      case Op::relu: return deft::relu(a);
      case Op::abs: return deft::abs(a);
      case Op::maximum: return deft::maximum(a, partner(a, b));
      case Op::minimum: return deft::minimum(a, partner(a, b));
      case Op::max_axis: return deft::max(a, s.axis, s.keepdims);
      case Op::max_all: return deft::max(a);
      case Op::min_axis: return deft::min(a, s.axis, s.keepdims);
      case Op::min_all: return deft::min(a);
      case Op::clip: return deft::clip(a, -1.0, 1.0);
      case Op::where_max: {
        const T d = partner(a, b);
        return deft::where(a > d, a, d);
      }
    }
    return a;
  }
};

Shape random_shape(fz::Source& src, int max_rank = 3) {
  const int r = src.pick(max_rank + 1);
  std::vector<i64> d(static_cast<std::size_t>(r));
  for (auto& e : d) e = 1 + i64(src.below(4));
  return Shape(d);
}

// Builds a program: each step picks an op that the current shapes allow.
Program generate(std::uint64_t seed) {
  fz::SeededSource src(seed);
  Program p;
  p.ties = seed % 2 == 0;
  const int n_inputs = 1 + src.pick(2);
  std::vector<Shape> shapes;
  for (int i = 0; i < n_inputs; ++i) shapes.push_back(random_shape(src)), p.input_shapes.push_back(shapes.back());
  std::vector<Shape> weights;
  const int n_steps = 1 + src.pick(6);
  while (int(p.steps.size()) < n_steps) {
    Step s;
    const bool first = p.steps.empty();
    // A tie program's first step is a kink on an input; the rest is smooth.
    const int range = p.ties ? (first ? kOps - kAwayFromZero : kSmooth) : kOps;
    s.op = Op((p.ties && first ? kAwayFromZero : 0) + src.pick(range));
    // The latest value most often, so programs go deep.
    s.a = p.ties && first ? src.pick(n_inputs) : src.chance(0.6) ? int(shapes.size()) - 1 : src.pick(int(shapes.size()));
    s.b = p.ties && first ? src.pick(n_inputs) : src.pick(int(shapes.size()));
    const bool binary_tie = s.op == Op::maximum || s.op == Op::minimum || s.op == Op::where_max;
    if (binary_tie && !p.ties && s.a == s.b) continue;  // a tie with itself, every element
    const Shape& a = shapes[std::size_t(s.a)];
    const Shape& b = shapes[std::size_t(s.b)];
    const int r = a.rank();
    s.axis = r ? src.pick(r) : 0;
    s.keepdims = src.chance(0.5);
    auto partner_shape = [&] { return broadcastable(a, b) ? b : Shape{}; };
    Shape out;
    switch (s.op) {
      case Op::softmax: case Op::log_softmax:
        if (r == 0) continue;
        out = a;
        break;
      case Op::sum_axis: case Op::mean_axis: case Op::norm_axis: case Op::max_axis: case Op::min_axis: {
        if (r == 0) continue;
        std::vector<i64> d(a.begin(), a.end());
        if (s.keepdims) d[std::size_t(s.axis)] = 1;
        else d.erase(d.begin() + s.axis);
        out = Shape(d);
        break;
      }
      case Op::sum_all: case Op::mean_all: case Op::norm_all: case Op::max_all: case Op::min_all: out = Shape{}; break;
      case Op::transpose: {
        s.perm.resize(std::size_t(r));
        std::iota(s.perm.begin(), s.perm.end(), 0);
        for (int i = r - 1; i > 0; --i) std::swap(s.perm[std::size_t(i)], s.perm[std::size_t(src.pick(i + 1))]);
        std::vector<i64> d;
        for (int x : s.perm) d.push_back(a[x]);
        out = Shape(d);
        break;
      }
      case Op::flatten: out = Shape{a.size()}; break;
      case Op::rows: case Op::slice: {
        if (r == 0) continue;
        const int axis = s.op == Op::rows ? 0 : s.axis;
        s.axis = axis;
        s.begin = i64(src.below(std::uint64_t(a[axis])));
        s.end = s.begin + 1 + i64(src.below(std::uint64_t(a[axis] - s.begin)));
        if (s.op == Op::slice) s.step = 1 + i64(src.below(3));
        std::vector<i64> d(a.begin(), a.end());
        d[std::size_t(axis)] = (s.end - s.begin + s.step - 1) / s.step;
        out = Shape(d);
        break;
      }
      case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::pow: case Op::maximum: case Op::minimum:
      case Op::where_max:
        out = broadcast(a, partner_shape());
        break;
      case Op::dot_right: case Op::dot_left: {
        if (r == 0 || r > 3 || p.input_shapes.size() >= 6) continue;  // dot takes up to rank 3
        const i64 m = 1 + i64(src.below(3)), n = 1 + i64(src.below(3));
        Shape w;
        if (s.op == Op::dot_right) {  // a (k), (m,k), (B,m,k) by W (k), (k,n) or, for a batch, (B,k,n)
          const i64 k = a[r - 1];
          const int kind = src.pick(r == 3 ? 3 : 2);
          w = kind == 0 ? Shape{k} : kind == 1 ? Shape{k, n} : Shape{a[0], k, n};
          std::vector<i64> d(a.begin(), a.end() - 1);
          if (kind >= 1) d.push_back(n);
          out = Shape(d);
        } else {  // W (k), (m,k), (B,m,k) by a (k), (k,n), (B,k,n)
          if (r == 3) {
            w = Shape{a[0], m, a[1]};
            out = Shape{a[0], m, a[2]};
          } else {
            const i64 k = a[0];
            const int kind = src.pick(r == 2 ? 3 : 2);
            w = kind == 0 ? Shape{k} : kind == 1 ? Shape{m, k} : Shape{2, m, k};
            if (r == 1) out = kind == 0 ? Shape{} : Shape{m};
            else out = kind == 0 ? Shape{a[1]} : kind == 1 ? Shape{m, a[1]} : Shape{2, m, a[1]};
            if (r == 1 && kind == 2) continue;  // (B,m,k)(k) is the dot_right form
          }
        }
        s.weight = int(p.input_shapes.size());
        p.input_shapes.push_back(w);
        break;
      }
      case Op::concat: {
        if (r == 0) continue;
        std::vector<i64> d(a.begin(), a.end());
        d[std::size_t(s.axis)] += 1;
        out = Shape(d);
        break;
      }
      case Op::stack: {
        s.axis = src.pick(r + 1);
        std::vector<i64> d(a.begin(), a.end());
        d.insert(d.begin() + s.axis, 2);
        out = Shape(d);
        break;
      }
      default: out = a; break;
    }
    p.steps.push_back(s);
    shapes.push_back(out);
  }
  p.out_shape = shapes.back();
  return p;
}

std::string describe(const Program& p) {
  std::ostringstream o;
  std::size_t w = 0;
  const std::size_t plain = p.input_shapes.size() - std::size_t(std::count_if(p.steps.begin(), p.steps.end(), [](const Step& s) { return s.weight >= 0; }));
  o << (p.ties ? "ties" : "smooth") << " program; inputs:";
  for (std::size_t i = 0; i < plain; ++i) o << " v" << i << p.input_shapes[i].to_string();
  o << "\n";
  std::size_t out = plain;
  for (const Step& s : p.steps) {
    o << "  v" << out++ << " = " << kNames[int(s.op)] << "(v" << s.a;
    if (s.op >= Op::add && s.op <= Op::pow) o << ", v" << s.b;
    if (s.op == Op::maximum || s.op == Op::minimum || s.op == Op::where_max || s.op == Op::concat || s.op == Op::stack)
      o << ", v" << s.b;
    o << ") axis " << s.axis << (s.keepdims ? " keepdims" : "") << " [" << s.begin << ", " << s.end << ")";
    if (s.step != 1) o << " step " << s.step;
    if (s.weight >= 0) o << " W" << w++ << p.input_shapes[std::size_t(s.weight)].to_string();
    o << "\n";
  }
  return o.str();
}

struct Outcome {
  bool ok = true;
  std::string message;
};

std::int64_t compared = 0;  // gradient elements and directions checked

// loss = sum(out * c) for a fixed random c: every output element matters.
Outcome check(const Program& p, std::uint64_t seed) {
  fz::SeededSource src(seed ^ 0x5bd1e995ull);
  std::vector<std::vector<double>> values;
  const std::size_t n_weights = std::size_t(std::count_if(p.steps.begin(), p.steps.end(), [](const Step& s) { return s.weight >= 0; }));
  for (std::size_t i = 0; i < p.input_shapes.size(); ++i) {
    std::vector<double> v(std::size_t(p.input_shapes[i].size()));
    const bool integer = p.ties && i < p.input_shapes.size() - n_weights;
    for (auto& x : v) x = integer ? double(i64(src.below(5)) - 2) : src.uniform(-1.5, 1.5);
    values.push_back(std::move(v));
  }
  std::vector<double> cv(std::size_t(p.out_shape.size()));
  for (auto& x : cv) x = src.uniform(-1, 1);
  const T c(cv, p.out_shape);
  const Runner runner{p};
  auto loss = [&](const std::vector<std::vector<double>>& at) {
    std::vector<T> in;
    for (std::size_t i = 0; i < at.size(); ++i) in.emplace_back(at[i], p.input_shapes[i]);
    return T(deft::sum(runner.run(in) * c)).item();
  };
  std::vector<T> inputs;
  for (std::size_t i = 0; i < values.size(); ++i) {
    inputs.emplace_back(values[i], p.input_shapes[i]);
    inputs.back().attach_grad();
  }
  std::vector<std::vector<double>> grads;
  try {
    {
      deft::autograd::record rec;
      T l = deft::sum(runner.run(inputs) * c);
      l.backward();
    }
    for (auto& x : inputs) grads.push_back(x.grad().to_vector());
  } catch (const std::exception& e) {
    return {false, std::string("backward threw: ") + e.what()};
  }
  const double f0 = loss(values);
  std::ostringstream why;
  auto fail = [&](const std::string& where, double got, double lo, double hi) {
    why << where << ": backward gives " << got << ", finite differences " << lo;
    if (hi != lo) why << " .. " << hi;
    return Outcome{false, why.str()};
  };
  // f along direction d (the same shape as values) at x + t d.
  auto along = [&](const std::vector<std::vector<double>>& d, double t) {
    auto x = values;
    for (std::size_t i = 0; i < x.size(); ++i)
      for (std::size_t k = 0; k < x[i].size(); ++k) x[i][k] += t * d[i][k];
    return loss(x);
  };
  auto unit = [&](std::size_t i, std::size_t k) {
    std::vector<std::vector<double>> d;
    for (const auto& v : values) d.emplace_back(v.size(), 0.0);
    d[i][k] = 1;
    return d;
  };
  // Each difference is taken at steps h and h/2; how far they differ
  // bounds the error of the second (it shrinks 4x per halving), so a
  // program with steep derivatives gets the slack its differences need.
  const double h = 1e-5, tol = 1e-6;
  auto central = [&](const std::vector<std::vector<double>>& d, double step) {
    return (along(d, step) - along(d, -step)) / (2 * step);
  };
  // Second-order one-sided differences (sign +1: right, -1: left). In tie
  // programs the inputs are integers, so no other kink lies within 2h.
  auto one_sided = [&](const std::vector<std::vector<double>>& d, double sign, double step) {
    return sign * (4 * along(d, sign * step) - along(d, 2 * sign * step) - 3 * f0) / (2 * step);
  };
  auto slack = [&](double coarse, double fine) { return tol * std::max(1.0, std::abs(fine)) + 2 * std::abs(coarse - fine); };
  if (!p.ties) {
    for (std::size_t i = 0; i < values.size(); ++i)
      for (std::size_t k = 0; k < values[i].size(); ++k) {
        const auto d = unit(i, k);
        const double coarse = central(d, h), numeric = central(d, h / 2);
        ++compared;
        if (!(std::abs(grads[i][k] - numeric) <= slack(coarse, numeric)))
          return fail("input " + std::to_string(i) + " element " + std::to_string(k), grads[i][k], numeric, numeric);
      }
    return {};
  }
  // Ties: one-sided differences bracket each element's gradient.
  auto bracket = [&](const std::vector<std::vector<double>>& d, double got, const std::string& where) -> Outcome {
    const double right = one_sided(d, 1, h / 2), left = one_sided(d, -1, h / 2);
    const double room = std::max(slack(one_sided(d, 1, h), right), slack(one_sided(d, -1, h), left));
    ++compared;
    if (!(got >= std::min(left, right) - room && got <= std::max(left, right) + room))
      return fail(where, got, std::min(left, right), std::max(left, right));
    return {};
  };
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::size_t k = 0; k < values[i].size(); ++k)
      if (auto o = bracket(unit(i, k), grads[i][k], "input " + std::to_string(i) + " element " + std::to_string(k)); !o.ok)
        return o;
  // Along the joint direction a tie of maximum, minimum or a max/min
  // reduction stays a tie. (An elementwise kink is separable: its Clarke
  // subgradient is any per-element choice, as clip's at both bounds.)
  const Op first = p.steps.front().op;
  if (first == Op::relu || first == Op::abs || first == Op::clip) return {};
  std::vector<std::vector<double>> all;
  double along_all = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const bool moves = i < values.size() - n_weights;  // the inputs, not dot's weights
    all.emplace_back(values[i].size(), moves ? 1.0 : 0.0);
    if (moves) along_all += std::accumulate(grads[i].begin(), grads[i].end(), 0.0);
  }
  return bracket(all, along_all, "every input moved together (the sum of their gradients)");
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t programs = 4000;
  if (const char* e = std::getenv("DEFT_FUZZ_GRADIENT_PROGRAMS")) programs = std::atoll(e);
  std::uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string value = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--programs") programs = std::stoll(value), ++i;
    else if (a == "--seed") seed = std::stoull(value), ++i;
    else if (a == "--replay") {
      const std::uint64_t s = std::stoull(value);
      const Program p = generate(s);
      std::cout << "seed " << s << ": " << describe(p);
      const Outcome o = check(p, s);
      std::cout << (o.ok ? "ok" : "FAIL: " + o.message) << "\n";
      return o.ok ? 0 : 1;
    } else {
      std::cerr << "usage: deft_fuzz_gradients [--programs N] [--seed S] | --replay SEED\n";
      return 2;
    }
  }
  std::int64_t failures = 0;
  for (std::int64_t n = 0; n < programs; ++n) {
    const std::uint64_t s = seed + std::uint64_t(n);
    const Program p = generate(s);
    const Outcome o = check(p, s);
    if (!o.ok) {
      ++failures;
      std::cout << "FAIL: seed " << s << ": " << o.message << "\n" << describe(p)
                << "replay with: deft_fuzz_gradients --replay " << s << "\n";
      if (failures >= 5) break;
    }
  }
  std::cout << programs << " gradient programs from seed " << seed << " (" << compared
            << " gradient elements and directions compared): " << failures << " failed\n";
  return failures ? 1 : 0;
}
