// Must not compile: += with a tensor of another element type.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  deft::Tensor<float> f = deft::ones({3});
  const deft::Tensor<double> d = deft::ones<double>({3});
  f += d;
}
