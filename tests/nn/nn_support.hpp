// Helpers shared by the nn test files (one translation unit in a unity build).
#pragma once
#include <cmath>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

namespace nn_test {

/// Whether e's message contains `what`.
inline bool mentions(const std::exception& e, const std::string& what) {
  return std::string(e.what()).find(what) != std::string::npos;
}

/// A path in the temporary directory, unique to this process.
inline std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("deft_nn_test_" + std::to_string(::getpid()) + "_" + name);
}

/// The optimizers' updates in double, written from their definitions, for
/// checking deft's Trainer: SGD with momentum and L2 decay in Gluon's form
/// (the rate inside the momentum buffer), Nesterov momentum in PyTorch's form,
/// and Adam with its bias corrections.
struct ReferenceUpdate {
  enum Kind { sgd, nesterov, adam };
  explicit ReferenceUpdate(Kind k) : kind(k) {}
  Kind kind;
  double momentum = 0.9, decay = 0.0;                 // SGD
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;  // Adam
  std::vector<double> m, v;                           // the optimizer's state

  /// Update number t (from 1) of w at rate lr, with the summed gradient g
  /// of a batch of `batch` samples.
  void apply(std::vector<double>& w, const std::vector<float>& g, double batch, double lr, int t) {
    m.resize(w.size(), 0.0);
    v.resize(w.size(), 0.0);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double gi = g[i] / batch;
      if (kind == sgd) {
        m[i] = momentum * m[i] - lr * (gi + decay * w[i]);
        w[i] += m[i];
      } else if (kind == nesterov) {
        const double decayed = gi + decay * w[i];
        m[i] = momentum * m[i] + decayed;
        w[i] -= lr * (decayed + momentum * m[i]);
      } else {
        m[i] = beta1 * m[i] + (1 - beta1) * gi;
        v[i] = beta2 * v[i] + (1 - beta2) * gi * gi;
        const double size = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
        w[i] -= size * m[i] / (std::sqrt(v[i]) + epsilon);
      }
    }
  }
};

}  // namespace nn_test
