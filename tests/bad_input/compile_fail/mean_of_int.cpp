// Must not compile: mean of an integer tensor.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  const deft::Tensor<std::int32_t> i = deft::ones<std::int32_t>({3});
  auto m = deft::mean(i);
  (void)m;
}
