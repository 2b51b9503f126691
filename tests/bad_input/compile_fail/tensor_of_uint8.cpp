// A first-hour mistake: an element type deft does not support (images are
// often bytes). Must fail on the Element concept, which lists the four types.
#include <cstdint>
#include <deft/deft.hpp>

int main() {
  deft::Tensor<std::uint8_t> pixels = deft::zeros<std::uint8_t>({28, 28});
  (void)pixels;
}
