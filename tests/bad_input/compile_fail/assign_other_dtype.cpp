// Must not compile: assign() of a float64 value into a float32 tensor.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  deft::Tensor<float> f = deft::ones({3});
  const deft::Tensor<double> d = deft::ones<double>({3});
  f.assign(d);
}
