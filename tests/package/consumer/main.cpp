// The consumer's program: deferred work, a sync point, the engine running
// independent tasks on its workers. Exits non-zero when a value is wrong.
#include <deft/deft.hpp>

#include <cstdio>

int main() {
  auto a = deft::ones({2, 3});
  auto b = deft::full({2, 3}, 4.0f);
  deft::Tensor<float> c = a * b + 2;                 // recorded, not run
  deft::Tensor<float> d = deft::sum(c * c, 1);       // depends on c
  const auto values = d.to_vector();                 // sync point
  const auto stats = deft::engine::stats();
  std::printf("consumer: d = [%g, %g], tasks run %llu, deft %d.%d.%d\n", values[0], values[1],
              (unsigned long long)stats.tasks_run, DEFT_VERSION_MAJOR, DEFT_VERSION_MINOR, DEFT_VERSION_PATCH);
  // each row: 3 * (1 * 4 + 2)^2 = 108
  if (values.size() != 2 || values[0] != 108.0f || values[1] != 108.0f || stats.tasks_run < 2) {
    std::fprintf(stderr, "consumer: wrong result\n");
    return 1;
  }
  return 0;
}
