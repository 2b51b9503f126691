// How long the waits between polls of a collective (core/backoff.hpp) really
// sleep: std::this_thread::sleep_for, which Linux lengthens by the thread's
// timer slack (50 us unless set), against deft's sleep_us, which lowers the
// slack for the sleep. Medians and 90th percentiles of 200 sleeps each.
// Not built by CMake (from the repository root):
//   g++ -std=c++20 -O2 -Iinclude bench/poll_sleep/poll_sleep.cpp -o poll_sleep && ./poll_sleep
#include <deft/core/backoff.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

template <class Sleep>
void time_sleeps(const char* what, std::int64_t us, Sleep sleep) {
  std::vector<double> took;
  for (int i = 0; i < 200; ++i) {
    const auto start = std::chrono::steady_clock::now();
    sleep(us);
    took.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(took.begin(), took.end());
  std::printf("%-28s %5lld us asked: median %7.1f us, p90 %7.1f us\n", what, static_cast<long long>(us), took[100],
              took[180]);
}

}  // namespace

int main() {
  for (std::int64_t us : {10, 50, 100}) {
    time_sleeps("std::this_thread::sleep_for", us,
                [](std::int64_t n) { std::this_thread::sleep_for(std::chrono::microseconds(n)); });
    time_sleeps("deft::detail::sleep_us", us, [](std::int64_t n) { deft::detail::sleep_us(n); });
  }
}
