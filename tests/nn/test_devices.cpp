// Several devices, on the CPU's logical devices cpu(0), cpu(1), cpu(2): copies
// between them, split_and_load, allreduce, and data-parallel training, which
// must train as one device would on the whole batch.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <deft/nn.hpp>

#include "nn_support.hpp"

using namespace deft;
using nn_test::mentions;

namespace {

const std::vector<Device> two = {cpu(0), cpu(1)};

std::shared_ptr<nn::Sequential> small_net() {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Dense>(16, nn::Act::relu), std::make_shared<nn::Dense>(3));
  return net;
}

// Trains `one` on the whole batch and `many` on its parts (xs, ys on
// `two`) side by side: `steps` SGD-with-momentum steps of batch size 10.
void train_side_by_side(nn::Block& one, nn::Block& many, const Tensor<float>& x, const Tensor<std::int64_t>& y,
                        const std::vector<Tensor<float>>& xs, const std::vector<Tensor<std::int64_t>>& ys, int steps) {
  const nn::SoftmaxCrossEntropyLoss loss;
  nn::Trainer t_one(one.collect_params(), nn::SGD{.learning_rate = 0.1f, .momentum = 0.9f});
  nn::Trainer t_many(many.collect_params(), nn::SGD{.learning_rate = 0.1f, .momentum = 0.9f});
  for (int step = 0; step < steps; ++step) {
    {
      autograd::record rec;
      loss(one(x), y).backward();
    }
    t_one.step(10);
    {
      autograd::record rec;
      for (std::size_t d = 0; d < xs.size(); ++d) loss(many(xs[d]), ys[d]).backward();
    }
    t_many.step(10);
  }
}

// many's copies on cpu(0) and cpu(1) hold the same bits, within 1e-5 of one's.
void expect_trained_alike(nn::Block& one, nn::Block& many) {
  const auto p_one = one.collect_params(), p_many = many.collect_params();
  BOOST_TEST_REQUIRE(p_one.size() == p_many.size());
  for (std::size_t i = 0; i < p_one.size(); ++i) {
    const auto ref = p_one[i]->data().to_vector();
    const auto on0 = p_many[i]->data(cpu(0)).to_vector(), on1 = p_many[i]->data(cpu(1)).to_vector();
    BOOST_TEST(on0 == on1, boost::test_tools::per_element());  // the copies stay equal, bit for bit
    for (std::size_t k = 0; k < ref.size(); ++k) BOOST_TEST(std::abs(on0[k] - ref[k]) <= 1e-5);
  }
}

// `parts` hold `batch`'s rows in order: sizes[p] rows on devices[p].
void expect_rows_in_order(const std::vector<Tensor<float>>& parts, const Tensor<float>& batch,
                          const std::vector<Device>& devices, const std::vector<std::int64_t>& sizes) {
  BOOST_TEST_REQUIRE(parts.size() == devices.size());
  const auto v = batch.to_vector();
  const std::int64_t columns = batch.shape()[1];
  std::size_t at = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    BOOST_TEST(parts[p].device() == devices[p]);
    BOOST_TEST(parts[p].shape() == (Shape{sizes[p], columns}));
    for (float x : parts[p].to_vector()) BOOST_TEST(x == v[at++]);
  }
  BOOST_TEST(at == v.size());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(devices)

BOOST_AUTO_TEST_CASE(to_copies_after_the_producer_and_the_copy_is_independent) {
  random::seed(11);
  Tensor<float> a = random::normal<float>(0, 1, {4, 5});
  const auto av = a.to_vector();
  const Tensor<float> b = Tensor<float>(a * 2.0f + 1.0f).to(cpu(1));
  const Tensor<float> rows = a.rows(1, 3).to(cpu(2));  // a view copies just its rows
  a += 5.0f;                                           // after the copies were recorded
  BOOST_TEST(b.device() == cpu(1));
  BOOST_TEST(rows.device() == cpu(2));
  const auto bv = b.to_vector(), rv = rows.to_vector(), a2 = a.to_vector();
  for (std::size_t i = 0; i < av.size(); ++i) {
    BOOST_TEST(std::abs(bv[i] - (2.0 * av[i] + 1.0)) <= 1e-6);
    BOOST_TEST(std::abs(a2[i] - (av[i] + 5.0)) <= 1e-6);
  }
  BOOST_TEST_REQUIRE(rv.size() == 10u);
  for (std::size_t i = 0; i < rv.size(); ++i) BOOST_TEST(rv[i] == av[5 + i]);
  // Already there: the same storage, no copy.
  Tensor<float> same = a.to(cpu(0));
  same.assign(Tensor<float>(zeros<float>({4, 5})));
  BOOST_TEST(a.to_vector() == std::vector<float>(20, 0.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(mixing_devices_is_refused_naming_both) {
  const Tensor<float> a = ones<float>({2, 3}), b = ones<float>({2, 3}, cpu(1));
  BOOST_CHECK_EXCEPTION((void)Tensor<float>(a + b), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "cpu(0)") && mentions(e, "cpu(1)"); });
  BOOST_CHECK_EXCEPTION((void)dot(a, ones<float>({3, 2}, cpu(1))), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "cpu(0)") && mentions(e, "cpu(1)"); });
  Tensor<float> c = ones<float>({2, 3});
  BOOST_CHECK_EXCEPTION(c.assign(b), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "cpu(1)") && mentions(e, "cpu(0)"); });
  // A GPU needs the CUDA backend (deft::cuda), which this test does not link.
  BOOST_CHECK_EXCEPTION((void)a.to(gpu(0)), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "gpu(0)") && mentions(e, "CUDA"); });
  BOOST_TEST(a.to_vector() == std::vector<float>(6, 1.0f), boost::test_tools::per_element());  // nothing was lost
}

BOOST_AUTO_TEST_CASE(gradients_flow_back_across_a_copy) {
  random::seed(12);
  Tensor<float> x = random::normal<float>(0, 1, {3, 4});
  x.attach_grad();
  {
    autograd::record rec;
    const Tensor<float> y = x.to(cpu(1));
    const Tensor<float> loss = sum(y * y * 3.0f);
    BOOST_TEST(loss.device() == cpu(1));
    loss.backward();
  }
  BOOST_TEST(x.grad().device() == cpu(0));
  const auto xv = x.to_vector(), g = x.grad().to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) BOOST_TEST(std::abs(g[i] - 6.0 * xv[i]) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(split_and_load_gives_one_balanced_part_per_device) {
  random::seed(13);
  const Tensor<float> batch = random::normal<float>(0, 1, {7, 3});
  const std::vector<Device> three = {cpu(0), cpu(1), cpu(2)};
  expect_rows_in_order(split_and_load(batch, three), batch, three, {3, 2, 2});
  BOOST_CHECK_EXCEPTION(split_and_load(batch, three, true), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "7 rows") && mentions(e, "even_split"); });
  BOOST_CHECK_EXCEPTION(split_and_load(batch.rows(0, 2), three), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "2 rows") && mentions(e, "cpu(2)"); });
  BOOST_CHECK_EXCEPTION(split_and_load(batch, {}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "no devices"); });
  BOOST_CHECK_EXCEPTION(split_and_load(sum(batch), three), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "scalar"); });
}

// Devices of different speeds get rows in proportion to their shares, in
// whole rows, at least one each; the rows keep their order.
BOOST_AUTO_TEST_CASE(split_and_load_shares_rows_in_proportion) {
  random::seed(14);
  const Tensor<float> batch = random::normal<float>(0, 1, {10, 3});
  const std::vector<Device> three = {cpu(0), cpu(1), cpu(2)};
  // quotas 2, 5, 3
  expect_rows_in_order(split_and_load(batch, three, std::vector<double>{1, 2.5, 1.5}), batch, three, {2, 5, 3});
  const auto rows_of = [](const std::vector<Tensor<float>>& ps) {
    std::vector<std::int64_t> r;
    for (const auto& p : ps) r.push_back(p.shape()[0]);
    return r;
  };
  // Equal shares split as the default does; a tiny share still gets a row.
  BOOST_TEST(rows_of(split_and_load(batch.rows(0, 7), three, std::vector<double>{2, 2, 2})) ==
             rows_of(split_and_load(batch.rows(0, 7), three)), boost::test_tools::per_element());
  BOOST_TEST(rows_of(split_and_load(batch.rows(0, 5), two, std::vector<double>{0.001, 1})) ==
             (std::vector<std::int64_t>{1, 4}), boost::test_tools::per_element());

  // Against the quotas, on random shares: whole rows that add up, at least
  // one each, and within one row of each quota when every quota is a row or more.
  std::mt19937 rng(5);
  for (int c = 0; c < 300; ++c) {
    const std::size_t n = 1 + rng() % 5;
    const std::int64_t rows = std::int64_t(n + rng() % 300);
    std::vector<double> shares(n);
    for (double& s : shares) s = 0.05 + double(rng() % 1000) / 100.0;
    const auto counts = detail::split_rows(rows, shares);
    double total = 0;
    for (double s : shares) total += s;
    std::int64_t sum = 0;
    bool all_quotas_a_row = true;
    for (double s : shares) all_quotas_a_row = all_quotas_a_row && double(rows) * s / total >= 1;
    for (std::size_t i = 0; i < n; ++i) {
      BOOST_TEST(counts[i] >= 1);
      if (all_quotas_a_row) BOOST_TEST(std::abs(double(counts[i]) - double(rows) * shares[i] / total) < 1.0);
      sum += counts[i];
    }
    BOOST_TEST(sum == rows);
  }

  // Huge finite shares split as their ratios do (their sum would overflow).
  BOOST_TEST(detail::split_rows(4, {1.7e308, 1.7e308}) == (std::vector<std::int64_t>{2, 2}), boost::test_tools::per_element());
  BOOST_TEST(detail::split_rows(4, {1e308, 1e307}) == (std::vector<std::int64_t>{3, 1}), boost::test_tools::per_element());
  BOOST_TEST(detail::split_rows(4, {1e-300, 3e-300}) == (std::vector<std::int64_t>{1, 3}), boost::test_tools::per_element());
  // Ordinary shares keep their exact quotas: 1.5 and 13.5 tie, and the tie
  // goes to the earlier part (a share taken relative to the largest would
  // round 1.5 down to 1.4999999999999998).
  BOOST_TEST(detail::split_rows(15, {1, 9}) == (std::vector<std::int64_t>{2, 13}), boost::test_tools::per_element());

  BOOST_CHECK_EXCEPTION(split_and_load(batch, three, std::vector<double>{1, 2}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "2 shares for 3 devices"); });
  BOOST_CHECK_EXCEPTION(split_and_load(batch, three, std::vector<double>{1, 0, 2}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "share of cpu(1) is 0"); });
  BOOST_CHECK_EXCEPTION(split_and_load(batch, two, std::vector<double>{-1, 2}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "share of cpu(0) is -1"); });
  BOOST_CHECK_EXCEPTION(split_and_load(batch, two, std::vector<double>{1, std::nan("")}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "share of cpu(1)"); });
  BOOST_CHECK_EXCEPTION(split_and_load(batch.rows(0, 2), three, std::vector<double>{1, 1, 1}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "2 rows"); });
}

// measure_shares runs each device's step alone, a warm-up and then the
// timed repeats, each waited for before the next; it returns steps per
// second (not checked against a clock: speed is the benchmarks' business).
BOOST_AUTO_TEST_CASE(measure_shares_times_each_device_alone) {
  const std::vector<Device> three = {cpu(0), cpu(1), cpu(2)};
  std::vector<Device> calls;
  Tensor<float> last;
  bool waited = true;
  const auto shares = measure_shares(three, [&](Device d) {
    if (last) waited = waited && last.is_ready();  // the previous step's work ran before this call
    calls.push_back(d);
    const Tensor<float> x = random::normal<float>(0, 1, {64, 64}, d);
    last = dot(x, x) + 1.0f;
    BOOST_TEST(!last.is_ready());  // deferred until measure_shares waits
  });
  BOOST_TEST(waited);
  BOOST_TEST(last.is_ready());
  const std::vector<Device> want = {cpu(0), cpu(0), cpu(0), cpu(0), cpu(1), cpu(1),
                                    cpu(1), cpu(1), cpu(2), cpu(2), cpu(2), cpu(2)};
  BOOST_TEST(calls == want, boost::test_tools::per_element());
  BOOST_TEST_REQUIRE(shares.size() == 3u);
  for (double s : shares) BOOST_TEST((s > 0 && std::isfinite(s)));
  // The shares split a batch directly.
  BOOST_TEST(split_and_load(random::normal<float>(0, 1, {9, 2}), three, shares).size() == 3u);

  int once = 0;
  (void)measure_shares(two, [&](Device) { ++once; }, 1);
  BOOST_TEST(once == 4);
  BOOST_CHECK_EXCEPTION(measure_shares({}, [](Device) {}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "no devices"); });
  BOOST_CHECK_EXCEPTION(measure_shares(two, [](Device) {}, 0), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "repeats must be at least 1, got 0"); });
  BOOST_CHECK_THROW(measure_shares(two, [](Device) { throw std::runtime_error("step failed"); }), std::runtime_error);

  // Work recorded before the call and not yet run is not the steps': its
  // failure is not measure_shares', and the caller's next wait_all() still
  // reports it (once), also after a step failed.
  for (const bool step_fails : {false, true}) {
    BOOST_TEST_CONTEXT("a step fails: " << step_fails) {
      const Tensor<float> failed = nn::SoftmaxCrossEntropyLoss()(random::normal<float>(0, 1, {2, 3}),
                                                                 Tensor<std::int64_t>(std::vector<std::int64_t>{7, 0}, {2}));
      BOOST_TEST(!failed.is_ready());
      auto step = [&](Device d) {
        if (step_fails) throw std::runtime_error("step failed");
        const Tensor<float> y = ones<float>({4}, d) * 2.0f;
        (void)y;
      };
      if (step_fails) BOOST_CHECK_THROW(measure_shares(two, step, 1), std::runtime_error);
      else BOOST_CHECK_NO_THROW(measure_shares(two, step, 1));
      BOOST_TEST(failed.is_ready());  // it ran, before the steps
      BOOST_CHECK_EXCEPTION(wait_all(), std::exception, [](const std::exception& e) { return mentions(e, "label"); });
      BOOST_CHECK_NO_THROW(wait_all());
    }
  }
}

BOOST_AUTO_TEST_CASE(allreduce_writes_the_same_sum_to_every_device) {
  random::seed(14);
  std::vector<Tensor<float>> parts;
  std::vector<std::vector<float>> before;
  for (int d = 0; d < 3; ++d) {
    parts.push_back(random::normal<float>(0, 1, {4, 33}).to(cpu(d)));
    before.push_back(parts.back().to_vector());
  }
  allreduce(parts);
  const auto first = parts[0].to_vector();
  for (int d = 0; d < 3; ++d) {
    BOOST_TEST(parts[d].device() == cpu(d));
    const auto got = parts[d].to_vector();
    BOOST_TEST(got == first, boost::test_tools::per_element());  // the same bits everywhere
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double ref = double(before[0][i]) + before[1][i] + before[2][i];
      BOOST_TEST(std::abs(got[i] - ref) <= 1e-5);
    }
  }
  std::vector<Tensor<float>> bad = {zeros<float>({2, 2}), zeros<float>({2, 3}, cpu(1))};
  BOOST_CHECK_EXCEPTION(allreduce(bad), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "part 1") && mentions(e, "(2, 3)"); });
}

// Many tensors at once: consecutive ones share a bucket (one packed sum)
// up to the bucket's bytes, from the last one back; each still gets the
// bits a sum of its own gives it. Shapes: a scalar, an empty tensor, parts
// that are rows of a larger tensor, two tensors too large to share a bucket.
BOOST_AUTO_TEST_CASE(allreduce_of_many_tensors_packs_them_into_buckets) {
  const std::vector<Device> three = {cpu(0), cpu(1), cpu(2)};
  const std::vector<Shape> shapes = {{4, 33}, {}, {7}, {0}, {2, 3, 5}, {600}, {5}};
  random::seed(15);
  const Tensor<float> big = random::normal<float>(0, 1, {6, 33}).to(cpu(1));
  const auto big_before = big.to_vector();
  std::vector<std::vector<Tensor<float>>> tensors(shapes.size()), alone(shapes.size());
  std::vector<std::vector<double>> want(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    want[i].assign(std::size_t(shapes[i].size()), 0.0);
    for (const Device d : three) {
      Tensor<float> part = i == 0 && d == cpu(1) ? big.rows(1, 5) : random::normal<float>(0, 1, shapes[i]).to(d);
      const auto v = part.to_vector();
      for (std::size_t k = 0; k < v.size(); ++k) want[i][k] += v[k];
      tensors[i].push_back(part);
      alone[i].push_back(Tensor<float>(v, shapes[i], d));
    }
  }
  // What one sum of its own records, for a tensor of any shape on these devices.
  const auto recorded = [] { return engine::stats().tasks_recorded; };
  std::uint64_t before = recorded();
  for (auto& parts : alone) allreduce(parts);
  const std::uint64_t one_sum = (recorded() - before) / shapes.size();
  BOOST_TEST_REQUIRE(one_sum * shapes.size() == recorded() - before);

  // 1024 bytes: {5} and {600} (2,400 bytes) alone, the five before them (680 bytes) packed.
  before = recorded();
  allreduce(tensors, 1024);
  BOOST_TEST(recorded() - before == 3 * one_sum + 3 + 3 * 5);  // a pack and five copies back per device
  for (std::size_t i = 0; i < shapes.size(); ++i)
    for (std::size_t d = 0; d < three.size(); ++d) {
      BOOST_TEST(tensors[i][d].device() == three[d]);
      const auto got = tensors[i][d].to_vector();
      BOOST_TEST(got == alone[i][d].to_vector(), boost::test_tools::per_element());
      for (std::size_t k = 0; k < got.size(); ++k) BOOST_TEST(std::abs(got[k] - want[i][k]) <= 1e-5);
    }
  const auto big_after = big.to_vector();
  for (std::size_t k = 0; k < big_after.size(); ++k)
    if (k < 33 || k >= 5 * 33) BOOST_TEST(big_after[k] == big_before[k]);  // rows outside the part kept
    else BOOST_TEST(big_after[k] == tensors[0][1].to_vector()[k - 33]);

  // A bad tensor anywhere is refused, naming it, before anything is recorded.
  std::vector<std::vector<Tensor<float>>> bad = {{zeros<float>({3}), zeros<float>({3}, cpu(1))},
                                                 {zeros<float>({2, 2}), zeros<float>({2, 3}, cpu(1))}};
  before = recorded();
  BOOST_CHECK_EXCEPTION(allreduce(bad), std::invalid_argument, [](const std::invalid_argument& e) {
    return mentions(e, "tensor 1") && mentions(e, "part 1") && mentions(e, "(2, 3)");
  });
  BOOST_TEST(recorded() == before);
  // An empty handle among scalar parts (its shape is () too) is refused
  // before the tensors after it are summed.
  std::vector<std::vector<Tensor<float>>> empty = {{Tensor<float>(), ones<float>({}, cpu(1))},
                                                   {ones<float>({2}), ones<float>({2}, cpu(1))}};
  BOOST_CHECK_THROW(allreduce(empty, 0), std::logic_error);
  for (const auto& t : empty[1]) BOOST_TEST(t.to_vector() == (std::vector<float>{1, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(data_parallel)

// The seeds' multi-device training: each device runs its part of the batch
// with its own copy of the parameters; step() sums the gradients. That must
// equal one device training on the whole batch, up to the order of float sums.
BOOST_AUTO_TEST_CASE(two_devices_train_like_one_device_on_the_whole_batch) {
  random::seed(21);
  const Tensor<float> x = random::normal<float>(0, 1, {10, 6});
  const Tensor<std::int64_t> y(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 2, 1, 0, 1}, {10});

  auto one = small_net(), many = small_net();
  random::seed(22);
  one->initialize(nn::init::xavier());
  (void)(*one)(x);  // draws the weights
  random::seed(22);
  many->initialize(nn::init::xavier(), two);
  (void)(*many)(split_and_load(x, two)[1]);  // the first call may be on any device
  for (auto* p : many->collect_params()) {
    BOOST_TEST(p->devices() == two);
    BOOST_TEST(p->data(cpu(1)).device() == cpu(1));
  }

  const auto xs = split_and_load(x, two);
  const auto ys = split_and_load(y, two);
  train_side_by_side(*one, *many, x, y, xs, ys, 5);
  expect_trained_alike(*one, *many);
  for (auto* p : many->collect_params())
    BOOST_TEST(p->grad(cpu(1)).to_vector() == p->grad(cpu(0)).to_vector(), boost::test_tools::per_element());  // allreduced
  // Accuracy over the devices equals the whole batch's.
  Tensor<float> correct = zeros<float>({});
  for (std::size_t d = 0; d < 2; ++d)
    correct = correct + sum(cast<float>(argmax((*many)(xs[d]), 1) == ys[d])).to(cpu(0));
  BOOST_TEST(correct.item() == sum(cast<float>(argmax((*one)(x), 1) == y)).item());
}

// The seeds' question for devices of different speeds: give the faster one
// more rows. With the loss summed over the samples and step(batch size),
// an uneven split trains as one device on the whole batch does.
BOOST_AUTO_TEST_CASE(an_uneven_split_trains_like_one_device) {
  random::seed(23);
  const Tensor<float> x = random::normal<float>(0, 1, {10, 6});
  const Tensor<std::int64_t> y(std::vector<std::int64_t>{2, 1, 0, 0, 1, 2, 1, 1, 0, 2}, {10});
  auto one = small_net(), many = small_net();
  random::seed(24);
  one->initialize(nn::init::xavier());
  (void)(*one)(x);
  random::seed(24);
  many->initialize(nn::init::xavier(), two);
  const std::vector<double> shares = {1, 4};  // cpu(1) taken to be 4x as fast
  const auto xs = split_and_load(x, two, shares);
  const auto ys = split_and_load(y, two, shares);
  BOOST_TEST_REQUIRE(xs[0].shape()[0] == 2);
  BOOST_TEST_REQUIRE(ys[1].shape()[0] == 8);
  (void)(*many)(xs[0]);  // draws the same weights as one's first call
  train_side_by_side(*one, *many, x, y, xs, ys, 4);
  expect_trained_alike(*one, *many);
}

// A batch with fewer rows than devices leaves a device out: its copies'
// gradients are the last step's, and the step must not add them. Three
// devices train like one on batches of 9, then 2 rows (on cpu(0), cpu(1)),
// then 9 again, with momentum carrying any error into the last step.
BOOST_AUTO_TEST_CASE(a_device_left_out_of_a_batch_adds_no_old_gradient) {
  const std::vector<Device> three = {cpu(0), cpu(1), cpu(2)};
  random::seed(25);
  const std::vector<std::int64_t> rows = {9, 2, 9};
  auto one = small_net(), many = small_net();
  random::seed(26);
  one->initialize(nn::init::xavier());
  (void)(*one)(random::normal<float>(0, 1, {1, 6}));
  random::seed(26);
  many->initialize(nn::init::xavier(), three);
  (void)(*many)(random::normal<float>(0, 1, {1, 6}));  // draws the same weights as one's first call
  const nn::SoftmaxCrossEntropyLoss loss;
  nn::Trainer t_one(one->collect_params(), nn::SGD{.learning_rate = 0.1f, .momentum = 0.9f});
  nn::Trainer t_many(many->collect_params(), nn::SGD{.learning_rate = 0.1f, .momentum = 0.9f});
  for (const std::int64_t r : rows) {
    const Tensor<float> x = random::normal<float>(0, 1, {r, 6});
    std::vector<std::int64_t> labels;
    for (std::int64_t i = 0; i < r; ++i) labels.push_back((i * 7 + r) % 3);
    const Tensor<std::int64_t> y(labels, {r});
    const std::vector<Device> used(three.begin(), three.begin() + std::min<std::int64_t>(r, 3));
    const auto xs = split_and_load(x, used);
    const auto ys = split_and_load(y, used);
    {
      autograd::record rec;
      loss((*one)(x), y).backward();
      for (std::size_t d = 0; d < used.size(); ++d) loss((*many)(xs[d]), ys[d]).backward();
    }
    t_one.step(r);
    t_many.step(r);
  }
  const auto p_one = one->collect_params(), p_many = many->collect_params();
  for (std::size_t i = 0; i < p_one.size(); ++i) {
    BOOST_TEST_CONTEXT(p_one[i]->name()) {
      const auto ref = p_one[i]->data().to_vector();
      for (const Device d : three) {
        const auto got = p_many[i]->data(d).to_vector();
        BOOST_TEST(got == p_many[i]->data(cpu(0)).to_vector(), boost::test_tools::per_element());
        for (std::size_t k = 0; k < ref.size(); ++k) BOOST_TEST(std::abs(got[k] - ref[k]) <= 1e-5);
      }
    }
  }
}

// Packing the gradients into buckets changes how many sums run, not their
// bits: training with the default buckets equals training with one sum per
// parameter, bit for bit, parameters and gradients, on three devices.
BOOST_AUTO_TEST_CASE(bucketed_gradients_train_like_one_sum_per_parameter) {
  const std::vector<Device> three = {cpu(0), cpu(1), cpu(2)};
  random::seed(23);
  const Tensor<float> x = random::normal<float>(0, 1, {9, 6});
  const Tensor<std::int64_t> y(std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 2, 1, 0}, {9});
  const nn::SoftmaxCrossEntropyLoss loss;
  std::vector<std::vector<std::vector<float>>> trained;  // per run, per parameter: value then gradient
  for (const std::size_t bucket : {thresholds::allreduce_bucket_bytes, std::size_t(0)}) {
    auto net = small_net();
    random::seed(24);
    net->initialize(nn::init::xavier(), three);
    nn::Trainer trainer(net->collect_params(), nn::Adam{.learning_rate = 0.01f});
    BOOST_TEST(trainer.allreduce_bucket_bytes() == thresholds::allreduce_bucket_bytes);
    trainer.set_allreduce_bucket_bytes(bucket);
    const auto xs = split_and_load(x, three);
    const auto ys = split_and_load(y, three);
    for (int step = 0; step < 3; ++step) {
      {
        autograd::record rec;
        for (std::size_t d = 0; d < three.size(); ++d) loss((*net)(xs[d]), ys[d]).backward();
      }
      trainer.step(9);
    }
    trained.emplace_back();
    for (auto* p : net->collect_params())
      for (const Device d : three) {
        trained.back().push_back(p->data(d).to_vector());
        trained.back().push_back(p->grad(d).to_vector());
      }
  }
  BOOST_TEST_REQUIRE(trained[0].size() == trained[1].size());
  for (std::size_t i = 0; i < trained[0].size(); ++i)
    BOOST_TEST(trained[0][i] == trained[1][i], boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_hybridized_network_keeps_one_graph_per_device) {
  random::seed(23);
  const Tensor<float> x = random::normal<float>(0, 1, {6, 5});
  auto net = small_net();
  net->initialize(nn::init::xavier(), two);
  const auto xs = split_and_load(x, two);
  std::vector<std::vector<float>> imperative;
  for (const auto& part : xs) imperative.push_back((*net)(part).to_vector());
  net->hybridize();
  for (int call = 0; call < 3; ++call)
    for (std::size_t d = 0; d < 2; ++d) {
      const Tensor<float> out = (*net)(xs[d]);
      BOOST_TEST(out.device() == two[d]);
      BOOST_TEST(out.to_vector() == imperative[d], boost::test_tools::per_element());
    }
  BOOST_TEST(net->traces() == 2);  // one per device, not one per switch
}

BOOST_AUTO_TEST_CASE(an_input_on_a_device_without_parameters_is_refused) {
  auto net = small_net();
  net->initialize(nn::init::xavier(), {cpu(0)});
  (void)(*net)(ones<float>({2, 4}));
  BOOST_CHECK_EXCEPTION((*net)(ones<float>({2, 4}, cpu(1))), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "no copy on cpu(1)") && mentions(e, "cpu(0)"); });
  auto* p = net->collect_params().front();
  BOOST_CHECK_EXCEPTION(p->reset_devices({cpu(0), cpu(0)}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "listed twice"); });
  BOOST_CHECK_EXCEPTION(p->reset_devices({}), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "no devices"); });
  // Moving keeps the value.
  const auto before = p->data().to_vector();
  p->reset_devices({cpu(2)});
  BOOST_TEST(p->data().device() == cpu(2));
  BOOST_TEST(p->data(cpu(2)).to_vector() == before, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
