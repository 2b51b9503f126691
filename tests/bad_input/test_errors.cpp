// Mistakes in the program: wrong shapes, axes, ranks, arguments, devices,
// empty handles and impossible sizes. Each must throw a specific exception
// naming the problem from the statement that makes it (record time), leave
// earlier work intact and the engine working. Huge allocations that fit
// size_t fail at the sync point with std::bad_alloc instead.
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>

#include "bad_input.hpp"

using namespace bad;

namespace {

const i64 kHuge46 = i64(1) << 46;  // 2^46 floats = 256 TiB: fits size_t, can never be allocated

std::string print(const Tensor<float>& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(bad_arguments, DeferredFixture)

BOOST_AUTO_TEST_CASE(constructors_and_shapes) {
  Witness w;
  std::vector<Case> cases = {
      {"Tensor: too few values", [] { Tensor<float>({1, 2, 3}, Shape{2, 2}); }, {"Tensor(values, shape)", "3 values", "(2, 2)"}},
      {"Tensor: too many values", [] { Tensor<std::int32_t>({1, 2, 3}, Shape{2}); }, {"3 values", "(2,)"}},
      {"Tensor: values for an empty shape", [] { Tensor<double>({1}, Shape{0, 3}); }, {"1 values", "(0, 3)"}},
      {"Shape: negative extent", [] { Tensor<float>({1}, Shape{-1}); }, {"negative extent -1"}},
      {"Shape: rank 9", [] { (void)Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}; }, {"rank", "maximum of 8"}},
      {"Shape: rank 9 from a vector", [] { (void)Shape(std::vector<i64>(9, 2)); }, {"rank", "maximum of 8"}},
      {"full: negative extent", [] { (void)deft::full<float>({2, -3}, 1.f); }, {"negative extent -3"}},
      {"zeros: negative extent", [] { (void)deft::zeros<double>({-2}); }, {"negative extent -2"}},
      {"ones: rank 9", [] { (void)deft::ones({1, 2, 1, 2, 1, 2, 1, 2, 1}); }, {"maximum of 8"}},
  };
  run_table<std::invalid_argument>(cases);
  w.check("constructors");
}

BOOST_AUTO_TEST_CASE(views_item_and_writes) {
  Witness w;
  const Tensor<float> m = make<float>({0, 1, 2, 3, 4, 5}, Shape{3, 2});
  const Tensor<float> s = make<float>({7}, Shape{});
  const Tensor<float> v3 = make<float>({1, 2, 3}, Shape{3});
  const Tensor<float> v4 = make<float>({1, 2, 3, 4}, Shape{4});
  const Tensor<float> m23 = make<float>({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor<float> t3 = make<float>({1, 2, 3}, Shape{3});
  Tensor<float> t32 = m.clone();
  t32.wait_to_read();
  std::vector<Case> cases = {
      {"rows: end < begin", [&] { (void)m.rows(2, 1); }, {"rows(2, 1)", "out of range", "(3, 2)"}},
      {"rows: negative begin", [&] { (void)m.rows(-1, 1); }, {"rows(-1, 1)", "(3, 2)"}},
      {"rows: end past the extent", [&] { (void)m.rows(0, 4); }, {"rows(0, 4)", "(3, 2)"}},
      {"rows: of a view, past the view", [&] { (void)m.rows(1, 3).rows(0, 3); }, {"rows(0, 3)", "(2, 2)"}},
      {"rows: of a scalar", [&] { (void)s.rows(0, 1); }, {"rows(0, 1)", "scalar"}},
      {"reshape: wrong element count", [&] { (void)m.reshape({4, 2}); }, {"reshape", "(3, 2)", "6 elements", "(4, 2)"}},
      {"reshape: -1 cannot be inferred", [&] { (void)m.reshape({-1, 4}); }, {"reshape", "-1", "(3, 2)"}},
      {"reshape: -1 next to a zero extent", [&] { (void)m.reshape({-1, 0}); }, {"reshape", "-1"}},
      {"reshape: two -1", [&] { (void)m.reshape({-1, -1}); }, {"reshape", "invalid extent -1"}},
      {"reshape: extent -2", [&] { (void)m.reshape({-2, -3}); }, {"reshape", "invalid extent -2"}},
      {"reshape: rank 9", [&] { (void)m.reshape({1, 1, 1, 1, 1, 1, 1, 3, 2}); }, {"maximum of 8"}},
      {"item: six elements", [&] { (void)m.item(); }, {"item()", "one element", "(3, 2)"}},
      {"item: no element", [&] { (void)m.rows(1, 1).item(); }, {"item()", "(0, 2)"}},
      {"assign: incompatible shape", [&] { t32.assign(v4); }, {"cannot broadcast", "assign", "(4,)", "(3, 2)"}},
      {"assign: a larger value", [&] { t3.assign(m23); }, {"assign", "(2, 3)", "(3,)"}},
      {"+=: result larger than the tensor", [&] { t3 += m23; }, {"+=", "(2, 3)", "(3,)"}},
      {"-=: incompatible", [&] { t3 -= v4; }, {"cannot broadcast", "(3,)", "(4,)"}},
      {"*=: result larger than the tensor", [&] { t3 *= m23; }, {"*=", "(2, 3)", "(3,)"}},
      {"/=: incompatible", [&] { t32 /= m23; }, {"cannot broadcast", "(3, 2)", "(2, 3)"}},
      {"+=: through a view", [&] { Tensor<float> r = t32.rows(0, 1); r += v3; }, {"cannot broadcast", "(1, 2)", "(3,)"}},
  };
  run_table<std::invalid_argument>(cases);
  // The tensors written to are unchanged.
  check_tensor(t3, {3}, {1, 2, 3}, 0, 0, "t3 after failed writes");
  check_tensor(t32, {3, 2}, {0, 1, 2, 3, 4, 5}, 0, 0, "t32 after failed writes");
  w.check("views and writes");
}

BOOST_AUTO_TEST_CASE(broadcasting_mismatches) {
  Witness w;
  const Tensor<float> a = make<float>(std::vector<float>(6, 1), Shape{2, 3});
  const Tensor<float> b = make<float>(std::vector<float>(4, 1), Shape{4});
  const Tensor<float> c = make<float>(std::vector<float>(6, 1), Shape{3, 2});
  using Bin = std::function<void(const Tensor<float>&, const Tensor<float>&)>;
  const std::vector<std::pair<std::string, Bin>> ops = {
      {"+", [](auto& x, auto& y) { (void)(x + y); }},
      {"-", [](auto& x, auto& y) { (void)(x - y); }},
      {"*", [](auto& x, auto& y) { (void)(x * y); }},
      {"/", [](auto& x, auto& y) { (void)(x / y); }},
      {"<", [](auto& x, auto& y) { (void)(x < y); }},
      {"<=", [](auto& x, auto& y) { (void)(x <= y); }},
      {">", [](auto& x, auto& y) { (void)(x > y); }},
      {">=", [](auto& x, auto& y) { (void)(x >= y); }},
      {"==", [](auto& x, auto& y) { (void)(x == y); }},
      {"!=", [](auto& x, auto& y) { (void)(x != y); }},
      {"maximum", [](auto& x, auto& y) { (void)deft::maximum(x, y); }},
      {"minimum", [](auto& x, auto& y) { (void)deft::minimum(x, y); }},
      {"pow", [](auto& x, auto& y) { (void)deft::pow(x, y); }},
  };
  std::vector<Case> cases;
  for (const auto& [name, op_ref] : ops) {
    const auto op = op_ref;  // clang 14 cannot capture a structured binding
    cases.push_back({name + " (2,3) (4,)", [&, op] { op(a, b); }, {"cannot broadcast", name, "(2, 3)", "(4,)"}});
    cases.push_back({name + " (2,3) (3,2)", [&, op] { op(a, c); }, {"cannot broadcast", name, "(2, 3)", "(3, 2)"}});
  }
  // Inside a larger expression: still at once, nothing recorded.
  cases.push_back({"nested +", [&] { (void)(deft::exp(a) * 2 + (b + 1)); }, {"cannot broadcast", "+", "(2, 3)", "(4,)"}});
  cases.push_back({"nested pow", [&] { (void)deft::pow(deft::sqrt(a), -b); }, {"cannot broadcast", "pow", "(2, 3)", "(4,)"}});
  cases.push_back({"nested <", [&] { (void)(deft::where(a > 0, a, 1.f) < deft::abs(b)); }, {"cannot broadcast", "<", "(2, 3)", "(4,)"}});
  cases.push_back({"where: values", [&] { (void)deft::where(a, a, b); }, {"cannot broadcast", "where", "(2, 3)", "(4,)"}});
  cases.push_back({"where: condition", [&] { (void)deft::where(b, a, 0.f); }, {"cannot broadcast", "where", "(4,)", "(2, 3)"}});
  cases.push_back({"where: scalars, bad cond", [&] { (void)deft::where(c, a, 1.f); }, {"where", "(3, 2)", "(2, 3)"}});
  cases.push_back({"Tensor c = a + b", [&] { Tensor<float> r = a + b; }, {"cannot broadcast", "+", "(2, 3)", "(4,)"}});
  cases.push_back({"cast then +", [&] { (void)(deft::cast<double>(a) + deft::cast<double>(b)); }, {"(2, 3)", "(4,)"}});
  cases.push_back({"map then *", [&] { (void)(deft::map([](float v) { return v; }, a) * b); }, {"(2, 3)", "(4,)"}});
  run_table<std::invalid_argument>(cases);
  w.check("broadcasting");
}

BOOST_AUTO_TEST_CASE(reduction_axes_and_empty_tensors) {
  Witness w;
  const Tensor<float> m = make<float>(std::vector<float>(6, 1), Shape{2, 3});
  const Tensor<float> s = make<float>({5}, Shape{});
  const Tensor<float> e = deft::zeros({0});
  const Tensor<float> e30 = deft::zeros({3, 0});
  const Tensor<std::int32_t> ei = deft::zeros<std::int32_t>({0, 4});
  using Red = std::function<void(const Tensor<float>&, int)>;
  const std::vector<std::pair<std::string, Red>> reds = {
      {"sum", [](auto& x, int a) { (void)deft::sum(x, a); }},   {"mean", [](auto& x, int a) { (void)deft::mean(x, a); }},
      {"max", [](auto& x, int a) { (void)deft::max(x, a); }},   {"min", [](auto& x, int a) { (void)deft::min(x, a); }},
      {"norm", [](auto& x, int a) { (void)deft::norm(x, a, true); }}, {"argmax", [](auto& x, int a) { (void)deft::argmax(x, a); }},
      {"softmax", [](auto& x, int a) { (void)deft::softmax(x, a); }},
      {"log_softmax", [](auto& x, int a) { (void)deft::log_softmax(x, a); }},
  };
  std::vector<Case> cases;
  for (const auto& [name, r_ref] : reds) {
    const auto r = r_ref;  // clang 14 cannot capture a structured binding
    cases.push_back({name + " axis 2", [&, r] { r(m, 2); }, {name, "axis 2", "rank 2"}});
    cases.push_back({name + " axis -3", [&, r] { r(m, -3); }, {name, "axis -3", "rank 2"}});
    cases.push_back({name + " axis 0 of a scalar", [&, r] { r(s, 0); }, {name, "axis 0", "rank 0"}});
  }
  cases.push_back({"sum of an expression, axis 5", [&] { (void)deft::sum(m * 2 + 1, 5); }, {"sum", "axis 5"}});
  cases.push_back({"mean of an expression, axis -4", [&] { (void)deft::mean(deft::exp(m), -4, true); }, {"mean", "axis -4"}});
  cases.push_back({"argmax of an expression, axis 2", [&] { (void)deft::argmax(m - 1, 2); }, {"argmax", "axis 2"}});
  cases.push_back({"max of an empty tensor", [&] { (void)deft::max(e); }, {"max", "empty", "(0,)"}});
  cases.push_back({"min of an empty tensor", [&] { (void)deft::min(e30); }, {"min", "empty", "(3, 0)"}});
  cases.push_back({"max of an empty int tensor", [&] { (void)deft::max(ei); }, {"max", "empty", "(0, 4)"}});
  cases.push_back({"max over an empty axis", [&] { (void)deft::max(e30, 1); }, {"max", "(3, 0)", "axis 1"}});
  cases.push_back({"min over an empty axis (-1)", [&] { (void)deft::min(e30, -1, true); }, {"min", "(3, 0)", "axis 1"}});
  cases.push_back({"argmax of an empty tensor", [&] { (void)deft::argmax(e); }, {"argmax", "empty", "(0,)"}});
  cases.push_back({"argmax over an empty axis", [&] { (void)deft::argmax(e30, 1); }, {"argmax", "axis 1", "(3, 0)"}});
  cases.push_back({"argmax of an empty expression", [&] { (void)deft::argmax(e30 * 2); }, {"argmax", "(3, 0)"}});
  run_table<std::invalid_argument>(cases);

  // Empty tensors where numpy defines a result: no error.
  check_tensor(deft::sum(e), {}, {0}, 0, 0, "sum of empty");
  check_tensor(deft::norm(e30), {}, {0}, 0, 0, "norm of empty");
  check_tensor(deft::mean(e), {}, {std::numeric_limits<double>::quiet_NaN()}, 0, 0, "mean of empty is NaN");
  check_tensor(deft::sum(e30, 1), {3}, {0, 0, 0}, 0, 0, "sum over an empty axis");
  check_tensor(deft::mean(e30, 1), {3}, std::vector<double>(3, std::nan("")), 0, 0, "mean over an empty axis");
  check_tensor(deft::sum(ei, 0), {4}, {0, 0, 0, 0}, 0, 0, "int sum over an empty axis");
  check_tensor(deft::max(e30, 0), {0}, {}, 0, 0, "max along a non-empty axis of an empty tensor");
  check_tensor(deft::argmax(ei, 1), {0}, {}, 0, 0, "argmax along a non-empty axis of an empty tensor");
  check_tensor(deft::softmax(e30, 1), {3, 0}, {}, 0, 0, "softmax over an empty axis");
  check_tensor(deft::log_softmax(e30, 0), {3, 0}, {}, 0, 0, "log_softmax along a non-empty axis of an empty tensor");
  w.check("reductions");
}

BOOST_AUTO_TEST_CASE(products_and_transposes) {
  Witness w;
  auto t = [](std::vector<i64> d) { return deft::zeros(shape_of(d)); };
  const Tensor<float> s = t({}), v3 = t({3}), v4 = t({4}), m23 = t({2, 3}), m42 = t({4, 2}), m34 = t({3, 4});
  const Tensor<float> b234 = t({2, 3, 4}), b345 = t({3, 4, 5}), b245 = t({2, 4, 5}), r4 = t({1, 2, 3, 4});
  deft::wait_all();
  engine::reset_stats();
  std::vector<Case> cases = {
      {"dot (2,3)(4,2)", [&] { (void)deft::dot(m23, m42); }, {"dot", "inner extents differ", "(2, 3)", "3 columns", "(4, 2)", "4 rows"}},
      {"dot (3)(4)", [&] { (void)deft::dot(v3, v4); }, {"dot", "(3,)", "(4,)"}},
      {"dot (2,3)(4)", [&] { (void)deft::dot(m23, v4); }, {"dot", "(2, 3)", "(4,)"}},
      {"dot (4)(2,3)", [&] { (void)deft::dot(v4, m23); }, {"dot", "(4,)", "(2, 3)"}},
      {"dot scalar", [&] { (void)deft::dot(s, v3); }, {"dot", "cannot multiply", "()", "(3,)"}},
      {"dot rank 4", [&] { (void)deft::dot(r4, m42); }, {"dot", "cannot multiply", "(1, 2, 3, 4)"}},
      {"dot (3)(2,3,4)", [&] { (void)deft::dot(v3, b234); }, {"dot", "cannot multiply", "(3,)", "(2, 3, 4)"}},
      {"dot batch mismatch", [&] { (void)deft::dot(b234, b345); }, {"dot", "batch extents differ", "(2, 3, 4)", "(3, 4, 5)"}},
      {"dot batched inner", [&] { (void)deft::dot(b234, b234); }, {"dot", "inner extents differ"}},
      {"matmul (2,3)(2,3)", [&] { (void)deft::matmul(m23, m23); }, {"inner extents differ", "(2, 3)"}},
      {"transpose: too few axes", [&] { (void)deft::transpose(m23, {0}); }, {"transpose", "1 axes", "(2, 3)"}},
      {"transpose: too many axes", [&] { (void)deft::transpose(v3, {0, 1}); }, {"transpose", "2 axes", "(3,)"}},
      {"transpose: repeated axis", [&] { (void)deft::transpose(b234, {0, 2, 0}); }, {"transpose", "axis 0 repeated", "(2, 3, 4)"}},
      {"transpose: repeated via -1", [&] { (void)deft::transpose(m23, {1, -1}); }, {"transpose", "repeated"}},
      {"transpose: axis out of range", [&] { (void)deft::transpose(m23, {0, 2}); }, {"transpose", "axis 2", "rank 2"}},
  };
  run_table<std::invalid_argument>(cases);
  // An expression operand is evaluated into its own task; a shape error must
  // still come first, before anything is recorded.
  expect_record_error<std::invalid_argument>([&] { (void)deft::dot(m23 + 1, m42 * 2); }, {"dot", "(2, 3)", "(4, 2)"},
                                            "dot of expressions");
  expect_record_error<std::invalid_argument>([&] { (void)deft::transpose(m23 * 2, {1, 1}); }, {"transpose", "repeated"},
                                            "transpose of an expression");
  // Edge shapes that are valid.
  check_tensor(deft::dot(t({2, 0}), t({0, 3})), {2, 3}, std::vector<double>(6, 0), 0, 0, "dot with k = 0");
  // Valid operands (no elements) whose product has more elements than 64 bits count.
  const Tensor<float> tall = t({i64(1) << 40, 0}), wide = t({0, i64(1) << 40});
  expect_record_error<std::length_error>([&] { (void)deft::dot(tall, wide); },
                                         {"(1099511627776, 1099511627776)", "64 bits"}, "dot of 2^80 elements");
  check_tensor(deft::dot(t({0, 3}), m34), {0, 4}, {}, 0, 0, "dot with m = 0");
  check_tensor(deft::transpose(s), {}, {0}, 0, 0, "transpose of a scalar");
  (void)b245;
  w.check("products");
}

// A number that does not fit an integer tensor's type would wrap around
// (x < 3000000000 on int32 would compare with -1294967296): refused.
BOOST_AUTO_TEST_CASE(integer_numbers_that_do_not_fit_the_tensor) {
  Witness w;
  const Tensor<std::int32_t> i32({5, -7}, Shape{2});
  const Tensor<std::int64_t> i64t({5, -7}, Shape{2});
  deft::wait_all();
  engine::reset_stats();
  std::vector<Case> cases = {
      {"int32 < 3e9", [&] { (void)(i32 < 3000000000LL); }, {"3000000000", "does not fit", "int32"}},
      {"int32 + 3e9", [&] { (void)(i32 + 3000000000LL); }, {"3000000000", "int32"}},
      {"int32 * -2^40", [&] { (void)(-(i64(1) << 40) * i32); }, {"-1099511627776", "int32"}},
      {"int64 - 2^64 - 1", [&] { (void)(i64t - std::numeric_limits<std::uint64_t>::max()); }, {"18446744073709551615", "int64"}},
      {"where int32", [&] { (void)deft::where(i32 > 0, i32, 5000000000LL); }, {"5000000000", "int32"}},
  };
  run_table<std::invalid_argument>(cases);
  // Numbers that fit, of any integer type, still work.
  check_tensor(Tensor<std::int32_t>(i32 + 2147483640LL), {2}, {2147483645.0, 2147483633.0}, 0, 0, "int32 + a long long that fits");
  check_tensor(Tensor<std::int64_t>(i64t * 4000000000u), {2}, {2e10, -2.8e10}, 0, 0, "int64 * an unsigned that fits");
  check_tensor(Tensor<std::int32_t>(i32 == char(5)), {2}, {1, 0}, 0, 0, "int32 == a char");
  w.check("integer numbers");
}

BOOST_AUTO_TEST_CASE(creation_and_random_arguments) {
  Witness w;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  std::vector<Case> cases = {
      {"arange: step 0", [] { (void)deft::arange<float>(0.f, 5.f, 0.f); }, {"arange", "step", "zero"}},
      {"arange<int32>: step 0", [] { (void)deft::arange<std::int32_t>(0, 5, 0); }, {"arange", "zero"}},
      {"arange: NaN stop", [] { (void)deft::arange<float>(0.f, float(NAN)); }, {"arange", "stop nan"}},
      {"arange: infinite stop", [&] { (void)deft::arange<double>(0, inf); }, {"arange", "stop inf"}},
      {"arange: NaN step", [&] { (void)deft::arange<double>(0, 1, nan); }, {"arange", "step nan"}},
      {"uniform: lo == hi", [] { (void)deft::random::uniform<float>(1, 1, {3}); }, {"random::uniform", "lo < hi", "lo = 1", "hi = 1"}},
      {"uniform: lo > hi", [] { (void)deft::random::uniform<double>(2, -1, {3}); }, {"random::uniform", "lo = 2", "hi = -1"}},
      {"uniform: NaN lo", [&] { (void)deft::random::uniform<float>(nan, 1, {3}); }, {"random::uniform", "nan"}},
      {"uniform: infinite hi", [&] { (void)deft::random::uniform<float>(0, inf, {3}); }, {"random::uniform", "finite", "inf"}},
      {"uniform: infinite range", [&] { (void)deft::random::uniform<double>(-1e308, 1e308, {3}); }, {"random::uniform", "finite"}},
      {"uniform<int32>: beyond int32", [] { (void)deft::random::uniform<std::int32_t>(-1e10, 1e10, {3}); }, {"uniform<int32>", "range of int32"}},
      {"uniform<int32>: hi = 2^31 + 1", [] { (void)deft::random::uniform<std::int32_t>(0, 2147483649.0, {3}); }, {"int32"}},
      {"uniform<int64>: lo below int64", [] { (void)deft::random::uniform<std::int64_t>(-1e19, 0, {3}); }, {"int64"}},
      {"normal: negative stddev", [] { (void)deft::random::normal<float>(0, -1, {3}); }, {"random::normal", "standard deviation", "-1"}},
      {"normal: NaN stddev", [&] { (void)deft::random::normal<double>(0, nan, {3}); }, {"random::normal", "nan"}},
      {"normal: infinite stddev", [&] { (void)deft::random::normal<float>(0, inf, {3}); }, {"random::normal", "finite", "inf"}},
      {"normal: NaN mean", [&] { (void)deft::random::normal<float>(nan, 1, {3}); }, {"random::normal", "mean = nan"}},
      {"uniform: negative extent", [] { (void)deft::random::uniform<float>(0, 1, {-4}); }, {"negative extent -4"}},
      {"uniform<float32>: beyond float", [] { (void)deft::random::uniform<float>(1e39, 2e39, {3}); }, {"uniform<float32>", "range of float32"}},
      {"normal<float32>: mean beyond float", [] { (void)deft::random::normal<float>(1e39, 1, {3}); }, {"normal<float32>", "range of float32"}},
  };
  run_table<std::invalid_argument>(cases);
  // Valid corner cases: empty ranges, hi at the top of int32, zero stddev.
  check_tensor(deft::arange<float>(5.f, 0.f), {0}, {}, 0, 0, "arange(5, 0) is empty");
  check_tensor(deft::arange<std::int32_t>(0, 5, -1), {0}, {}, 0, 0, "arange(0, 5, -1) is empty");
  check_tensor(deft::arange<std::int64_t>(3, -3, -2), {3}, {3, 1, -1}, 0, 0, "arange with a negative step");
  const auto top = deft::random::uniform<std::int32_t>(2147483646.0, 2147483648.0, {1000}).to_vector();
  BOOST_TEST(std::count(top.begin(), top.end(), 2147483647) > 0);
  BOOST_TEST(std::all_of(top.begin(), top.end(), [](std::int32_t v) { return v >= 2147483646; }));
  const auto top64 = deft::random::uniform<std::int64_t>(-9.2233720368547758e18, 9.2233720368547758e18, {1000}).to_vector();
  BOOST_TEST(top64.size() == 1000u);  // converted without overflow (UBSan would flag it)
  // A rejected call does not shift the numbers of later calls.
  deft::random::seed(11);
  const auto a = deft::random::uniform<float>(0, 1, {64}).to_vector();
  deft::random::seed(11);
  BOOST_CHECK_THROW(deft::random::uniform<float>(1, 0, {64}), std::invalid_argument);
  BOOST_CHECK_THROW(deft::random::uniform<float>(0, 1, {64}, deft::gpu(0)), std::invalid_argument);
  BOOST_CHECK_THROW(deft::random::normal<float>(0, 1, {i64(1) << 62}), std::length_error);
  BOOST_TEST(same_bits(deft::random::uniform<float>(0, 1, {64}).to_vector(), a), "sequence shifted by rejected calls");
  w.check("creation");
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(empty_handles, DeferredFixture)

BOOST_AUTO_TEST_CASE(every_use_throws_logic_error) {
  Witness w;
  Tensor<float> e;
  Tensor<float> moved = deft::ones({3});
  Tensor<float> taker = std::move(moved);
  const Tensor<float> a = make<float>({1, 2, 3}, Shape{3});
  Tensor<float> target = a.clone();
  target.wait_to_read();
  const std::vector<std::string> msg = {"empty Tensor handle"};
  std::vector<Case> cases = {
      {"e + 1", [&] { (void)(e + 1); }, msg}, {"1 + e", [&] { (void)(1.f + e); }, msg},
      {"a * e", [&] { (void)(a * e); }, msg}, {"-e", [&] { (void)(-e); }, msg},
      {"exp(e)", [&] { (void)deft::exp(e); }, msg}, {"relu(e)", [&] { (void)deft::relu(e); }, msg},
      {"maximum(e, a)", [&] { (void)deft::maximum(e, a); }, msg}, {"e < a", [&] { (void)(e < a); }, msg},
      {"where(e, a, a)", [&] { (void)deft::where(e, a, a); }, msg}, {"where(a, e, 0)", [&] { (void)deft::where(a, e, 0.f); }, msg},
      {"cast(e)", [&] { (void)deft::cast<double>(e); }, msg}, {"map(f, e)", [&] { (void)deft::map([](float v) { return v; }, e); }, msg},
      {"sum(e)", [&] { (void)deft::sum(e); }, msg}, {"mean(e, 0)", [&] { (void)deft::mean(e, 0); }, msg},
      {"max(e)", [&] { (void)deft::max(e); }, msg}, {"min(e)", [&] { (void)deft::min(e); }, msg},
      {"norm(e)", [&] { (void)deft::norm(e); }, msg}, {"argmax(e)", [&] { (void)deft::argmax(e); }, msg},
      {"argmax(e, 0)", [&] { (void)deft::argmax(e, 0); }, msg},
      {"dot(e, a)", [&] { (void)deft::dot(e, a); }, msg}, {"dot(a, e)", [&] { (void)deft::dot(a, e); }, msg},
      {"matmul(e, e)", [&] { (void)deft::matmul(e, e); }, msg}, {"transpose(e)", [&] { (void)deft::transpose(e); }, msg},
      {"e.rows", [&] { (void)e.rows(0, 1); }, msg}, {"e.reshape", [&] { (void)e.reshape({1}); }, msg},
      {"e.reshape(-1)", [&] { (void)e.reshape({-1}); }, msg}, {"e.clone", [&] { (void)e.clone(); }, msg},
      {"e.item", [&] { (void)e.item(); }, msg}, {"e.to_vector", [&] { (void)e.to_vector(); }, msg},
      {"e.wait_to_read", [&] { e.wait_to_read(); }, msg}, {"e.is_ready", [&] { (void)e.is_ready(); }, msg},
      {"e.device", [&] { (void)e.device(); }, msg}, {"e.assign(a)", [&] { e.assign(a); }, msg},
      {"e.assign(1)", [&] { e.assign(a * 0 + 1); }, msg},
      {"e += 1", [&] { e += 1; }, msg}, {"e -= a", [&] { e -= a; }, msg}, {"e *= 2", [&] { e *= 2; }, msg},
      {"e /= a", [&] { e /= a; }, msg}, {"target += e", [&] { target += e; }, msg},
      {"target.assign(e)", [&] { target.assign(e); }, msg}, {"eval(e * 2)", [&] { (void)deft::eval(e * 2); }, msg},
      {"print e", [&] { (void)print(e); }, msg},
      {"moved-from + 1", [&] { (void)(moved + 1); }, msg}, {"moved-from item", [&] { (void)moved.item(); }, msg},
  };
  run_table<std::logic_error>(cases);
  BOOST_TEST(!e);
  check_tensor(target, {3}, {1, 2, 3}, 0, 0, "target untouched");
  // Assigning to an empty handle rebinds it: that is fine.
  e = a + 1;
  check_tensor(e, {3}, {2, 3, 4}, 0, 0, "empty handle given a value");
  moved = a * 2;
  check_tensor(moved, {3}, {2, 4, 6}, 0, 0, "moved-from handle given a value");
  check_tensor(taker, {3}, {1, 1, 1}, 0, 0, "moved-to handle");
  w.check("empty handles");
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(devices, DeferredFixture)

BOOST_AUTO_TEST_CASE(gpu_without_a_cuda_backend) {
  Witness w;
  const auto g = deft::gpu(0);
  const std::vector<std::string> cuda = {"gpu(0)", "CUDA", "does not include"};
  auto with = [&](std::string fn) {
    auto p = cuda;
    p.push_back(fn);
    return p;
  };
  std::vector<Case> cases = {
      {"Tensor(values, shape, gpu)", [&] { Tensor<float>({1, 2}, Shape{2}, g); }, with("Tensor(values, shape)")},
      {"full on gpu", [&] { (void)deft::full<float>({2}, 1.f, g); }, with("full")},
      {"zeros on gpu", [&] { (void)deft::zeros<double>({2}, g); }, with("full")},
      {"ones on gpu(1)", [&] { (void)deft::ones<std::int32_t>({2}, deft::gpu(1)); }, {"gpu(1)", "CUDA"}},
      {"arange on gpu", [&] { (void)deft::arange<float>(0.f, 4.f, 1.f, g); }, with("arange")},
      {"uniform on gpu", [&] { (void)deft::random::uniform<float>(0, 1, {2}, g); }, with("uniform")},
      {"normal on gpu", [&] { (void)deft::random::normal<double>(0, 1, {2}, g); }, with("normal")},
  };
  run_table<std::invalid_argument>(cases);
  w.check("gpu");
}

BOOST_AUTO_TEST_CASE(operands_on_different_devices) {
  // cpu(1) has the CPU backend, so it shows mismatches without a GPU.
  Witness w;
  const Tensor<float> a = deft::full<float>({3}, 2.f);
  const Tensor<float> b = deft::full<float>({3}, 3.f, deft::cpu(1));
  const Tensor<float> m = deft::full<float>({3, 3}, 1.f, deft::cpu(1));
  Tensor<float> t = make<float>({1, 2, 3}, Shape{3});
  std::vector<Case> cases = {
      {"a + b", [&] { (void)(a + b); }, {"+", "different devices", "cpu(0)", "cpu(1)"}},
      {"b * a", [&] { (void)(b * a); }, {"*", "cpu(1)", "cpu(0)"}},
      {"maximum", [&] { (void)deft::maximum(a, b); }, {"maximum", "different devices"}},
      {"where: values", [&] { (void)deft::where(a, a, b); }, {"where", "cpu(0)", "cpu(1)"}},
      {"where: condition", [&] { (void)deft::where(b, a, 0.f); }, {"where", "condition on cpu(1)", "cpu(0)"}},
      {"dot", [&] { (void)deft::dot(a, m); }, {"dot", "different devices", "cpu(0)", "cpu(1)"}},
      {"t += b", [&] { t += b; }, {"different devices", "cpu(0)", "cpu(1)"}},
      {"t.assign(b)", [&] { t.assign(b); }, {"assign", "cannot write a value on cpu(1) into a tensor on cpu(0)"}},
  };
  run_table<std::invalid_argument>(cases);
  // What is allowed: numbers adopt the tensor's device, also as both branches of where.
  const Tensor<float> r = deft::where(b > 2.5f, 1.f, -1.f);
  BOOST_TEST(r.device() == deft::cpu(1));
  check_tensor(r, {3}, {1, 1, 1}, 0, 0, "where(cond on cpu(1), 1, -1)");
  const Tensor<float> s = deft::sum(m * 2, 0);
  BOOST_TEST(s.device() == deft::cpu(1));
  check_tensor(s, {3}, {6, 6, 6}, 0, 0, "sum on cpu(1)");
  t = b + 1;  // rebinding moves t to b's device
  BOOST_TEST(t.device() == deft::cpu(1));
  w.check("devices");
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(huge_sizes, DeferredFixture)

BOOST_AUTO_TEST_CASE(byte_size_overflow_is_length_error_at_record_time) {
  Witness w;
  const i64 big = i64(1) << 62;  // 2^62 floats = 2^64 bytes
  // Two 8 GiB operands that must never run: no bound may submit them, and
  // they are dropped (discarded) before anything syncs.
  std::optional<LimitsGuard> unbounded(engine::Limits{.max_recorded_bytes = ~std::size_t(0)});
  Tensor<float> col = deft::zeros({i64(1) << 31, 1}), row = deft::zeros({1, i64(1) << 31});
  const Tensor<float> tall = deft::zeros({i64(1) << 40, 0});  // empty, but wide shapes come from it
  const Tensor<float> flat = deft::zeros({0, i64(1) << 40, i64(1) << 40});  // so does reducing its empty axis
  std::vector<Case> cases = {
      {"Shape: 2^64 elements", [] { (void)Shape{i64(1) << 32, i64(1) << 32}; }, {"(4294967296, 4294967296)", "64 bits"}},
      {"Shape: 2^63 overflow", [] { (void)Shape{3, i64(1) << 62}; }, {"64 bits"}},
      {"full<float> 2^62", [&] { (void)deft::full<float>({big}, 1.f); }, {"float32", "(4611686018427387904,)", "more bytes than fit"}},
      {"zeros<double> 2^61", [] { (void)deft::zeros<double>({i64(1) << 61}); }, {"float64", "more bytes"}},
      {"ones<int64> 2^61 - 1", [] { (void)deft::ones<std::int64_t>({(i64(1) << 61) - 1}); }, {"int64", "more bytes"}},
      {"uniform 2^62", [&] { (void)deft::random::uniform<float>(0, 1, {big}); }, {"more bytes"}},
      {"arange<float> 0..1e30", [] { (void)deft::arange<float>(0.f, 1e30f); }, {"arange", "1e+30", "more than fit"}},
      {"arange<double> 2^61 elements", [] { (void)deft::arange<double>(0, 0x1p61); }, {"float64", "more bytes"}},
      {"broadcast to 2^62 elements", [&] { Tensor<float> r = col + row * 2; }, {"float32", "(2147483648, 2147483648)", "more bytes"}},
      {"dot to 2^62 elements", [&] { (void)deft::dot(col, row); }, {"(2147483648, 2147483648)", "more bytes"}},
      {"reshape of an empty tensor to 2^80", [&] { (void)tall.reshape({i64(1) << 40, i64(1) << 40, 0}); }, {"64 bits"}},
      {"sum over an empty axis to 2^80", [&] { (void)deft::sum(flat, 0); }, {"(1099511627776, 1099511627776)", "64 bits"}},
      {"sum over an empty axis, kept", [&] { (void)deft::sum(flat, 0, true); }, {"64 bits"}},
  };
  run_table<std::length_error>(cases);
  col = Tensor<float>();
  row = Tensor<float>();
  unbounded.reset();
  w.check("length_error");
}

BOOST_AUTO_TEST_CASE(allocation_failure_is_bad_alloc_at_the_sync_point) {
  // Each statement records fine (the size fits size_t); the allocation fails
  // on the worker; its sync points rethrow std::bad_alloc, dependents are
  // skipped, nothing else is affected.
  Witness w;
  const Tensor<float> col = deft::full<float>({i64(1) << 23, 1}, 1.f), row = deft::full<float>({1, i64(1) << 23}, 2.f);
  struct Huge {
    std::string what;
    std::function<Tensor<float>()> make;
  };
  const std::vector<Huge> huge = {
      {"full 2^46", [] { return deft::full<float>({kHuge46}, 1.f); }},
      {"uniform 2^46", [] { return deft::random::uniform<float>(0, 1, {i64(1) << 23, i64(1) << 23}); }},
      {"arange 2^46", [] { return deft::arange<float>(0.f, float(kHuge46)); }},
      {"broadcast to 2^46", [&] { return Tensor<float>(col * row + 1); }},
      {"dot to 2^46", [&] { return deft::dot(col, row); }},
  };
  for (const auto& h : huge) {
    engine::reset_stats();
    Tensor<float> t;
    BOOST_CHECK_NO_THROW(t = h.make());
    Tensor<float> dep;
    BOOST_CHECK_NO_THROW(dep = deft::sum(t * 2, 0));
    // (A statement this large passes the engine's byte bounds, so it may be
    // submitted, and fail, while it is recorded; the error still waits for a sync point.)
    expect_throw<std::bad_alloc>([&] { t.wait_to_read(); }, {}, h.what + ": wait_to_read");
    expect_throw<std::bad_alloc>([&] { (void)dep.to_vector(); }, {}, h.what + ": dependent");
    expect_throw<std::bad_alloc>([&] { (void)print(t.reshape({-1}).rows(0, 2)); }, {}, h.what + ": printing a view");
    expect_throw<std::bad_alloc>([] { deft::wait_all(); }, {}, h.what + ": wait_all");
    BOOST_CHECK_NO_THROW(deft::wait_all());
    BOOST_TEST(engine::stats().tasks_failed == 1u, h.what);
  }
  // In synchronous mode the statement itself throws.
  {
    ModeGuard sync(engine::Mode::synchronous);
    expect_throw<std::bad_alloc>([] { (void)deft::full<float>({kHuge46}, 1.f); }, {}, "synchronous full 2^46");
  }
  BOOST_TEST(engine::stats().bytes_pending == 0u);
  w.check("bad_alloc");
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(bad_engine_settings, DeferredFixture)

BOOST_AUTO_TEST_CASE(rejected_settings_name_the_problem_and_change_nothing) {
  Witness w;
  const int workers = engine::num_workers();
  const auto limits = engine::limits();
  std::vector<Case> cases = {
      {"set_num_workers(0)", [] { engine::set_num_workers(0); }, {"set_num_workers", "at least one worker", "got 0"}},
      {"set_num_workers(-3)", [] { engine::set_num_workers(-3); }, {"set_num_workers", "got -3"}},
      {"set_limits recorded tasks 0", [] { engine::set_limits(engine::Limits{.max_recorded_tasks = 0}); }, {"limits", "at least 1"}},
      {"set_limits in-flight tasks 0", [] { engine::set_limits(engine::Limits{.max_inflight_tasks = 0}); }, {"limits", "at least 1"}},
  };
  run_table<std::invalid_argument>(cases);
  BOOST_TEST(engine::num_workers() == workers);
  BOOST_TEST(engine::limits().max_recorded_bytes == limits.max_recorded_bytes);
  BOOST_TEST(engine::limits().max_inflight_tasks == limits.max_inflight_tasks);
  w.check("engine settings");
}

BOOST_AUTO_TEST_CASE(zero_byte_bounds_are_valid_and_do_not_hang) {
  // Byte bounds of zero are allowed: every statement is submitted at once
  // and the recording thread waits for it (no deadlock, right numbers).
  Witness w;
  LimitsGuard g(engine::Limits{.max_recorded_bytes = 0, .max_inflight_bytes = 0});
  Tensor<float> y = deft::zeros({100});
  for (int i = 0; i < 50; ++i) y = y + 1;
  check_tensor(y, {100}, std::vector<double>(100, 50), 0, 0, "chain under zero byte bounds");
  LimitsGuard g1(engine::Limits{.max_recorded_tasks = 1, .max_inflight_tasks = 1});
  Tensor<float> z = deft::ones({10});
  for (int i = 0; i < 20; ++i) z += z;
  check_tensor(z, {10}, std::vector<double>(10, 1 << 20), 0, 0, "chain under task bounds of 1");
  w.check("zero bounds");
}

BOOST_AUTO_TEST_SUITE_END()
