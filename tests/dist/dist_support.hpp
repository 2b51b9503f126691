// Helpers for the tests across processes: every rank's inputs, drawn from a
// seed of its rank so that each rank can compute the others' for a reference.
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
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

/// The tolerance of a float sum of elements of total magnitude `magnitude`
/// (integers: exact).
template <class T>
double tolerance_of(double magnitude) {
  if constexpr (std::is_integral_v<T>) return 0.0;
  else return 4.0 * double(std::numeric_limits<T>::epsilon()) * magnitude + 1e-30;
}

/// allreduce with `op` of every rank's values_of<T>(r, key, n) on `device`,
/// checked on this rank against a double reference of every rank's values.
template <class T>
void check_allreduce(deft::dist::ReduceOp op, std::uint64_t key, deft::Shape shape, deft::Device device = {}) {
  using deft::dist::ReduceOp;
  const int ranks = deft::dist::size();
  const std::int64_t n = shape.size();
  deft::Tensor<T> t = deft::Tensor<T>(values_of<T>(deft::dist::rank(), key, n), shape).to(device);
  deft::dist::allreduce(t, op);
  BOOST_TEST(t.device() == device);
  const std::vector<T> got = t.to_vector();
  BOOST_REQUIRE_EQUAL(got.size(), std::size_t(n));
  std::vector<std::vector<T>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(values_of<T>(r, key, n));
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double ref = op == ReduceOp::max ? -INFINITY : op == ReduceOp::min ? INFINITY : 0.0, mag = 0;
    for (int r = 0; r < ranks; ++r) {
      const double x = double(all[std::size_t(r)][std::size_t(i)]);
      mag += std::abs(x);
      if (op == ReduceOp::max) ref = std::max(ref, x);
      else if (op == ReduceOp::min) ref = std::min(ref, x);
      else ref += x;
    }
    if (op == ReduceOp::mean) ref = std::is_integral_v<T> ? std::trunc(ref / ranks) : ref / ranks;
    if (std::abs(double(got[std::size_t(i)]) - ref) > tolerance_of<T>(mag)) ++bad;
  }
  BOOST_TEST(bad == 0, bad << " of " << n << " elements differ (op " << deft::dist::op_name(op) << ", "
                                << deft::dtype_name(deft::dtype_of<T>) << ", shape " << shape.to_string() << ", on "
                                << device << ")");
}

/// A communicator of its own over MPI_COMM_WORLD (a failure test breaks it,
/// not the world's).
inline std::shared_ptr<deft::dist::MpiCommunicator> fresh(deft::dist::Options o = {}) {
  return std::make_shared<deft::dist::MpiCommunicator>(MPI_COMM_WORLD, o);
}

/// A small data-parallel training problem, shared by the CPU and GPU tests.
namespace training {

/// 5 -> 16 -> 8 -> 3, Kaiming-initialized on `device` at the first forward.
inline std::shared_ptr<deft::nn::Sequential> make_net(deft::Device device = {}) {
  namespace nn = deft::nn;
  auto net = std::make_shared<nn::Sequential>();
  // No BatchNorm: its batch statistics are each rank's own rows, which one
  // process at the global batch would not compute.
  net->add(std::make_shared<nn::Dense>(16, nn::Act::relu), std::make_shared<nn::Dense>(8, nn::Act::relu),
           std::make_shared<nn::Dense>(3));
  net->initialize(nn::init::kaiming(), {device});
  return net;
}

/// 5 -> 16 -> BatchNorm -> relu -> 3, Kaiming-initialized on `device` at
/// the first forward; its BatchNorm synchronized across the ranks where asked.
inline std::shared_ptr<deft::nn::Sequential> make_normalized_net(deft::Device device = {}) {
  namespace nn = deft::nn;
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Dense>(16), std::make_shared<nn::BatchNorm>(0.8f),
           std::make_shared<nn::Activation>(nn::Act::relu), std::make_shared<nn::Dense>(3));
  net->initialize(nn::init::kaiming(), {device});
  return net;
}

/// Per parameter, the largest difference between a's and b's values,
/// relative to a's (at least 1e-3).
inline std::vector<double> relative_differences(const std::vector<std::vector<float>>& a,
                                                const std::vector<std::vector<float>>& b) {
  std::vector<double> out;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double worst = a[i].size() == b[i].size() ? 0.0 : INFINITY;
    for (std::size_t k = 0; k < a[i].size() && k < b[i].size(); ++k)
      worst = std::max(worst, std::abs(double(a[i][k]) - double(b[i][k])) / (1e-3 + std::abs(double(a[i][k]))));
    out.push_back(worst);
  }
  return out;
}

/// Every parameter's values, in collect_params() order.
inline std::vector<std::vector<float>> values(deft::nn::Sequential& net) {
  std::vector<std::vector<float>> out;
  for (deft::nn::Parameter* p : net.collect_params()) out.push_back(p->data().to_vector());
  return out;
}

/// 96 samples of 5 features, 3 classes.
inline std::pair<deft::Tensor<float>, deft::Tensor<std::int64_t>> data_set() {
  std::vector<float> x(96 * 5);
  std::vector<std::int64_t> y(96);
  std::mt19937 gen(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) v = d(gen);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int64_t((x[i * 5] > 0) + (x[i * 5 + 1] > 0.5f));
  return {deft::Tensor<float>(x, deft::Shape{96, 5}), deft::Tensor<std::int64_t>(y, deft::Shape{96})};
}

/// `epochs` passes over `loader`, each batch moved to `device`.
inline void train(deft::nn::Sequential& net, deft::nn::Trainer& trainer, deft::data::DataLoader& loader, int epochs,
                  deft::Device device = {}) {
  for (int e = 0; e < epochs; ++e)
    for (const deft::data::Batch& b : loader) {
      {
        deft::autograd::record rec;
        deft::nn::SoftmaxCrossEntropyLoss()(net(b.x.to(device)), b.y.to(device)).backward();
      }
      trainer.step(b.rows);
    }
}

}  // namespace training

}  // namespace dist_test
