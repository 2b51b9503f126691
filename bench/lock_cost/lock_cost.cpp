// What a locked instruction costs on this machine where deft's statements
// take them (a leaf's reference, a spin lock): a loop of 64-byte stores (a
// tree being built), with a relaxed atomic add or a plain add after each.
// Three rounds, each mode in turn; nanoseconds per iteration.
// Not built by CMake (from the repository root):
//   g++ -std=c++20 -O2 -march=native bench/lock_cost/lock_cost.cpp -o lock_cost && ./lock_cost
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace {
std::atomic<long> shared_count{0};
long plain_count = 0;
char scratch[4096];
}  // namespace

int main() {
  constexpr int iterations = 20000000;
  for (int round = 0; round < 3; ++round)
    for (const bool locked : {false, true}) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) {
        std::memset(scratch + (i & 1023), i, 64);
        asm volatile("" ::: "memory");
        if (locked) {
          shared_count.fetch_add(1, std::memory_order_relaxed);
        } else {
          plain_count = plain_count + 1;
          asm volatile("" ::: "memory");
        }
      }
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
      std::printf("%-28s %.2f ns per iteration\n", locked ? "stores + locked add" : "stores + plain add", ns / iterations);
    }
}
