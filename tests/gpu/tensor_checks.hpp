// Tensors on gpu(i) through the whole library: the engine records their
// work, on_device hands it to Executor<gpu>, buffers come from the device's
// pool, and copies, sync points and errors go through the GPU backend. Two
// runners: test_kernels_host.cpp with the emulated backend (host memory as
// two GPUs, Thrust's C++ backend; CI runs it) and test_kernels_device.cu on
// a real GPU. Results are compared with naive double-precision loops on
// random inputs, or with the CPU's result where the CPU computes the same
// operations (autograd, an SGD step). Random programs: random_checks.hpp.
#pragma once
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <deft/deft.hpp>
#include <deft/nn.hpp>

#include "check_support.hpp"

namespace gpu_tensors {

/// A fused tree with row and column broadcasting, on data copied to the GPU
/// and back: one expression on gpu(0) against a double loop.
inline void fused_expression() {
  const i64 r = 37, c = 53;
  const auto va = random_values(r * c, 1), vb = random_values(c, 2), vc = random_values(r, 3);
  const auto dev = deft::gpu(0);
  const Tensor<float> a = Tensor<float>(va, {r, c}).to(dev), b = Tensor<float>(vb, {c}).to(dev);
  const Tensor<float> col = Tensor<float>(vc, {r, 1}, dev);  // made on the device directly
  BOOST_TEST(a.device() == dev);
  Tensor<float> y = a * b + col * 2.0f - deft::maximum(a, 0.0f);
  BOOST_TEST(y.device() == dev);
  std::vector<double> want(std::size_t(r * c));
  for (i64 i = 0; i < r; ++i)
    for (i64 j = 0; j < c; ++j) {
      const double x = va[i * c + j];
      want[i * c + j] = x * vb[j] + double(vc[i]) * 2 - std::max(x, 0.0);
    }
  expect_near(y.to_vector(), want, 1e-6, "a*b + col*2 - max(a, 0)");
  expect_near(y.to(deft::cpu()).to_vector(), want, 1e-6, "the same, copied to the host by to()");

  // Still rank 3 once collapsed (a broadcast along the middle axis): the
  // element functor for any rank, where ranks 1 and 2 above have their own.
  const i64 p = 4, q = 5, w = 6;
  const auto vx = random_values(p * q * w, 11), vm = random_values(q, 12);
  const Tensor<float> x3 = Tensor<float>(vx, {p, q, w}, dev), m3 = Tensor<float>(vm, {q, 1}, dev);
  std::vector<double> want3(vx.size()), sum3(std::size_t(p * w), 0);
  for (i64 i = 0; i < p; ++i)
    for (i64 j = 0; j < q; ++j)
      for (i64 k = 0; k < w; ++k) {
        const double e = double(vx[(i * q + j) * w + k]) * vm[j];
        want3[(i * q + j) * w + k] = e + 1;
        sum3[i * w + k] += e;
      }
  expect_near(Tensor<float>(x3 * m3 + 1.0f).to_vector(), want3, 1e-6, "x[4,5,6] * m[5,1] + 1");
  expect_near(deft::sum(x3 * m3, 1).to_vector(), sum3, 1e-5, "sum of x[4,5,6] * m[5,1] along axis 1");
}

/// In-place updates and a write through a row view while a pending reader
/// holds the old version (the copy-on-write copies the rest on the device).
inline void updates_and_views() {
  const i64 r = 8, c = 33;
  const auto v = random_values(r * c, 4);
  Tensor<float> y = Tensor<float>(v, {r, c}).to(deft::gpu(0));
  Tensor<float> before = y * 1.0f;  // reads the current version
  y += 1.0f;
  auto mid = y.rows(2, 5);
  mid *= 3.0f;
  std::vector<double> want_y(v.size()), want_before(v.begin(), v.end());
  for (i64 i = 0; i < r; ++i)
    for (i64 j = 0; j < c; ++j) want_y[i * c + j] = (double(v[i * c + j]) + 1) * (i >= 2 && i < 5 ? 3 : 1);
  expect_near(y.to_vector(), want_y, 1e-6, "y after += and a view's *=");
  expect_near(before.to_vector(), want_before, 0, "a reader of the old version");
  expect_near(mid.to_vector(), std::vector<double>(want_y.begin() + 2 * c, want_y.begin() + 5 * c), 1e-6, "the view");
  BOOST_TEST(y.reshape({r * c}).rows(3 * c + 1, 3 * c + 2).item() == float(want_y[3 * c + 1]));  // at an offset
}

/// Sums, means and maxima of all elements and along each axis, and argmax
/// (of all elements, and along long axes).
inline void reductions() {
  const i64 r = 129, c = 301;
  const auto v = random_values<double>(r * c, 5);
  const Tensor<double> x = Tensor<double>(v, {r, c}).to(deft::gpu(0));
  double total = 0, best = -1e300;
  i64 best_at = 0;
  std::vector<double> rows(std::size_t(r), 0), cols(std::size_t(c), 0);
  for (i64 i = 0; i < r; ++i)
    for (i64 j = 0; j < c; ++j) {
      const double e = v[i * c + j];
      total += e, rows[i] += e, cols[j] += e;
      if (e > best) best = e, best_at = i * c + j;
    }
  BOOST_TEST(deft::sum(x).item() == total, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(deft::mean(x).item() == total / double(r * c), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(deft::max(x).item() == best);
  BOOST_TEST(deft::argmax(x).item() == best_at);
  expect_near(deft::sum(x, 1).to_vector(), rows, 1e-12, "sum along axis 1");
  expect_near(deft::sum(x, 0).to_vector(), cols, 1e-12, "sum along axis 0");
  // A long axis with few outputs (a sum over a batch) is cut into runs
  // that a second kernel merges, with scratch memory from the pool.
  const i64 tall = 4000;
  const auto w = random_values<double>(tall * 3, 6);
  const Tensor<double> t = Tensor<double>(w, {tall, 3}).to(deft::gpu(0));
  std::vector<double> per_column(3, 0), column_means(3);
  for (i64 i = 0; i < tall; ++i)
    for (i64 j = 0; j < 3; ++j) per_column[j] += w[i * 3 + j];
  for (i64 j = 0; j < 3; ++j) column_means[j] = per_column[j] / double(tall);
  expect_near(deft::sum(t, 0).to_vector(), per_column, 1e-12, "sum along a long axis 0");
  expect_near(deft::mean(t, 0).to_vector(), column_means, 1e-12, "mean along a long axis 0");
  std::vector<double> per_row(3, 0);  // the same values as 3 rows of 4000: the last axis
  for (i64 i = 0; i < 3 * tall; ++i) per_row[i / tall] += w[i];
  expect_near(deft::sum(t.reshape({3, tall}), 1).to_vector(), per_row, 1e-12, "sum along a long axis 1");
  std::vector<i64> column_best(3, 0), row_best(3, 0);  // the first largest, as the split argmax must keep
  for (i64 i = 0; i < tall; ++i)
    for (i64 j = 0; j < 3; ++j)
      if (w[i * 3 + j] > w[column_best[j] * 3 + j]) column_best[j] = i;
  for (i64 i = 0; i < 3 * tall; ++i)
    if (w[i] > w[i / tall * tall + row_best[i / tall]]) row_best[i / tall] = i % tall;
  i64 whole_best = 0;  // 12000 elements: one pair too few scratch ends exactly at a block's end (ASan)
  for (i64 i = 1; i < 3 * tall; ++i)
    if (w[i] > w[whole_best]) whole_best = i;
  BOOST_TEST(deft::argmax(t).item() == whole_best);
  BOOST_TEST(deft::argmax(t, 0).to_vector() == column_best, boost::test_tools::per_element());
  BOOST_TEST(deft::argmax(t.reshape({3, tall}), 1).to_vector() == row_best, boost::test_tools::per_element());
}

/// Matrix products (cuBLAS on a GPU), the transposed-operand form autograd
/// uses, and a batched product, against a double loop.
inline void products() {
  const i64 m = 45, k = 70, n = 31;
  const auto va = random_values(m * k, 6), vb = random_values(k * n, 7);
  const auto dev = deft::gpu(0);
  const Tensor<float> a = Tensor<float>(va, {m, k}).to(dev), b = Tensor<float>(vb, {k, n}).to(dev);
  std::vector<double> want(std::size_t(m * n), 0);
  double scale = 0;
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < n; ++j)
      for (i64 p = 0; p < k; ++p) {
        want[i * n + j] += double(va[i * k + p]) * vb[p * n + j];
        scale = std::max(scale, std::abs(double(va[i * k + p]) * vb[p * n + j]));
      }
  expect_near(deft::dot(a, b).to_vector(), want, 1e-5 * k * scale, "dot(a, b)");
  // Axis permutations on the device: (aᵀ)ᵀ · b.
  const Tensor<float> at = deft::transpose(a, {1, 0});
  expect_near(deft::dot(deft::transpose(at, {1, 0}), b).to_vector(), want, 1e-5 * k * scale, "dot((aᵀ)ᵀ, b)");
  const std::vector<std::int32_t> ia{1, -2, 3, 4, 5, -6}, ib{7, 8, -9, 10, 11, 12};
  const Tensor<std::int32_t> ta(ia, {2, 3}, dev), tb(ib, {3, 2}, dev);
  const auto ic = deft::dot(ta, tb).to_vector();
  for (i64 i = 0; i < 2; ++i)
    for (i64 j = 0; j < 2; ++j) {
      std::int32_t w = 0;
      for (i64 p = 0; p < 3; ++p) w += ia[i * 3 + p] * ib[p * 2 + j];
      BOOST_TEST(ic[i * 2 + j] == w);
    }
}

/// Creation and random numbers on the device: the same seed draws the same
/// numbers as on the CPU (bit for bit in the emulation, which runs the host's
/// code; within a few units in the last place on a GPU).
inline void creation_and_random(bool exact) {
  const auto dev = deft::gpu(0);
  const auto r = deft::arange<float>(-3, 5, 0.5f, dev).to_vector();
  BOOST_REQUIRE_EQUAL(r.size(), 16u);
  for (std::size_t i = 0; i < r.size(); ++i) BOOST_TEST(r[i] == -3.0f + 0.5f * float(i));
  for (float x : deft::full<float>({3, 4}, 2.5f, dev).to_vector()) BOOST_TEST(x == 2.5f);
  deft::random::seed(99);
  const auto on_gpu = deft::random::normal<float>(1, 3, {1001}, dev).to_vector();
  deft::random::seed(99);
  const auto on_cpu = deft::random::normal<float>(1, 3, {1001}).to_vector();
  for (std::size_t i = 0; i < on_cpu.size(); ++i) {
    if (exact) BOOST_TEST(on_gpu[i] == on_cpu[i]);
    else BOOST_TEST(on_gpu[i] == on_cpu[i], boost::test_tools::tolerance(1e-5f));
  }
}

/// Copies between the host and two devices keep the values and are
/// independent of later writes to their source; wait_all covers GPU work.
inline void copies_between_devices() {
  BOOST_REQUIRE_GE(deft::num_gpus(), 1);
  // A second GPU where there is one (the emulation has two); on one GPU, a
  // clone of the rows on gpu(0) (to() its own device shares the buffer).
  const bool two = deft::num_gpus() > 1;
  const deft::Device other = deft::gpu(two ? 1 : 0);
  const auto v = random_values(1000, 8);
  Tensor<float> host(v, {10, 100});
  Tensor<float> g0 = host.to(deft::gpu(0));
  Tensor<float> g1 = two ? g0.rows(3, 7).to(other) : g0.rows(3, 7).clone();
  BOOST_TEST(g1.device() == other);
  g0 += 1.0f;  // after the copy was recorded: g1 keeps the old rows
  deft::wait_all();
  BOOST_TEST(g1.is_ready());
  expect_near(g1.to_vector(), std::vector<double>(v.begin() + 300, v.begin() + 700), 0, "rows 3..7 copied to the other GPU");
  std::vector<double> plus(v.begin(), v.end());
  for (auto& x : plus) x += 1;
  expect_near(g0.to(deft::cpu()).to_vector(), plus, 1e-6, "gpu(0) after +=");
  std::vector<double> twice(v.begin() + 300, v.begin() + 700);
  for (auto& x : twice) x *= 2;
  expect_near(Tensor<float>(g1.to(deft::gpu(0)) * 2.0f).to_vector(), twice, 1e-6, "back on gpu(0), doubled");
}

/// Copies to a GPU are staged through pinned blocks in chunks (4 MiB on CUDA,
/// 16 KiB in the emulation) and copies back land in page-locked host tensors:
/// a tensor of several chunks and an odd tail makes the round trip intact.
inline void pinned_round_trip() {
  const i64 n = (i64(1) << 21) + 12345;  // 8.4 MB of float: three CUDA chunks
  const auto v = random_values(n, 31);
  Tensor<float> host(v, {n});
  BOOST_TEST(!host.is_pinned());
  Tensor<float> g = host.to(deft::gpu(0));
  host += 1.0f;  // recorded after the copy: the copy reads the old values
  const Tensor<float> direct(v, {n}, deft::gpu(0));  // staged by the constructor itself
  Tensor<float> back = Tensor<float>(g + direct).to(deft::cpu());
  BOOST_TEST(back.is_pinned());
  // Between the CPU's logical devices a copy is a memcpy: no pinned memory for it.
  BOOST_TEST(!back.to(deft::cpu(1)).is_pinned());
  std::vector<double> twice(v.begin(), v.end());
  for (auto& x : twice) x *= 2;
  expect_near(back.to_vector(), twice, 0, "gpu(0) and back, through pinned memory");
  // A pinned host tensor is an ordinary CPU tensor: CPU work reads and writes it.
  back *= 0.5f;
  expect_near(back.to_vector(), std::vector<double>(v.begin(), v.end()), 0, "the pinned tensor halved on the CPU");
  std::vector<double> plus(v.begin(), v.end());
  for (auto& x : plus) x += 1;
  expect_near(host.to_vector(), plus, 1e-6, "the source after +=");
}

/// Bad input raises at the call that makes the work, naming what was wrong.
inline void errors() {
  const Tensor<float> host = deft::ones<float>({2, 3});
  const Tensor<float> dev = deft::ones<float>({2, 3}, deft::gpu(0));
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no std::invalid_argument");
  };
  const std::string mixed = message([&] { Tensor<float> z = host + dev; });
  BOOST_TEST(mixed.find("cpu(0)") != std::string::npos);
  BOOST_TEST(mixed.find("gpu(0)") != std::string::npos);
  const std::string missing = message([] { (void)deft::zeros<float>({4}, deft::gpu(7)); });
  BOOST_TEST(missing.find("no device gpu(7)") != std::string::npos, missing);
  const std::string conv = message([&] {
    (void)deft::conv2d(deft::ones<float>({1, 1, 4, 4}, deft::gpu(0)), deft::ones<float>({1, 1, 3, 3}));
  });
  BOOST_TEST(conv.find("gpu(0)") != std::string::npos, conv);
  BOOST_TEST(conv.find("cpu(0)") != std::string::npos, conv);
}

/// conv2d (bias, stride, padding), overlapping max pooling and average
/// pooling on gpu(0), and their gradients, equal the CPU's (which the conv
/// suites check against double loops). The last case spans two of the GPU's
/// im2col blocks (its partial sums of dW and db); its dW sums 670,000
/// float products, in another order on each device (the emulation's
/// product adds them one by one), hence its wider tolerance.
inline void convolution_and_pooling() {
  struct Case {
    Shape x, w;
    deft::Size2d stride, padding;
    double tol;
  };
  const i64 per_block = deft::thresholds::gpu_conv_block_elements / (25 * 28 * 28);
  const Case cases[] = {{{3, 2, 9, 8}, {4, 2, 3, 2}, {2, 1}, {1, 2}, 1e-5},
                        {{2, 3, 7, 7}, {5, 3, 7, 7}, {1, 1}, {3, 3}, 1e-5},
                        {{per_block + 2, 1, 28, 28}, {2, 1, 5, 5}, {1, 1}, {2, 2}, 1e-3}};
  for (const auto& k : cases) {
    auto run = [&](deft::Device dev) {
      Tensor<float> x = Tensor<float>(random_values(k.x.size(), 21), k.x).to(dev);
      Tensor<float> w = Tensor<float>(random_values(k.w.size(), 22), k.w).to(dev);
      Tensor<float> b = Tensor<float>(random_values(k.w[0], 23), {k.w[0]}).to(dev);
      x.attach_grad();
      w.attach_grad();
      b.attach_grad();
      Tensor<float> y, m, a, loss;
      {
        deft::autograd::record recording;
        y = deft::conv2d(x, w, b, k.stride, k.padding);
        m = deft::max_pool2d(y, {2, 2}, {1, 1});  // an element may be the maximum of several windows
        a = deft::avg_pool2d(y, {2, 1}, {1, 1});
        const Tensor<float> cm = Tensor<float>(random_values(m.shape().size(), 24), m.shape()).to(dev);
        const Tensor<float> ca = Tensor<float>(random_values(a.shape().size(), 25), a.shape()).to(dev);
        loss = deft::sum(m * cm) + deft::sum(a * ca);
      }
      loss.backward();
      std::vector<float> all;
      for (const Tensor<float>* t : {&y, &m, &a, &loss}) {
        const auto v = t->to_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
      for (const Tensor<float>& g : {x.grad(), w.grad(), b.grad()}) {
        const auto v = g.to_vector();
        all.insert(all.end(), v.begin(), v.end());
      }
      return all;
    };
    const auto on_cpu = run(deft::cpu());
    const auto on_gpu = run(deft::gpu(0));
    expect_near(on_gpu, std::vector<double>(on_cpu.begin(), on_cpu.end()), k.tol,
                ("conv2d, pooling and their gradients, x " + k.x.to_string()).c_str());
  }
}

/// Gradients of a small network computed on the GPU equal the CPU's, and
/// one SGD step on each device gives the same weights.
inline void autograd_and_sgd() {
  auto step_on = [](deft::Device dev) {
    deft::random::seed(3);
    deft::nn::Sequential net;
    net.add(std::make_shared<deft::nn::Dense>(16, deft::nn::Act::relu), std::make_shared<deft::nn::Dense>(3));
    net.initialize(deft::nn::init::xavier(), {dev});
    const auto vx = random_values(8 * 5, 9);
    std::vector<std::int64_t> labels{0, 1, 2, 1, 0, 2, 2, 1};
    const Tensor<float> x = Tensor<float>(vx, {8, 5}).to(dev);
    const Tensor<std::int64_t> y = Tensor<std::int64_t>(labels, {8}).to(dev);
    deft::nn::SoftmaxCrossEntropyLoss loss_fn;
    deft::nn::Trainer trainer(net.collect_params(), deft::nn::SGD{0.1f});
    Tensor<float> loss;
    {
      deft::autograd::record recording;
      loss = loss_fn(net(x), y);
    }
    loss.backward();
    trainer.step(8);
    std::vector<float> weights;
    for (auto* p : net.collect_params()) {
      const auto w = p->data(dev).to_vector();
      weights.insert(weights.end(), w.begin(), w.end());
    }
    weights.push_back(deft::sum(loss).item());
    return weights;
  };
  const auto on_cpu = step_on(deft::cpu());
  const auto on_gpu = step_on(deft::gpu(0));
  expect_near(on_gpu, std::vector<double>(on_cpu.begin(), on_cpu.end()), 1e-5, "weights after one SGD step, and the loss");
}

/// slice (a copy and a view), concat, stack, softmax, one_hot and clip on
/// gpu(0), values and gradients, against the same program on the CPU
/// (tests/autograd/test_indexing.cpp checks the CPU against double loops).
inline void slicing_and_joining() {
  auto run_on = [](deft::Device dev) {
    const auto vx = random_values(3 * 4 * 5, 14), vy = random_values(3 * 2 * 5, 15);
    Tensor<float> x = Tensor<float>(vx, {3, 4, 5}).to(dev), y = Tensor<float>(vy, {3, 2, 5}).to(dev);
    x.attach_grad();
    y.attach_grad();
    std::vector<float> out;
    auto put = [&](const Tensor<float>& t) {
      const auto v = t.to(deft::cpu()).to_vector();
      out.insert(out.end(), v.begin(), v.end());
    };
    {
      deft::autograd::record r;
      const Tensor<float> j = deft::concat({x, y}, 1), s = deft::slice(j, 1, 2, 5), v = deft::slice(j, 0, 1, 2);
      const Tensor<float> st = deft::stack({s, deft::slice(x, 1, 0, 3)}, 2);
      const Tensor<float> loss = deft::sum(deft::softmax(st, 1) * deft::clip(st, -1.0f, 1.0f)) + deft::sum(deft::log_softmax(v, 2) * v);
      loss.backward();
      put(j), put(s), put(v), put(st), put(loss);
    }
    put(x.grad()), put(y.grad());
    const std::vector<std::int64_t> idx{2, 0, 1, 2};
    put(deft::one_hot(Tensor<std::int64_t>(idx, {4}).to(dev), 3));
    return out;
  };
  const auto on_cpu = run_on(deft::cpu());
  expect_near(run_on(deft::gpu(0)), std::vector<double>(on_cpu.begin(), on_cpu.end()), 1e-5,
              "slices, joins, softmax, clip and one_hot with their gradients");
}

/// A forward through Dense layers (weight in x units, bias), relu between
/// them, in double precision from the parameters' current values.
inline std::vector<double> dense_forward_reference(deft::nn::Block& net, const std::vector<float>& x, i64 rows) {
  std::vector<double> h(x.begin(), x.end());
  const auto params = net.collect_params();
  for (std::size_t l = 0; l < params.size(); l += 2) {
    const auto w = params[l]->data().to_vector(), b = params[l + 1]->data().to_vector();
    const i64 units = i64(b.size()), in = i64(w.size()) / units;
    std::vector<double> next(std::size_t(rows * units));
    for (i64 r = 0; r < rows; ++r)
      for (i64 u = 0; u < units; ++u) {
        double acc = b[std::size_t(u)];
        for (i64 k = 0; k < in; ++k) acc += h[std::size_t(r * in + k)] * w[std::size_t(k * units + u)];
        next[std::size_t(r * units + u)] = l + 2 < params.size() ? std::max(acc, 0.0) : acc;
      }
    h = std::move(next);
  }
  return h;
}

/// A hybridized network on gpu(0) computes its forward at every replay, its
/// replays run as one CUDA graph or kernel by kernel; new parameter values
/// trace (and record) it again. Checked against a double loop.
inline void hybridized_forward() {
  for (const bool graph : {true, false}) {
    deft::random::seed(5);
    auto net = std::make_shared<deft::nn::Sequential>();
    net->add(std::make_shared<deft::nn::Dense>(32, deft::nn::Act::relu),
             std::make_shared<deft::nn::Dense>(16, deft::nn::Act::relu), std::make_shared<deft::nn::Dense>(4));
    net->initialize(deft::nn::init::xavier(), {deft::gpu(0)});
    const i64 rows = 8;
    std::vector<std::vector<float>> inputs;
    for (unsigned k = 0; k < 3; ++k) inputs.push_back(random_values(rows * 10, 60 + k));
    (void)(*net)(Tensor<float>(inputs[0], {rows, 10}).to(deft::gpu(0))).to_vector();  // parameters drawn
    net->hybridize(true, {.cuda_graph = graph});
    for (int round = 0; round < 2; ++round) {
      for (int call = 0; call < 4; ++call) {
        const auto& x = inputs[std::size_t(call) % inputs.size()];
        const Tensor<float> out = (*net)(Tensor<float>(x, {rows, 10}).to(deft::gpu(0)));
        BOOST_TEST(out.device() == deft::gpu(0));
        expect_near(out.to_vector(), dense_forward_reference(*net, x, rows), 1e-5,
                    graph ? "hybridized forward, one graph" : "hybridized forward, kernel by kernel");
      }
      for (auto* p : net->collect_params()) p->data(deft::gpu(0)) = p->data(deft::gpu(0)) * 0.75f + 0.01f;
    }
    BOOST_TEST(net->traces() == 2);
    BOOST_TEST(net->cuda_graphs() == (graph ? 1 : 0));  // on a real GPU: the capture worked
  }
}

/// TrainStep (the whole training step traced and replayed) on one GPU, on
/// both, and on the host and a GPU together, against the step written out
/// on a twin network with the same parameters: SGD with momentum, and Adam
/// with the gradients clipped. Three epochs of three batches, the last one
/// shorter (a second trace). The losses, the scores and the parameters
/// agree within 1e-5, every device holds the same parameters, and on one
/// GPU each trace replays as one program (a CUDA graph).
inline void train_step_on_gpus() {
  namespace nn = deft::nn;
  struct Case {
    std::vector<deft::Device> devices;
    bool adam;
    float clip;
  };
  const std::vector<Case> cases = {{{deft::gpu(0)}, false, 0.0f},
                                   {{deft::gpu(0)}, true, 0.5f},
                                   {{deft::gpu(0), deft::gpu(1)}, false, 0.0f},
                                   {{deft::cpu(), deft::gpu(0)}, false, 0.0f},
                                   {{deft::cpu(), deft::gpu(0)}, true, 0.5f}};
  const std::vector<i64> rows = {12, 12, 6};
  for (const Case& k : cases) {
    // A real machine may have one GPU; the emulation always has two.
    const auto missing = [](deft::Device d) { return d.type == deft::DeviceType::gpu && d.index >= deft::num_gpus(); };
    if (std::ranges::any_of(k.devices, missing)) {
      BOOST_TEST_MESSAGE("skipped on " << deft::detail::device_list(k.devices) << ": this machine has "
                                       << deft::num_gpus() << " GPU(s)");
      continue;
    }
    BOOST_TEST_CONTEXT("on " << deft::detail::device_list(k.devices) << (k.adam ? ", Adam" : ", SGD")
                             << (k.clip > 0 ? ", clipped" : "")) {
      deft::random::seed(71);
      std::vector<std::vector<Tensor<float>>> xs;
      std::vector<std::vector<Tensor<std::int64_t>>> ys;
      std::mt19937 draw(72);
      for (const i64 r : rows) {
        std::vector<std::int64_t> labels(static_cast<std::size_t>(r));
        for (auto& l : labels) l = std::int64_t(draw() % 5);
        xs.push_back(deft::split_and_load(Tensor<float>(random_values(r * 8, unsigned(draw())), {r, 8}), k.devices));
        ys.push_back(deft::split_and_load(Tensor<std::int64_t>(labels, {r}), k.devices));
      }
      const auto make = [&] {
        auto net = std::make_shared<nn::Sequential>();
        net->add(std::make_shared<nn::Dense>(16, nn::Act::relu), std::make_shared<nn::Dense>(5));
        net->initialize(nn::init::normal(0.3f), k.devices);
        (void)(*net)(xs[0][0]).to_vector();  // deferred initialization
        return net;
      };
      auto hybrid = make(), plain = make();
      const auto a = hybrid->collect_params(), b = plain->collect_params();
      for (std::size_t i = 0; i < a.size(); ++i) b[i]->set_data(a[i]->data().clone());
      using Optimizer = std::variant<nn::SGD, nn::Adam>;
      const Optimizer opt = k.adam ? Optimizer(nn::Adam{.learning_rate = 0.01f})
                                   : Optimizer(nn::SGD{.learning_rate = 0.1f, .momentum = 0.9f});
      nn::Trainer hybrid_trainer(a, opt), plain_trainer(b, opt);
      const nn::SoftmaxCrossEntropyLoss loss;
      nn::TrainStep step(*hybrid, loss, hybrid_trainer);
      step.set_max_grad_norm(k.clip);
      // Each GPU parameter's mark (what its wait_to_read waits for), kept
      // alive so that a new one cannot take its address.
      std::vector<std::shared_ptr<void>> marks;
      for (int epoch = 0; epoch < 3; ++epoch)
        for (std::size_t s = 0; s < rows.size(); ++s) {
          const auto got = step(xs[s], ys[s]);
          // A replay (as one CUDA graph too) writes every parameter: each
          // gets this run's mark, not the one an earlier run left.
          std::vector<std::shared_ptr<void>> now;
          for (const deft::Device d : k.devices)
            if (d.type == deft::DeviceType::gpu)
              for (auto* p : a) {
                p->data(d).wait_to_read();
                now.push_back(p->data(d).leaf().buffer->ready_mark);
              }
          for (std::size_t i = 0; i < marks.size(); ++i)
            BOOST_TEST((now[i] && now[i] != marks[i]), "epoch " << epoch << " batch " << s << ": parameter " << i
                                                                << " kept an earlier run's mark");
          marks = std::move(now);
          std::vector<std::pair<Tensor<float>, Tensor<float>>> want(k.devices.size());
          {
            deft::autograd::record recording;
            for (std::size_t d = 0; d < k.devices.size(); ++d) {
              const Tensor<float> scores = (*plain)(xs[s][d]);
              const Tensor<float> l = loss(scores, ys[s][d]);
              l.backward();
              want[d] = {l.detach(), scores.detach()};
            }
          }
          if (k.clip > 0) {
            plain_trainer.allreduce_grads();
            (void)nn::clip_global_norm(b, k.clip);
            plain_trainer.update(rows[s]);
          } else {
            plain_trainer.step(rows[s]);
          }
          for (std::size_t d = 0; d < k.devices.size(); ++d) {
            BOOST_TEST(got[d].loss.device() == k.devices[d]);
            const auto host = [](const Tensor<float>& t) {
              const auto v = t.to(deft::cpu()).to_vector();
              return std::vector<double>(v.begin(), v.end());
            };
            expect_near(got[d].loss.to(deft::cpu()).to_vector(), host(want[d].first), 1e-5, "a part's loss");
            expect_near(got[d].scores.to(deft::cpu()).to_vector(), host(want[d].second), 1e-5, "a part's scores");
          }
        }
      BOOST_TEST(step.traces() == 2);
      BOOST_TEST(step.replays() == 6);
      BOOST_TEST(step.cuda_graphs() == (k.devices.size() == 1 ? 2 : 0));
      for (std::size_t i = 0; i < a.size(); ++i) {
        const auto want = b[i]->data(k.devices[0]).to(deft::cpu()).to_vector();
        for (const deft::Device d : k.devices) {
          BOOST_TEST(a[i]->data(d).to(deft::cpu()).to_vector() == a[i]->data(k.devices[0]).to(deft::cpu()).to_vector(),
                     boost::test_tools::per_element());
          expect_near(a[i]->data(d).to(deft::cpu()).to_vector(), std::vector<double>(want.begin(), want.end()), 1e-5,
                      "a parameter after training");
        }
      }
    }
  }
}

}  // namespace gpu_tensors

/// Registers the checks above; `exact`: the backend runs the host's code.
#define DEFT_GPU_TENSOR_CASES(exact)                                                             \
  BOOST_AUTO_TEST_CASE(fused_expression_on_gpu) { gpu_tensors::fused_expression(); }            \
  BOOST_AUTO_TEST_CASE(updates_and_views_on_gpu) { gpu_tensors::updates_and_views(); }          \
  BOOST_AUTO_TEST_CASE(slicing_and_joining_on_gpu) { gpu_tensors::slicing_and_joining(); }      \
  BOOST_AUTO_TEST_CASE(reductions_on_gpu) { gpu_tensors::reductions(); }                        \
  BOOST_AUTO_TEST_CASE(products_on_gpu) { gpu_tensors::products(); }                            \
  BOOST_AUTO_TEST_CASE(creation_and_random_on_gpu) { gpu_tensors::creation_and_random(exact); } \
  BOOST_AUTO_TEST_CASE(copies_between_devices) { gpu_tensors::copies_between_devices(); }       \
  BOOST_AUTO_TEST_CASE(pinned_round_trip) { gpu_tensors::pinned_round_trip(); }                 \
  BOOST_AUTO_TEST_CASE(errors_name_the_devices) { gpu_tensors::errors(); }                      \
  BOOST_AUTO_TEST_CASE(convolution_and_pooling_on_gpu) { gpu_tensors::convolution_and_pooling(); } \
  BOOST_AUTO_TEST_CASE(autograd_and_sgd_on_gpu) { gpu_tensors::autograd_and_sgd(); }             \
  BOOST_AUTO_TEST_CASE(hybridized_forward_on_gpu) { gpu_tensors::hybridized_forward(); }        \
  BOOST_AUTO_TEST_CASE(train_step_on_gpus) { gpu_tensors::train_step_on_gpus(); }     
