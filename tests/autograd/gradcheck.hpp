// Gradients against central finite differences: the loss is rebuilt from the
// parameters' current values for every perturbation, in double precision.
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <deft/deft.hpp>

namespace agt {

using deft::Shape;
using deft::Tensor;
using Loss = std::function<Tensor<double>()>;

inline Tensor<double> uniform(const Shape& s, double lo = -1, double hi = 1) {
  return deft::random::uniform<double>(lo, hi, s);
}

/// Records loss() (a one-element value), back-propagates and compares every
/// parameter's gradient with (loss(p + h) - loss(p - h)) / 2h elementwise:
/// |analytic - numeric| <= tol * max(1, |numeric|).
inline void check_gradients(const std::vector<Tensor<double>*>& params, const Loss& loss, double tol = 1e-6,
                            double h = 1e-6) {
  for (auto* p : params) p->attach_grad();
  {
    deft::autograd::record rec;
    Tensor<double> y = loss();
    BOOST_REQUIRE_EQUAL(y.size(), 1);
    y.backward();
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    Tensor<double>& p = *params[k];
    const Tensor<double> original = p;  // keeps the variable and its gradient for the caller
    const Shape shape = p.shape();
    const std::vector<double> analytic = p.grad().to_vector();
    const std::vector<double> v = p.to_vector();
    BOOST_REQUIRE_EQUAL(analytic.size(), v.size());
    double worst = 0;
    std::size_t worst_i = 0;
    double worst_num = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      auto at = [&](double delta) {
        auto w = v;
        w[i] += delta;
        p = Tensor<double>(w, shape);
        return loss().item();
      };
      const double numeric = (at(h) - at(-h)) / (2 * h);
      const double err = std::abs(analytic[i] - numeric) / std::max(1.0, std::abs(numeric));
      if (err > worst) worst = err, worst_i = i, worst_num = numeric;
    }
    p = original;
    BOOST_TEST_INFO("parameter " << k << " shape " << shape.to_string() << ": element " << worst_i << " analytic "
                                 << analytic[worst_i] << " numeric " << worst_num);
    BOOST_TEST(worst <= tol);
  }
}

}  // namespace agt
