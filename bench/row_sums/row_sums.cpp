// Row sums of a 4096 x 4096 float32 matrix on one thread, to tell deft's
// loop from where its data sits: Eigen's rowwise().sum() and deft's row loop
// (reduce_contiguous, what sum(x, 1) runs per row) over one buffer, and
// deft's loop over deft's own tensor against a copy in fresh memory.
// Interleaved rounds, medians. Not built by CMake (Eigen is optional):
//   g++ -std=c++20 -O3 -march=native -DNDEBUG -Iinclude -I/usr/include/eigen3 \
//     bench/row_sums/row_sums.cpp -o row_sums -pthread && ./row_sums
#include <deft/deft.hpp>

#include <Eigen/Dense>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t n = 4096;

void clobber(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

void deft_rows(const float* x, float* out) {
  for (std::int64_t r = 0; r < n; ++r)
    out[r] = deft::detail::cpu::reduce_contiguous<deft::detail::SumReducer<float>>(x + r * n, n);
  clobber(out);
}

}  // namespace

int main() {
  deft::engine::set_num_workers(1);
  deft::random::seed(12);
  const auto t = deft::random::uniform<float>(0, 1, {n, n});
  const auto values = t.to_vector();
  const float* own = deft::detail::whole_storage(t)->as<const float>();
  auto* copy = static_cast<float*>(std::aligned_alloc(64, std::size_t(n * n) * sizeof(float)));
  auto* out = static_cast<float*>(std::aligned_alloc(64, std::size_t(n) * sizeof(float)));
  std::copy(values.begin(), values.end(), copy);
  using RowMajor = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMajor> e(copy, n, n);
  const char* names[] = {"Eigen rowwise().sum(), copy", "deft's row loop, copy", "deft's row loop, deft's tensor"};
  const auto runs = [&](int k) {
    if (k == 0) {
      Eigen::Map<Eigen::ArrayXf>(out, n) = e.rowwise().sum();
      clobber(out);
    } else {
      deft_rows(k == 1 ? copy : own, out);
    }
  };
  std::vector<double> ms[3];
  for (int round = -1; round < 61; ++round)
    for (int k = 0; k < 3; ++k) {
      const auto start = Clock::now();
      runs(k);
      if (round >= 0) ms[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  for (int k = 0; k < 3; ++k) {
    std::sort(ms[k].begin(), ms[k].end());
    std::printf("%-32s %.3f ms (median of 61)\n", names[k], ms[k][30]);
  }
  std::free(copy);
  std::free(out);
}
