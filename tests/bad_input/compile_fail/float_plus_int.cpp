// Must not compile: float32 + int32 tensors.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  const deft::Tensor<float> f = deft::ones({3});
  const deft::Tensor<std::int32_t> i = deft::ones<std::int32_t>({3});
  auto e = f + i;
  (void)e;
}
