// The README's first example written with the libtorch C++ API (a peer in compile_time.sh).
#include <torch/torch.h>
#include <iostream>

int main() {
  auto a = torch::ones({1, 2});
  auto b = torch::ones({1, 2});
  torch::Tensor c = a * b + 2;
  std::cout << c << '\n';
}
