// Median wall time of `softmax(x, 1)` over an R x C float tensor (synced
// each call), on deft's default workers. It uses deft's public API only, so
// the same file compiles against any checkout: to compare two commits,
// build it against each tree's include/ and run the two in turn.
// Not built by CMake (from the repository root, <tree> the checkout timed):
//   g++ -std=c++20 -O3 -march=native -DNDEBUG -I<tree>/include bench/softmax_rows/softmax_rows.cpp -o softmax_rows -pthread
//   ./softmax_rows 1024 2048 [calls]
#include <deft/deft.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: softmax_rows ROWS COLS [CALLS]\n");
    return 2;
  }
  const std::int64_t rows = std::atol(argv[1]), cols = std::atol(argv[2]);
  const int calls = argc > 3 ? std::atoi(argv[3]) : 15;
  deft::random::seed(7);
  const auto x = deft::random::uniform<float>(-4, 4, {rows, cols});
  deft::Tensor<float> y = deft::softmax(x, 1);  // warm-up: the allocator's cache, the workers
  y.wait_to_read();
  std::vector<double> ms;
  for (int i = 0; i < calls; ++i) {
    const auto start = std::chrono::steady_clock::now();
    y = deft::softmax(x, 1);
    y.wait_to_read();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("softmax(x, 1) of %lldx%lld: %.3f ms median of %d calls\n", static_cast<long long>(rows),
              static_cast<long long>(cols), ms[ms.size() / 2], calls);
}
