// Must not compile: a float32 tensor initialised from a float64 expression.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  const deft::Tensor<double> d = deft::ones<double>({3});
  deft::Tensor<float> f = d * 2.0;
  (void)f;
}
