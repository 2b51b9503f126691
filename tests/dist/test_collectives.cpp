// Collectives on tensors across ranks against a reference each rank computes
// itself (in double precision) from every rank's inputs; the rendezvous's
// checks of mismatched collectives and the watchdog's timeout.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "dist_support.hpp"

using namespace deft;
using dist_test::values_of;
using dist_test::mentions;
using dist_test::check_allreduce;

BOOST_AUTO_TEST_SUITE(collectives)

BOOST_AUTO_TEST_CASE(allreduce_matches_a_double_reference_for_every_op_and_type) {
  std::uint64_t key = 1;
  for (const Shape& s : {Shape{1}, Shape{7, 3}, Shape{1000}, Shape{4, 5, 6}, Shape{0}, Shape{}})
    for (auto op : {dist::ReduceOp::sum, dist::ReduceOp::mean, dist::ReduceOp::max, dist::ReduceOp::min}) {
      check_allreduce<float>(op, key++, s);
      check_allreduce<double>(op, key++, s);
      check_allreduce<std::int32_t>(op, key++, s);
      check_allreduce<std::int64_t>(op, key++, s);
    }
  // A sum larger than one eager message (Open MPI's shared-memory path changes protocol).
  check_allreduce<float>(dist::ReduceOp::sum, 777, Shape{3, 1 << 18});
}

// Up to thresholds::rendezvous_data_max_bytes an allreduce's data goes with
// its rendezvous message and each rank combines all of it: every rank must
// still end with the same bits, at the bound and in place.
BOOST_AUTO_TEST_CASE(small_allreduces_give_every_rank_the_same_bits) {
  const std::int64_t n = std::int64_t(thresholds::rendezvous_data_max_bytes / 4);
  check_allreduce<float>(dist::ReduceOp::sum, 900, Shape{n});
  check_allreduce<float>(dist::ReduceOp::sum, 901, Shape{n + 1});  // one past: the rendezvous, then MPI
  const auto mine = values_of<float>(dist::rank(), 902, n);
  Tensor<float> t(mine, Shape{n});
  dist::allreduce(t);
  const auto all = dist::allgather(t).to_vector();
  const auto here = t.to_vector();
  for (int r = 0; r < dist::size(); ++r)
    BOOST_TEST(std::equal(here.begin(), here.end(), all.begin() + std::ptrdiff_t(r) * n), "rank " << r << " differs");
}

// From thresholds::mpi_ring_min_bytes to mpi_ring_max_bytes the watchdog's
// allreduce runs as deft's ring: blocks of unequal length (no rank count
// divides these sizes), in place and into a new buffer.
BOOST_AUTO_TEST_CASE(large_allreduces_match_the_reference_for_every_op_and_type) {
  const auto at_least = [](std::size_t element) {
    return std::int64_t(thresholds::mpi_ring_min_bytes / element) + 7;
  };
  std::uint64_t key = 500;
  for (auto op : {dist::ReduceOp::sum, dist::ReduceOp::mean, dist::ReduceOp::max, dist::ReduceOp::min}) {
    check_allreduce<float>(op, key++, Shape{at_least(4)});
    check_allreduce<double>(op, key++, Shape{at_least(8)});
    check_allreduce<std::int32_t>(op, key++, Shape{3, at_least(4) / 3 + 1});
    check_allreduce<std::int64_t>(op, key++, Shape{at_least(8)});
  }
  // Past thresholds::mpi_ring_max_bytes, MPI_Iallreduce again.
  check_allreduce<float>(dist::ReduceOp::sum, key++, Shape{std::int64_t(thresholds::mpi_ring_max_bytes / 4) + 5});
  const std::int64_t n = at_least(4);
  const auto mine = values_of<float>(dist::rank(), 600, n);
  Tensor<float> in_place(mine, Shape{n}), copied(mine, Shape{n});
  // A recorded reader of the input, not run yet: the sum goes to a new buffer (copy-on-write).
  const Tensor<float> kept = copied * 1.0f;
  dist::allreduce(in_place);
  dist::allreduce(copied);
  BOOST_TEST(copied.to_vector() == in_place.to_vector());
  BOOST_TEST(kept.to_vector() == mine);
  // Every rank ends with the same bits: each block is summed on one rank.
  const auto all = dist::allgather(in_place).to_vector();
  const auto here = in_place.to_vector();
  for (int r = 0; r < dist::size(); ++r)
    BOOST_TEST(std::equal(here.begin(), here.end(), all.begin() + std::ptrdiff_t(r) * n), "rank " << r << " differs");
}

BOOST_AUTO_TEST_CASE(broadcast_writes_the_roots_value_everywhere) {
  for (int root = 0; root < dist::size(); ++root) {
    Tensor<float> t(values_of<float>(dist::rank(), 50 + std::uint64_t(root), 33), Shape{3, 11});
    Tensor<float> view_holder = t;  // another handle of the same tensor sees the new value
    dist::broadcast(t, root);
    BOOST_TEST(view_holder.to_vector() == values_of<float>(root, 50 + std::uint64_t(root), 33));
  }
  // Into a view: the rows are written in place, the rest is left alone.
  Tensor<std::int64_t> whole(values_of<std::int64_t>(dist::rank(), 60, 12), Shape{4, 3});
  Tensor<std::int64_t> rows = whole.rows(1, 3);
  dist::broadcast(rows, dist::size() - 1);
  const auto mine = values_of<std::int64_t>(dist::rank(), 60, 12), root = values_of<std::int64_t>(dist::size() - 1, 60, 12);
  const auto got = whole.to_vector();
  for (std::size_t i = 0; i < 12; ++i) BOOST_TEST(got[i] == (i >= 3 && i < 9 ? root[i] : mine[i]));
}

BOOST_AUTO_TEST_CASE(allgather_concatenates_every_rank_in_rank_order) {
  Tensor<double> t(values_of<double>(dist::rank(), 70, 10), Shape{2, 5});
  const Tensor<double> g = dist::allgather(t);
  BOOST_TEST(g.shape() == (Shape{2 * std::int64_t(dist::size()), 5}));
  std::vector<double> ref;
  for (int r = 0; r < dist::size(); ++r) {
    const auto v = values_of<double>(r, 70, 10);
    ref.insert(ref.end(), v.begin(), v.end());
  }
  BOOST_TEST(g.to_vector() == ref);
  const Tensor<std::int32_t> scalar(std::vector<std::int32_t>{dist::rank() * 3}, Shape{});
  const Tensor<std::int32_t> all = dist::allgather(scalar);
  BOOST_TEST(all.shape() == Shape{std::int64_t(dist::size())});
  for (int r = 0; r < dist::size(); ++r) BOOST_TEST(all.to_vector()[std::size_t(r)] == r * 3);
}

BOOST_AUTO_TEST_CASE(reduce_scatter_keeps_this_ranks_rows_of_the_sum) {
  const std::int64_t ranks = dist::size(), rows = 2 * ranks, cols = 3;
  Tensor<float> t(values_of<float>(dist::rank(), 80, rows * cols), Shape{rows, cols});
  const Tensor<float> mine = dist::reduce_scatter(t, dist::ReduceOp::max);
  BOOST_TEST(mine.shape() == (Shape{2, cols}));
  const auto got = mine.to_vector();
  std::vector<std::vector<float>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(values_of<float>(r, 80, rows * cols));
  for (std::int64_t i = 0; i < 2 * cols; ++i) {
    float ref = -INFINITY;
    for (int r = 0; r < ranks; ++r) ref = std::max(ref, all[std::size_t(r)][std::size_t(dist::rank() * 2 * cols + i)]);
    BOOST_TEST(got[std::size_t(i)] == ref);
  }
  BOOST_CHECK_EXCEPTION(dist::reduce_scatter(Tensor<float>(std::vector<float>(std::size_t(ranks + 1)), Shape{ranks + 1})),
                        std::invalid_argument, [](const auto& e) { return mentions(e, "split evenly"); });
}

// Inputs up to thresholds::rendezvous_data_max_bytes travel inside the
// rendezvous; larger ones through MPI's collectives after it: both sides.
BOOST_AUTO_TEST_CASE(broadcast_allgather_and_reduce_scatter_on_both_sides_of_the_rendezvous_bound) {
  const int ranks = dist::size();
  const std::int64_t bound = std::int64_t(thresholds::rendezvous_data_max_bytes / 4);
  for (const std::int64_t cols : {std::int64_t(3), bound / ranks + 1}) {
    const std::int64_t rows = 2 * std::int64_t(ranks), n = rows * cols, block = n / ranks;
    std::vector<std::vector<float>> f;
    std::vector<std::vector<double>> d;
    for (int r = 0; r < ranks; ++r) {
      f.push_back(values_of<float>(r, 90 + std::uint64_t(cols), n));
      d.push_back(values_of<double>(r, 91 + std::uint64_t(cols), n));
    }
    Tensor<float> b(f[std::size_t(dist::rank())], Shape{rows, cols});
    dist::broadcast(b, ranks - 1);
    BOOST_TEST(b.to_vector() == f[std::size_t(ranks - 1)], "broadcast of " << n);
    std::vector<float> gathered;
    for (const auto& v : f) gathered.insert(gathered.end(), v.begin(), v.end());
    BOOST_TEST(dist::allgather(Tensor<float>(f[std::size_t(dist::rank())], Shape{rows, cols})).to_vector() == gathered,
               "allgather of " << n);
    const auto got =
        dist::reduce_scatter(Tensor<double>(d[std::size_t(dist::rank())], Shape{rows, cols}), dist::ReduceOp::mean)
            .to_vector();
    BOOST_REQUIRE_EQUAL(got.size(), std::size_t(block));
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < block; ++i) {
      double sum = 0, mag = 0;
      for (const auto& v : d) {
        sum += v[std::size_t(dist::rank() * block + i)];
        mag += std::abs(v[std::size_t(dist::rank() * block + i)]);
      }
      if (std::abs(got[std::size_t(i)] - sum / ranks) > dist_test::tolerance_of<double>(mag)) ++bad;
    }
    BOOST_TEST(bad == 0, bad << " of " << block << " elements of a mean reduce_scatter of " << n << " differ");
  }
}

BOOST_AUTO_TEST_CASE(bucketed_allreduce_of_many_tensors_equals_one_at_a_time) {
  // Tensors of mixed sizes: buckets of 100 bytes hold several small ones, the large ones go alone.
  const std::vector<Shape> shapes{{3}, {2, 4}, {40}, {1}, {5, 5}, {0}, {7}};
  for (std::size_t bucket : {std::size_t(0), std::size_t(100), std::size_t(1) << 20}) {
    std::vector<Tensor<float>> many, one;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto v = values_of<float>(dist::rank(), 90 + i, shapes[i].size());
      many.emplace_back(v, shapes[i]);
      one.emplace_back(v, shapes[i]);
    }
    dist::allreduce(many, dist::ReduceOp::sum, bucket);
    for (auto& t : one) dist::allreduce(t);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      BOOST_TEST(many[i].shape() == shapes[i]);
      BOOST_TEST(many[i].to_vector() == one[i].to_vector(), "tensor " << i << ", buckets of " << bucket << " bytes");
    }
  }
}

BOOST_AUTO_TEST_CASE(collectives_are_deferred_and_run_in_recording_order) {
  // Recorded now, run at the sync point: a chain of collectives, each reading
  // what the one before gave, comes out as a loop of blocking calls would.
  Tensor<double> t(std::vector<double>{1.0 + dist::rank()}, Shape{1});
  for (int i = 0; i < 20; ++i) {
    dist::allreduce(t, dist::ReduceOp::mean);
    t = t * 2.0 + double(dist::rank());
  }
  double mean = 0;  // after the first allreduce: the mean of 1..size
  for (int r = 0; r < dist::size(); ++r) mean += 1.0 + r;
  mean /= dist::size();
  for (int i = 1; i < 20; ++i) {
    double next = 0;
    for (int r = 0; r < dist::size(); ++r) next += mean * 2.0 + r;
    mean = next / dist::size();
  }
  BOOST_TEST(t.to_vector()[0] == mean * 2.0 + dist::rank(), boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(a_barrier_is_a_sync_point_of_every_rank) {
  Tensor<float> t(std::vector<float>{float(dist::rank())}, Shape{1});
  dist::allreduce(t);
  dist::barrier();
  BOOST_TEST(t.to_vector()[0] == float(dist::size() * (dist::size() - 1) / 2));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(collective_errors)

BOOST_AUTO_TEST_CASE(ranks_with_other_shapes_are_named_on_every_rank) {
  if (dist::size() < 2) return;
  auto comm = dist_test::fresh();
  // The last rank sends one element more.
  const std::int64_t n = dist::rank() == dist::size() - 1 ? 5 : 4;
  Tensor<float> t(std::vector<float>(std::size_t(n), 1.0f), Shape{n});
  dist::allreduce(t, dist::ReduceOp::sum, comm);
  BOOST_CHECK_EXCEPTION(t.wait_to_read(), dist::Error, [&](const dist::Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return mentions(e, "allreduce #0") && mentions(e, "but rank") && mentions(e, "same order");
  });
  // Later collectives on it fail with that error.
  Tensor<float> u(std::vector<float>{1.0f}, Shape{1});
  dist::allreduce(u, dist::ReduceOp::sum, comm);
  BOOST_CHECK_EXCEPTION(u.wait_to_read(), dist::Error, [](const auto& e) { return mentions(e, "allreduce #0"); });
}

// A small allreduce carries its data in the rendezvous; a peer at another
// collective must still read the announcement and name both.
BOOST_AUTO_TEST_CASE(a_small_allreduce_against_a_broadcast_is_named_on_every_rank) {
  if (dist::size() < 2) return;
  auto comm = dist_test::fresh();
  Tensor<float> t(std::vector<float>(4, 1.0f), Shape{4});
  if (dist::rank() == 0) dist::allreduce(t, dist::ReduceOp::sum, comm);
  else dist::broadcast(t, 0, comm);
  BOOST_CHECK_EXCEPTION(t.wait_to_read(), dist::Error, [](const dist::Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return mentions(e, "allreduce #0") && mentions(e, "broadcast #0") && mentions(e, "same order");
  });
}

// 16 KiB rides the rendezvous in several pieces; rank 1's 10 elements in
// one. The others must name rank 1 from its first piece, not wait for the
// pieces it never sends.
BOOST_AUTO_TEST_CASE(a_message_in_pieces_against_a_shorter_one_is_named_at_once) {
  if (dist::size() < 2) return;
  auto comm = dist_test::fresh({.timeout = std::chrono::seconds(20), .on_timeout = dist::OnTimeout::raise});
  const std::int64_t big = std::int64_t(thresholds::rendezvous_data_max_bytes / sizeof(float));
  static_assert(thresholds::rendezvous_data_max_bytes > 2 * thresholds::rendezvous_piece_bytes);
  const std::int64_t n = dist::rank() == 1 ? 10 : big;
  Tensor<float> t(std::vector<float>(std::size_t(n), 1.0f), Shape{n});
  dist::allreduce(t, dist::ReduceOp::sum, comm);
  const auto start = std::chrono::steady_clock::now();
  BOOST_CHECK_EXCEPTION(t.wait_to_read(), dist::Error, [&](const dist::Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return mentions(e, "shape (10,)") && mentions(e, "shape (" + std::to_string(big) + ",)");
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(10)));
}

BOOST_AUTO_TEST_CASE(the_same_count_in_another_shape_is_named) {
  if (dist::size() < 2) return;
  auto comm = dist_test::fresh();
  const Shape s = dist::rank() == 0 ? Shape{2, 3} : Shape{3, 2};
  Tensor<float> t(std::vector<float>(6, 1.0f), s);
  dist::allreduce(t, dist::ReduceOp::sum, comm);
  BOOST_CHECK_EXCEPTION(t.wait_to_read(), dist::Error, [](const dist::Error& e) {
    return mentions(e, "shape (2, 3)") && mentions(e, "shape (3, 2)");
  });
}

BOOST_AUTO_TEST_CASE(a_skipped_collective_is_caught_by_the_watchdog) {
  if (dist::size() < 2) return;
  auto comm = dist_test::fresh({.timeout = std::chrono::milliseconds(1500), .on_timeout = dist::OnTimeout::raise});
  Tensor<float> a(std::vector<float>{1.0f, 2.0f}, Shape{2}), b(std::vector<float>{3.0f, 4.0f}, Shape{2});
  // Rank 1 skips the first allreduce. Its second, of the same shape, pairs
  // with the others' first; their second then waits for rank 1 in vain.
  if (dist::rank() != 1) dist::allreduce(a, dist::ReduceOp::sum, comm);
  dist::allreduce(b, dist::ReduceOp::sum, comm);
  if (dist::rank() == 1) {
    b.wait_to_read();
    BOOST_TEST(b.to_vector() == (std::vector<float>{float(dist::size() - 1) * 1.0f + 3.0f, float(dist::size() - 1) * 2.0f + 4.0f}));
  } else {
    const auto start = std::chrono::steady_clock::now();
    BOOST_CHECK_EXCEPTION(b.wait_to_read(), dist::Timeout, [](const dist::Timeout& e) {
      BOOST_TEST_MESSAGE(e.what());
      return mentions(e, "allreduce #1") && mentions(e, "for rank(s) 1,") && mentions(e, "1.5 s");
    });
    BOOST_TEST((std::chrono::steady_clock::now() - start < std::chrono::seconds(20)));
    // Later collectives on it refuse at once.
    Tensor<float> c(std::vector<float>{1.0f}, Shape{1});
    dist::allreduce(c, dist::ReduceOp::sum, comm);
    BOOST_CHECK_EXCEPTION(c.wait_to_read(), dist::Error, [](const auto& e) { return mentions(e, "allreduce #1"); });
  }
  dist::barrier();  // every rank meets again on the world's communicator
}

BOOST_AUTO_TEST_SUITE_END()
