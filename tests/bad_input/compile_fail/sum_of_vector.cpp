// A first-hour mistake: handing a std::vector to a deft function instead of a
// tensor (wrap it: deft::Tensor<float>(v, {n})). Must fail on the Operand concept.
#include <deft/deft.hpp>
#include <vector>

int main() {
  std::vector<float> v{1, 2, 3};
  auto s = deft::sum(v);
  (void)s;
}
