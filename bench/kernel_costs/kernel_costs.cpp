// Median wall time of the statements whose kernels every program compiles
// and runs: the fused a*b + c*2 - max(d, 0) on 2^24 floats (2 workers,
// streaming stores) and on 4096 (1 worker: what a statement costs end to
// end), a bias add x + b over rows of 256 and of 10 (dense rows of a
// broadcast), a column broadcast x + c (a strided row), and the backward of
// mean(tanh(x * w) + b, 1) at 64x64 and 1024x1024 (a reduction of a tree,
// differentiated through its program). It uses deft's public API only, so
// the same file compiles against any checkout: to compare two commits,
// build it against each tree's include/ and run the two in turn.
// Not built by CMake:
//   g++ -std=c++20 -O2 -march=native -DNDEBUG -I<tree>/include \
//     bench/kernel_costs/kernel_costs.cpp -o kernel_costs -pthread && ./kernel_costs
#include <deft/deft.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace {

using namespace deft;

/// Median over `repeats` of the mean time of `inner` calls of f, in microseconds.
double median_us(int repeats, int inner, const std::function<void()>& f) {
  f();  // buffers cached
  std::vector<double> us;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) f();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / inner);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void row(const char* what, double us) { std::printf("%-52s %10.3f us\n", what, us); }

}  // namespace

int main() {
  random::seed(1);
  const auto u = [](Shape s) { return random::uniform<float>(-1, 1, s); };
  const std::int64_t big = std::int64_t(1) << 24;
  auto a = u({big}), b = u({big}), c = u({big}), d = u({big});
  auto s1 = u({4096}), s2 = u({4096}), s3 = u({4096}), s4 = u({4096});
  auto x = u({4096, 256}), bias = u({256}), xs = u({65536, 10}), bs = u({10}), col = u({4096, 1});
  Tensor<float> y, z, w, ws, wc;

  engine::set_num_workers(2);
  row("a*b + c*2 - max(d, 0), 2^24, 2 workers", median_us(15, 3, [&] {
        y = a * b + c * 2 - maximum(d, 0);
        y.wait_to_read();
      }));
  row("x + b, 4096x256 + 256, 2 workers", median_us(15, 20, [&] {
        w = x + bias;
        w.wait_to_read();
      }));
  row("x + b, 65536x10 + 10, 2 workers", median_us(15, 20, [&] {
        ws = xs + bs;
        ws.wait_to_read();
      }));
  row("x + c, 4096x256 + 4096x1, 2 workers", median_us(15, 20, [&] {
        wc = x + col;
        wc.wait_to_read();
      }));
  for (std::int64_t n : {64, 1024}) {
    auto xg = u({n, n}), wg = u({n, n}), bg = u({n});
    for (auto* t : {&xg, &wg, &bg}) t->attach_grad();
    char what[64];
    std::snprintf(what, sizeof what, "backward of mean(tanh(x*w) + b, 1), %lldx%lld", (long long)n, (long long)n);
    row(what, median_us(21, n < 256 ? 50 : 3, [&] {
          Tensor<float> l;
          {
            autograd::record rec;
            l = mean(tanh(xg * wg) + bg, 1);
          }
          l.backward();
          for (auto* t : {&xg, &wg, &bg}) t->grad().wait_to_read();
        }));
  }
  engine::set_num_workers(1);
  row("a*b + c*2 - max(d, 0), 4096, 1 worker", median_us(15, 2000, [&] {
        z = s1 * s2 + s3 * 2 - maximum(s4, 0);
        z.wait_to_read();
      }));
}
