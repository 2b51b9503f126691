// BatchNorm with statistics synchronized across the ranks: each rank holds
// some rows of a global batch, and together they must compute what one
// process computes on the whole batch (checked against a double-precision
// loop, and by training against one process at the global batch).
#include "../nn/batch_norm_reference.hpp"
#include "dist_support.hpp"

using namespace deft;
using dist_test::mentions;
using namespace dist_test::training;

namespace {

/// Rows [begin, end) of this rank's share of `rows` rows split over the ranks.
std::pair<std::int64_t, std::int64_t> my_rows(std::int64_t rows) {
  const std::int64_t r = dist::rank(), p = dist::size();
  return {rows * r / p, rows * (r + 1) / p};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sync_batch_norm)

BOOST_AUTO_TEST_CASE(ranks_normalize_and_differentiate_as_one_batch) {
  // 7 rows: 3 ranks hold 2, 2 and 3 of them; each rank draws the whole
  // batch from one seed and keeps its rows.
  for (const Shape& shape : {Shape{7, 3, 4, 5}, Shape{7, 6}}) {
    const std::int64_t n = shape[0], c = shape[1], s = shape.size() / (n * c);
    random::seed(77);
    const Tensor<float> x_all = random::normal<float>(2, 3, shape);  // off-centre: the mean matters
    const Tensor<float> g_all = random::normal<float>(0, 1, shape);
    const Tensor<float> gamma = random::uniform<float>(0.5, 1.5, {c}), beta = random::normal<float>(0, 1, {c});
    const auto [begin, end] = my_rows(n);
    nn::BatchNorm bn(0.8f);
    bn.set_communicator(dist::world());
    bn.initialize();
    Tensor<float> x = Tensor<float>(x_all.rows(begin, end)).clone();
    const Tensor<float> g = Tensor<float>(g_all.rows(begin, end)).clone();
    {
      autograd::predict_mode shapes_only;
      (void)bn(x).to_vector();  // the parameters take their shapes
    }
    bn.gamma().set_data(gamma);
    bn.beta().set_data(beta);
    x.attach_grad();
    Tensor<float> y;
    {
      autograd::record rec;
      y = bn(x);
      sum(y * g).backward();
    }
    const BatchNormReference ref(to_doubles(x_all.to_vector()), to_doubles(g_all.to_vector()),
                                 to_doubles(gamma.to_vector()), to_doubles(beta.to_vector()), n, c, s, 1e-5, true);
    const std::size_t first = std::size_t(begin * c * s);
    const std::string on = " on rank " + std::to_string(dist::rank()) + ", shape " + shape.to_string();
    const auto expect_close = [&](const std::vector<float>& got, const std::vector<double>& want, std::size_t from,
                                  double tol, const char* what) {
      const std::string bad = first_mismatch(got, want, from, tol);
      BOOST_TEST(bad.empty(), what << on << ": " << bad);
    };
    expect_close(y.to_vector(), ref.y, first, 2e-5, "y");
    expect_close(x.grad().to_vector(), ref.dx, first, 5e-4, "dx");
    // dγ and dβ are each rank's share; their sum over the ranks is the batch's.
    Tensor<float> dgamma = bn.gamma().grad().clone(), dbeta = bn.beta().grad().clone();
    dist::allreduce(dgamma);
    dist::allreduce(dbeta);
    expect_close(dgamma.to_vector(), ref.dgamma, 0, 1e-4, "dgamma");
    expect_close(dbeta.to_vector(), ref.dbeta, 0, 1e-4, "dbeta");
    // running = 0.8 * running + 0.2 * batch, from zeros and ones: the same on every rank.
    std::vector<double> mean(ref.mean), var(ref.var);
    for (auto& m : mean) m *= 0.2;
    for (auto& v : var) v = 0.8 + 0.2 * v;
    expect_close(bn.running_mean().data().to_vector(), mean, 0, 1e-5, "running mean");
    expect_close(bn.running_var().data().to_vector(), var, 0, 1e-5, "running var");
  }
}

BOOST_AUTO_TEST_CASE(ranks_at_global_batch_b_train_like_one_process_with_batch_norm) {
  const auto [x, y] = data_set();
  auto single = make_normalized_net(), parallel = make_normalized_net();
  random::seed(1000 + std::uint64_t(dist::rank()));
  (void)(*parallel)(x.rows(0, 2));
  random::seed(1000);
  (void)(*single)(x.rows(0, 2));
  BOOST_TEST(nn::synchronize_batch_norm(*parallel, dist::world()) == 1u);
  nn::Trainer one(single->collect_params(), nn::SGD{0.1f, 0.9f}), many(parallel->collect_params(), nn::SGD{0.1f, 0.9f});
  many.set_communicator(dist::world());  // rank 0's values everywhere, the running statistics too
  data::DataLoader whole(x, y, 20, {.seed = 3, .prefetch = false});
  data::DataLoader part(x, y, 20, {.seed = 3, .prefetch = false, .num_shards = dist::size(), .shard = dist::rank()});
  train(*single, one, whole, 2);
  train(*parallel, many, part, 2);
  const std::vector<nn::NamedParameter> named = parallel->named_params();
  const auto worst = relative_differences(values(*single), values(*parallel));
  BOOST_REQUIRE(worst.size() == named.size());
  for (std::size_t i = 0; i < worst.size(); ++i)  // float sums in another order, over 10 steps: relative 1e-3
    BOOST_TEST(worst[i] < 1e-3, named[i].path << ": relative difference " << worst[i]);
  // The running statistics, not summed by the Trainer, agree bit for bit across the ranks.
  for (auto* p : {"1.running_mean", "1.running_var"}) {
    const auto it = std::ranges::find_if(named, [&](const auto& q) { return q.path == p; });
    BOOST_REQUIRE(it != named.end());
    const auto mine = it->parameter->data().to_vector();
    const auto all = dist::allgather(it->parameter->data()).to_vector();
    for (int r = 0; r < dist::size(); ++r)
      BOOST_TEST(std::equal(mine.begin(), mine.end(), all.begin() + std::ptrdiff_t(r) * std::ptrdiff_t(mine.size())),
                 p << " differs on rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(a_layer_on_several_devices_of_a_process_is_refused) {
  nn::BatchNorm bn;
  bn.initialize(nn::init::zeros(), {cpu(0), cpu(1)});
  (void)bn(ones({4, 3})).to_vector();
  bn.set_communicator(dist::world());
  const std::uint64_t before = dist::world()->recorded();
  autograd::train_mode training;
  BOOST_CHECK_EXCEPTION((void)bn(ones({4, 3})), std::logic_error,
                        [](const auto& e) { return mentions(e, "one device per process") && mentions(e, "2 devices"); });
  BOOST_TEST(dist::world()->recorded() == before);
  // Back to this process's batch alone: no collective.
  bn.set_communicator(nullptr);
  (void)bn(random::normal<float>(0, 1, {4, 3})).to_vector();
  BOOST_TEST(dist::world()->recorded() == before);
}

BOOST_AUTO_TEST_CASE(synchronize_batch_norm_sets_each_layer_once_and_unsets_it) {
  // One BatchNorm held twice (weights shared), one elsewhere, at depth 2.
  auto shared = std::make_shared<nn::BatchNorm>();
  auto deep = std::make_shared<nn::BatchNorm>();
  auto inner = std::make_shared<nn::Sequential>();
  inner->add(std::make_shared<nn::Dense>(4), deep);
  nn::Sequential net;
  net.add(shared, inner, shared);
  BOOST_TEST(nn::synchronize_batch_norm(net, dist::world()) == 2u);
  BOOST_TEST(shared->communicator() == dist::world());
  BOOST_TEST(deep->communicator() == dist::world());
  BOOST_TEST(nn::synchronize_batch_norm(net, nullptr) == 2u);
  BOOST_TEST(!shared->communicator());
}

BOOST_AUTO_TEST_SUITE_END()
