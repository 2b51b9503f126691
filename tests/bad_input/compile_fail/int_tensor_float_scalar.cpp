// Must not compile: an int32 tensor combined with a floating-point number.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  const deft::Tensor<std::int32_t> i = deft::ones<std::int32_t>({3});
  auto e = i * 1.5;
  (void)e;
}
