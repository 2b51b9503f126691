// Conan's test package: deft from the package compiles, defers and computes.
#include <deft/deft.hpp>

#include <cstdio>

int main() {
  auto a = deft::ones({1, 2});
  auto b = deft::ones({1, 2});
  deft::Tensor<float> c = a * b + 2;  // recorded; runs at the sync point below
  const auto v = c.to_vector();
  std::printf("deft test_package: c = [%g, %g]\n", v[0], v[1]);
  return v.size() == 2 && v[0] == 3.0f && v[1] == 3.0f ? 0 : 1;
}
