// The libtorch rows (eager C++ API through ATen, which is what torch:: calls).
// Compiled with libtorch's headers only when CMake found libtorch.
#if DEFT_BENCH_HAVE_TORCH && DEFT_BENCH_TORCH_TU
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/version.h>

#include <cstring>

#include "harness.hpp"

namespace bench {
namespace torch_peer {

namespace {
at::Tensor wrap(const float* p, std::vector<std::int64_t> shape) {
  // from_blob does not copy: torch reads the very values deft and the others read.
  return at::from_blob(const_cast<float*>(p), shape, at::TensorOptions().dtype(at::kFloat));
}
}  // namespace

std::string version() { return TORCH_VERSION; }
void set_threads(int n) { at::set_num_threads(n); }

Summary fused(const float* a, const float* b, const float* c, const float* d, std::int64_t n, int inner,
              float* check_out) {
  at::Tensor ta = wrap(a, {n}), tb = wrap(b, {n}), tc = wrap(c, {n}), td = wrap(d, {n});
  at::Tensor y;
  const Summary s = measure([&] {
    for (int i = 0; i < inner; ++i) y = ta * tb + tc * 2 - at::clamp_min(td, 0);
  });
  std::memcpy(check_out, y.data_ptr<float>(), sizeof(float) * n);
  return s;
}

Summary bias_add(const float* x, const float* b, std::int64_t rows, std::int64_t cols) {
  at::Tensor tx = wrap(x, {rows, cols}), tb = wrap(b, {cols}), y;
  return measure([&] { y = tx + tb; });
}

Summary col_scale(const float* x, const float* s, std::int64_t rows, std::int64_t cols) {
  at::Tensor tx = wrap(x, {rows, cols}), ts = wrap(s, {rows, 1}), y;
  return measure([&] { y = tx * ts; });
}

Summary softmax(const float* x, std::int64_t rows, std::int64_t cols, float* check_out) {
  at::Tensor tx = wrap(x, {rows, cols}), y;
  const Summary s = measure([&] { y = at::softmax(tx, 1); });
  std::memcpy(check_out, y.data_ptr<float>(), sizeof(float) * rows * cols);
  return s;
}

Summary sum_all(const float* x, std::int64_t n, double* result) {
  at::Tensor tx = wrap(x, {n}), y;
  const Summary s = measure([&] { y = at::sum(tx); });
  *result = y.item<float>();
  return s;
}

Summary sum_axis(const float* x, std::int64_t rows, std::int64_t cols, int axis) {
  at::Tensor tx = wrap(x, {rows, cols}), y;
  return measure([&] { y = at::sum(tx, {axis}); });
}

Summary matmul(const float* a, const float* b, std::int64_t m, std::int64_t k, std::int64_t n, float* c) {
  at::Tensor ta = wrap(a, {m, k}), tb = wrap(b, {k, n}), tc = wrap(c, {m, n});
  return measure([&] { at::mm_out(tc, ta, tb); });
}

Summary tiny_ops(int ops, bool in_place) {
  at::Tensor x = at::rand({4}), y = x + 1;
  return measure([&] {
    if (in_place)
      for (int i = 0; i < ops; ++i) y.add_(1);
    else
      for (int i = 0; i < ops; ++i) y = x + 1;
  });
}

Summary seeds(const float* x, std::int64_t rows, std::int64_t cols, int steps) {
  at::Tensor tx = wrap(x, {rows, cols}), y;
  return measure([&] {
    for (int i = 0; i < steps; ++i) y = tx + 1;
  });
}

Summary mlp_step(const float* x, std::int64_t batch, const std::vector<std::vector<float>>& weights, float lr,
                 float* final_loss) {
  const std::int64_t dims[] = {512, 2048, 512, 1};
  std::vector<at::Tensor> params;
  for (int layer = 0; layer < 3; ++layer) {
    params.push_back(wrap(weights[2 * layer].data(), {dims[layer], dims[layer + 1]}).clone().set_requires_grad(true));
    params.push_back(wrap(weights[2 * layer + 1].data(), {dims[layer + 1]}).clone().set_requires_grad(true));
  }
  const at::Tensor tx = wrap(x, {batch, 512}), ty = at::ones({batch});
  at::Tensor l;
  const Summary s = measure([&] {
    const at::Tensor h1 = at::relu(at::addmm(params[1], tx, params[0]));
    const at::Tensor h2 = at::relu(at::addmm(params[3], h1, params[2]));
    const at::Tensor out = at::addmm(params[5], h2, params[4]).reshape({batch});
    l = (out - ty).pow(2) * 0.5;
    l.sum().backward();
    at::NoGradGuard no_grad;
    for (auto& p : params) {
      p.sub_(p.grad(), lr / float(batch));
      p.mutable_grad().zero_();
    }
  });
  *final_loss = l.mean().item<float>();
  return s;
}

Summary small_forward(const float* x, const std::vector<std::vector<float>>& weights, int calls, float* out) {
  const std::int64_t dims[] = {512, 256, 128, 2};
  std::vector<at::Tensor> params;
  for (int layer = 0; layer < 3; ++layer) {
    params.push_back(wrap(weights[2 * layer].data(), {dims[layer], dims[layer + 1]}).clone());
    params.push_back(wrap(weights[2 * layer + 1].data(), {dims[layer + 1]}).clone());
  }
  const at::Tensor tx = wrap(x, {1, 512});
  at::NoGradGuard no_grad;
  at::Tensor y;
  const Summary s = measure([&] {
    for (int i = 0; i < calls; ++i) {
      const at::Tensor h1 = at::relu(at::addmm(params[1], tx, params[0]));
      const at::Tensor h2 = at::relu(at::addmm(params[3], h1, params[2]));
      y = at::addmm(params[5], h2, params[4]);
    }
  });
  std::memcpy(out, y.data_ptr<float>(), 2 * sizeof(float));
  return s;
}

Summary mlp_epoch(const float* images, const std::int64_t* labels, std::int64_t n, std::int64_t features,
                  std::int64_t batch, const std::vector<std::vector<float>>& weights, float lr, float momentum,
                  float* last_loss) {
  const std::int64_t dims[] = {features, 256, 10};
  std::vector<at::Tensor> params, velocity;
  for (int layer = 0; layer < 2; ++layer) {
    params.push_back(wrap(weights[2 * layer].data(), {dims[layer], dims[layer + 1]}).clone().set_requires_grad(true));
    params.push_back(wrap(weights[2 * layer + 1].data(), {dims[layer + 1]}).clone().set_requires_grad(true));
  }
  for (const auto& p : params) velocity.push_back(at::zeros_like(p));
  const at::Tensor tx = wrap(images, {n, features});
  const at::Tensor ty = at::from_blob(const_cast<std::int64_t*>(labels), {n}, at::TensorOptions().dtype(at::kLong));
  at::Tensor l;
  const Summary s = measure([&] {
    for (std::int64_t i = 0; i < n; i += batch) {
      const std::int64_t e = std::min(n, i + batch);
      const at::Tensor h = at::relu(at::addmm(params[1], tx.slice(0, i, e), params[0]));
      const at::Tensor scores = at::addmm(params[3], h, params[2]);
      l = at::cross_entropy_loss(scores, ty.slice(0, i, e));  // mean over the batch, as deft's step(batch) does
      l.backward();
      at::NoGradGuard no_grad;
      for (std::size_t j = 0; j < params.size(); ++j) {  // v = momentum v + g; p -= lr v
        velocity[j].mul_(momentum).add_(params[j].grad());
        params[j].sub_(velocity[j], lr);
        params[j].mutable_grad().zero_();
      }
    }
  });
  *last_loss = l.item<float>();
  return s;
}

}  // namespace torch_peer
}  // namespace bench
#endif
