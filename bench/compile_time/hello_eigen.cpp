// The README's first example written with Eigen's Tensor module (a peer in compile_time.sh).
#include <unsupported/Eigen/CXX11/Tensor>
#include <iostream>

int main() {
  Eigen::Tensor<float, 2> a(1, 2), b(1, 2);
  a.setConstant(1.f);
  b.setConstant(1.f);
  Eigen::Tensor<float, 2> c = a * b + 2.f;
  std::cout << c << '\n';
}
