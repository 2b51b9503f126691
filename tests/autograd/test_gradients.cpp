// Every differentiable operation against finite differences (gradcheck.hpp).
#include "gradcheck.hpp"

#include <algorithm>
#include <random>

using namespace deft;
using agt::check_gradients;
using agt::uniform;

BOOST_AUTO_TEST_SUITE(gradients)

BOOST_AUTO_TEST_CASE(unary_functions) {
  random::seed(11);
  Tensor<double> x = uniform({3, 5}), pos = uniform({3, 5}, 0.2, 2.0);
  check_gradients({&x}, [&] { return Tensor<double>(sum(-x * 3.0)); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(abs(x) * x)); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(exp(x))); });
  check_gradients({&pos}, [&] { return Tensor<double>(sum(log(pos))); });
  check_gradients({&pos}, [&] { return Tensor<double>(sum(sqrt(pos))); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(tanh(x))); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(sin(x * 3.0) + cos(x * 2.0))); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(sigmoid(x))); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(relu(x) * x)); });
}

BOOST_AUTO_TEST_CASE(binary_operators_and_functions) {
  random::seed(12);
  Tensor<double> a = uniform({4, 3}), b = uniform({4, 3}, 0.5, 1.5), c = uniform({4, 3});
  check_gradients({&a, &b}, [&] { return Tensor<double>(sum(a + b * 2.0)); });
  check_gradients({&a, &b}, [&] { return Tensor<double>(sum(a - b)); });
  check_gradients({&a, &b}, [&] { return Tensor<double>(sum(a * b * a)); });
  check_gradients({&a, &b}, [&] { return Tensor<double>(sum(a / b)); });
  check_gradients({&a, &c}, [&] { return Tensor<double>(sum(maximum(a, c) * 2.0 + minimum(a, c))); });
  check_gradients({&a, &b}, [&] { return Tensor<double>(sum(pow(b, a))); });
  check_gradients({&b}, [&] { return Tensor<double>(sum(pow(b, 3.0))); });
  check_gradients({&a, &c}, [&] { return Tensor<double>(sum(where(a > c, a * a, c * 3.0))); });
  // Through float32: a step of 1e-3 keeps float rounding out of the numeric derivative.
  check_gradients({&a}, [&] { return Tensor<double>(sum(cast<double>(cast<float>(a)) * a)); }, 1e-4, 1e-3);
}

BOOST_AUTO_TEST_CASE(broadcasting_reduces_gradients_to_the_operand_shape) {
  random::seed(13);
  Tensor<double> x = uniform({2, 3, 4}), row = uniform({4}), col = uniform({3, 1}), s = uniform({1});
  check_gradients({&x, &row, &col, &s}, [&] { return Tensor<double>(sum(tanh(x * row + col) * s)); });
  Tensor<double> scalar = uniform({});
  check_gradients({&x, &scalar}, [&] { return Tensor<double>(sum(x * scalar)); });
}

BOOST_AUTO_TEST_CASE(reductions) {
  random::seed(14);
  Tensor<double> x = uniform({3, 4});
  check_gradients({&x}, [&] { return Tensor<double>(sum(sum(x * x, 1) * sum(x, 0, true).reshape({4}).rows(0, 3))); });
  check_gradients({&x}, [&] { return Tensor<double>(mean(x * x)); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(mean(exp(x), 0) * 3.0)); });
  check_gradients({&x}, [&] { return Tensor<double>(max(x * 2.0) + min(x)); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(max(x, 1) * 2.0) - sum(min(x, 0, true))); });
  check_gradients({&x}, [&] { return Tensor<double>(norm(x) + sum(norm(x, 1))); });
}

BOOST_AUTO_TEST_CASE(matrix_products_and_transposes) {
  random::seed(15);
  Tensor<double> a = uniform({3, 4}), b = uniform({4, 2}), v = uniform({4}), w = uniform({4});
  check_gradients({&a, &b}, [&] { return Tensor<double>(sum(tanh(dot(a, b)))); });
  check_gradients({&a, &v}, [&] { return Tensor<double>(sum(exp(dot(a, v)))); });
  check_gradients({&v, &b}, [&] { return Tensor<double>(sum(exp(dot(v, b)))); });
  check_gradients({&v, &w}, [&] { return Tensor<double>(dot(v, w) * dot(v, v)); });
  check_gradients({&a, &b}, [&] { return Tensor<double>(sum(tanh(dot(transpose(b), transpose(a))))); });
  Tensor<double> x3 = uniform({2, 3, 4}), y3 = uniform({2, 4, 2});
  check_gradients({&x3, &b}, [&] { return Tensor<double>(sum(sigmoid(dot(x3, b)))); });
  check_gradients({&x3, &y3}, [&] { return Tensor<double>(sum(sigmoid(matmul(x3, y3)))); });
  check_gradients({&x3, &v}, [&] { return Tensor<double>(sum(sigmoid(dot(x3, v)))); });  // (2,3) = (2,3,4)(4)
  // Large enough (4+ rows) that the gradients' products go through the packed
  // GEMM reading one operand transposed.
  Tensor<double> c = uniform({6, 5}), d = uniform({5, 7}), x4 = uniform({2, 6, 5}), y4 = uniform({2, 5, 4});
  check_gradients({&c, &d}, [&] { return Tensor<double>(sum(tanh(dot(c, d)))); });
  check_gradients({&x4, &y4}, [&] { return Tensor<double>(sum(sigmoid(matmul(x4, y4)))); });
  check_gradients({&x4, &d}, [&] { return Tensor<double>(sum(sigmoid(dot(x4, d)))); });
  const Tensor<double> weights = uniform({3, 4, 2});
  check_gradients({&x3}, [&] { return Tensor<double>(sum(transpose(x3, {1, 2, 0}) * weights)); });
}

BOOST_AUTO_TEST_CASE(views) {
  random::seed(16);
  Tensor<double> x = uniform({4, 3});
  check_gradients({&x}, [&] { return Tensor<double>(sum(exp(x.rows(1, 3)) * 2.0)); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(x.reshape({3, 4}).rows(0, 2) * x.reshape({2, 6}).reshape({3, 4}).rows(1, 3))); });
}

BOOST_AUTO_TEST_CASE(a_small_mlp_in_float32_and_float64) {
  random::seed(17);
  Tensor<double> x = uniform({8, 5}), w1 = uniform({5, 6}), b1 = uniform({6}), w2 = uniform({6, 1}), b2 = uniform({1});
  Tensor<double> y = uniform({8, 1});
  check_gradients({&w1, &b1, &w2, &b2}, [&] {
    Tensor<double> h = relu(dot(x, w1) + b1);
    Tensor<double> out = dot(h, w2) + b2;
    return Tensor<double>(mean((out - y) * (out - y) * 0.5));
  });
  // float32: the same gradients as float64 to float precision.
  std::vector<Tensor<float>> pf;
  for (auto* p : {&w1, &b1, &w2, &b2}) pf.push_back(Tensor<float>(cast<float>(*p)));
  for (auto& p : pf) p.attach_grad();
  const Tensor<float> xf = cast<float>(x), yf = cast<float>(y);
  {
    autograd::record rec;
    Tensor<float> h = relu(dot(xf, pf[0]) + pf[1]);
    Tensor<float> out = dot(h, pf[2]) + pf[3];
    Tensor<float> loss = mean((out - yf) * (out - yf) * 0.5f);
    loss.backward();
  }
  std::vector<Tensor<double>*> pd = {&w1, &b1, &w2, &b2};
  for (std::size_t k = 0; k < pf.size(); ++k) {
    const auto gf = pf[k].grad().to_vector();
    const auto gd = pd[k]->grad().to_vector();  // from the float64 check above
    for (std::size_t i = 0; i < gf.size(); ++i) BOOST_TEST(std::abs(gf[i] - gd[i]) <= 1e-5 * std::max(1.0, std::abs(gd[i])));
  }
}

// At a tie the gradient is a subgradient that sums to the upstream one:
// relu'(0) = 0; maximum/minimum give a tie to the left operand; max/min
// reductions split it evenly between the tied extremes. Inputs are small
// integers, so that ties are frequent; the reference is a double loop.
BOOST_AUTO_TEST_CASE(ties_get_a_subgradient_that_sums_to_the_upstream_one) {
  std::mt19937 gen(21);
  std::uniform_int_distribution<int> small(-2, 2);
  const std::int64_t rows = 7, cols = 5;
  std::vector<float> xv(rows * cols), yv(rows * cols), up(rows * cols);
  for (auto& v : xv) v = float(small(gen));
  for (auto& v : yv) v = float(small(gen));
  std::uniform_real_distribution<float> weight(0.5f, 1.5f);
  for (auto& v : up) v = weight(gen);
  const Tensor<float> u(up, Shape{rows, cols});
  const auto grads = [&](auto f) {
    Tensor<float> x(xv, Shape{rows, cols}), y(yv, Shape{rows, cols});
    x.attach_grad();
    y.attach_grad();
    {
      autograd::record rec;
      Tensor<float> loss = f(x, y);
      loss.backward();
    }
    return std::pair{x.grad().to_vector(), y.grad().to_vector()};
  };
  const auto expect_near = [](const std::vector<float>& got, const std::vector<double>& want, const char* what) {
    BOOST_TEST_CONTEXT(what) {
      BOOST_REQUIRE_EQUAL(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(std::abs(got[i] - want[i]) <= 1e-6 * (1 + std::abs(want[i])), "element " << i << ": " << got[i] << " vs " << want[i]);
    }
  };
  const std::size_t n = xv.size();
  {  // relu: 1 above 0, 0 at and below
    auto [gx, gy] = grads([&](auto& x, auto&) { return Tensor<float>(sum(relu(x) * u)); });
    std::vector<double> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = xv[i] > 0 ? up[i] : 0.0;
    expect_near(gx, want, "relu");
  }
  for (bool is_max : {true, false}) {  // maximum/minimum: a tie goes to the left operand
    auto [gx, gy] = grads([&](auto& x, auto& y) { return Tensor<float>(sum((is_max ? Tensor<float>(maximum(x, y)) : Tensor<float>(minimum(x, y))) * u)); });
    std::vector<double> wx(n), wy(n);
    for (std::size_t i = 0; i < n; ++i) {
      const bool left = is_max ? xv[i] >= yv[i] : xv[i] <= yv[i];
      (left ? wx : wy)[i] = up[i];
    }
    expect_near(gx, wx, is_max ? "maximum, left" : "minimum, left");
    expect_near(gy, wy, is_max ? "maximum, right" : "minimum, right");
  }
  for (bool is_max : {true, false}) {
    // Along axis 1, weighted per row; and over the whole tensor.
    const Tensor<float> w(std::vector<float>(up.begin(), up.begin() + rows), Shape{rows});
    auto [gx, gy] = grads([&](auto& x, auto&) {
      return Tensor<float>(sum((is_max ? Tensor<float>(max(x, 1)) : Tensor<float>(min(x, 1))) * w) +
                           (is_max ? Tensor<float>(max(x)) : Tensor<float>(min(x))) * 3.0f);
    });
    std::vector<double> want(n, 0.0);
    const auto better = [&](float a, float b) { return is_max ? a > b : a < b; };
    float extreme = xv[0];
    for (float v : xv) extreme = better(v, extreme) ? v : extreme;
    const double all_ties = double(std::count(xv.begin(), xv.end(), extreme));
    for (std::int64_t r = 0; r < rows; ++r) {
      float best = xv[r * cols];
      for (std::int64_t c = 0; c < cols; ++c) best = better(xv[r * cols + c], best) ? xv[r * cols + c] : best;
      const double ties = double(std::count(xv.begin() + r * cols, xv.begin() + (r + 1) * cols, best));
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::size_t i = r * cols + c;
        if (xv[i] == best) want[i] += up[r] / ties;
        if (xv[i] == extreme) want[i] += 3.0 / all_ties;
      }
    }
    expect_near(gx, want, is_max ? "max reductions" : "min reductions");
  }
}

BOOST_AUTO_TEST_SUITE_END()
