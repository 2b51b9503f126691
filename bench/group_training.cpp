// training: the seeds' MLP training step (batch 1024, 512 -> 2048 -> 512 -> 1,
// ReLU, L2 loss, SGD lr 0.005) with deft's nn + autograd against libtorch's
// eager autograd, same initial weights and data; ms per step (forward,
// backward and update, ending with every value computed).
#include <deft/nn.hpp>

#include "common.hpp"

namespace bench {

void bench_training() {
  using namespace deft;
  const char* g = "training";
  const std::string name = "mlp step 512-2048-512-1";
  const std::string size = "1024x512";
  constexpr std::int64_t batch = 1024;
  const int w = engine::num_workers();

  random::seed(7);
  const Tensor<float> x = random::normal<float>(0, 1, {batch, 512});
  const Tensor<float> y = ones<float>({batch});
  nn::Sequential net;
  auto d1 = std::make_shared<nn::Dense>(2048, nn::Act::relu);
  auto d2 = std::make_shared<nn::Dense>(512, nn::Act::relu);
  auto d3 = std::make_shared<nn::Dense>(1);
  net.add(d1, d2, d3);
  net.initialize(nn::init::normal(0.01));
  (void)net(x).to_vector();  // deferred initialization
  // The peers start from the same weights.
  std::vector<std::vector<float>> weights;
  for (auto* p : net.collect_params()) weights.push_back(p->data().to_vector());

  nn::Trainer trainer(net.collect_params(), nn::SGD{.learning_rate = 0.005f});
  const nn::L2Loss loss;
  float deft_loss = 0;
  const Summary s = measure([&] {
    Tensor<float> l;
    {
      autograd::record rec;
      l = loss(net(x), y);
      l.backward();
    }
    trainer.step(batch);
    wait_all();
    deft_loss = mean(l).item();
  });
  add_time(g, name, "deft", w, size, "ms", s);

#if DEFT_BENCH_HAVE_TORCH
  torch_peer::set_threads(w);
  const auto xv = x.to_vector();
  float torch_loss = 0;
  add_time(g, name, "torch", w, size, "ms", torch_peer::mlp_step(xv.data(), batch, weights, 0.005f, &torch_loss));
  std::printf("%-12s loss after the timed steps: deft %.6f, torch %.6f (both start from the same weights)\n", g,
              deft_loss, torch_loss);
#else
  skip(g, "torch", "libtorch not found");
#endif
}

}  // namespace bench
