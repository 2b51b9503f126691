// The statements whose cost recording adds, one kind per run, for counting
// instructions (bench/record_cost.py runs this under callgrind):
//   0  y = x + 1 on 4 floats, recorded only (each overwrite cancels the last)
//   1  y = x + 1, recorded and run in place (y.wait_to_read())
//   2  a new tensor z = x + 1 per statement, run
//   3  e = a*b + c*2 - max(d, 0) on 4096 floats, run
#include <deft/deft.hpp>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const int kind = argc > 1 ? std::atoi(argv[1]) : 0;
  const int n = argc > 2 ? std::atoi(argv[2]) : 20000;
  deft::engine::set_num_workers(1);
  auto x = deft::ones({4});
  deft::Tensor<float> y = x + 1;
  y.wait_to_read();
  auto a = deft::ones({4096}), b = deft::ones({4096}), c = deft::ones({4096}), d = deft::ones({4096});
  deft::Tensor<float> e = a * b + c * 2 - deft::maximum(d, 0.0f);
  e.wait_to_read();
  for (int i = 0; i < n; ++i) {
    if (kind == 0) {
      y = x + 1;
    } else if (kind == 1) {
      y = x + 1;
      y.wait_to_read();
    } else if (kind == 2) {
      deft::Tensor<float> z = x + 1;
      z.wait_to_read();
    } else {
      e = a * b + c * 2 - deft::maximum(d, 0.0f);
      e.wait_to_read();
    }
  }
  deft::wait_all();
  std::printf("%g %g\n", double(y.to_vector()[0]), double(e.to_vector()[0]));
}
