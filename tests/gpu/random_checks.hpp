// Random programs on the host and the GPUs (two where there are two):
// statements over tensors, recorded gradients, hybridized forwards, each
// statement on a device of its own, against double-precision references or
// the host's run of the same program. They reach what the fixed cases of
// tensor_checks.hpp order by hand. Both runners include this (the device
// runner in a translation unit of its own: nvcc takes minutes over these).
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <deft/deft.hpp>
#include <deft/nn.hpp>

#include "check_support.hpp"

namespace gpu_tensors {

/// Random programs over five square matrices on the host and the GPUs (two
/// where there are two): fused expressions whose operands are first copied
/// to one device, matrix products (one operand transposed, or a block of
/// rows), reductions along an axis broadcast back, in-place updates of the
/// whole and of a block of rows through a view, views held across later
/// statements (they see in-place updates of their storage, and keep the old
/// storage when the matrix is rebound), copies to another device, new values
/// uploaded, sums read as scalars, values read back, waits. A quarter run in
/// synchronous mode, the rest deferred with 1 to 3 workers. Every value read
/// is compared with a double-precision run of the same program, within a
/// bound on float32's rounding carried through each statement. This reaches
/// what the fixed cases order by hand: lanes the engine picks, blocks the
/// pools hand from one lane to the next, views at an offset into a block,
/// scratch memory of reductions, marks, and waits after host waits.
inline void random_programs(int programs = 150) {
  const std::vector<deft::Device> devices = host_and_gpus();
  // A value's reference: each element's exact value, the sum of |terms| behind
  // it (`size`), and a bound on float32's error relative to that size from
  // the roundings so far (`rel`, on top of a flat 1e-5 for elementwise steps).
  struct Reference {
    std::vector<double> value, size;
    double rel = 0;
  };
  struct Slot : Reference {
    Tensor<float> t;
    int generation = 0;  // changes when t is rebound to a new storage (not on in-place updates)
  };
  // Rows [r0, r1) of a slot's storage, held across statements: it reads the
  // slot's current value while the slot keeps that storage, and the value it
  // had when the slot was rebound (`frozen`) after that.
  struct HeldView {
    Tensor<float> t;
    std::size_t slot;
    int generation;
    i64 r0, r1;
    Reference frozen;
  };
  constexpr double eps = 1.0 / (1 << 24);  // float32's unit roundoff
  std::mt19937 rng(2029);
  EngineForPrograms engine;
  for (int p = 0; p < programs; ++p) {
    const i64 s = std::vector<i64>{1, 6, 31, 77}[rng() % 4];  // the matrices are s x s
    const bool synchronous = rng() % 4 == 0;
    engine.run_next(synchronous, synchronous ? 0 : 1 + int(rng() % 3));
    const auto any_device = [&] { return devices[rng() % devices.size()]; };
    std::vector<Slot> slots(5);
    std::vector<HeldView> held;
    const auto rows_of = [&](const Reference& r, i64 r0, i64 r1) {
      Reference out{{r.value.begin() + r0 * s, r.value.begin() + r1 * s}, {r.size.begin() + r0 * s, r.size.begin() + r1 * s}, r.rel};
      return out;
    };
    // Rebinds slot a to a new storage: the views of the old one keep its value.
    const auto rebind = [&](Slot& a, Tensor<float> t, Reference r) {
      for (HeldView& h : held)
        if (&slots[h.slot] == &a && h.generation == a.generation) h.frozen = rows_of(a, h.r0, h.r1), h.generation = -1;
      a.t = std::move(t);
      static_cast<Reference&>(a) = std::move(r);
      ++a.generation;
    };
    const auto fresh = [&](Slot& a) {
      const auto v = random_values(s * s, unsigned(rng()));
      Reference r{{v.begin(), v.end()}, std::vector<double>(v.size()), 0};
      for (std::size_t e = 0; e < v.size(); ++e) r.size[e] = std::abs(r.value[e]);
      rebind(a, Tensor<float>(v, {s, s}, any_device()), std::move(r));
    };
    for (Slot& a : slots) fresh(a);
    const auto check = [&](const Reference& r, const std::vector<float>& got, const char* what) {
      BOOST_REQUIRE_EQUAL(got.size(), r.value.size());
      for (std::size_t e = 0; e < got.size(); ++e)
        if (!(std::abs(double(got[e]) - r.value[e]) <= (1e-5 + 2 * r.rel) * r.size[e] + 1e-30))
          BOOST_FAIL("program " << p << " (" << s << "x" << s << "), " << what << ": element " << e << " is "
                                << got[e] << ", want " << r.value[e]);
    };
    const auto check_view = [&](const HeldView& h, const char* what) {
      check(h.generation < 0 ? h.frozen : rows_of(slots[h.slot], h.r0, h.r1), h.t.to(deft::cpu()).to_vector(), what);
    };
    // x on device d: itself, or a copy recorded now.
    const auto on = [](const Tensor<float>& x, deft::Device d) { return x.device() == d ? x : x.to(d); };
    // A block of rows [r0, r1), possibly empty.
    const auto any_rows = [&] {
      const i64 r0 = i64(rng() % std::uint64_t(s + 1)), r1 = r0 + i64(rng() % std::uint64_t(s - r0 + 1));
      return std::pair{r0, r1};
    };
    // (b + c) * f elementwise, and b's rows times c: the reference steps.
    const auto product = [&](const Reference& b, bool transpose_b, const Reference& c, i64 r0, i64 r1) {
      Reference out{std::vector<double>((r1 - r0) * s), std::vector<double>((r1 - r0) * s),
                    b.rel + c.rel + b.rel * c.rel + double(s + 2) * eps};
      for (i64 i = r0; i < r1; ++i)
        for (i64 j = 0; j < s; ++j) {
          double v = 0, m = 0;
          for (i64 k = 0; k < s; ++k) {
            const i64 bi = transpose_b ? k * s + i : i * s + k;
            v += b.value[bi] * c.value[k * s + j], m += b.size[bi] * c.size[k * s + j];
          }
          out.value[(i - r0) * s + j] = v / double(s), out.size[(i - r0) * s + j] = m / double(s);
        }
      return out;
    };
    for (int op = 0; op < 30; ++op) {
      Slot &a = slots[rng() % 5], &b = slots[rng() % 5], &c = slots[rng() % 5];
      switch (rng() % 12) {
        case 0: {  // a = (b + c) * 0.5, on b's device
          const deft::Device d = b.t.device();
          Reference r{std::vector<double>(b.value.size()), std::vector<double>(b.value.size()), std::max(b.rel, c.rel) + eps};
          for (std::size_t e = 0; e < r.value.size(); ++e)
            r.value[e] = (b.value[e] + c.value[e]) * 0.5, r.size[e] = (b.size[e] + c.size[e]) * 0.5;
          rebind(a, (on(b.t, d) + on(c.t, d)) * 0.5f, std::move(r));
          break;
        }
        case 1: {  // a = maximum(b, 0) - c * 0.5, on c's device
          const deft::Device d = c.t.device();
          Reference r{std::vector<double>(b.value.size()), std::vector<double>(b.value.size()), std::max(b.rel, c.rel) + 2 * eps};
          for (std::size_t e = 0; e < r.value.size(); ++e)
            r.value[e] = std::max(b.value[e], 0.0) - c.value[e] * 0.5, r.size[e] = b.size[e] + c.size[e] * 0.5;
          rebind(a, deft::maximum(on(b.t, d), 0.0f) - on(c.t, d) * 0.5f, std::move(r));
          break;
        }
        case 2: {  // a += b * 0.25, in a's storage
          const deft::Device d = a.t.device();
          const Tensor<float> add = on(b.t, d) * 0.25f;  // before a changes (b may be a)
          a.t += add;
          for (std::size_t e = 0; e < a.value.size(); ++e)
            a.value[e] += b.value[e] * 0.25, a.size[e] += b.size[e] * 0.25;
          a.rel = std::max(a.rel, b.rel) + 2 * eps;
          break;
        }
        case 3: {  // a = b on another device (a clone on the same one: no shared storage)
          const deft::Device d = any_device();
          Reference r = b;
          rebind(a, b.t.device() == d ? b.t.clone() : b.t.to(d), std::move(r));
          break;
        }
        case 4:
          fresh(a);
          break;
        case 5:
          if (!held.empty() && rng() % 2) check_view(held[rng() % held.size()], "held view");
          else check(a, a.t.to_vector(), "to_vector");
          break;
        case 6: {  // the sum, read as a scalar
          double want = 0, size = 0;
          for (std::size_t e = 0; e < a.value.size(); ++e) want += a.value[e], size += a.size[e];
          const double got = deft::sum(a.t).item();
          if (!(std::abs(got - want) <= (double(s * s) * 1.2e-7 + 1e-5 + 2 * a.rel) * size + 1e-30))
            BOOST_FAIL("program " << p << ": sum is " << got << ", want " << want);
          break;
        }
        case 7: {  // a = op(b) . c / s, op a transpose or nothing, on c's device
          const deft::Device d = c.t.device();
          const bool transpose_b = rng() % 2;
          Reference r = product(b, transpose_b, c, 0, s);
          const Tensor<float> lhs = transpose_b ? Tensor<float>(deft::transpose(on(b.t, d))) : on(b.t, d);
          rebind(a, deft::dot(lhs, on(c.t, d)) * (1.0f / float(s)), std::move(r));
          break;
        }
        case 8: {  // a = b - mean or max of c along an axis, broadcast back, on b's device
          const deft::Device d = b.t.device();
          const int axis = int(rng() % 2);
          const bool use_max = rng() % 2;
          const Tensor<float> cd = on(c.t, d);
          Tensor<float> reduced = use_max ? Tensor<float>(deft::max(cd, axis, true)) : Tensor<float>(deft::mean(cd, axis, true));
          Reference r{std::vector<double>(b.value.size()), std::vector<double>(b.value.size()),
                      std::max(b.rel, c.rel + double(s + 1) * eps) + eps};
          for (i64 i = 0; i < s; ++i)
            for (i64 j = 0; j < s; ++j) {
              double v = use_max ? -INFINITY : 0, m = 0;
              for (i64 k = 0; k < s; ++k) {
                const i64 e = axis == 0 ? k * s + j : i * s + k;
                if (use_max) {
                  if (c.value[e] > v) v = c.value[e];
                  m = std::max(m, c.size[e]);  // the max moves by at most the largest element's error
                } else {
                  v += c.value[e] / double(s), m += c.size[e] / double(s);
                }
              }
              r.value[i * s + j] = b.value[i * s + j] - v, r.size[i * s + j] = b.size[i * s + j] + m;
            }
          rebind(a, on(b.t, d) - reduced, std::move(r));
          break;
        }
        case 9: {  // rows [r0, r1) of a updated through a view: += b's rows / 4, or = b's rows . c / s
          const auto [r0, r1] = any_rows();
          const deft::Device d = a.t.device();
          Tensor<float> view = a.t.rows(r0, r1);
          if (rng() % 2) {
            // b's rows copied to d after taking the view, or the view of b's copy
            const Tensor<float> src = rng() % 2 ? on(b.t.rows(r0, r1), d) : on(b.t, d).rows(r0, r1);
            view += src * 0.25f;
            for (i64 e = r0 * s; e < r1 * s; ++e) a.value[e] += b.value[e] * 0.25, a.size[e] += b.size[e] * 0.25;
            a.rel = std::max(a.rel, b.rel) + 2 * eps;
          } else {
            const Reference r = product(b, false, c, r0, r1);
            view.assign(deft::dot(on(b.t, d).rows(r0, r1), on(c.t, d)) * (1.0f / float(s)));
            std::copy(r.value.begin(), r.value.end(), a.value.begin() + r0 * s);
            std::copy(r.size.begin(), r.size.end(), a.size.begin() + r0 * s);
            a.rel = std::max(a.rel, r.rel);
          }
          break;
        }
        case 10: {  // hold a view of a's rows (at most four held)
          const auto [r0, r1] = any_rows();
          HeldView h{a.t.rows(r0, r1), std::size_t(&a - slots.data()), a.generation, r0, r1, {}};
          if (held.size() < 4) held.push_back(std::move(h));
          else held[rng() % held.size()] = std::move(h);
          break;
        }
        default:
          if (rng() % 2) a.t.wait_to_read();
          else deft::wait_all();
      }
    }
    for (const Slot& a : slots) check(a, a.t.to(deft::cpu()).to_vector(), "at the end");
    for (const HeldView& h : held) check_view(h, "held view at the end");
  }
}

/// Random recorded programs in double precision: a chain of 2 to 8
/// differentiable statements (broadcasts, unary functions, where, matrix
/// products with and without transposed operands, reductions along an axis
/// and their norms, views of rows, reshapes, a padded convolution with a
/// bias then max or average pooling) over seven variables, then a
/// loss and backward(). Each statement runs on a device drawn from the host
/// and the GPUs, so values, and gradients on their way back, cross devices
/// through recorded copies, and a variable's gradient gathers parts from
/// several devices. The result and every gradient must match the same
/// program run on the host alone (whose gradients tests/autograd checks
/// against finite differences) to 1e-10 of the gradient's largest element.
/// Double precision keeps a comparison (where, maximum, relu, a reduction's
/// maximum) from going the other way on the other device's rounding.
inline void random_gradient_programs(int programs = 80) {
  using T = Tensor<double>;
  const std::vector<deft::Device> devices = host_and_gpus();
  std::mt19937 rng(4711);
  EngineForPrograms engine;
  struct Statement {
    unsigned op, device, bits;
  };
  for (int p = 0; p < programs; ++p) {
    const i64 r = std::vector<i64>{1, 5, 33}[rng() % 3], c = std::vector<i64>{1, 4, 17}[rng() % 3];
    std::vector<Statement> program(2 + rng() % 7);
    for (Statement& st : program) st = {unsigned(rng() % 14), unsigned(rng()), unsigned(rng())};
    const unsigned loss_kind = rng() % 5, loss_bits = unsigned(rng());
    std::vector<unsigned> home(7);
    for (unsigned& h : home) h = unsigned(rng());
    const std::vector<std::vector<double>> values = {
        random_values<double>(r * c, unsigned(rng()), -1, 1), random_values<double>(c * c, unsigned(rng()), -1, 1),
        random_values<double>(c, unsigned(rng()), -1, 1), random_values<double>(r, unsigned(rng()), -1, 1),
        random_values<double>(r * c, unsigned(rng()), -1, 1), random_values<double>(8, unsigned(rng()), -1, 1),
        random_values<double>(2, unsigned(rng()), -1, 1), random_values<double>(r * c, unsigned(rng()), -1, 1)};
    const std::vector<Shape> shapes = {{r, c}, {c, c}, {c}, {r, 1}, {r, c}, {2, 1, 2, 2}, {2}};
    const bool synchronous = rng() % 4 == 0;
    const int run_workers = 1 + int(rng() % 3);

    // The result, then the seven variables' gradients, on the host.
    const auto run = [&](bool spread) {
      const auto device = [&](unsigned k) { return spread ? devices[k % devices.size()] : deft::cpu(); };
      std::vector<T> vars;
      for (std::size_t v = 0; v < shapes.size(); ++v) vars.push_back(T(values[v], shapes[v], device(home[v])).attach_grad());
      T result;
      {
        deft::autograd::record recording;
        T h = vars[0];
        for (const Statement& st : program) {
          const deft::Device d = device(st.device);
          const auto on = [&](const T& t) { return t.device() == d ? t : t.to(d); };
          h = on(h);
          const T x = on(vars[0]), w = on(vars[1]), row = on(vars[2]), col = on(vars[3]), g = on(vars[4]);
          const T kernel = on(vars[5]), bias = on(vars[6]);
          const int axis = int(st.bits % 2);
          const i64 r0 = i64(st.bits / 2 % std::uint64_t(r)), r1 = r0 + 1 + i64(st.bits / 64 % std::uint64_t(r - r0));
          switch (st.op) {
            case 0: h = deft::tanh(h * row + col); break;
            case 1: h = deft::sigmoid(h) * g - h * x; break;
            case 2: h = deft::dot(h, w) * (1.0 / double(c)); break;
            case 3: h = deft::transpose(deft::dot(deft::transpose(w), deft::transpose(h))) * (1.0 / double(c)); break;
            case 4: h = h - deft::mean(h, axis, true); break;
            case 5: h = h - (st.bits & 4 ? T(deft::max(h, axis, true)) : T(deft::min(h, axis, true))); break;
            case 6: h = deft::where(h > g, h * g, g * 0.5); break;
            case 7: h = deft::relu(h) + deft::abs(g) * h; break;
            case 8: h = deft::exp(-h * h) + deft::log(g * g + 1.0); break;
            case 9: h = h / (deft::abs(g) + 1.0) + deft::sqrt(h * h + 1.0); break;
            case 10:
              h = deft::pow(deft::abs(h) + 1.0, 1.5) * 0.5 - deft::maximum(h, g) + deft::minimum(h, col);
              break;
            case 11: h = h + deft::sum(h.rows(r0, r1), 0, true) * (1.0 / double(r)); break;
            case 12: {
              // Two channels of (r + 1) x (c + 1), pooled back to r x c. Adding
              // x keeps the pooled values apart (h may be all zeros), so the
              // maximum cannot change with the other device's rounding.
              const T y = deft::conv2d(T(h + x * 0.25).reshape({1, 1, r, c}), kernel, bias, {1, 1}, {1, 1});
              const T pooled = st.bits & 2 ? T(deft::max_pool2d(y, {2, 2}, {1, 1})) : T(deft::avg_pool2d(y, {2, 2}, {1, 1}));
              h = deft::sum(pooled, 1).reshape({r, c}) * 0.5;
              break;
            }
            default: {
              const T along = deft::tanh(deft::dot(h, row));  // (r): a matrix times a vector
              h = deft::transpose(h.reshape({c, r})).reshape({r, c}) * 0.5 + h * along.reshape({r, 1});
              if (st.bits & 8) h = h / (deft::norm(h, axis, true) + 1.0);
            }
          }
        }
        const i64 r0 = i64(loss_bits % std::uint64_t(r)), r1 = r0 + 1 + i64(loss_bits / 8 % std::uint64_t(r - r0));
        const T head = T(values[7], {r, c}, h.device());
        switch (loss_kind) {
          case 0: result = deft::sum(h * head); break;
          case 1: result = deft::mean(h * h); break;
          case 2: result = deft::sum(deft::norm(h, int(loss_bits % 2))); break;
          case 3: result = deft::sum(h.rows(r0, r1)); break;
          default: result = h;  // with a head gradient
        }
        if (loss_kind == 4) result.backward(head);
        else result.backward();
      }
      std::vector<std::vector<double>> out{result.to(deft::cpu()).to_vector()};
      for (const T& v : vars) out.push_back(v.grad().to(deft::cpu()).to_vector());
      return out;
    };
    engine.run_next(synchronous, run_workers);
    const auto on_host = run(false), spread = run(true);
    const char* names[] = {"the result", "x's gradient", "w's gradient", "row's gradient", "col's gradient",
                           "g's gradient", "kernel's gradient", "bias's gradient"};
    for (std::size_t k = 0; k < on_host.size(); ++k) {
      BOOST_REQUIRE_EQUAL(spread[k].size(), on_host[k].size());
      double scale = 1;
      for (const double v : on_host[k]) scale = std::max(scale, std::abs(v));
      for (std::size_t e = 0; e < on_host[k].size(); ++e)
        if (!(std::abs(spread[k][e] - on_host[k][e]) <= 1e-10 * scale))
          BOOST_FAIL("gradient program " << p << " (" << r << "x" << c << ", " << program.size() << " statements), "
                                         << names[k] << ": element " << e << " is " << spread[k][e] << ", the host's "
                                         << on_host[k][e]);
    }
  }
}

/// A block whose forward is a recipe of statements over its input (r x c)
/// and two parameters, w (c x c) and row (c): products with and without
/// transposed operands, unary functions, a broadcast row, a mean or maximum
/// along an axis subtracted, and a sum over the batch added. Every
/// statement is continuous, so float32's rounding moves the result by a
/// bounded amount (see random_hybridized_forwards).
class RecipeBlock final : public deft::nn::Block {
 public:
  explicit RecipeBlock(std::vector<unsigned> recipe)
      : Block(deft::nn::auto_name("recipe")), recipe_(std::move(recipe)), w_(add_parameter("weight")),
        row_(add_parameter("row")) {}
  Tensor<float> forward(const Tensor<float>& x) override {
    const i64 r = x.shape()[0], c = x.shape()[1];
    w_.materialize({c, c});
    row_.materialize({c});
    const Tensor<float> &w = w_.data(x.device()), &row = row_.data(x.device());
    Tensor<float> h = x;
    for (const unsigned st : recipe_) {
      const int axis = int(st / 8 % 2);
      switch (st % 8) {
        case 0: h = deft::tanh(h * row + 0.5f); break;
        case 1: h = deft::sigmoid(h) * h; break;
        case 2: h = deft::dot(h, w) * (1.0f / float(c)); break;
        case 3: h = deft::transpose(deft::dot(deft::transpose(w), deft::transpose(h))) * (1.0f / float(c)); break;
        case 4: h = h - deft::mean(h, axis, true); break;
        case 5: h = h - deft::max(h, axis, true); break;
        case 6: h = deft::relu(h) + h * 0.25f; break;
        default: h = h + deft::sum(h, 0, true) * (1.0f / float(r));
      }
    }
    return h;
  }

  /// The forward in double precision from the parameters' current values
  /// on `d`: the value of each element and the sum of the magnitudes behind
  /// it (what float32's rounding is relative to).
  std::pair<std::vector<double>, std::vector<double>> reference(const std::vector<float>& x, i64 r, deft::Device d) {
    const auto wf = w_.data(d).to_vector(), rowf = row_.data(d).to_vector();
    const i64 c = i64(rowf.size());
    std::vector<double> h(x.begin(), x.end()), m(h.size());
    for (std::size_t e = 0; e < h.size(); ++e) m[e] = std::abs(h[e]);
    const auto at = [c](i64 i, i64 j) { return std::size_t(i * c + j); };
    for (const unsigned st : recipe_) {
      const int axis = int(st / 8 % 2);
      std::vector<double> next(h.size()), next_m(h.size());
      for (i64 i = 0; i < r; ++i)
        for (i64 j = 0; j < c; ++j) {
          const double v = h[at(i, j)], vm = m[at(i, j)];
          double out = 0, out_m = 0;
          switch (st % 8) {
            case 0: out = std::tanh(v * rowf[j] + 0.5), out_m = vm * std::abs(rowf[j]) + 0.5; break;
            case 1: out = v / (1 + std::exp(-v)), out_m = vm; break;
            case 2:
            case 3:
              for (i64 k = 0; k < c; ++k) out += h[at(i, k)] * wf[at(k, j)], out_m += m[at(i, k)] * std::abs(wf[at(k, j)]);
              out /= double(c), out_m /= double(c);
              break;
            case 4:
            case 5: {
              const bool use_max = st % 8 == 5;
              double red = use_max ? -INFINITY : 0, red_m = 0;
              for (i64 k = 0; k < (axis == 0 ? r : c); ++k) {
                const std::size_t e = axis == 0 ? at(k, j) : at(i, k);
                if (use_max) red = std::max(red, h[e]), red_m = std::max(red_m, m[e]);
                else red += h[e] / double(axis == 0 ? r : c), red_m += m[e] / double(axis == 0 ? r : c);
              }
              out = v - red, out_m = vm + red_m;
              break;
            }
            case 6: out = std::max(v, 0.0) + v * 0.25, out_m = vm * 1.25; break;
            default:
              out = v, out_m = vm;
              for (i64 k = 0; k < r; ++k) out += h[at(k, j)] / double(r), out_m += m[at(k, j)] / double(r);
          }
          next[at(i, j)] = out, next_m[at(i, j)] = out_m;
        }
      h = std::move(next), m = std::move(next_m);
    }
    return {h, m};
  }

 private:
  std::vector<unsigned> recipe_;
  deft::nn::Parameter &w_, &row_;
};

/// Random recipes (RecipeBlock) hybridized on the host or a GPU, replayed
/// as one program (a CUDA graph on a GPU) or kernel by kernel, on new inputs
/// of two batch sizes, then again after the parameters change (a new
/// trace). Every output is compared with the recipe run in double
/// precision: within 1e-5 per statement of the magnitudes behind each
/// element, float32's rounding with room for the reductions' order.
inline void random_hybridized_forwards(int programs = 40) {
  const std::vector<deft::Device> devices = host_and_gpus();
  std::mt19937 rng(1931);
  EngineForPrograms engine;
  for (int p = 0; p < programs; ++p) {
    std::vector<unsigned> recipe(2 + rng() % 6);
    for (unsigned& st : recipe) st = unsigned(rng() % 16);
    const i64 c = std::vector<i64>{3, 16, 29}[rng() % 3];
    const std::vector<i64> batches{std::vector<i64>{1, 7, 40}[rng() % 3], std::vector<i64>{1, 7, 40}[rng() % 3]};
    const deft::Device d = devices[rng() % devices.size()];
    const bool graph = rng() % 2, synchronous = rng() % 4 == 0;
    engine.run_next(synchronous, synchronous ? 0 : 1 + int(rng() % 3));
    deft::random::seed(unsigned(rng()));
    auto net = std::make_shared<RecipeBlock>(recipe);
    net->initialize(deft::nn::init::uniform(1.0f), {d});
    (void)(*net)(Tensor<float>(random_values(c, unsigned(rng())), {1, c}, d)).to_vector();  // parameters drawn
    net->hybridize(true, {.cuda_graph = graph});
    const auto check = [&](i64 r, const char* when) {
      const auto x = random_values(r * c, unsigned(rng()));
      const auto got = (*net)(Tensor<float>(x, {r, c}).to(d)).to(deft::cpu()).to_vector();
      const auto [want, size] = net->reference(x, r, d);
      BOOST_REQUIRE_EQUAL(got.size(), want.size());
      for (std::size_t e = 0; e < got.size(); ++e)
        if (!(std::abs(double(got[e]) - want[e]) <= 1e-5 * double(recipe.size()) * (size[e] + 1)))
          BOOST_FAIL("hybridized recipe " << p << " on " << d << " (" << r << "x" << c << ", " << recipe.size()
                                          << " statements, " << when << "): element " << e << " is " << got[e]
                                          << ", want " << want[e]);
    };
    for (int call = 0; call < 4; ++call) check(batches[std::size_t(call) % 2], "first parameters");
    for (auto* param : net->collect_params()) param->data(d) = param->data(d) * 0.75f + 0.01f;
    for (int call = 0; call < 3; ++call) check(batches[std::size_t(call) % 2], "changed parameters");
    // Once per batch size, and again after the change where the recipe reads
    // the parameters (an update of unread ones is written in place).
    const bool reads_parameters = std::ranges::any_of(recipe, [](unsigned st) { return st % 8 == 0 || st % 8 == 2 || st % 8 == 3; });
    BOOST_TEST(net->traces() == (batches[0] == batches[1] ? 1 : 2) * (reads_parameters ? 2 : 1));
    if (d.type == deft::DeviceType::cpu || !graph) BOOST_TEST(net->cuda_graphs() == 0);
  }
}

}  // namespace gpu_tensors

/// Registers the random programs above.
#define DEFT_GPU_RANDOM_CASES                                                                                  \
  BOOST_AUTO_TEST_CASE(random_programs_on_the_host_and_gpus) { gpu_tensors::random_programs(); }                \
  BOOST_AUTO_TEST_CASE(random_gradient_programs_across_devices) { gpu_tensors::random_gradient_programs(); } \
  BOOST_AUTO_TEST_CASE(random_hybridized_forwards) { gpu_tensors::random_hybridized_forwards(); }
