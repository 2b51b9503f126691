// Must not compile: exp of an integer tensor.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  const deft::Tensor<std::int64_t> i = deft::ones<std::int64_t>({3});
  auto e = deft::exp(i);
  (void)e;
}
