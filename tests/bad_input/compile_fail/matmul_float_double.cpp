// Must not compile: matmul of float32 and float64.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  const deft::Tensor<float> a = deft::ones({2, 2});
  const deft::Tensor<double> b = deft::ones<double>({2, 2});
  auto c = deft::matmul(a, b);
  (void)c;
}
