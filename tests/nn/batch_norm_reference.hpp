// BatchNorm in double precision, the reference of the nn and dist tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// BatchNorm in double over x viewed as (n, c, s): the output, and with an
// upstream gradient g the gradients of x, gamma and beta. With `batch`,
// the batch's statistics (and the gradient through them); else `mean` and
// `var` as given.
struct BatchNormReference {
  std::vector<double> y, dx, dgamma, dbeta, mean, var;
  BatchNormReference(const std::vector<double>& x, const std::vector<double>& g, const std::vector<double>& gamma,
                     const std::vector<double>& beta, std::int64_t n, std::int64_t c, std::int64_t s, double eps,
                     bool batch, std::vector<double> given_mean = {}, std::vector<double> given_var = {})
      : y(x.size()), dx(x.size()), dgamma(c), dbeta(c), mean(std::move(given_mean)), var(std::move(given_var)) {
    const double m = double(n * s);
    auto at = [&](std::int64_t i, std::int64_t ch, std::int64_t k) { return std::size_t((i * c + ch) * s + k); };
    if (batch) mean.assign(c, 0.0), var.assign(c, 0.0);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      if (batch) {
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t k = 0; k < s; ++k) mean[ch] += x[at(i, ch, k)] / m;
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t k = 0; k < s; ++k) var[ch] += (x[at(i, ch, k)] - mean[ch]) * (x[at(i, ch, k)] - mean[ch]) / m;
      }
      const double inv = 1.0 / std::sqrt(var[ch] + eps);
      double sum_g = 0, sum_g_xhat = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t k = 0; k < s; ++k) {
          const std::size_t p = at(i, ch, k);
          const double xhat = (x[p] - mean[ch]) * inv;
          y[p] = xhat * gamma[ch] + beta[ch];
          sum_g += g[p];
          sum_g_xhat += g[p] * xhat;
        }
      dgamma[ch] = sum_g_xhat;
      dbeta[ch] = sum_g;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t k = 0; k < s; ++k) {
          const std::size_t p = at(i, ch, k);
          const double xhat = (x[p] - mean[ch]) * inv;
          dx[p] = batch ? gamma[ch] * inv / m * (m * g[p] - sum_g - xhat * sum_g_xhat) : gamma[ch] * inv * g[p];
        }
    }
  }
};

/// The values of v in double.
inline std::vector<double> to_doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

/// "" when got[i] is within tol of want[begin + i] for every i (relative, and
/// absolute where |want| < 1); else the first element that is not.
inline std::string first_mismatch(const std::vector<float>& got, const std::vector<double>& want, std::size_t begin,
                                  double tol) {
  if (begin + got.size() > want.size())
    return std::to_string(got.size()) + " values from " + std::to_string(begin) + " of " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(double(got[i]) - want[begin + i]) <= tol * std::max(1.0, std::abs(want[begin + i]))))
      return "element " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[begin + i]);
  return "";
}
