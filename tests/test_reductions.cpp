// Reductions (sum mean max min norm argmax) over all elements and along every
// axis, against naive double-precision loops, on random shapes; expression
// operands; empty extents; axis errors; worker-count independence.
#include <optional>
#include <tuple>

#include "common.hpp"

using namespace dt;
namespace engine = deft::engine;

namespace {

enum class Kind { sum, mean, max, min, norm, argmax };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::sum: return "sum";
    case Kind::mean: return "mean";
    case Kind::max: return "max";
    case Kind::min: return "min";
    case Kind::norm: return "norm";
    case Kind::argmax: return "argmax";
  }
  return "?";
}

/// Reference of a reduction of `x` (dims d) along `axis` (-1 for all):
/// the values, and for each output the sum of |x| it combined (error scale).
struct Ref {
  std::vector<i64> dims;
  std::vector<double> value, scale;
};

Ref reference(Kind k, const std::vector<double>& x, const std::vector<i64>& d, int axis, bool keepdims) {
  Ref r;
  i64 outer = 1, len = 1, inner = 1;
  if (axis < 0) {
    len = product(d);
    if (keepdims) r.dims.assign(d.size(), 1);
  } else {
    for (int i = 0; i < int(d.size()); ++i) {
      if (i < axis) outer *= d[i];
      else if (i == axis) len = d[i];
      else inner *= d[i];
      if (i != axis) r.dims.push_back(d[i]);
      else if (keepdims) r.dims.push_back(1);
    }
  }
  r.value.resize(outer * inner);
  r.scale.resize(outer * inner);
  for (i64 o = 0; o < outer; ++o)
    for (i64 i = 0; i < inner; ++i) {
      double acc = 0, abs_acc = 0, best = 0;
      i64 best_j = -1;
      for (i64 j = 0; j < len; ++j) {
        const double v = x[(o * len + j) * inner + i];
        abs_acc += std::abs(v);
        switch (k) {
          case Kind::sum:
          case Kind::mean: acc += v; break;
          case Kind::norm: acc += v * v; break;
          default:
            if (best_j < 0 || (k == Kind::min ? v < best : v > best)) {
              best = v;
              best_j = j;
            }
        }
      }
      double out = 0;
      switch (k) {
        case Kind::sum: out = acc; break;
        case Kind::mean: out = acc / double(len); abs_acc /= double(len); break;
        case Kind::norm: out = std::sqrt(acc); abs_acc = out; break;
        case Kind::max:
        case Kind::min: out = best; break;
        case Kind::argmax: out = double(best_j); break;
      }
      r.value[o * inner + i] = out;
      r.scale[o * inner + i] = abs_acc;
    }
  return r;
}

using Result = std::pair<std::vector<i64>, std::vector<double>>;

/// The shape and values of a result.
template <class U>
Result result_of(const Tensor<U>& r) {
  return {dims_of(r.shape()), to_double(r.to_vector())};
}

/// Runs reduction k of a tensor through deft (all elements when no axis).
template <class T>
Result run(Kind k, const Tensor<T>& x, std::optional<int> axis, bool keepdims) {
  if (k == Kind::argmax) return result_of(axis ? deft::argmax(x, *axis, keepdims) : deft::argmax(x));
  Tensor<T> r;
  if constexpr (std::is_floating_point_v<T>) {
    if (k == Kind::mean) r = axis ? deft::mean(x, *axis, keepdims) : deft::mean(x);
    if (k == Kind::norm) r = axis ? deft::norm(x, *axis, keepdims) : deft::norm(x);
  }
  if (k == Kind::sum) r = axis ? deft::sum(x, *axis, keepdims) : deft::sum(x);
  if (k == Kind::max) r = axis ? deft::max(x, *axis, keepdims) : deft::max(x);
  if (k == Kind::min) r = axis ? deft::min(x, *axis, keepdims) : deft::min(x);
  return result_of(r);
}

template <class T>
double sum_rtol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

/// Compares a deft reduction's result with the reference (tolerance relative to
/// the sum of magnitudes it combined; exact for max/min/argmax and integers).
/// `xv` (dims d) holds the values the reduction consumed.
template <class T>
void check_reduction(Kind k, const Result& result, const std::vector<double>& xv, const std::vector<i64>& d,
                     std::optional<int> axis, bool keepdims, const std::string& label) {
  const int rank = int(d.size());
  const int norm_axis = axis ? (*axis < 0 ? *axis + rank : *axis) : -1;
  const Ref ref = reference(k, xv, d, norm_axis, keepdims);
  const auto& [dims, got] = result;
  std::ostringstream what;
  what << kind_name(k) << "(" << label << " " << str(shape_of(d)) << (axis ? ", axis " + std::to_string(*axis) : "")
       << (keepdims ? ", keepdims" : "") << ") " << type_name<T>();
  BOOST_TEST(dims == ref.dims, what.str() << ": result shape " << str(shape_of(dims)));
  if (dims != ref.dims) return;
  const bool exact = std::is_integral_v<T> || k == Kind::max || k == Kind::min || k == Kind::argmax;
  std::size_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = exact ? 0 : sum_rtol<T>() * ref.scale[i] + 1e-30;
    const bool ok = std::isnan(ref.value[i]) ? std::isnan(got[i]) : std::abs(got[i] - ref.value[i]) <= tol;
    if (!ok && bad++ < 4) first << "\n  [" << i << "] got " << got[i] << ", expected " << ref.value[i] << " (tol " << tol << ")";
  }
  BOOST_TEST(bad == 0u, what.str() << ": " << bad << " of " << got.size() << " wrong" << first.str());
}

/// Every reduction kind valid for T, over all elements and along every axis
/// (positive and negative), with and without keepdims.
template <class T>
void check_all_reductions(const std::vector<T>& v, const std::vector<i64>& d, const std::string& label) {
  const Tensor<T> x = make(v, shape_of(d));
  const auto xv = to_double(v);
  std::vector<Kind> kinds{Kind::sum, Kind::max, Kind::min, Kind::argmax};
  if (std::is_floating_point_v<T>) {
    kinds.push_back(Kind::mean);
    kinds.push_back(Kind::norm);
  }
  const int rank = int(d.size());
  for (Kind k : kinds) {
    if (product(d) == 0 && (k == Kind::max || k == Kind::min || k == Kind::argmax)) continue;
    check_reduction<T>(k, run(k, x, std::nullopt, false), xv, d, std::nullopt, false, label);
    for (int axis = -rank; axis < rank; ++axis) {
      const int a = axis < 0 ? axis + rank : axis;
      if (d[a] == 0 && (k == Kind::max || k == Kind::min || k == Kind::argmax)) continue;
      for (bool keep : {false, true}) check_reduction<T>(k, run(k, x, axis, keep), xv, d, axis, keep, label);
    }
  }
}

const std::vector<std::vector<i64>> kShapes = {
    {}, {1}, {7}, {4, 5}, {3, 1, 6}, {2, 3, 4, 5}, {1, 1},
    {150000},       // several reduce chunks, split across workers
    {1000, 37},     // many rows, short contiguous reductions
    {37, 1000},     // long rows / column tiles
    {6, 1500},      // column tiles wider than one block
    {70000, 2},     // long strided reductions
    {3, 4, 1100}};  // middle axis with a wide inner extent

using FloatTypes = std::tuple<float, double>;
using IntTypes = std::tuple<std::int32_t, std::int64_t>;

}  // namespace

BOOST_FIXTURE_TEST_SUITE(reductions, EngineFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(fixed_shapes_float, T, FloatTypes) {
  std::mt19937 g(401);
  for (const auto& d : kShapes) check_all_reductions<T>(random_values<T>(g, product(d), -10, 10), d, "x");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fixed_shapes_int, T, IntTypes) {
  std::mt19937 g(402);
  // A narrow range gives many ties: argmax must return the first maximum.
  for (const auto& d : kShapes) check_all_reductions<T>(random_values<T>(g, product(d), -3, 3), d, "x");
  for (const auto& d : kShapes) check_all_reductions<T>(random_values<T>(g, product(d), -1000, 1000), d, "x");
}

BOOST_AUTO_TEST_CASE(random_shapes) {
  std::mt19937 g(403);
  std::uniform_int_distribution<int> rank(1, 4), ext(1, 6);
  for (int t = 0; t < 40; ++t) {
    std::vector<i64> d(rank(g));
    for (auto& x : d) x = ext(g);
    check_all_reductions<float>(random_values<float>(g, product(d), -5, 5), d, "random");
    check_all_reductions<std::int32_t>(random_values<std::int32_t>(g, product(d), -4, 4), d, "random");
  }
}

BOOST_AUTO_TEST_CASE(positive_data_large_sums) {
  // All-positive data: rounding errors do not cancel, the hardest case for float sums.
  std::mt19937 g(404);
  const std::vector<i64> d{400, 2500};
  check_all_reductions<float>(random_values<float>(g, product(d), 0, 1), d, "positive");
}

BOOST_AUTO_TEST_CASE(reductions_consume_expressions) {
  std::mt19937 g(405);
  const std::vector<i64> d{53, 301};
  const auto av = random_values<float>(g, product(d), -2, 2);
  const auto bv = random_values<float>(g, product(d), -2, 2);
  const auto rv = random_values<float>(g, 301, -2, 2);
  const Tensor<float> a = make(av, shape_of(d)), b = make(bv, shape_of(d)), row = make(rv, Shape{301});
  auto values = [&](auto f) {
    std::vector<double> r(av.size());
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = f(double(av[i]), double(bv[i]), double(rv[i % 301]));
    return r;
  };
  const auto ab1 = values([](double x, double y, double) { return double(float(x * y)) + 1; });
  check_reduction<float>(Kind::sum, result_of(deft::sum(a * b + 1, 1, false)), ab1, d, 1, false, "a*b+1");
  check_reduction<float>(Kind::sum, result_of(deft::sum(a * b + 1, 0, true)), ab1, d, 0, true, "a*b+1");
  check_reduction<float>(Kind::sum, result_of(deft::sum(a * b + 1)), ab1, d, std::nullopt, false, "a*b+1");
  const auto ex = values([](double x, double, double) { return double(float(std::exp(x * 0.5))); });
  check_reduction<float>(Kind::mean, result_of(deft::mean(deft::exp(a * 0.5), 0, false)), ex, d, 0, false, "exp(a/2)");
  const auto amb = values([](double x, double y, double) { return double(float(std::abs(x) - y)); });
  check_reduction<float>(Kind::max, result_of(deft::max(deft::abs(a) - b)), amb, d, std::nullopt, false, "|a|-b");
  check_reduction<float>(Kind::min, result_of(deft::min(deft::abs(a) - b, -2, false)), amb, d, -2, false, "|a|-b");
  const auto prod = values([](double x, double y, double) { return double(float(x * y)); });
  check_reduction<float>(Kind::argmax, result_of(deft::argmax(a * b, -1, false)), prod, d, -1, false, "a*b");
  check_reduction<float>(Kind::argmax, result_of(deft::argmax(a * b, 0, true)), prod, d, 0, true, "a*b");
  check_reduction<float>(Kind::argmax, result_of(deft::argmax(a * b)), prod, d, std::nullopt, false, "a*b");
  const auto diff = values([](double x, double y, double) { return double(float(x - y)); });
  check_reduction<float>(Kind::norm, result_of(deft::norm(a - b, 0, false)), diff, d, 0, false, "a-b");
  // A broadcasting expression: the row is added to every row of a.
  const auto bc = values([](double x, double, double r) { return double(float(x + r)); });
  check_reduction<float>(Kind::sum, result_of(deft::sum(a + row, 0, false)), bc, d, 0, false, "a+row");
  check_reduction<float>(Kind::max, result_of(deft::max(a + row, 1, false)), bc, d, 1, false, "a+row");
  const auto wh = values([](double x, double, double) { return x > 0 ? x : 10.0; });
  check_reduction<float>(Kind::min, result_of(deft::min(deft::where(a > 0, a, 10), 1, false)), wh, d, 1, false, "where");
  // A cast operand (evaluated element by element, without SIMD).
  const auto wide = values([](double x, double y, double) { return double(float(x)) * double(float(y)); });
  check_reduction<double>(Kind::sum, result_of(deft::sum(deft::cast<double>(a) * deft::cast<double>(b), 0)), wide, d,
                          0, false, "cast<double>(a)*cast<double>(b)");
  check_reduction<double>(Kind::argmax, result_of(deft::argmax(deft::cast<double>(a) * deft::cast<double>(b), 0)),
                          wide, d, 0, false, "cast<double>(a)*cast<double>(b)");
  // A rows() view: only its rows are reduced.
  const std::vector<double> mid(ab1.begin() + 2 * 301, ab1.begin() + 7 * 301);
  const auto rows_view = a.rows(2, 7);
  check_reduction<float>(Kind::sum, result_of(deft::sum(rows_view * b.rows(2, 7) + 1, 1, false)), mid, {5, 301}, 1, false, "rows(2,7)");
  const std::vector<double> mid_a(av.begin() + 2 * 301, av.begin() + 7 * 301);
  check_reduction<float>(Kind::argmax, result_of(deft::argmax(rows_view, 0)), mid_a, {5, 301}, 0, false, "rows(2,7)");
  check_reduction<float>(Kind::max, result_of(deft::max(rows_view, 0, true)), mid_a, {5, 301}, 0, true, "rows(2,7)");
}

BOOST_AUTO_TEST_CASE(argmax_returns_int64) {
  static_assert(std::is_same_v<decltype(deft::argmax(std::declval<Tensor<float>&>())), Tensor<std::int64_t>>);
  static_assert(std::is_same_v<decltype(deft::argmax(std::declval<Tensor<double>&>(), 0)), Tensor<std::int64_t>>);
  static_assert(std::is_same_v<decltype(deft::sum(std::declval<Tensor<std::int32_t>&>())), Tensor<std::int32_t>>);
  const Tensor<float> x = make<float>({1, 3, 3, 2, 0, 3}, Shape{2, 3});
  const Tensor<std::int64_t> all = deft::argmax(x);
  BOOST_TEST(all.rank() == 0);
  BOOST_TEST(all.item() == 1);  // first of the three maxima
  check_tensor(deft::argmax(x, 1), {2}, {1, 2}, 0, 0, "argmax axis 1");
  check_tensor(deft::argmax(x, 0), {3}, {1, 0, 0}, 0, 0, "argmax axis 0");
  check_tensor(deft::argmax(x, 0, true), {1, 3}, {1, 0, 0}, 0, 0, "argmax axis 0 keepdims");
  const Tensor<float> s = make<float>({5}, Shape{});
  BOOST_TEST(deft::argmax(s).item() == 0);
  BOOST_TEST(deft::sum(s).item() == 5.f);
}

BOOST_AUTO_TEST_CASE(nan_handling) {
  const float nan = NAN;
  const Tensor<float> x = make<float>({1, nan, 3, nan}, Shape{4});
  BOOST_TEST(std::isnan(deft::max(x).item()));
  BOOST_TEST(std::isnan(deft::min(x).item()));
  BOOST_TEST(std::isnan(deft::sum(x).item()));
  BOOST_TEST(deft::argmax(x).item() == 1);  // the first NaN, as numpy
  const Tensor<float> m = make<float>({1, 2, nan, 0}, Shape{2, 2});
  check_tensor(deft::max(m, 0), {2}, {NAN, 2}, 0, 0, "max axis 0 with NaN");
  check_tensor(deft::max(m, 1), {2}, {2, NAN}, 0, 0, "max axis 1 with NaN");
}

BOOST_AUTO_TEST_CASE(empty_extents) {
  const Tensor<float> e0 = make<float>({}, Shape{0});
  const Tensor<float> e30 = make<float>({}, Shape{3, 0});
  const Tensor<float> e03 = make<float>({}, Shape{0, 3});
  deft::wait_all();
  engine::reset_stats();
  BOOST_CHECK_THROW(deft::max(e0), std::invalid_argument);
  BOOST_CHECK_THROW(deft::min(e0), std::invalid_argument);
  BOOST_CHECK_THROW(deft::argmax(e0), std::invalid_argument);
  BOOST_CHECK_THROW(deft::max(e30), std::invalid_argument);
  BOOST_CHECK_THROW(deft::max(e30, 1), std::invalid_argument);
  BOOST_CHECK_THROW(deft::min(e30, -1), std::invalid_argument);
  BOOST_CHECK_THROW(deft::argmax(e30, 1), std::invalid_argument);
  BOOST_CHECK_THROW(deft::argmax(e03, 0, true), std::invalid_argument);
  BOOST_CHECK_THROW(deft::max(e0 * 2 + 1), std::invalid_argument);
  BOOST_TEST(engine::stats().tasks_recorded == 0u);  // thrown when built, nothing recorded
  // Reductions that have something to return.
  BOOST_TEST(deft::sum(e0).item() == 0.f);
  BOOST_TEST(std::isnan(deft::mean(e0).item()));
  BOOST_TEST(deft::norm(e0).item() == 0.f);
  check_tensor(deft::sum(e03, 0), {3}, {0, 0, 0}, 0, 0, "sum (0,3) axis 0");
  check_tensor(deft::mean(e03, 0), {3}, {NAN, NAN, NAN}, 0, 0, "mean (0,3) axis 0");
  check_tensor(deft::sum(e30, 1), {3}, {0, 0, 0}, 0, 0, "sum (3,0) axis 1");
  check_tensor(deft::max(e30, 0), {0}, {}, 0, 0, "max (3,0) axis 0");
  check_tensor(deft::argmax(e30, 0), {0}, {}, 0, 0, "argmax (3,0) axis 0");
}

BOOST_AUTO_TEST_CASE(bad_axis_throws) {
  const Tensor<float> x = deft::ones({2, 3});
  const Tensor<float> s = deft::ones({});
  BOOST_CHECK_THROW(deft::sum(x, 2), std::invalid_argument);
  BOOST_CHECK_THROW(deft::sum(x, -3), std::invalid_argument);
  BOOST_CHECK_THROW(deft::mean(x, 5, true), std::invalid_argument);
  BOOST_CHECK_THROW(deft::max(x, 2), std::invalid_argument);
  BOOST_CHECK_THROW(deft::min(x, -3), std::invalid_argument);
  BOOST_CHECK_THROW(deft::norm(x, 2), std::invalid_argument);
  BOOST_CHECK_THROW(deft::argmax(x, 2), std::invalid_argument);
  BOOST_CHECK_THROW(deft::argmax(x, -3), std::invalid_argument);
  BOOST_CHECK_THROW(deft::sum(s, 0), std::invalid_argument);
  BOOST_CHECK_THROW(deft::sum(x * 2, 7), std::invalid_argument);
  try {
    (void)deft::sum(x, 2);
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("axis 2") != std::string::npos, e.what());
  }
  // Valid negative axes work.
  check_tensor(deft::sum(x, -1), {2}, {3, 3}, 0, 0, "sum axis -1");
  check_tensor(deft::sum(x, -2, true), {1, 3}, {2, 2, 2}, 0, 0, "sum axis -2 keepdims");
}

// Reductions are cut into fixed pieces: the same bits with any worker count.
BOOST_AUTO_TEST_CASE(same_bits_for_any_worker_count) {
  std::mt19937 g(406);
  const std::vector<i64> d{1000, 1003};
  const auto v = random_values<float>(g, product(d), -1, 1);
  const auto dv = random_values<double>(g, 300000, -1, 1);
  auto compute = [&] {
    const Tensor<float> x = make(v, shape_of(d));
    const Tensor<double> y = make(dv, Shape{300000});
    std::vector<std::vector<double>> r;  // float results widened exactly
    r.push_back(to_double(deft::sum(x).to_vector()));
    r.push_back(to_double(deft::sum(x, 0).to_vector()));
    r.push_back(to_double(deft::sum(x, 1).to_vector()));
    r.push_back(to_double(deft::mean(x).to_vector()));
    r.push_back(to_double(deft::norm(x).to_vector()));
    r.push_back(to_double(deft::sum(x * x + 1).to_vector()));
    r.push_back(to_double(deft::mean(x * 3, 0).to_vector()));
    r.push_back(deft::sum(y).to_vector());
    r.push_back(deft::sum(y.reshape({600, 500}), 0).to_vector());
    return r;
  };
  const auto one = with_workers(1, compute), two = with_workers(2, compute), three = with_workers(3, compute);
  BOOST_REQUIRE(one.size() == two.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    BOOST_TEST(same_bits(one[i], two[i]), "result " << i << " differs between 1 and 2 workers");
    BOOST_TEST(same_bits(one[i], three[i]), "result " << i << " differs between 1 and 3 workers");
  }
  // And the value is right.
  double ref = 0, scale = 0;
  for (float x : v) {
    ref += x;
    scale += std::abs(x);
  }
  BOOST_TEST(std::abs(one[0][0] - ref) <= 2e-5 * scale);
}

BOOST_AUTO_TEST_SUITE_END()
