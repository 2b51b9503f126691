// The two kernels a convolution's weight gradient may use per block,
// dYb (O x len) times colsbᵀ (len x K), on one thread: dot products of
// contiguous rows (gemm_nt) and the packed GEMM reading colsᵀ in place,
// called in alternation on the same operands (GFLOP/s, medians of 7 rounds).
// The shapes are the narrow ResNet-18's on 28x28 images and the 1x1
// shortcuts; thresholds::conv_weight_packed_min chooses between the two.
// Not built by CMake:
//   g++ -std=c++20 -O3 -march=native -DNDEBUG -I<tree>/include \
//     bench/conv_weight_products/conv_weight_products.cpp -o cwp -pthread && ./cwp
#include <deft/deft.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  deft::engine::set_num_workers(1);
  struct Shape {
    std::int64_t o, k, len;
  };
  const Shape shapes[] = {{8, 72, 784},   {16, 144, 392}, {32, 288, 196}, {64, 576, 112},
                          {16, 8, 784},   {32, 16, 392},  {64, 32, 224}};
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  using clock = std::chrono::steady_clock;
  std::printf("| O | K | len | dot products (gemm_nt), GFLOP/s | packed GEMM, GFLOP/s | packed chosen |\n|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    std::vector<float> dy(std::size_t(s.o * s.len)), cols(std::size_t(s.k * s.len)), c(std::size_t(s.o * s.k));
    for (auto& x : dy) x = u(g);
    for (auto& x : cols) x = u(g);
    const int reps = int(std::max<std::int64_t>(3, 400'000'000 / (2 * s.o * s.k * s.len)));
    auto dots = [&] {
      for (int r = 0; r < reps; ++r) deft::detail::cpu::gemm_nt(s.o, s.k, s.len, dy.data(), cols.data(), c.data(), false);
    };
    auto packed = [&] {
      for (int r = 0; r < reps; ++r)
        deft::detail::cpu::GemmKernel<float>::run(s.o, s.k, s.len, dy.data(), false, cols.data(), true, c.data());
    };
    auto seconds = [&](auto&& f) {
      const auto t0 = clock::now();
      f();
      return std::chrono::duration<double>(clock::now() - t0).count();
    };
    dots();
    packed();
    std::vector<double> td, tp;
    for (int round = 0; round < 7; ++round) {
      td.push_back(seconds(dots));
      tp.push_back(seconds(packed));
    }
    std::sort(td.begin(), td.end());
    std::sort(tp.begin(), tp.end());
    const double flops = 2.0 * double(s.o * s.k * s.len) * reps;
    const bool chosen = s.o >= deft::thresholds::conv_weight_packed_min && s.k >= deft::thresholds::conv_weight_packed_min;
    std::printf("| %lld | %lld | %lld | %.1f | %.1f | %s |\n", (long long)s.o, (long long)s.k, (long long)s.len,
                flops / td[3] / 1e9, flops / tp[3] / 1e9, chosen ? "yes" : "no");
  }
}
