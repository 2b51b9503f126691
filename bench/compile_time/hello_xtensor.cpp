// The README's first example written with xtensor on xsimd (a peer in compile_time.sh).
#include <iostream>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xio.hpp>
#include <xtensor/xtensor.hpp>

int main() {
  xt::xtensor<float, 2> a = xt::ones<float>({1, 2});
  xt::xtensor<float, 2> b = xt::ones<float>({1, 2});
  xt::xtensor<float, 2> c = a * b + 2.f;
  std::cout << c << '\n';
}
