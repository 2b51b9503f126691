// A debug build for this machine's SIMD (-O0 -march=native) must compile:
// GCC 12 at -O0 rejects xsimd 8's AVX-512BW blends, which log, exp, pow and
// the nn layers' activations reach (eval/cpu/simd.hpp picks AVX2 there).
#include <deft/deft.hpp>
#include <deft/nn.hpp>

int main() {
  deft::Tensor<float> x = deft::random::uniform<float>(0.5f, 2, {4, 8});
  deft::Tensor<double> y = deft::cast<double>(x);
  auto z = deft::log(x) + deft::exp(x) * deft::pow(x, 1.5f) + deft::tanh(x) - deft::sigmoid(x);
  auto w = deft::sum(deft::log(y) * deft::exp(y));
  deft::nn::Dense dense(3, deft::nn::Act::relu);
  auto out = dense(z);
  (void)w; (void)out;
}
