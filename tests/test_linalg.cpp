// Matrix products and transposes against naive double loops; reshape and
// rows() views.
#include <array>
#include <tuple>

#include "common.hpp"

using namespace dt;
namespace engine = deft::engine;

namespace {

/// A product case: a of dims da times b of dims db, computed as `batch` GEMMs.
struct ProductRef {
  std::vector<i64> dims;
  std::vector<double> value, scale;  // scale: sum over p of |a_ip * b_pj|
};

/// Naive reference of numpy-style dot for the supported rank combinations.
ProductRef ref_dot(const std::vector<double>& a, const std::vector<i64>& da, const std::vector<double>& b,
                   const std::vector<i64>& db) {
  const int ra = int(da.size()), rb = int(db.size());
  const i64 k = da[ra - 1];
  const i64 m = ra >= 2 ? da[ra - 2] : 1;
  const i64 n = rb >= 2 ? db[rb - 1] : 1;
  const i64 batch = ra == 3 ? da[0] : 1;
  const bool batched_b = rb == 3;
  ProductRef r;
  if (ra == 3) r.dims.push_back(batch);
  if (ra >= 2) r.dims.push_back(m);
  if (rb >= 2) r.dims.push_back(n);
  r.value.assign(batch * m * n, 0);
  r.scale.assign(batch * m * n, 0);
  for (i64 q = 0; q < batch; ++q)
    for (i64 i = 0; i < m; ++i)
      for (i64 j = 0; j < n; ++j) {
        double s = 0, sa = 0;
        for (i64 p = 0; p < k; ++p) {
          const double x = a[(q * m + i) * k + p];
          // b as (k, n): a vector b is (k, 1).
          const double y = b[(batched_b ? q * k * n : 0) + p * n + j];
          s += x * y;
          sa += std::abs(x * y);
        }
        r.value[(q * m + i) * n + j] = s;
        r.scale[(q * m + i) * n + j] = sa;
      }
  return r;
}

template <class T>
void check_product(const Tensor<T>& c, const ProductRef& r, const std::string& what) {
  BOOST_TEST(dims_of(c.shape()) == r.dims, what << ": result shape " << c.shape().to_string());
  if (dims_of(c.shape()) != r.dims) return;
  const auto got = c.to_vector();
  const double rtol = std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, double> ? 1e-13 : 0;
  std::size_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = rtol * r.scale[i];
    if (!(std::abs(double(got[i]) - r.value[i]) <= tol) && bad++ < 4)
      first << "\n  [" << i << "] got " << double(got[i]) << ", expected " << r.value[i] << " (tol " << tol << ")";
  }
  BOOST_TEST(bad == 0u, what << ": " << bad << " of " << got.size() << " wrong" << first.str());
}

template <class T>
void check_dot(std::mt19937& g, const std::vector<i64>& da, const std::vector<i64>& db) {
  const double lo = std::is_integral_v<T> ? -10 : -1, hi = -lo;
  const auto av = random_values<T>(g, product(da), lo, hi);
  const auto bv = random_values<T>(g, product(db), lo, hi);
  const Tensor<T> a = make(av, shape_of(da)), b = make(bv, shape_of(db));
  const auto r = ref_dot(to_double(av), da, to_double(bv), db);
  const std::string what = std::string("dot ") + type_name<T>() + " " + str(shape_of(da)) + str(shape_of(db));
  check_product(deft::dot(a, b), r, what);
}

template <class T>
void check_transpose(std::mt19937& g, const std::vector<i64>& d, const std::vector<int>& axes) {
  const auto v = random_values<T>(g, product(d), -100, 100);
  const Tensor<T> x = make(v, shape_of(d));
  const int r = int(d.size());
  std::vector<int> perm(axes);
  if (perm.empty() && r > 0) {
    perm.resize(r);
    for (int i = 0; i < r; ++i) perm[i] = r - 1 - i;
  }
  for (auto& p : perm)
    if (p < 0) p += r;
  std::vector<i64> od(r);
  for (int i = 0; i < r; ++i) od[i] = d[perm[i]];
  std::vector<double> ref(v.size());
  for (i64 o = 0; o < product(od); ++o) {
    const auto oi = unravel(o, od);
    std::vector<i64> ii(r);
    for (int t = 0; t < r; ++t) ii[perm[t]] = oi[t];
    i64 lin = 0;
    for (int t = 0; t < r; ++t) lin = lin * d[t] + ii[t];
    ref[o] = double(v[lin]);
  }
  const Tensor<T> t = axes.empty() ? deft::transpose(x) : deft::transpose(x, axes);
  std::ostringstream what;
  what << "transpose " << type_name<T>() << " " << str(shape_of(d)) << " axes";
  for (int a : axes) what << ' ' << a;
  check_tensor(t, od, ref, 0, 0, what.str());
}

/// The last two axes of a row-major array of dims d swapped (a plain loop).
template <class T>
std::vector<T> swap_last_two(const std::vector<T>& v, const std::vector<i64>& d) {
  const std::size_t r = d.size();
  if (r < 2) return v;
  const i64 rows = d[r - 2], cols = d[r - 1], mats = product(d) / std::max<i64>(1, rows * cols);
  std::vector<T> out(v.size());
  for (i64 q = 0; q < mats; ++q)
    for (i64 i = 0; i < rows; ++i)
      for (i64 j = 0; j < cols; ++j) out[(q * cols + j) * rows + i] = v[(q * rows + i) * cols + j];
  return out;
}

/// op(a) · op(b) through the GEMM's transposed reads (what gradients use),
/// against the naive product of explicitly transposed copies. `da` and `db`
/// are the logical (already transposed) dims.
template <class T>
void check_transposed_product(std::mt19937& g, const std::vector<i64>& da, bool ta, const std::vector<i64>& db,
                              bool tb) {
  const double lo = std::is_integral_v<T> ? -10 : -1, hi = -lo;
  const auto av = random_values<T>(g, product(da), lo, hi);
  const auto bv = random_values<T>(g, product(db), lo, hi);
  auto stored = [](const std::vector<T>& v, std::vector<i64> d, bool t) {
    if (!t || d.size() < 2) return std::make_pair(v, d);
    auto s = swap_last_two(v, d);
    std::swap(d[d.size() - 2], d[d.size() - 1]);
    return std::make_pair(s, d);
  };
  const auto [sa, sda] = stored(av, da, ta);
  const auto [sb, sdb] = stored(bv, db, tb);
  const Tensor<T> a = make(sa, shape_of(sda)), b = make(sb, shape_of(sdb));
  const auto r = ref_dot(to_double(av), da, to_double(bv), db);
  const std::string what = std::string("product ") + type_name<T>() + " " + str(shape_of(da)) + (ta ? "ᵀ" : "") +
                           str(shape_of(db)) + (tb ? "ᵀ" : "");
  check_product(deft::detail::record_product(a.leaf(), ta, b.leaf(), tb, "dot"), r, what);
}

using AllTypes = std::tuple<float, double, std::int32_t, std::int64_t>;

}  // namespace

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(linalg, EngineFixture)

BOOST_AUTO_TEST_CASE_TEMPLATE(dot_all_rank_combinations, T, AllTypes) {
  std::mt19937 g(501);
  // (k)(k)
  for (i64 k : {1, 7, 16, 17, 100, 1000}) check_dot<T>(g, {k}, {k});
  // (m,k)(k,n): tiles, tails, k > the packed depth, m > one row block.
  const std::vector<std::array<i64, 3>> mkn = {{1, 1, 1},    {2, 3, 4},     {5, 16, 17},  {16, 16, 16},
                                               {17, 33, 15}, {33, 1, 65},   {6, 256, 32}, {97, 300, 31},
                                               {100, 257, 300}, {1, 50, 70}, {50, 70, 1},  {2, 513, 3},
                                               {3, 70, 400}, {1, 300, 1000}};  // few-row strips of 16, 8, 4, 1 vectors
  for (const auto& [m, k, n] : mkn) check_dot<T>(g, {m, k}, {k, n});
  // (m,k)(k) and (k)(k,n)
  for (const auto& [m, k] : std::vector<std::pair<i64, i64>>{{1, 1}, {37, 129}, {300, 300}, {5, 3}}) {
    check_dot<T>(g, {m, k}, {k});
    check_dot<T>(g, {k}, {k, m});
  }
  // Batched: (b,m,k)(b,k,n), (b,m,k)(k,n), (b,m,k)(k)
  check_dot<T>(g, {3, 17, 33}, {3, 33, 15});
  check_dot<T>(g, {4, 100, 64}, {4, 64, 50});
  check_dot<T>(g, {1, 5, 5}, {1, 5, 5});
  check_dot<T>(g, {5, 20, 31}, {31, 40});
  check_dot<T>(g, {2, 130, 70}, {70, 19});
  check_dot<T>(g, {3, 10, 20}, {20});
}

// Sizes past the GEMM cache blocks (core/thresholds.hpp), with tails: in
// every direction, and wider than two column blocks. Builds that lower the
// blocks (the sanitizers') get smaller products through the same paths.
constexpr i64 rows_past_blocks = deft::thresholds::gemm_mc + 65;     // 257
constexpr i64 depth_past_blocks = 2 * deft::thresholds::gemm_kc + 1;  // 513
constexpr i64 cols_past_blocks = 2 * deft::thresholds::gemm_nc + 52;  // 2100

BOOST_AUTO_TEST_CASE(dot_large_float) {
  std::mt19937 g(502);
  constexpr i64 m = rows_past_blocks, k = depth_past_blocks, n = cols_past_blocks;
  check_dot<float>(g, {m, k}, {k, 300});  // several packed panels in every direction
  check_dot<float>(g, {7, 300}, {300, n});  // wider than one column block
  check_dot<double>(g, {130, 260}, {260, 140});
  check_dot<float>(g, {100003}, {100003});
  check_dot<float>(g, {1000, 700}, {700});
}

BOOST_AUTO_TEST_CASE_TEMPLATE(products_of_transposed_operands, T, AllTypes) {
  std::mt19937 g(509);
  // Packed kernel (m >= 4), matrix-vector, few rows, tails in every direction.
  const std::vector<std::array<i64, 3>> mkn = {{1, 1, 1},   {2, 3, 4},    {5, 16, 17},    {17, 33, 15},
                                               {33, 1, 65}, {97, 300, 31}, {100, 257, 300}, {1, 50, 70},
                                               {50, 70, 1}, {3, 513, 40}, {4, 9, 2}};
  for (const auto& [m, k, n] : mkn)
    for (int t = 1; t < 4; ++t) check_transposed_product<T>(g, {m, k}, t & 1, {k, n}, t & 2);
  for (int t = 1; t < 4; ++t) {
    check_transposed_product<T>(g, {3, 17, 33}, t & 1, {3, 33, 15}, t & 2);  // batched
    check_transposed_product<T>(g, {2, 30, 70}, t & 1, {70, 19}, t & 2);     // batched, shared right operand
  }
  check_transposed_product<T>(g, {37, 129}, true, {129}, false);  // (k,m)ᵀ(m): a gradient of (m,k)(k)
}

BOOST_AUTO_TEST_CASE(products_of_transposed_operands_large) {
  std::mt19937 g(510);
  constexpr i64 m = rows_past_blocks, k = depth_past_blocks, n = cols_past_blocks;
  check_transposed_product<float>(g, {m, k}, true, {k, 300}, false);
  check_transposed_product<float>(g, {m, k}, false, {k, 300}, true);
  check_transposed_product<float>(g, {130, k + 187}, true, {k + 187, n}, true);  // wider than one column block
}

BOOST_AUTO_TEST_CASE(dot_empty_extents) {
  const Tensor<float> a = deft::ones({3, 0}), b = deft::ones({0, 4});
  check_tensor(Tensor<float>(deft::dot(a, b)), {3, 4}, std::vector<double>(12, 0.0), 0, 0, "(3,0)(0,4)");
  check_tensor(Tensor<float>(deft::dot(deft::ones({0, 5}), deft::ones({5, 3}))), {0, 3}, {}, 0, 0, "(0,5)(5,3)");
  check_tensor(Tensor<float>(deft::dot(deft::ones({2, 5}), deft::ones({5, 0}))), {2, 0}, {}, 0, 0, "(2,5)(5,0)");
  const Tensor<float> e = deft::ones({0});
  const Tensor<float> z = deft::dot(e, e);
  BOOST_TEST(z.rank() == 0);
  BOOST_TEST(z.item() == 0.f);
}

BOOST_AUTO_TEST_CASE(dot_of_views_and_expressions) {
  std::mt19937 g(503);
  const auto av = random_values<float>(g, 40 * 30, -1, 1);
  const auto bv = random_values<float>(g, 30 * 20, -1, 1);
  const Tensor<float> a = make(av, Shape{40, 30}), b = make(bv, Shape{30, 20});
  // Rows 5..25 of a, and b seen as (30, 20) through a reshape of a flat view.
  const Tensor<float> c = deft::dot(a.rows(5, 25), b.reshape({-1}).reshape({30, 20}));
  const std::vector<double> asub(av.begin() + 5 * 30, av.begin() + 25 * 30);
  check_product(c, ref_dot(asub, {20, 30}, to_double(bv), {30, 20}), "dot(rows view, reshape view)");
  // Expression operands are evaluated first.
  std::vector<double> a2(av.size()), b1(bv.size());
  for (std::size_t i = 0; i < av.size(); ++i) a2[i] = 2.0 * av[i];
  for (std::size_t i = 0; i < bv.size(); ++i) b1[i] = double(bv[i]) + 1;
  check_product(Tensor<float>(deft::dot(a * 2, b + 1)), ref_dot(a2, {40, 30}, b1, {30, 20}), "dot(a*2, b+1)");
  check_product(Tensor<float>(deft::matmul(a, b)), ref_dot(to_double(av), {40, 30}, to_double(bv), {30, 20}), "matmul");
  // A product inside an elementwise expression and a reduction.
  const Tensor<float> s = deft::sum(deft::dot(a, b) * 0 + 1);
  BOOST_TEST(s.item() == 800.f);
}

BOOST_AUTO_TEST_CASE(dot_shape_errors) {
  auto expect = [](auto f, std::vector<std::string> parts, const char* what) {
    bool thrown = false;
    try {
      f();
    } catch (const std::invalid_argument& e) {
      thrown = true;
      for (const auto& p : parts)
        BOOST_TEST(std::string(e.what()).find(p) != std::string::npos, what << ": '" << e.what() << "' lacks " << p);
    }
    BOOST_TEST(thrown, what << ": no std::invalid_argument");
  };
  const Tensor<float> m23 = deft::ones({2, 3}), v4 = deft::ones({4}), s = deft::ones({});
  const Tensor<float> b234 = deft::ones({2, 3, 4}), b345 = deft::ones({3, 4, 5}), m45 = deft::ones({4, 5});
  const Tensor<float> r4 = deft::ones({1, 2, 3, 4});
  deft::wait_all();
  engine::reset_stats();
  expect([&] { (void)deft::dot(m23, v4); }, {"(2, 3)", "(4,)"}, "(2,3)(4)");
  expect([&] { (void)deft::dot(v4, m23); }, {"(4,)", "(2, 3)"}, "(4)(2,3)");
  expect([&] { (void)deft::dot(m23, m23); }, {"(2, 3)"}, "(2,3)(2,3)");
  expect([&] { (void)deft::matmul(m23, m45); }, {"(2, 3)", "(4, 5)"}, "matmul (2,3)(4,5)");
  expect([&] { (void)deft::dot(s, v4); }, {"()", "(4,)"}, "scalar");
  expect([&] { (void)deft::dot(m45, b345); }, {"(4, 5)", "(3, 4, 5)"}, "(m,k)(b,k,n)");
  expect([&] { (void)deft::dot(b234, b345); }, {"(2, 3, 4)", "(3, 4, 5)"}, "batch mismatch");
  expect([&] { (void)deft::dot(r4, m45); }, {"(1, 2, 3, 4)"}, "rank 4");
  BOOST_TEST(engine::stats().tasks_recorded == 0u);
  BOOST_TEST(engine::stats().tasks_run == 0u);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(transpose_2d, T, AllTypes) {
  std::mt19937 g(504);
  for (const auto& d : std::vector<std::vector<i64>>{{1, 1}, {3, 5}, {33, 65}, {64, 64}, {100, 300}, {0, 5}, {1, 1000}, {700, 3}}) {
    check_transpose<T>(g, d, {});
    check_transpose<T>(g, d, {1, 0});
    check_transpose<T>(g, d, {0, 1});
  }
}

BOOST_AUTO_TEST_CASE(transpose_nd) {
  std::mt19937 g(505);
  const std::vector<std::vector<int>> perms3 = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (const auto& p : perms3) {
    check_transpose<float>(g, {3, 4, 5}, p);
    check_transpose<std::int64_t>(g, {7, 1, 40}, p);
  }
  check_transpose<float>(g, {3, 4, 5}, {});  // reversed
  check_transpose<float>(g, {2, 3, 4, 5}, {-1, 0, 2, 1});
  check_transpose<double>(g, {2, 3, 4, 5}, {3, 2, 1, 0});
  check_transpose<float>(g, {20, 30, 40, 2}, {1, 3, 0, -2});  // large enough for several workers
  check_transpose<float>(g, {9}, {0});
  check_transpose<float>(g, {}, {});
  // Of a rows() view (an offset into the storage).
  {
    const auto base = random_values<float>(g, 10 * 6, -1, 1);
    const Tensor<float> m = make(base, Shape{10, 6});
    std::vector<double> ref;
    for (int j = 0; j < 6; ++j)
      for (int i = 3; i < 7; ++i) ref.push_back(base[i * 6 + j]);
    check_tensor(Tensor<float>(deft::transpose(m.rows(3, 7))), {6, 4}, ref, 0, 0, "transpose(rows(3,7))");
  }
  // Of an expression, and twice.
  const auto v = random_values<float>(g, 6 * 7, -1, 1);
  const Tensor<float> x = make(v, Shape{6, 7});
  const Tensor<float> tt = deft::transpose(deft::transpose(x * 2));
  std::vector<double> ref(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) ref[i] = 2.0 * v[i];
  check_tensor(tt, {6, 7}, ref, 0, 0, "transpose(transpose(2x))");
}

BOOST_AUTO_TEST_CASE(transpose_errors) {
  const Tensor<float> x = deft::ones({2, 3, 4});
  BOOST_CHECK_THROW(deft::transpose(x, {0, 0, 1}), std::invalid_argument);
  BOOST_CHECK_THROW(deft::transpose(x, {0, 1}), std::invalid_argument);
  BOOST_CHECK_THROW(deft::transpose(x, {0, 1, 3}), std::invalid_argument);
  BOOST_CHECK_THROW(deft::transpose(x, {0, 1, -4}), std::invalid_argument);
  BOOST_CHECK_THROW(deft::transpose(x, {2, 1, -1}), std::invalid_argument);  // -1 repeats 2
}

BOOST_AUTO_TEST_SUITE_END()

// =============================================================================
BOOST_FIXTURE_TEST_SUITE(views, EngineFixture)

BOOST_AUTO_TEST_CASE(reshape_views) {
  std::mt19937 g(601);
  const auto v = random_values<float>(g, 24, -5, 5);
  const Tensor<float> x = make(v, Shape{2, 3, 4});
  const auto vd = to_double(v);
  check_tensor(x.reshape({4, 6}), {4, 6}, vd, 0, 0, "reshape (4,6)");
  check_tensor(x.reshape({-1}), {24}, vd, 0, 0, "reshape (-1)");
  check_tensor(x.reshape({2, -1, 3}), {2, 4, 3}, vd, 0, 0, "reshape (2,-1,3)");
  check_tensor(x.reshape({-1, 1, 8}), {3, 1, 8}, vd, 0, 0, "reshape (-1,1,8)");
  check_tensor(x.reshape(std::vector<i64>{24, 1}), {24, 1}, vd, 0, 0, "reshape vector");
  const Tensor<float> one = make<float>({7}, Shape{1});
  check_tensor(one.reshape({}), {}, {7}, 0, 0, "reshape to 0-d");
  check_tensor(make<float>({}, Shape{0, 3}).reshape({-1}), {0}, {}, 0, 0, "empty reshape (-1)");
  // Errors.
  BOOST_CHECK_THROW(x.reshape({5, 5}), std::invalid_argument);
  BOOST_CHECK_THROW(x.reshape({-1, -1}), std::invalid_argument);
  BOOST_CHECK_THROW(x.reshape({-1, 5}), std::invalid_argument);
  BOOST_CHECK_THROW(x.reshape({-2, 12}), std::invalid_argument);
  BOOST_CHECK_THROW(make<float>({}, Shape{0, 3}).reshape({0, -1}), std::invalid_argument);
  try {
    (void)x.reshape({5, 5});
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("(2, 3, 4)") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(reshape_shares_storage) {
  Tensor<float> x = make<float>({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor<float> flat = x.reshape({-1});
  flat += 10;  // through the view
  check_tensor(x, {2, 3}, {11, 12, 13, 14, 15, 16}, 0, 0, "parent after view +=");
  x *= 2;  // through the parent
  check_tensor(flat, {6}, {22, 24, 26, 28, 30, 32}, 0, 0, "view after parent *=");
  x.reshape({3, 2}).rows(1, 2).assign(deft::zeros({1}));
  check_tensor(x, {2, 3}, {22, 24, 0, 0, 30, 32}, 0, 0, "rows of a reshape, assigned");
}

BOOST_AUTO_TEST_CASE(rows_views) {
  std::mt19937 g(602);
  const auto v = random_values<float>(g, 10 * 7, -5, 5);
  const Tensor<float> x = make(v, Shape{10, 7});
  auto slice = [&](i64 b, i64 e) { return std::vector<double>(v.begin() + b * 7, v.begin() + e * 7); };
  check_tensor(x.rows(0, 10), {10, 7}, slice(0, 10), 0, 0, "rows(0,10)");
  check_tensor(x.rows(3, 6), {3, 7}, slice(3, 6), 0, 0, "rows(3,6)");
  check_tensor(x.rows(9, 10), {1, 7}, slice(9, 10), 0, 0, "rows(9,10)");
  check_tensor(x.rows(4, 4), {0, 7}, {}, 0, 0, "rows(4,4)");
  check_tensor(x.rows(2, 9).rows(1, 3), {2, 7}, slice(3, 5), 0, 0, "rows of rows");
  check_tensor(x.rows(2, 4).reshape({-1}), {14}, slice(2, 4), 0, 0, "reshape of rows");
  check_tensor(x.reshape({5, 14}).rows(1, 3), {2, 14}, slice(2, 6), 0, 0, "rows of reshape");
  // Views take part in expressions (with broadcasting) like any tensor.
  const Tensor<float> y = x.rows(0, 3) - x.rows(9, 10);
  std::vector<double> ref;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 7; ++j) ref.push_back(double(float(v[i * 7 + j] - v[9 * 7 + j])));
  check_tensor(y, {3, 7}, ref, 0, 0, "rows - broadcast row");
  const Tensor<float> r3 = make(random_values<float>(g, 4 * 2 * 3, -1, 1), Shape{4, 2, 3});
  BOOST_TEST((dims_of(r3.rows(1, 3).shape()) == std::vector<i64>{2, 2, 3}));
  const auto all3 = r3.to_vector();
  BOOST_TEST(r3.rows(1, 3).to_vector() == std::vector<float>(all3.begin() + 6, all3.begin() + 18));
  // Out of range.
  BOOST_CHECK_THROW(x.rows(-1, 2), std::invalid_argument);
  BOOST_CHECK_THROW(x.rows(0, 11), std::invalid_argument);
  BOOST_CHECK_THROW(x.rows(5, 4), std::invalid_argument);
  BOOST_CHECK_THROW(x.rows(11, 11), std::invalid_argument);
  BOOST_CHECK_THROW(x.rows(2, 5).rows(0, 4), std::invalid_argument);
  BOOST_CHECK_THROW(make<float>({1}, Shape{}).rows(0, 1), std::invalid_argument);
  try {
    (void)x.rows(0, 11);
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("(10, 7)") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(views_of_pending_values) {
  const Tensor<float> base = make<float>({1, 2, 3, 4, 5, 6}, Shape{3, 2});
  deft::wait_all();
  engine::reset_stats();
  const Tensor<float> x = base * 10;  // deferred
  const Tensor<float> v = x.rows(1, 3);
  const Tensor<float> r = x.reshape({-1});
  BOOST_TEST(engine::stats().tasks_run == (deferred_mode() ? 0u : 1u));
  check_tensor(v, {2, 2}, {30, 40, 50, 60}, 0, 0, "rows of a pending tensor");
  check_tensor(r, {6}, {10, 20, 30, 40, 50, 60}, 0, 0, "reshape of a pending tensor");
  BOOST_TEST(engine::stats().tasks_run == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
