// Tasks recorded and median wall time per training step of three pieces
// whose derivatives deft fuses: a linear layer with the softmax
// cross-entropy (784 -> 10, batch 256), a training-mode BatchNorm forward
// and backward over (256, 16, 28, 28), and a step of the narrow ResNet-18
// (width 8, batch 128, SGD with momentum). It uses deft's public API only,
// so the same file compiles against any checkout: to compare two commits,
// build it against each tree's include/ and run the two in turn.
// Not built by CMake:
//   g++ -std=c++20 -O2 -march=native -DNDEBUG -I<tree>/include \
//     bench/step_costs/step_costs.cpp -o step_costs -pthread && ./step_costs
#include <deft/deft.hpp>
#include <deft/nn.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace {

using namespace deft;

void report(const char* what, int repeats, const std::function<void()>& step) {
  step();  // shapes inferred, buffers cached
  const auto before = engine::stats();
  step();
  const auto tasks = engine::stats().tasks_recorded - before.tasks_recorded;
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%-46s %5llu tasks  %9.3f ms (median of %d)\n", what, static_cast<unsigned long long>(tasks),
              ms[ms.size() / 2], repeats);
}

}  // namespace

int main() {
  random::seed(1);
  {
    Tensor<float> w = random::normal<float>(0, 0.1f, {784, 10});
    w.attach_grad();
    const Tensor<float> x = random::normal<float>(0, 1, {256, 784});
    const Tensor<std::int64_t> y = cast<std::int64_t>(random::uniform<float>(0, 9.99f, {256}));
    report("linear 784->10 + softmax cross-entropy, 256", 201, [&] {
      {
        autograd::record rec;
        nn::SoftmaxCrossEntropyLoss{}(dot(x, w), y).backward();
      }
      w.grad().wait_to_read();
    });
  }
  {
    auto bn = std::make_shared<nn::BatchNorm>();
    bn->initialize();
    Tensor<float> x = random::normal<float>(1, 2, {256, 16, 28, 28});
    const Tensor<float> up = random::normal<float>(0, 1, {256, 16, 28, 28});
    x.attach_grad();
    report("BatchNorm train forward+backward, 256x16x28x28", 31, [&] {
      {
        autograd::record rec;
        (*bn)(x).backward(up);
      }
      x.grad().wait_to_read();
      bn->gamma().grad().wait_to_read();
    });
  }
  {
    auto net = nn::resnet18(10, 8);
    net->initialize(nn::init::kaiming());
    const Tensor<float> x = random::normal<float>(0, 1, {128, 1, 28, 28});
    const Tensor<std::int64_t> y = cast<std::int64_t>(random::uniform<float>(0, 9.99f, {128}));
    nn::Trainer trainer(net->collect_params(), nn::SGD{0.1f, 0.9f});
    report("ResNet-18 width 8 training step, batch 128", 9, [&] {
      Tensor<float> loss;
      {
        autograd::record rec;
        loss = nn::SoftmaxCrossEntropyLoss{}((*net)(x), y);
        loss.backward();
      }
      trainer.step(128);
      (void)sum(loss).item();
    });
  }
}
