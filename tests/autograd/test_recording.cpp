// What is recorded and when: grad_req write/add/null, head gradients,
// retain_graph, pause, saved values surviving in-place writes, detach, fused
// backward passes, and every misuse raising a clear error.
#include "gradcheck.hpp"

#include <stdexcept>
#include <string>

using namespace deft;
using agt::uniform;

namespace {

std::vector<double> values(const Tensor<double>& t) { return t.to_vector(); }

bool mentions(const std::exception& e, const std::string& what) {
  return std::string(e.what()).find(what) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(recording)

BOOST_AUTO_TEST_CASE(grad_req_write_overwrites_and_add_accumulates) {
  random::seed(21);
  Tensor<double> x = uniform({5}), y = uniform({5});
  x.attach_grad();
  y.attach_grad(autograd::GradReq::add);
  for (int pass = 1; pass <= 3; ++pass) {
    autograd::record rec;
    Tensor<double> loss = sum(x * y);
    loss.backward();
  }
  const auto xv = values(x), yv = values(y), gx = values(x.grad()), gy = values(y.grad());
  for (int i = 0; i < 5; ++i) {
    BOOST_TEST(gx[i] == yv[i]);                                        // d(x.y)/dx, last pass only
    BOOST_TEST(std::abs(gy[i] - 3 * xv[i]) <= 1e-12 * std::abs(xv[i]));  // three passes added
  }
}

BOOST_AUTO_TEST_CASE(grad_req_null_leaves_the_gradient_alone) {
  Tensor<double> x = uniform({3});
  x.attach_grad(autograd::GradReq::null);
  {
    autograd::record rec;
    Tensor<double> loss = sum(x * x);
    loss.backward();
  }
  for (double g : values(x.grad())) BOOST_TEST(g == 0.0);
}

BOOST_AUTO_TEST_CASE(head_gradient_scales_the_result) {
  random::seed(22);
  Tensor<double> x = uniform({2, 3});
  Tensor<double> head = uniform({2, 3});
  x.attach_grad();
  {
    autograd::record rec;
    Tensor<double> y = x * x;
    y.backward(head);
  }
  const auto xv = values(x), hv = values(head), g = values(x.grad());
  for (int i = 0; i < 6; ++i) BOOST_TEST(std::abs(g[i] - 2 * xv[i] * hv[i]) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(the_graph_is_freed_unless_retained) {
  Tensor<double> x = uniform({4});
  x.attach_grad(autograd::GradReq::add);
  autograd::record rec;
  Tensor<double> y = sum(exp(x));
  y.backward(true);
  y.backward();  // retained once
  const auto xv = values(x), g = values(x.grad());
  for (int i = 0; i < 4; ++i) BOOST_TEST(std::abs(g[i] - 2 * std::exp(xv[i])) <= 1e-12 * std::exp(xv[i]));
  BOOST_CHECK_EXCEPTION(y.backward(), std::logic_error, [](const std::logic_error& e) {
    return mentions(e, "freed by an earlier backward()") && mentions(e, "retain_graph");
  });
}

// A value computed from one whose graph an earlier backward() freed has no
// way back to the inputs: its backward() is refused before any gradient
// changes, not run as if the inputs did not matter.
BOOST_AUTO_TEST_CASE(a_backward_through_a_freed_part_of_the_graph_is_refused) {
  Tensor<double> x = uniform({5});
  x.attach_grad();
  autograd::record rec;
  Tensor<double> h = x * 2.0;
  Tensor<double> l1 = sum(h), l2 = sum(h * h);
  l1.backward();
  const auto g1 = values(x.grad());
  for (double g : g1) BOOST_TEST(g == 2.0);
  BOOST_CHECK_EXCEPTION(l2.backward(), std::logic_error, [](const std::logic_error& e) {
    return mentions(e, "freed by an earlier backward()") && mentions(e, "retain_graph");
  });
  BOOST_TEST(values(x.grad()) == g1, boost::test_tools::per_element());
  // With the graph retained, the second pass reaches x: d/dx sum(4x^2) = 8x.
  Tensor<double> h2 = x * 2.0;
  Tensor<double> m1 = sum(h2), m2 = sum(h2 * h2);
  m1.backward(true);
  m2.backward();
  const auto xv = values(x), g2 = values(x.grad());
  for (int i = 0; i < 5; ++i) BOOST_TEST(std::abs(g2[i] - 8 * xv[i]) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(saved_values_survive_later_in_place_writes) {
  random::seed(23);
  Tensor<double> x = uniform({6}), z = uniform({6});
  x.attach_grad();
  const auto z_before = values(z);
  autograd::record rec;
  Tensor<double> y = sum(x * z);
  {
    autograd::pause p;
    z += 100.0;  // a new version of z; the recorded product keeps the old one
  }
  y.backward();
  const auto g = values(x.grad());
  for (int i = 0; i < 6; ++i) BOOST_TEST(g[i] == z_before[i]);
}

BOOST_AUTO_TEST_CASE(pause_and_detach_stop_gradients) {
  Tensor<double> x = uniform({3});
  x.attach_grad();
  autograd::record rec;
  Tensor<double> stopped;
  {
    autograd::pause p;
    BOOST_TEST(!autograd::is_recording());
    stopped = x * 5.0;
  }
  BOOST_TEST(autograd::is_recording());
  Tensor<double> y = sum(x * 2.0 + stopped + x.detach() * 7.0);
  y.backward();
  for (double g : values(x.grad())) BOOST_TEST(g == 2.0);
}

BOOST_AUTO_TEST_CASE(assignment_outside_recording_keeps_a_variable_attached) {
  Tensor<double> w = uniform({3});
  w.attach_grad();
  for (int step = 0; step < 2; ++step) {
    {
      autograd::record rec;
      Tensor<double> loss = sum(w * w);
      loss.backward();
    }
    w = w - w.grad() * 0.25;  // an SGD step: w stays a variable
  }
  BOOST_TEST(static_cast<bool>(w.grad_meta()));
  BOOST_TEST(w.grad().shape() == w.shape());
}

BOOST_AUTO_TEST_CASE(a_fused_tree_backpropagates_in_a_few_fused_tasks) {
  // y = sum(tanh(x * w + b) * x) is one fused forward task; its backward
  // costs a bounded number of tasks per leaf, not one per expression node.
  Tensor<double> x = uniform({64}), w = uniform({64}), b = uniform({64});
  for (auto* p : {&x, &w, &b}) p->attach_grad();
  autograd::record rec;
  Tensor<double> y = sum(tanh(x * w + b) * x);
  wait_all();
  const auto before = engine::stats().tasks_recorded;
  y.backward();
  wait_all();
  const auto tasks = engine::stats().tasks_recorded - before;
  // ones(), then per leaf use (4: x twice, w, b) one fused task, one add for
  // x's second use, and one delivery into grad() per variable (3).
  BOOST_TEST(tasks <= 1u + 4u + 1u + 3u);
}

BOOST_AUTO_TEST_CASE(misuse_raises_clear_errors) {
  Tensor<double> x = uniform({2, 2});
  BOOST_CHECK_EXCEPTION(x.grad(), std::logic_error, [](const std::logic_error& e) { return mentions(e, "attach_grad()"); });
  Tensor<double> unrecorded = x * 2.0;
  BOOST_CHECK_EXCEPTION(unrecorded.backward(), std::logic_error,
                        [](const std::logic_error& e) { return mentions(e, "autograd::record"); });
  x.attach_grad();
  autograd::record rec;
  Tensor<double> y = x * 3.0;
  BOOST_CHECK_EXCEPTION(y += 1.0, std::logic_error, [](const std::logic_error& e) { return mentions(e, "y = y + x"); });
  BOOST_CHECK_EXCEPTION(y.backward(uniform({3})), std::invalid_argument,
                        [](const std::invalid_argument& e) { return mentions(e, "(3,)") && mentions(e, "(2, 2)"); });
  Tensor<double> mapped = deft::map([](double v) { return v * v; }, x);
  BOOST_CHECK_EXCEPTION(sum(mapped).backward(), std::logic_error,
                        [](const std::logic_error& e) { return mentions(e, "deft::map"); });
}

// A node that throws midway leaves every gradient as it was: `a`, reached
// before the map's node in the walk, must not get its share.
BOOST_AUTO_TEST_CASE(failed_backward_changes_no_gradient) {
  Tensor<double> a = uniform({3}), b = uniform({3});
  a.attach_grad();
  b.attach_grad();
  std::vector<double> before;
  {
    autograd::record rec;
    Tensor<double> y = sum(a * a);
    y.backward();
    before = a.grad().to_vector();
  }
  autograd::record rec;
  Tensor<double> mapped = deft::map([](double v) { return v * v; }, b);
  Tensor<double> y = sum(mapped) + sum(a * 3.0);
  BOOST_CHECK_EXCEPTION(y.backward(), std::logic_error,
                        [](const std::logic_error& e) { return mentions(e, "deft::map"); });
  const auto after = a.grad().to_vector();
  BOOST_TEST(after == before, boost::test_tools::per_element());
  for (double g : b.grad().to_vector()) BOOST_TEST(g == 0.0);
}

BOOST_AUTO_TEST_SUITE_END()
