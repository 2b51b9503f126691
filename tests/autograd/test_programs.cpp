// Elementwise trees differentiated through their programs (expr/program.hpp,
// eval/cpu/program.hpp): every operation in one tree, broadcast operands,
// a value read twice, outputs long enough to be split between workers,
// against hand-written derivatives in double precision; and sums and means
// of a tree (compile-time derivatives) against the same.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <deft/deft.hpp>

using namespace deft;

namespace {

std::vector<float> random_values(std::size_t n, float lo, float hi, std::uint32_t seed) {
  std::vector<float> v(n);
  std::uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + (hi - lo) * float(s >> 8) / float(1u << 24);
  }
  return v;
}

double sigmoid_d(double v) { return 1 / (1 + std::exp(-v)); }

/// Relative error |got - want| / max(1, |want|), the largest over the elements.
double worst_error(const std::vector<float>& got, const std::vector<double>& want) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(want[i])));
  return worst;
}

struct Gradients {
  std::vector<float> x, y, b;
};

// f = where(x > y, x*y, exp(x) / (y*y + 1)) - tanh(x)*b + sigmoid(y) + maximum(x, y)*2 + x*x + y
//     + pow(abs(x) + 1, y) - relu(y - b) + log(abs(y) + 2) * sin(x) - cos(y) / sqrt(b) + b
// (x and y of shape (rows, cols), b of shape (cols) and positive), backward
// with head gradient g.
Gradients program_gradients(const Tensor<float>& xv, const Tensor<float>& yv, const Tensor<float>& bv,
                            const Tensor<float>& g) {
  Tensor<float> x = xv.clone(), y = yv.clone(), b = bv.clone();
  x.attach_grad();
  y.attach_grad();
  b.attach_grad();
  {
    autograd::record rec;
    // Two trees (a program holds 16 leaves), each one program.
    // y and b are also added as they are: their gradient is g itself.
    auto first = where(x > y, x * y, exp(x) / (y * y + 1.0f)) - tanh(x) * b + sigmoid(y) + maximum(x, y) * 2.0f + x * x + y;
    auto second = pow(abs(x) + 1.0f, y) - relu(y - b) + log(abs(y) + 2.0f) * sin(x) - cos(y) / sqrt(b) + b;
    static_assert(detail::has_program<decltype(first)> && detail::has_program<decltype(second)>);
    Tensor<float> f = Tensor<float>(std::move(first)) + Tensor<float>(std::move(second));
    f.backward(g);
  }
  return {x.grad().to_vector(), y.grad().to_vector(), b.grad().to_vector()};
}

void check_against_double_loop(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  const std::size_t n = std::size_t(rows * cols);
  const auto xs = random_values(n, -2, 2, seed), ys = random_values(n, -2, 2, seed + 1),
             bs = random_values(std::size_t(cols), 0.5f, 2, seed + 2), gs = random_values(n, -1, 1, seed + 3);
  const Shape s{rows, cols};
  const Gradients got = program_gradients(Tensor<float>(xs, s), Tensor<float>(ys, s), Tensor<float>(bs, {cols}),
                                          Tensor<float>(gs, s));
  std::vector<double> dx(n), dy(n), db(std::size_t(cols), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t i = std::size_t(r * cols + c);
      const double x = xs[i], y = ys[i], b = bs[std::size_t(c)], g = gs[i];
      double gx = 0, gy = 0, gb = 0;
      if (x > y) gx += y, gy += x;
      else gx += std::exp(x) / (y * y + 1), gy += -std::exp(x) * 2 * y / ((y * y + 1) * (y * y + 1));
      const double t = std::tanh(x);
      gx -= (1 - t * t) * b, gb -= t;
      gy += sigmoid_d(y) * (1 - sigmoid_d(y));
      if (x >= y) gx += 2;
      else gy += 2;
      const double base = std::abs(x) + 1, p = std::pow(base, y);
      gx += y * std::pow(base, y - 1) * (x > 0 ? 1 : x < 0 ? -1 : 0), gy += p * std::log(base);
      gx += 2 * x, gy += 1, gb += 1;
      if (y - b > 0) gy -= 1, gb += 1;
      const double l = std::log(std::abs(y) + 2);
      gx += l * std::cos(x), gy += (y > 0 ? 1 : y < 0 ? -1 : 0) / (std::abs(y) + 2) * std::sin(x);
      gy += std::sin(y) / std::sqrt(b), gb += std::cos(y) * 0.5 / (b * std::sqrt(b));
      dx[i] = g * gx, dy[i] = g * gy;
      db[std::size_t(c)] += g * gb;
    }
  // float arithmetic through about thirty steps, and b's gradient summed over `rows` terms
  BOOST_TEST(worst_error(got.x, dx) < 2e-5);
  BOOST_TEST(worst_error(got.y, dy) < 2e-5);
  BOOST_TEST(worst_error(got.b, db) < 2e-6 * double(rows));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(programs)

BOOST_AUTO_TEST_CASE(a_fused_tree_of_every_operation_matches_its_derivatives) {
  static_assert(detail::has_program<decltype(std::declval<Tensor<float>&>() * 2.0f + 1.0f)>);
  check_against_double_loop(3, 5, 1);
  check_against_double_loop(67, 45, 2);  // rows shorter than a chunk, b broadcast along them
}

BOOST_AUTO_TEST_CASE(long_outputs_split_between_workers_give_the_same_bits) {
  // No broadcast here: the output is one row of 200,003 elements, many
  // chunks and, with several workers, several pieces.
  const std::int64_t n = 200003;
  const auto xs = random_values(std::size_t(n), -2, 2, 7), ys = random_values(std::size_t(n), -2, 2, 8),
             gs = random_values(std::size_t(n), -1, 1, 9);
  const auto run = [&] {
    Tensor<float> x(xs, {n}), y(ys, {n});
    x.attach_grad();
    y.attach_grad();
    {
      autograd::record rec;
      auto e = tanh(x * y) + exp(y) * x - x * x;
      static_assert(detail::has_program<decltype(e)>);
      Tensor<float> f = std::move(e);
      f.backward(Tensor<float>(gs, {n}));
    }
    return std::pair{x.grad().to_vector(), y.grad().to_vector()};
  };
  const int workers = engine::num_workers();
  engine::set_num_workers(1);
  const auto one = run();
  engine::set_num_workers(4);
  const auto four = run();
  engine::set_num_workers(workers);
  BOOST_TEST(one.first == four.first);
  BOOST_TEST(one.second == four.second);
  const std::size_t count = std::size_t(n);
  std::vector<double> dx(count), dy(count);
  for (std::size_t i = 0; i < std::size_t(n); ++i) {
    const double x = xs[i], y = ys[i], g = gs[i], t = std::tanh(x * y);
    dx[i] = g * ((1 - t * t) * y + std::exp(y) - 2 * x);
    dy[i] = g * ((1 - t * t) * x + std::exp(y) * x);
  }
  BOOST_TEST(worst_error(one.first, dx) < 1e-5);
  BOOST_TEST(worst_error(one.second, dy) < 1e-5);
}

BOOST_AUTO_TEST_CASE(sums_and_means_of_a_tree_match_their_derivatives) {
  // r = sum or mean of f = x*y + exp(x)*b - y + c over all elements or one
  // axis (x, y of shape (rows, cols); b, c of shape (cols); c reached
  // through sums only), backward with a random head gradient of r's shape.
  const std::int64_t rows = 37, cols = 29;
  const std::size_t n = std::size_t(rows * cols);
  const auto xs = random_values(n, -1, 1, 21), ys = random_values(n, -1, 1, 22),
             bs = random_values(std::size_t(cols), -1, 1, 23), cs = random_values(std::size_t(cols), -1, 1, 24);
  struct Case {
    bool mean;
    int axis;  // -1: all elements
    bool keepdims;
  };
  for (const Case k : {Case{false, -1, false}, Case{true, -1, false}, Case{false, 0, false}, Case{true, 1, true},
                       Case{false, 1, false}, Case{true, 0, true}}) {
    Tensor<float> x(xs, {rows, cols}), y(ys, {rows, cols}), b(bs, {cols}), c(cs, {cols});
    for (auto* t : {&x, &y, &b, &c}) t->attach_grad();
    std::vector<float> head;
    {
      autograd::record rec;
      auto f = x * y + exp(x) * b - y + c;
      static_assert(detail::has_program<decltype(f)>);
      Tensor<float> r;
      if (k.axis < 0) r = k.mean ? Tensor<float>(mean(f)) : Tensor<float>(sum(f));
      else r = k.mean ? Tensor<float>(mean(f, k.axis, k.keepdims)) : Tensor<float>(sum(f, k.axis, k.keepdims));
      head = random_values(std::size_t(r.size()), -1, 1, 25 + std::uint32_t(k.axis + 1));
      r.backward(Tensor<float>(head, r.shape()));
    }
    std::vector<double> dx(n), dy(n), db(std::size_t(cols), 0.0), dc(std::size_t(cols), 0.0);
    const double count = k.axis < 0 ? double(n) : k.axis == 0 ? double(rows) : double(cols);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        const std::size_t e = std::size_t(i * cols + j);
        const std::size_t at = k.axis < 0 ? 0 : k.axis == 0 ? std::size_t(j) : std::size_t(i);
        const double g = double(head[at]) / (k.mean ? count : 1.0);
        const double xv = xs[e], yv = ys[e];
        dx[e] = g * (yv + std::exp(xv) * bs[std::size_t(j)]);
        dy[e] = g * (xv - 1);
        db[std::size_t(j)] += g * std::exp(xv);
        dc[std::size_t(j)] += g;
      }
    BOOST_TEST_CONTEXT("mean " << k.mean << ", axis " << k.axis << ", keepdims " << k.keepdims) {
      BOOST_TEST(worst_error(x.grad().to_vector(), dx) < 1e-6);
      BOOST_TEST(worst_error(y.grad().to_vector(), dy) < 1e-6);
      BOOST_TEST(worst_error(b.grad().to_vector(), db) < 1e-6 * double(rows));  // sums of `rows` terms
      BOOST_TEST(worst_error(c.grad().to_vector(), dc) < 1e-6 * double(rows));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_tree_too_large_for_a_program_keeps_its_compile_time_derivative) {
  Tensor<float> x = full<float>({4}, 0.5f);
  x.attach_grad();
  {
    autograd::record rec;
    // 18 leaves: more than a program holds.
    auto e = x * x + x * x + x * x + x * x + x * x + x * x + x * x + x * x + x * x;
    static_assert(!detail::has_program<decltype(e)>);
    Tensor<float> f = e;
    f.backward();
  }
  for (float v : x.grad().to_vector()) BOOST_TEST(v == 9.0f);  // d(9 x^2)/dx at 0.5, exact in float
}

BOOST_AUTO_TEST_SUITE_END()
