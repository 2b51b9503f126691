// Helpers for the tests across processes: every rank's inputs, drawn from a
// seed of its rank so that each rank can compute the others' for a reference.
#pragma once
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <deft/dist.hpp>
#include <deft/data.hpp>
#include <deft/nn.hpp>

namespace dist_test {

/// Rank r's values for case `key`: n numbers, integers in [-50, 50] for
/// integer types, normal floats otherwise.
template <class T>
std::vector<T> values_of(int r, std::uint64_t key, std::int64_t n) {
  std::mt19937_64 gen(key * 1000003u + std::uint64_t(r));
  std::vector<T> v(std::size_t(n), T{});
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<int> d(-50, 50);
    for (auto& x : v) x = T(d(gen));
  } else {
    std::normal_distribution<double> d(0.0, 3.0);
    for (auto& x : v) x = T(d(gen));
  }
  return v;
}

/// Whether what() contains `text`.
inline bool mentions(const std::exception& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

/// A communicator of its own over MPI_COMM_WORLD (a failure test breaks it,
/// not the world's).
inline std::shared_ptr<deft::dist::MpiCommunicator> fresh(deft::dist::Options o = {}) {
  return std::make_shared<deft::dist::MpiCommunicator>(MPI_COMM_WORLD, o);
}

}  // namespace dist_test
