// Collectives on GPU tensors across processes, through deft's CUDA backend
// and NCCL communicators bootstrapped over MPI, run against the stand-in
// (tests/gpu/fake_cuda: each process's GPUs are host memory, its NCCL talks
// to the other processes over local sockets). Its call counts show which
// path each collective took: NCCL on the GPU, or staging through the host.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fake_cuda.hpp>

#include "dist_support.hpp"

using namespace deft;
using dist_test::mentions;
using dist_test::values_of;
using dist_test::check_allreduce;

namespace {

Device this_ranks_gpu() { return gpu(dist::local_rank() % num_gpus()); }

unsigned long long nccl_calls() {
  return fake_cuda::calls("ncclAllReduce") + fake_cuda::calls("ncclBroadcast") + fake_cuda::calls("ncclAllGather") +
         fake_cuda::calls("ncclReduceScatter");
}

// The NCCL faults' tests: a communicator that raises on timeout, and 16
// values on this rank's GPU.
std::shared_ptr<dist::Communicator> raising(std::chrono::milliseconds timeout) {
  return dist_test::fresh({.timeout = timeout, .on_timeout = dist::OnTimeout::raise});
}
Tensor<float> on_gpu(std::uint64_t seed) {
  return Tensor<float>(values_of<float>(dist::rank(), seed, 16), Shape{16}).to(this_ranks_gpu());
}
// Allreduces t over comm and checks that reading it raises Failure, as
// `check` accepts, within 20 s (every fault's timeout is shorter, or a
// fault needs none).
template <class Failure, class Check>
void fails_in_time(Tensor<float>& t, const std::shared_ptr<dist::Communicator>& comm, Check&& check) {
  const auto start = std::chrono::steady_clock::now();
  dist::allreduce(t, dist::ReduceOp::sum, comm);
  BOOST_CHECK_EXCEPTION(t.wait_to_read(), Failure, [&](const Failure& e) {
    BOOST_TEST_MESSAGE(e.what());
    return check(e);
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(20)), "raised within 20 s");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(nccl_across_processes)

BOOST_AUTO_TEST_CASE(allreduce_on_gpus_runs_over_nccl_and_matches_a_double_reference) {
  BOOST_TEST_REQUIRE(num_gpus() > 0);
  BOOST_TEST(dist::world()->runs_on(this_ranks_gpu()) == this_ranks_gpu());
  const auto before = fake_cuda::calls("ncclAllReduce");
  std::uint64_t key = 1000, collectives = 0;
  for (const Shape& s : {Shape{1}, Shape{7, 3}, Shape{1000}, Shape{}})
    for (auto op : {dist::ReduceOp::sum, dist::ReduceOp::mean, dist::ReduceOp::max, dist::ReduceOp::min}) {
      check_allreduce<float>(op, key++, s, this_ranks_gpu());
      check_allreduce<double>(op, key++, s, this_ranks_gpu());
      check_allreduce<std::int32_t>(op, key++, s, this_ranks_gpu());
      check_allreduce<std::int64_t>(op, key++, s, this_ranks_gpu());
      collectives += 4;
    }
  BOOST_TEST(fake_cuda::calls("ncclAllReduce") - before == collectives);
}

BOOST_AUTO_TEST_CASE(broadcast_allgather_and_reduce_scatter_on_gpus_match_the_host_ones) {
  const int ranks = dist::size(), me = dist::rank();
  const auto before = nccl_calls();
  for (int root = 0; root < ranks; ++root) {
    Tensor<float> t = Tensor<float>(values_of<float>(me, 2000 + std::uint64_t(root), 33), Shape{3, 11}).to(this_ranks_gpu());
    dist::broadcast(t, root);
    BOOST_TEST(t.to_vector() == values_of<float>(root, 2000 + std::uint64_t(root), 33));
  }
  const Tensor<std::int64_t> mine(values_of<std::int64_t>(me, 2100, 10), Shape{2, 5});
  const Tensor<std::int64_t> g = dist::allgather(mine.to(this_ranks_gpu()));
  BOOST_TEST(g.device() == this_ranks_gpu());
  BOOST_TEST(g.to_vector() == dist::allgather(mine).to_vector());  // the host's, over MPI

  const std::int64_t rows = 2 * ranks;
  const Tensor<double> x(values_of<double>(me, 2200, rows * 3), Shape{rows, 3});
  for (auto op : {dist::ReduceOp::sum, dist::ReduceOp::max}) {
    const Tensor<double> part = dist::reduce_scatter(x.to(this_ranks_gpu()), op);
    BOOST_TEST(part.device() == this_ranks_gpu());
    BOOST_TEST(part.shape() == (Shape{2, 3}));
    // Both sum in rank order here (Open MPI's reduce for two or three ranks, the stand-in's star): equal bits.
    const auto host = dist::reduce_scatter(x, op).to_vector(), got = part.to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(got[i] == host[i], boost::test_tools::tolerance(1e-12));
  }
  BOOST_TEST(nccl_calls() - before == unsigned(ranks + 1 + 2));
}

BOOST_AUTO_TEST_CASE(bucketed_allreduce_on_gpus_packs_on_the_gpu_and_equals_one_at_a_time) {
  const std::vector<Shape> shapes{{3}, {2, 4}, {40}, {1}, {5, 5}, {0}, {7}};
  std::vector<Tensor<float>> many, one;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const Tensor<float> v(values_of<float>(dist::rank(), 2300 + i, shapes[i].size()), shapes[i]);
    many.push_back(v.to(this_ranks_gpu()));
    one.push_back(v.to(this_ranks_gpu()));
  }
  const auto before = fake_cuda::calls("ncclAllReduce");
  dist::allreduce(many, dist::ReduceOp::sum, 100);
  for (auto& t : many) t.wait_to_read();  // deferred: launched by now
  // Buckets of at most 100 bytes from the last tensor back: {7 + 0 floats},
  // {25}, {1}, {40}, {8 + 3}: five collectives for seven tensors.
  BOOST_TEST(fake_cuda::calls("ncclAllReduce") - before == 5u);
  for (auto& t : one) dist::allreduce(t);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    BOOST_TEST(many[i].device() == this_ranks_gpu());
    BOOST_TEST(many[i].to_vector() == one[i].to_vector(), "tensor " << i);
  }
}

BOOST_AUTO_TEST_CASE(gpu_collectives_off_stage_through_the_host) {
  dist::Options o;
  o.gpu_collectives = false;
  const auto comm = dist_test::fresh(o);
  BOOST_TEST(comm->runs_on(this_ranks_gpu()) == Device{});
  Tensor<float> t = Tensor<float>(values_of<float>(dist::rank(), 2400, 64), Shape{64}).to(this_ranks_gpu());
  const auto before = nccl_calls();
  dist::allreduce(t, dist::ReduceOp::max, comm);
  BOOST_TEST(t.device() == this_ranks_gpu());
  const auto got = t.to_vector();
  BOOST_TEST(nccl_calls() == before);
  std::vector<float> ref = values_of<float>(0, 2400, 64);
  for (int r = 1; r < dist::size(); ++r) {
    const auto v = values_of<float>(r, 2400, 64);
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = std::max(ref[i], v[i]);
  }
  BOOST_TEST(got == ref);
}

BOOST_AUTO_TEST_CASE(a_rank_on_the_host_where_the_others_are_on_gpus_is_named) {
  // Rank 0 passes a host tensor, the others a GPU one: the paths differ, and every rank says so.
  const auto comm = dist_test::fresh();
  Tensor<float> t(values_of<float>(dist::rank(), 2500, 8), Shape{8});
  if (dist::rank() != 0) t = t.to(this_ranks_gpu());
  dist::allreduce(t, dist::ReduceOp::sum, comm);
  BOOST_CHECK_EXCEPTION(t.wait_to_read(), dist::Error, [](const dist::Error& e) {
    return mentions(e, "on the GPU") && mentions(e, "every rank must record the same collectives");
  });
}

// NCCL's bootstrap: rank 1 cannot join the communicator. Every rank names
// it at once, where rank 0's NCCL would otherwise wait for rank 1 without end.
BOOST_AUTO_TEST_CASE(a_rank_that_cannot_join_the_nccl_communicator_is_named_on_every_rank) {
  if (dist::size() < 2) return;
  const auto comm = raising(std::chrono::seconds(30));  // named long before the timeout
  if (dist::rank() == 1) fake_cuda::inject("ncclCommInitRank", fake_cuda::Fault::fail);
  Tensor<float> t = on_gpu(2600);
  fails_in_time<dist::Error>(t, comm, [](const dist::Error& e) {
    return mentions(e, "allreduce #0") && mentions(e, "rank(s) 1 of") &&
           mentions(e, "could not join NCCL's communicator") && (dist::rank() != 1 || mentions(e, "(rank 1: NCCL ncclCommInitRank"));
  });
  dist::barrier();
}

// Rank 1 starts joining and never finishes: every rank's watchdog ends the
// wait for the communicator after the timeout, and aborts it.
BOOST_AUTO_TEST_CASE(a_communicator_that_never_forms_is_found_by_the_watchdog) {
  if (dist::size() < 2) return;
  const auto comm = raising(std::chrono::milliseconds(1500));
  if (dist::rank() == 1) fake_cuda::inject("ncclCommInitRank", fake_cuda::Fault::hang);
  Tensor<float> t = on_gpu(2700);
  fails_in_time<dist::Timeout>(t, comm, [](const dist::Timeout& e) {
    return mentions(e, "allreduce #0") && mentions(e, "1.5 s") && mentions(e, "for NCCL's communicator to form");
  });
  // Later collectives on it refuse at once.
  Tensor<float> u = Tensor<float>(std::vector<float>{1.0f}, Shape{1}).to(this_ranks_gpu());
  dist::allreduce(u, dist::ReduceOp::sum, comm);
  BOOST_CHECK_EXCEPTION(u.wait_to_read(), dist::Error, [](const auto& e) { return mentions(e, "allreduce #0"); });
  dist::barrier();
}

// Every rank joined, but NCCL never takes the next allreduce (each rank's
// call stays in progress): every rank's watchdog ends that wait after the
// timeout. (One rank alone stuck there would leave the others waiting for
// its data, which the watchdog covers as before; in the stand-in their
// GPUs would then fail for good when its abort cuts their sockets.)
BOOST_AUTO_TEST_CASE(a_collective_nccl_never_takes_is_found_by_the_watchdog) {
  if (dist::size() < 2) return;
  const auto comm = raising(std::chrono::milliseconds(1500));
  Tensor<float> t = on_gpu(2800);
  dist::allreduce(t, dist::ReduceOp::sum, comm);
  t.wait_to_read();  // the communicator forms and works
  fake_cuda::inject("ncclAllReduce", fake_cuda::Fault::hang);
  fails_in_time<dist::Timeout>(t, comm, [](const dist::Timeout& e) {
    return mentions(e, "allreduce #1") && mentions(e, "1.5 s") && mentions(e, "for NCCL to take the collective");
  });
  dist::barrier();
}

BOOST_AUTO_TEST_CASE(ranks_training_on_gpus_over_nccl_match_one_process_on_the_host) {
  using namespace dist_test::training;
  const auto [x, y] = data_set();
  auto single = make_net(), parallel = make_net(this_ranks_gpu());
  random::seed(3000 + std::uint64_t(dist::rank()));  // set_communicator broadcasts rank 0's values
  (void)(*parallel)(x.rows(0, 2).to(this_ranks_gpu()));
  random::seed(3000);
  (void)(*single)(x.rows(0, 2));
  nn::Trainer one(single->collect_params(), nn::SGD{0.1f, 0.9f}), many(parallel->collect_params(), nn::SGD{0.1f, 0.9f});
  many.set_communicator(dist::world());
  many.set_allreduce_bucket_bytes(512);  // several buckets, packed on the GPU
  data::DataLoader whole(x, y, 24, {.seed = 5, .prefetch = false});
  data::DataLoader part(x, y, 24, {.seed = 5, .prefetch = false, .num_shards = dist::size(), .shard = dist::rank()});
  const auto before = fake_cuda::calls("ncclAllReduce");
  train(*single, one, whole, 2);
  train(*parallel, many, part, 2, this_ranks_gpu());
  const auto b = values(*parallel);
  const auto worst = relative_differences(values(*single), b);
  BOOST_TEST(fake_cuda::calls("ncclAllReduce") > before);  // the gradients went over NCCL
  const auto params = parallel->collect_params();
  BOOST_REQUIRE(worst.size() == params.size());
  for (std::size_t i = 0; i < worst.size(); ++i) {
    BOOST_TEST(params[i]->data().device() == this_ranks_gpu());
    // Float sums in another order, over 8 steps: relative 1e-3.
    BOOST_TEST(worst[i] < 1e-3, params[i]->name() << ": relative difference " << worst[i]);
    // The same bits on every rank: each rank's values gathered over NCCL.
    const auto all = dist::allgather(params[i]->data().reshape({std::int64_t(b[i].size())})).to_vector();
    for (int r = 0; r < dist::size(); ++r)
      BOOST_TEST(std::equal(b[i].begin(), b[i].end(), all.begin() + std::ptrdiff_t(r) * std::ptrdiff_t(b[i].size())),
                 params[i]->name() << " differs on rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(batch_norm_synchronized_over_nccl_trains_like_one_process_on_the_host) {
  using namespace dist_test::training;
  const auto [x, y] = data_set();
  auto single = make_normalized_net(), parallel = make_normalized_net(this_ranks_gpu());
  random::seed(3100 + std::uint64_t(dist::rank()));
  (void)(*parallel)(x.rows(0, 2).to(this_ranks_gpu()));
  random::seed(3100);
  (void)(*single)(x.rows(0, 2));
  nn::synchronize_batch_norm(*parallel, dist::world());
  nn::Trainer one(single->collect_params(), nn::SGD{0.1f, 0.9f}), many(parallel->collect_params(), nn::SGD{0.1f, 0.9f});
  many.set_communicator(dist::world());
  data::DataLoader whole(x, y, 24, {.seed = 6, .prefetch = false});
  data::DataLoader part(x, y, 24, {.seed = 6, .prefetch = false, .num_shards = dist::size(), .shard = dist::rank()});
  const auto before = fake_cuda::calls("ncclAllReduce"), gathers_before = fake_cuda::calls("ncclAllGather");
  train(*single, one, whole, 1);
  train(*parallel, many, part, 1, this_ranks_gpu());
  const std::vector<nn::NamedParameter> named = parallel->named_params();
  const auto worst = relative_differences(values(*single), values(*parallel));  // syncs: the collectives ran
  // Per step: the statistics' allgather, then the backward's allreduce and the gradients'.
  const auto steps = std::uint64_t(whole.num_batches());
  BOOST_TEST(fake_cuda::calls("ncclAllGather") - gathers_before >= steps);
  BOOST_TEST(fake_cuda::calls("ncclAllReduce") - before >= 2 * steps);
  BOOST_REQUIRE(worst.size() == named.size());
  for (std::size_t i = 0; i < worst.size(); ++i)
    BOOST_TEST(worst[i] < 1e-3, named[i].path << ": relative difference " << worst[i]);
}

BOOST_AUTO_TEST_SUITE_END()
