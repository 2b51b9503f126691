// Must not compile: random::normal of an integer dtype.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  auto n = deft::random::normal<std::int32_t>(0, 1, {3});
  (void)n;
}
