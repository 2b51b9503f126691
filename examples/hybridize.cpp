// Hybridization, after the seeds (D2L "hybrid programming", MXNet): the net
// 512 -> 256 -> 128 -> 2 at batch 1, 1000 forward calls before and after
// net.hybridize().
//
// Two loops, because deft differs from MXNet here: `for (...) net(x);` then
// wait_all() lets deft skip the 999 forwards whose results nobody can read
// (imperatively; a replayed graph keeps its buffers, so it runs them all),
// while reading every result makes each call run.
#include <deft/nn.hpp>

#include <chrono>
#include <cstdio>

using namespace deft;

namespace {

double seconds_for(nn::Block& net, const Tensor<float>& x, bool read_each) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) {
    Tensor<float> y = net(x);
    if (read_each) y.wait_to_read();
  }
  wait_all();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
  random::seed(0);
  nn::Sequential net;
  net.add(std::make_shared<nn::Dense>(256, nn::Act::relu), std::make_shared<nn::Dense>(128, nn::Act::relu),
          std::make_shared<nn::Dense>(2));
  net.initialize();
  const Tensor<float> x = random::normal<float>(0, 1, {1, 512});
  const auto imperative = net(x).to_vector();  // also initializes the parameters

  const double before_read = seconds_for(net, x, true), before_free = seconds_for(net, x, false);
  net.hybridize();
  const auto hybrid = net(x).to_vector();  // traces the graph
  const double after_read = seconds_for(net, x, true), after_free = seconds_for(net, x, false);

  std::printf("1000 calls, each result read:  before hybridizing %.4f sec, after %.4f sec (%.2fx)\n", before_read,
              after_read, before_read / after_read);
  std::printf("1000 calls, then wait_all():   before hybridizing %.4f sec, after %.4f sec\n", before_free, after_free);
  std::printf("outputs: imperative [%.6f, %.6f], hybridized [%.6f, %.6f]; traced %lld time(s)\n", imperative[0],
              imperative[1], hybrid[0], hybrid[1], static_cast<long long>(net.traces()));
  return imperative == hybrid ? 0 : 1;
}
