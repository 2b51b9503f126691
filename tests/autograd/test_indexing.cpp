// slice, concat, stack, one_hot, clip, softmax and log_softmax: values
// against double loops on random inputs, gradients against finite
// differences (gradcheck.hpp), and the errors for bad arguments.
#include "gradcheck.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace deft;
using agt::check_gradients;
using agt::uniform;

namespace {

using i64 = std::int64_t;

std::vector<double> as_double(const Tensor<float>& t) {
  const auto v = t.to_vector();
  return {v.begin(), v.end()};
}

// Row-major index of `at` in `shape`.
i64 flat(const Shape& shape, const std::vector<i64>& at) {
  i64 i = 0;
  for (int d = 0; d < shape.rank(); ++d) i = i * shape[d] + at[d];
  return i;
}

// Calls f(index) for every index of `shape`, in row-major order.
template <class F>
void for_each_index(const Shape& shape, F&& f) {
  std::vector<i64> at(shape.rank(), 0);
  for (i64 n = 0; n < shape.size(); ++n) {
    f(at);
    for (int d = shape.rank() - 1; d >= 0 && ++at[d] == shape[d]; --d) at[d] = 0;
  }
}

// A message check for BOOST_CHECK_EXCEPTION: the error names each part.
auto names(std::vector<std::string> parts) {
  return [parts](const std::exception& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      if (what.find(p) == std::string::npos) {
        BOOST_TEST_MESSAGE("'" << what << "' lacks '" << p << "'");
        return false;
      }
    return true;
  };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(indexing)

BOOST_AUTO_TEST_CASE(slices_along_every_axis_match_a_loop) {
  random::seed(31);
  const Shape shape{3, 4, 5};
  const Tensor<float> x = random::uniform<float>(-1, 1, shape);
  const auto xv = x.to_vector();
  for (int axis = 0; axis < 3; ++axis)
    for (const auto& range : {std::pair<i64, i64>{0, shape[axis]}, {1, 3}, {2, 2}, {shape[axis] - 1, shape[axis]}}) {
      const i64 b = range.first, e = range.second;  // (clang 14 cannot capture structured bindings)
      const Tensor<float> s = slice(x, axis, b, e);
      Shape want_shape = shape;
      want_shape[axis] = e - b;
      BOOST_TEST_CONTEXT("axis " << axis << " [" << b << ", " << e << ")") {
        BOOST_TEST(s.shape() == want_shape);
        std::vector<float> want;
        for_each_index(want_shape, [&](std::vector<i64> at) {
          at[axis] += b;
          want.push_back(xv[flat(shape, at)]);
        });
        BOOST_TEST(s.to_vector() == want, boost::test_tools::per_element());
      }
    }
  // Negative axes count from the end; along the first axis the slice is a view.
  BOOST_TEST(slice(x, -1, 1, 2).to_vector() == slice(x, 2, 1, 2).to_vector(), boost::test_tools::per_element());
  Tensor<float> y = x.clone();
  Tensor<float> rows = slice(y, 0, 1, 2);
  rows += 1.0f;
  BOOST_TEST(y.to_vector()[20] == xv[20] + 1.0f);
}

BOOST_AUTO_TEST_CASE(slices_with_steps_and_negative_bounds_match_a_loop) {
  random::seed(35);
  const Shape shape{4, 7, 5};
  const Tensor<double> x = uniform(shape);
  const auto xv = x.to_vector();
  struct Case {
    i64 begin, end, step;
  };
  for (int axis = 0; axis < 3; ++axis)
    for (const Case c : {Case{0, shape[axis], 2}, Case{1, shape[axis], 3}, Case{-3, -1, 1}, Case{-shape[axis], -1, 2},
                         Case{0, shape[axis], 100}, Case{2, 2, 2}, Case{1, -1, 2}}) {
      const i64 b = c.begin < 0 ? c.begin + shape[axis] : c.begin, e = c.end < 0 ? c.end + shape[axis] : c.end;
      const Tensor<double> s = slice(x, axis, c.begin, c.end, c.step);
      Shape want_shape = shape;
      want_shape[axis] = (e - b + c.step - 1) / c.step;
      BOOST_TEST_CONTEXT("axis " << axis << " [" << c.begin << ", " << c.end << ") step " << c.step) {
        BOOST_TEST(s.shape() == want_shape);
        std::vector<double> want;
        for_each_index(want_shape, [&](std::vector<i64> at) {
          at[std::size_t(axis)] = b + at[std::size_t(axis)] * c.step;
          want.push_back(xv[flat(shape, at)]);
        });
        BOOST_TEST(s.to_vector() == want, boost::test_tools::per_element());
      }
    }
}

BOOST_AUTO_TEST_CASE(concat_and_stack_match_a_loop) {
  random::seed(32);
  for (int axis = 0; axis < 3; ++axis) {
    Shape sa{2, 3, 4}, sb = sa, sc = sa;
    sb[axis] = 1;
    sc[axis] = 3;
    const Tensor<double> a = uniform(sa), b = uniform(sb), c = uniform(sc);
    const Tensor<double> j = concat({a, b, c}, axis);
    Shape sj = sa;
    sj[axis] = sa[axis] + 1 + 3;
    BOOST_TEST_CONTEXT("concat along axis " << axis) {
      BOOST_TEST(j.shape() == sj);
      const auto av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector(), jv = j.to_vector();
      for_each_index(sj, [&](std::vector<i64> at) {
        const double got = jv[flat(sj, at)];
        double want;
        if (at[axis] < sa[axis]) want = av[flat(sa, at)];
        else if (at[axis] < sa[axis] + 1) at[axis] -= sa[axis], want = bv[flat(sb, at)];
        else at[axis] -= sa[axis] + 1, want = cv[flat(sc, at)];
        BOOST_TEST(got == want);
      });
    }
  }
  const Tensor<float> p = random::uniform<float>(-1, 1, Shape{3, 4}), q = random::uniform<float>(-1, 1, Shape{3, 4});
  for (int axis : {0, 1, 2, -1}) {
    const Tensor<float> s = stack(std::vector<Tensor<float>>{p, q}, axis);
    const int a = axis < 0 ? 2 : axis;
    Shape want_shape{3, 4};
    std::vector<std::int64_t> dims{3, 4};
    dims.insert(dims.begin() + a, 2);
    BOOST_TEST_CONTEXT("stack along axis " << axis) {
      BOOST_TEST(s.shape() == Shape(dims));
      const auto sv = s.to_vector(), pv = p.to_vector(), qv = q.to_vector();
      for_each_index(s.shape(), [&](std::vector<i64> at) {
        const i64 which = at[a];
        at.erase(at.begin() + a);
        BOOST_TEST(sv[flat(s.shape(), [&] { auto full = at; full.insert(full.begin() + a, which); return full; }())] ==
                   (which ? qv : pv)[flat(want_shape, at)]);
      });
    }
  }
}

BOOST_AUTO_TEST_CASE(gradients_of_slices_joins_softmax_and_clip) {
  random::seed(33);
  Tensor<double> x = uniform({3, 4, 2}), y = uniform({3, 2, 2});
  const Tensor<double> w = uniform({3, 3, 2}), wc = uniform({3, 10, 2}), ws = uniform({3, 2, 2, 2}), wx = uniform({3, 4, 2});
  // A copy (a middle axis) and views (the first axis).
  check_gradients({&x}, [&] { return Tensor<double>(sum(slice(x, 1, 1, 4) * w)); });
  check_gradients({&x}, [&] { return Tensor<double>(sum(slice(x, 0, 1, 3) * exp(slice(x, 0, 0, 2)))); });
  // Steps and negative bounds: every step-th element gets the upstream gradient, the rest none.
  check_gradients({&x}, [&] { return Tensor<double>(sum(exp(slice(x, 1, 0, -1, 2)) * slice(x, -2, -3, 4, 2))); });
  check_gradients({&x, &y}, [&] { return Tensor<double>(sum(tanh(concat({x, y, x}, 1)) * wc)); });
  check_gradients({&x, &y}, [&] { return Tensor<double>(sum(stack({slice(x, 1, 0, 2), y}, 3) * ws)); });
  // A part without a gradient is skipped; the others still get theirs.
  const Tensor<double> constant = uniform({3, 1, 2});
  check_gradients({&y}, [&] { return Tensor<double>(sum(exp(concat({constant, y}, 1)))); });
  for (int axis = 0; axis < 3; ++axis) {
    BOOST_TEST_CONTEXT("axis " << axis) {
      check_gradients({&x}, [&] { return Tensor<double>(sum(softmax(x * 3.0, axis) * wx)); });
      check_gradients({&x}, [&] { return Tensor<double>(sum(log_softmax(x * 3.0, axis) * wx)); });
    }
  }
  check_gradients({&x}, [&] { return Tensor<double>(sum(clip(x * 2.0, -0.5, 0.7) * wx)); });
}

BOOST_AUTO_TEST_CASE(softmax_matches_a_double_loop_far_from_zero) {
  random::seed(34);
  const i64 rows = 6, cols = 37;
  // Scores up to +-80: exp overflows float without the shift by the maximum.
  const Tensor<float> x = random::uniform<float>(-80, 80, Shape{rows, cols});
  const auto xv = x.to_vector();
  for (int axis : {0, 1}) {
    const Tensor<float> s = softmax(x, axis), ls = log_softmax(x, axis);
    std::vector<double> want_s(xv.size()), want_ls(xv.size());
    const i64 outer = axis == 0 ? cols : rows, n = axis == 0 ? rows : cols;
    for (i64 o = 0; o < outer; ++o) {
      auto at = [&](i64 k) { return axis == 0 ? k * cols + o : o * cols + k; };
      double m = -INFINITY, total = 0;
      for (i64 k = 0; k < n; ++k) m = std::max(m, double(xv[at(k)]));
      for (i64 k = 0; k < n; ++k) total += std::exp(double(xv[at(k)]) - m);
      for (i64 k = 0; k < n; ++k) {
        want_s[at(k)] = std::exp(double(xv[at(k)]) - m) / total;
        want_ls[at(k)] = double(xv[at(k)]) - m - std::log(total);
      }
    }
    const auto got_s = as_double(s), got_ls = as_double(ls);
    BOOST_TEST_CONTEXT("axis " << axis) {
      for (std::size_t i = 0; i < xv.size(); ++i) {
        // x - m rounds to float: a relative error of 2^-24 |x - m| in exp(x - m).
        const double rel = 2e-6 + 0x1p-23 * std::abs(want_ls[i]);
        BOOST_TEST(std::abs(got_s[i] - want_s[i]) <= rel * want_s[i] + 1e-37, "softmax [" << i << "]");
        BOOST_TEST(std::abs(got_ls[i] - want_ls[i]) <= 2e-6 * std::max(1.0, std::abs(want_ls[i])), "log_softmax [" << i << "]");
      }
    }
  }
  // A NaN makes its own slice NaN, and only that one.
  Tensor<float> z = Tensor<float>(std::vector<float>{1, NAN, 2, 3}, Shape{2, 2});
  const auto zs = softmax(z, 1).to_vector();
  BOOST_TEST((std::isnan(zs[0]) && std::isnan(zs[1]) && !std::isnan(zs[2]) && !std::isnan(zs[3])));
}

// The innermost axis on the CPU is one row kernel: rows of several SIMD
// batches plus a tail, rows split between workers, rank 3, and a row view
// (an offset into its storage), each against a double loop.
BOOST_AUTO_TEST_CASE(softmax_along_the_last_axis_matches_a_double_loop) {
  random::seed(36);
  const Tensor<float> big = random::uniform<float>(-20, 20, Shape{64, 3000});
  const Tensor<float> cases[] = {random::uniform<float>(-20, 20, Shape{3, 5, 300}), big,
                                 Tensor<float>(big.rows(5, 9)), random::uniform<float>(-20, 20, Shape{1, 1})};
  for (const Tensor<float>& x : cases) {
    const auto xv = x.to_vector();
    const i64 cols = x.shape()[x.shape().rank() - 1], rows = x.size() / cols;
    const auto got_s = as_double(softmax(x)), got_ls = as_double(log_softmax(x, x.shape().rank() - 1));
    BOOST_TEST_CONTEXT("shape " << x.shape().to_string()) {
      for (i64 r = 0; r < rows; ++r) {
        const float* row = xv.data() + r * cols;
        double m = -INFINITY, total = 0;
        for (i64 k = 0; k < cols; ++k) m = std::max(m, double(row[k]));
        for (i64 k = 0; k < cols; ++k) total += std::exp(double(row[k]) - m);
        for (i64 k = 0; k < cols; ++k) {
          const i64 i = r * cols + k;
          const double want_s = std::exp(double(row[k]) - m) / total, want_ls = double(row[k]) - m - std::log(total);
          // x - m rounds to float (2^-24 |x - m| relative in exp), and a
          // float sum of up to 3000 terms adds a few 1e-7.
          BOOST_TEST(std::abs(got_s[i] - want_s) <= (3e-6 + 0x1p-23 * std::abs(want_ls)) * want_s + 1e-37,
                     "softmax [" << i << "]");
          BOOST_TEST(std::abs(got_ls[i] - want_ls) <= 2e-6 * std::max(1.0, std::abs(want_ls)), "log_softmax [" << i << "]");
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(one_hot_and_clip_match_a_loop) {
  std::mt19937 gen(35);
  std::uniform_int_distribution<std::int64_t> pick(0, 6);
  std::vector<std::int64_t> idx(4 * 3);
  for (auto& i : idx) i = pick(gen);
  const Tensor<double> h = one_hot<double>(Tensor<std::int64_t>(idx, Shape{4, 3}), 7);
  BOOST_TEST(h.shape() == Shape({4, 3, 7}));
  const auto hv = h.to_vector();
  for (std::size_t i = 0; i < idx.size(); ++i)
    for (std::int64_t k = 0; k < 7; ++k) BOOST_TEST(hv[i * 7 + k] == (idx[i] == k ? 1.0 : 0.0));
  idx[5] = 7;
  BOOST_CHECK_EXCEPTION(one_hot(Tensor<std::int64_t>(idx, Shape{4, 3}), 7).to_vector(), std::out_of_range,
                        names({"one_hot", "index 7", "[0, 7)"}));
  try {
    wait_all();  // deferred: the failure is reported once more there, then cleared
  } catch (const std::out_of_range&) {
  }

  random::seed(36);
  const Tensor<float> x = random::uniform<float>(-2, 2, Shape{5, 9});
  const auto xv = x.to_vector();
  const auto cv = Tensor<float>(clip(x, -0.5f, 1.25f)).to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) BOOST_TEST(cv[i] == std::min(std::max(xv[i], -0.5f), 1.25f));
  // At the bounds the gradient passes (PyTorch's clamp), outside it does not.
  Tensor<float> b(std::vector<float>{-1, -0.5f, 0, 1.25f, 2}, Shape{5});
  b.attach_grad();
  {
    autograd::record r;
    Tensor<float> loss = sum(clip(b, -0.5f, 1.25f) * 3.0f);
    loss.backward();
  }
  BOOST_TEST(b.grad().to_vector() == std::vector<float>({0, 3, 3, 3, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_named_before_any_work) {
  const Tensor<float> x = zeros<float>(Shape{2, 3, 4}), y = zeros<float>(Shape{2, 5, 4});
  BOOST_CHECK_EXCEPTION(slice(x, 1, 2, 4), std::invalid_argument, names({"slice", "[2, 4)", "axis 1", "(2, 3, 4)"}));
  BOOST_CHECK_EXCEPTION(slice(x, 1, 2, 1), std::invalid_argument, names({"slice", "[2, 1)"}));
  BOOST_CHECK_EXCEPTION(slice(x, 3, 0, 1), std::invalid_argument, names({"slice", "axis 3"}));
  BOOST_CHECK_EXCEPTION(slice(x, 1, 0, 3, 0), std::invalid_argument, names({"slice", "step 0", "at least 1"}));
  BOOST_CHECK_EXCEPTION(slice(x, 2, -5, 4), std::invalid_argument, names({"slice", "[-5, 4)", "count from the end"}));
  BOOST_CHECK_EXCEPTION(concat({x, y}, 2), std::invalid_argument, names({"concat", "tensor 1", "(2, 5, 4)", "(2, 3, 4)"}));
  BOOST_CHECK_EXCEPTION(concat({x, zeros<float>(Shape{2, 3})}, 0), std::invalid_argument, names({"concat", "tensor 1", "(2, 3)"}));
  BOOST_CHECK_EXCEPTION(concat({x, zeros<float>(Shape{2, 3, 4}, cpu(1))}, 0), std::invalid_argument,
                        names({"concat", "tensor 1", "cpu(1)", "cpu(0)"}));
  BOOST_CHECK_EXCEPTION(concat(std::vector<Tensor<float>>{}, 0), std::invalid_argument, names({"concat", "no tensors"}));
  BOOST_CHECK_EXCEPTION(stack({x, y}, 0), std::invalid_argument, names({"stack", "tensor 1", "(2, 5, 4)"}));
  BOOST_CHECK_EXCEPTION(stack({x, x}, 4), std::invalid_argument, names({"stack", "axis 4"}));
  BOOST_CHECK_EXCEPTION(clip(x, 1.0f, -1.0f), std::invalid_argument, names({"clip", "1", "-1"}));
  BOOST_CHECK_EXCEPTION(one_hot(zeros<std::int64_t>(Shape{3}), 0), std::invalid_argument, names({"one_hot", "depth"}));
  BOOST_CHECK_EXCEPTION(softmax(x, 3), std::invalid_argument, names({"axis 3"}));
}

BOOST_AUTO_TEST_SUITE_END()
