// Control for the compile-fail tests: the same kind of code with matching
// element types (and explicit casts) compiles with the same command line.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  deft::Tensor<float> f = deft::ones({3});
  const deft::Tensor<double> d = deft::ones<double>({3});
  const deft::Tensor<std::int32_t> i = deft::ones<std::int32_t>({3});
  deft::Tensor<float> g = deft::cast<float>(d) * 2.f + deft::cast<float>(i);
  f.assign(deft::cast<float>(d));
  f += deft::cast<float>(d);
  auto w = deft::where(f, f, deft::cast<float>(d));
  auto m = deft::matmul(deft::cast<double>(f.reshape({3, 1})), d.reshape({1, 3}));
  auto e = deft::exp(deft::cast<double>(i)) + deft::mean(deft::cast<float>(i * 2)).item();
  auto n = deft::random::normal<double>(0, 1, {3});
  (void)g; (void)w; (void)m; (void)e; (void)n;
}
