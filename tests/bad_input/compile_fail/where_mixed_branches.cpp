// Must not compile: where() with branches of different element types.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  const deft::Tensor<float> c = deft::ones({3});
  const deft::Tensor<double> d = deft::ones<double>({3});
  auto e = deft::where(c, c, d);
  (void)e;
}
