// Reading data files: gunzip, IDX (exact decode of seeded random files and
// every error), Fashion-MNIST from synthetic directories and, when Debian's
// dataset-fashion-mnist is installed, from the real files.
#include <chrono>
#include <cmath>
#include <optional>
#include <cstdlib>
#include <map>
#include <new>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <deft/data.hpp>

#include "data_support.hpp"

#include <zlib.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define DD_HAS_SANITIZER 1
#endif
#endif
#ifndef DD_HAS_SANITIZER
#define DD_HAS_SANITIZER 0
#endif

using namespace dd;
namespace data = deft::data;

namespace {

/// The payload of the embedded gzip fixtures below (4 x 300 bytes).
Bytes fixture_payload() {
  Bytes b(1200);
  for (std::uint64_t i = 0; i < b.size(); ++i) b[i] = std::uint8_t((i * 2654435761u >> 7) % 9 * 28);
  return b;
}
// That IDX file gzipped by zlib 1.2 at level 9: with the Z_FIXED strategy (a
// fixed-Huffman block) and the default strategy (a dynamic-Huffman block).
const char* const fixture_fixed =
    "1f8b08000000000002036360e06062606060616060d46158112273a4c0e2c18a10862305320f7a42185680280bb0780f481c"
    "2cdd0395b600491f814ac3b459206b2bc0a62d04595b0fb2b623d8b4e1760c03698e0921cd312b083ae608698e9121cd3103"
    "10a032031ca00f063840570c7080160c70805a0c7080925afe000035f4b811bc040000";
const char* const fixture_dynamic =
    "1f8b0800000000000203c594b109c0300c043f214586d00819408368100da241348806f128c1c601170941952a839e83e30a"
    "03e70ee000b60b2e14cacd05a1d44ce0fde171b77e1fb3cd99fb1c737e305e317dc364c56cc5e20dfb96414e467232fe2b13"
    "3919cac91404a5e2a0ad38a81707d5e2a05c1c34fbffdc35f4b811bc040000";

/// Runs f() in a child process whose address space may grow by only `cap`
/// bytes, and checks that it throws std::runtime_error saying `expected`
/// (not std::bad_alloc, which means it asked for more). Skipped under the
/// sanitizers, which reserve terabytes of address space.
template <class F>
void check_within_memory_cap(std::size_t cap, F&& f, const std::string& expected) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || DD_HAS_SANITIZER
  (void)cap, (void)f;
  BOOST_TEST_MESSAGE("skipped under a sanitizer: " << expected);
#else
  const pid_t child = fork();
  BOOST_TEST_REQUIRE(child >= 0);
  if (child == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    rlimit limit{};
    if (pages <= 0 || getrlimit(RLIMIT_AS, &limit) != 0) _exit(9);
    limit.rlim_cur = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + rlim_t(cap);
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(9);
    try {
      f();
      _exit(2);
    } catch (const std::runtime_error& e) {
      _exit(std::string(e.what()).find(expected) != std::string::npos ? 0 : 3);
    } catch (const std::bad_alloc&) {
      _exit(4);
    } catch (...) {
      _exit(5);
    }
  }
  int status = 0;
  BOOST_TEST_REQUIRE(waitpid(child, &status, 0) == child);
  BOOST_TEST_REQUIRE(WIFEXITED(status));
  // 2: no error; 3: another message; 4: std::bad_alloc, it took more than `cap`.
  BOOST_TEST(WEXITSTATUS(status) == 0, "exit status " << WEXITSTATUS(status) << ", expected an error saying " << expected);
#endif
}

/// Restores an environment variable at scope exit.
struct EnvVar {
  std::string name;
  std::optional<std::string> old;
  EnvVar(std::string n, const std::optional<std::string>& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    set(value);
  }
  ~EnvVar() { set(old); }
  void set(const std::optional<std::string>& v) {
    if (v) ::setenv(name.c_str(), v->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

/// A Fashion-MNIST-like directory: n images of rows x cols and their labels,
/// seeded random; `gz` gzips the files as Debian does.
struct FakeSet {
  Bytes pixels, labels;
};
FakeSet write_fake_split(const fs::path& dir, data::Split split, std::uint32_t n, std::uint32_t rows, std::uint32_t cols,
                         bool gz, std::uint64_t seed) {
  FakeSet s{random_bytes(std::size_t(n) * rows * cols, seed), random_bytes(n, seed + 1, 10)};
  const char* img = split == data::Split::train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte";
  const char* lbl = split == data::Split::train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte";
  const Bytes ib = idx_bytes({n, rows, cols}, s.pixels), lb = idx_bytes({n}, s.labels);
  write_file(dir / (std::string(img) + (gz ? ".gz" : "")), gz ? gzip_stored(ib) : ib);
  write_file(dir / (std::string(lbl) + (gz ? ".gz" : "")), gz ? gzip_stored(lb) : lb);
  return s;
}

}  // namespace

// --- gzip ------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(gzip)

BOOST_AUTO_TEST_CASE(crc32_check_value) {
  const std::string s = "123456789";  // the CRC catalogue's check input
  BOOST_TEST(data::detail::crc32({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()}) == 0xCBF43926u);
  BOOST_TEST(data::detail::crc32({}) == 0u);
  // A CRC continues across calls.
  const Bytes b = random_bytes(1001, 7);
  std::uint32_t c = 0;
  for (std::uint8_t x : b) c = data::detail::crc32({&x, 1}, c);
  BOOST_TEST(c == data::detail::crc32(b));
}

BOOST_AUTO_TEST_CASE(stored_blocks_and_header_fields) {
  const Bytes d = random_bytes(200000, 11);  // > 65535: several stored blocks
  for (std::uint8_t flags : {0, 2, 4, 8, 16, 2 | 4 | 8 | 16}) {
    BOOST_TEST_CONTEXT("flags " << int(flags)) {
      BOOST_TEST((data::gunzip(gzip_stored(d, flags), "x") == d));
      BOOST_TEST((data::gunzip(gzip_stored(d, flags, 1000), "x") == d));
    }
  }
  BOOST_TEST(data::gunzip(gzip_stored(Bytes{}), "x").empty());
}

BOOST_AUTO_TEST_CASE(fixed_and_dynamic_huffman_blocks) {
  const Bytes idx = idx_bytes({4, 300}, fixture_payload());
  const Bytes fixed = from_hex(fixture_fixed), dynamic = from_hex(fixture_dynamic);
  BOOST_TEST(((fixed[10] >> 1) & 3) == 1);  // the first block's type
  BOOST_TEST(((dynamic[10] >> 1) & 3) == 2);
  BOOST_TEST((data::gunzip(fixed, "x") == idx));
  BOOST_TEST((data::gunzip(dynamic, "x") == idx));
}

BOOST_AUTO_TEST_CASE(concatenated_members) {
  const Bytes ab = random_bytes(5300, 1);
  BOOST_TEST((data::gunzip(gzip_members(ab, {5000}), "x") == ab));
}

BOOST_AUTO_TEST_CASE(truncated_and_damaged_data_throw) {
  // Every prefix of a compressed stream is an error, never a crash or a hang.
  for (const Bytes& g : {from_hex(fixture_dynamic), from_hex(fixture_fixed), gzip_stored(random_bytes(3000, 5), 8, 1000)})
    for (std::size_t cut = 0; cut < g.size(); ++cut)
      BOOST_CHECK_THROW(data::gunzip(std::span(g.data(), cut), "x"), std::runtime_error);
  const Bytes dyn = from_hex(fixture_dynamic);
  DD_CHECK_THROWS(data::gunzip(std::span(dyn).first(60), "f.gz"), std::runtime_error, "f.gz",
                  "corrupt gzip data", "truncated");
  // A flipped bit in the data: the CRC-32 (or the code tables) notice.
  Bytes g = gzip_stored(random_bytes(3000, 5));
  g[100] ^= 4;
  DD_CHECK_THROWS(data::gunzip(g, "f.gz"), std::runtime_error, "f.gz", "CRC-32 mismatch");
  // Random damage anywhere: an error or (in header bytes nobody checks) the
  // right data; never a crash.
  std::mt19937_64 r(3);
  const Bytes idx = idx_bytes({4, 300}, fixture_payload());
  for (int i = 0; i < 2000; ++i) {
    Bytes d = from_hex(i % 2 ? fixture_dynamic : fixture_fixed);
    d[r() % d.size()] ^= std::uint8_t(1 << (r() % 8));
    try {
      BOOST_TEST((data::gunzip(d, "x") == idx));
    } catch (const std::runtime_error&) {
    }
  }
  Bytes bad = gzip_stored(random_bytes(10, 5));
  bad[2] = 7;
  DD_CHECK_THROWS(data::gunzip(bad, "f.gz"), std::runtime_error, "compression method 7");
  Bytes trailing = gzip_stored(random_bytes(10, 5));
  trailing.insert(trailing.end(), {0, 0, 0});
  DD_CHECK_THROWS(data::gunzip(trailing, "f.gz"), std::runtime_error, "3 bytes after the last gzip member");
}

// A cut file's last 4 bytes are compressed data, read as its length: the
// first guess of the output's size must not zero-fill gigabytes before the
// error is found.
BOOST_AUTO_TEST_CASE(a_cut_file_is_refused_without_a_huge_allocation) {
  Bytes g = gzip_stored(random_bytes(std::size_t(2) << 20, 9));
  for (std::size_t k = 1; k <= 4; ++k) g[g.size() - k] = 0xFF;  // "4 GiB - 1 bytes"
  check_within_memory_cap(std::size_t(512) << 20, [&] { (void)data::gunzip(g, "f.gz"); }, "length mismatch");
}

BOOST_AUTO_TEST_CASE(a_limit_on_the_output_is_kept_across_members_and_within_memory) {
  const Bytes ab = random_bytes(1000, 3), both = gzip_members(ab, {700});
  BOOST_TEST((data::gunzip(both, "f.gz", 1000) == ab));  // exactly the limit
  DD_CHECK_THROWS(data::gunzip(both, "f.gz", 999), std::runtime_error,
                  "f.gz: the gzip data inflates to more than 999 bytes, the most the caller allows");
  DD_CHECK_THROWS(data::gunzip(gzip_zeros({}, std::size_t(1) << 20), "z.gz", 4096), std::runtime_error,
                  "more than 4096 bytes");
  // Limits and checks other than the limit still apply below it.
  Bytes damaged = gzip_stored(std::span(ab).first(700));
  damaged[damaged.size() - 8] ^= 1;
  DD_CHECK_THROWS(data::gunzip(damaged, "d.gz", 1000), std::runtime_error, "CRC-32 mismatch");
  // 1 GiB of zeros from 6.6 MB, allowed 1 MiB: the memory stays far below 1 GiB.
  check_within_memory_cap(
      std::size_t(128) << 20,
      [&] { (void)data::gunzip(gzip_zeros({}, std::size_t(1) << 30, false), "bomb.gz", std::size_t(1) << 20); },
      "more than 1048576 bytes");
}

BOOST_AUTO_TEST_CASE(agrees_with_zlib) {
  std::mt19937_64 r(2024);
  for (int it = 0; it < 1500; ++it) {
    const std::size_t n = r() % (it < 1000 ? 5000 : 200000);
    const int kind = int(r() % 4), level = int(r() % 10), strategy = int(r() % 5);
    Bytes src(n);  // random, few symbols, text-like with rare changes, long runs
    for (std::size_t k = 0; k < n; ++k)
      src[k] = kind == 0 ? std::uint8_t(r()) : kind == 1 ? std::uint8_t(r() % 4)
             : kind == 2 ? std::uint8_t("abcabcabd"[k % 9] + (r() % 50 == 0)) : std::uint8_t(k / 100);
    z_stream z{};
    BOOST_REQUIRE(deflateInit2(&z, level, Z_DEFLATED, 31, 8, strategy) == Z_OK);
    Bytes comp(deflateBound(&z, uLong(n)) + 64);
    z.next_in = src.data();
    z.avail_in = uInt(n);
    z.next_out = comp.data();
    z.avail_out = uInt(comp.size());
    BOOST_REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
    comp.resize(z.total_out);
    deflateEnd(&z);
    BOOST_TEST_CONTEXT("stream " << it << ": " << n << " bytes, kind " << kind << ", level " << level << ", strategy " << strategy) {
      BOOST_TEST((data::gunzip(comp, "x") == src));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// --- idx ---------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(idx)

BOOST_AUTO_TEST_CASE(exact_decode_plain_and_gzipped) {
  TempDir dir;
  const std::vector<std::vector<std::uint32_t>> shapes = {{1}, {37}, {5, 3, 7}, {2, 1, 3, 1, 2}, {3, 256, 2}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    std::size_t n = 1;
    for (auto d : shapes[i]) n *= d;
    const Bytes payload = random_bytes(n, 100 + i);
    const Bytes file = idx_bytes(shapes[i], payload);
    write_file(dir / "a.idx", file);
    write_file(dir / "a.idx.gz", gzip_stored(file, 8, 500));
    for (const char* name : {"a.idx", "a.idx.gz"}) {
      BOOST_TEST_CONTEXT(name << ", shape " << i) {
        const data::IdxArray a = data::read_idx(dir / name);
        BOOST_TEST(a.dims == std::vector<std::int64_t>(shapes[i].begin(), shapes[i].end()), boost::test_tools::per_element());
        BOOST_TEST(a.size() == std::int64_t(n));
        BOOST_TEST((a.data == payload));
      }
    }
  }
  // gzip is recognised by content, not by name.
  write_file(dir / "plain_name", gzip_stored(idx_bytes({3}, Bytes{1, 2, 3})));
  BOOST_TEST((data::read_idx(dir / "plain_name").data == Bytes{1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(errors_name_the_file_and_the_problem) {
  TempDir dir;
  const Bytes ok = idx_bytes({2, 3}, random_bytes(6, 1));
  auto check_file = [&](const std::string& name, const Bytes& bytes, std::vector<std::string> parts) {
    write_file(dir / name, bytes);
    parts.push_back((dir / name).string() + ": ");  // every message names the file
    check_throws<std::runtime_error>([&] { data::read_idx(dir / name); }, parts, name.c_str());
  };
  DD_CHECK_THROWS(data::read_idx(dir / "absent"), std::runtime_error, (dir / "absent").string(), "no such file");
  DD_CHECK_THROWS(data::read_idx(dir.path), std::runtime_error, "is a directory");
  // There, but out of reach (a loop of links; the same path as a lack of
  // permission, which root would not see): not "no such file".
  std::filesystem::create_symlink(dir / "loop_b", dir / "loop_a");
  std::filesystem::create_symlink(dir / "loop_a", dir / "loop_b");
  DD_CHECK_THROWS(data::read_idx(dir / "loop_a"), std::runtime_error, (dir / "loop_a").string() + ": cannot read: ",
                  std::make_error_code(std::errc::too_many_symbolic_link_levels).message());
  check_file("empty", {}, {"too short for an IDX file (0 bytes"});
  Bytes magic = ok;
  magic[0] = 0x12, magic[1] = 0x34;
  check_file("magic", magic, {"bad magic number 0x12340802", "not an IDX file"});
  Bytes f32 = ok;
  f32[2] = 0x0D;
  check_file("float", f32, {"element type 0x0D (float32) is not supported"});
  Bytes unknown = ok;
  unknown[2] = 0x07;
  check_file("unknown", unknown, {"unknown IDX element type code 0x07"});
  check_file("rank0", Bytes{0, 0, 8, 0}, {"declares no dimensions"});
  check_file("rank9", Bytes{0, 0, 8, 9}, {"9 dimensions"});
  check_file("zero_extent", idx_bytes({4, 0, 3}, {}), {"dimension 1 has extent 0"});
  check_file("short_header", Bytes(ok.begin(), ok.begin() + 9), {"truncated header", "12 header bytes", "has 9"});
  check_file("truncated", Bytes(ok.begin(), ok.end() - 2), {"truncated", "2 x 3 = 6 bytes", "has 4"});
  Bytes longer = ok;
  longer.insert(longer.end(), {9, 9, 9});
  check_file("trailing", longer, {"3 trailing bytes", "2 x 3 = 6 bytes", "has 9"});
  check_file("huge", idx_bytes({0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}), {"more elements than fit in 64 bits"});
  // A sound gzip file with a bad IDX inside says both.
  write_file(dir / "t.gz", gzip_stored(Bytes(ok.begin(), ok.end() - 1)));
  DD_CHECK_THROWS(data::read_idx(dir / "t.gz"), std::runtime_error, (dir / "t.gz").string() + " (after gunzip)", "truncated");
  // A damaged gzip file.
  Bytes gz = gzip_stored(ok);
  gz.resize(gz.size() - 5);
  write_file(dir / "cut.gz", gz);
  DD_CHECK_THROWS(data::read_idx(dir / "cut.gz"), std::runtime_error, (dir / "cut.gz").string(), "corrupt gzip data");
}

// A file of a few MB can inflate to gigabytes: read_idx stops as soon as the
// data passes what the IDX header declares, before allocating the rest.
BOOST_AUTO_TEST_CASE(gzip_data_past_the_header_is_refused_before_it_is_inflated) {
  TempDir dir;
  const Bytes header = idx_bytes({2, 3}, {});
  const std::vector<std::string> parts = {(dir / "bomb.gz").string() + " (after gunzip): more data than the header declares",
                                          "2 x 3 = 6 bytes of data after the 12-byte header"};
  write_file(dir / "bomb.gz", gzip_zeros(header, std::size_t(1) << 20));
  check_throws<std::runtime_error>([&] { data::read_idx(dir / "bomb.gz"); }, parts, "1 MiB of zeros");
  // The whole file inflated would take 1 GiB: allowed 128 MiB.
  // (Written in the child: under a sanitizer the check is skipped.)
  check_within_memory_cap(
      std::size_t(128) << 20,
      [&] {
        write_file(dir / "bomb.gz", gzip_zeros(header, std::size_t(1) << 30, false));
        data::read_idx(dir / "bomb.gz");
      },
      parts[0]);
  // Exactly the declared size still reads: a short file (inflated whole with
  // the header), and one whose last 258-byte back-reference ends at the limit.
  write_file(dir / "exact.gz", gzip_zeros(header, 6));
  const data::IdxArray exact = data::read_idx(dir / "exact.gz");
  BOOST_TEST((exact.data == Bytes(6, 0)));
  BOOST_TEST((exact.dims == std::vector<std::int64_t>{2, 3}));
  write_file(dir / "run.gz", gzip_zeros(idx_bytes({259}, {}), 259));
  BOOST_TEST((data::read_idx(dir / "run.gz").data == Bytes(259, 0)));
  // One byte more than declared, in the same run: refused.
  write_file(dir / "run.gz", gzip_zeros(idx_bytes({258}, {}), 259));
  DD_CHECK_THROWS(data::read_idx(dir / "run.gz"), std::runtime_error, "more data than the header declares");
  write_file(dir / "wide.gz", gzip_zeros(idx_bytes({1000, 1000}, {}), 1000000));
  BOOST_TEST((data::read_idx(dir / "wide.gz").data == Bytes(1000000, 0)));
}

// `gzip a b > c` makes a file of several members: the header pass and the
// limit on the data both carry across member boundaries.
BOOST_AUTO_TEST_CASE(gzip_members_split_anywhere_read_and_a_bomb_in_a_later_member_is_refused) {
  TempDir dir;
  const Bytes big = idx_bytes({40, 3}, random_bytes(120, 7));  // past the 36 bytes of the header pass
  for (const std::vector<std::size_t>& cuts : std::vector<std::vector<std::size_t>>{{3}, {12}, {20}, {36}, {37}, {5, 30, 90}}) {
    write_file(dir / "m.gz", gzip_members(big, cuts));
    const data::IdxArray a = data::read_idx(dir / "m.gz");
    BOOST_TEST((a.dims == std::vector<std::int64_t>{40, 3}));
    BOOST_TEST((a.data == Bytes(big.begin() + 12, big.end())), "cut at " << cuts.front());
  }
  const Bytes small = idx_bytes({2, 3}, random_bytes(6, 8));  // inflated whole by the header pass
  write_file(dir / "s.gz", gzip_members(small, {7}));
  BOOST_TEST((data::read_idx(dir / "s.gz").data == Bytes(small.begin() + 12, small.end())));
  // The declared data whole in the first member, `zeros` more in the second.
  const auto write_bomb = [&](std::size_t zeros, bool checksum) {
    Bytes bomb = gzip_members(small, {});
    const Bytes more = gzip_zeros({}, zeros, checksum);
    bomb.insert(bomb.end(), more.begin(), more.end());
    write_file(dir / "bomb.gz", bomb);
  };
  write_bomb(std::size_t(1) << 20, true);
  DD_CHECK_THROWS(data::read_idx(dir / "bomb.gz"), std::runtime_error, "more data than the header declares",
                  "2 x 3 = 6 bytes of data");
  // 1 GiB in the second member: allowed 128 MiB.
  check_within_memory_cap(
      std::size_t(128) << 20,
      [&] {
        write_bomb(std::size_t(1) << 30, false);
        data::read_idx(dir / "bomb.gz");
      },
      "more data than the header declares");
}

BOOST_AUTO_TEST_SUITE_END()

// --- fashion_mnist (synthetic files) -------------------------------------------------

BOOST_AUTO_TEST_SUITE(fashion_mnist)

BOOST_AUTO_TEST_CASE(loads_plain_and_gzipped_splits) {
  TempDir dir;
  const FakeSet train = write_fake_split(dir.path, data::Split::train, 50, 4, 3, true, 10);
  const FakeSet test = write_fake_split(dir.path, data::Split::test, 20, 4, 3, false, 20);
  for (auto [split, set] : {std::pair{data::Split::train, &train}, std::pair{data::Split::test, &test}}) {
    const std::int64_t n = std::int64_t(set->labels.size());
    const data::FashionMnist grid = data::load_fashion_mnist(dir.path, split);
    BOOST_TEST(grid.size() == n);
    BOOST_TEST((grid.images.shape() == deft::Shape{n, 4, 3}));
    BOOST_TEST((grid.labels.shape() == deft::Shape{n}));
    const std::vector<float> px = grid.images.to_vector();
    for (std::size_t i = 0; i < px.size(); ++i) BOOST_TEST_REQUIRE(px[i] == float(set->pixels[i]) / 255.0f);
    const std::vector<std::int64_t> lb = grid.labels.to_vector();
    BOOST_TEST(lb == std::vector<std::int64_t>(set->labels.begin(), set->labels.end()), boost::test_tools::per_element());
    const data::FashionMnist flat = data::load_fashion_mnist(dir.path, split, data::Layout::flat);
    BOOST_TEST((flat.images.shape() == deft::Shape{n, 12}));
    BOOST_TEST((flat.images.to_vector() == px));
  }
  BOOST_TEST(data::fashion_mnist_classes.size() == 10u);
  BOOST_TEST(data::fashion_mnist_classes[0] == "T-shirt/top");
  BOOST_TEST(data::fashion_mnist_classes[9] == "Ankle boot");
}

BOOST_AUTO_TEST_CASE(bad_directories_and_files) {
  TempDir dir;
  DD_CHECK_THROWS(data::load_fashion_mnist(dir.path, data::Split::test), std::runtime_error, dir.path.string(),
                  "has no t10k-images-idx3-ubyte", "apt-get install dataset-fashion-mnist", "--data DIR");
  // As many labels as images.
  write_fake_split(dir.path, data::Split::test, 20, 4, 3, false, 1);
  write_file(dir / "t10k-labels-idx1-ubyte", idx_bytes({19}, random_bytes(19, 2, 10)));
  DD_CHECK_THROWS(data::load_fashion_mnist(dir.path, data::Split::test), std::runtime_error, "has 20 images but",
                  (dir / "t10k-labels-idx1-ubyte").string(), "has 19 labels");
  // Labels outside 0..9.
  Bytes labels = random_bytes(20, 3, 10);
  labels[7] = 10;
  write_file(dir / "t10k-labels-idx1-ubyte", idx_bytes({20}, labels));
  DD_CHECK_THROWS(data::load_fashion_mnist(dir.path, data::Split::test), std::runtime_error, "label 10 of sample 7 is outside 0..9");
  // Images that are not (N, rows, cols).
  write_file(dir / "t10k-images-idx3-ubyte", idx_bytes({20, 12}, random_bytes(240, 4)));
  DD_CHECK_THROWS(data::load_fashion_mnist(dir.path, data::Split::test), std::runtime_error,
                  "expected images of shape (N, rows, cols), found shape (20, 12)");
  // An image file out of reach (a loop of links) is named as such, not as absent.
  fs::remove(dir / "t10k-images-idx3-ubyte");
  fs::create_symlink(dir / "t10k-images-idx3-ubyte", dir / "t10k-images-idx3-ubyte");
  const std::string loop = std::make_error_code(std::errc::too_many_symbolic_link_levels).message();
  DD_CHECK_THROWS(data::load_fashion_mnist(dir.path, data::Split::test), std::runtime_error,
                  "cannot read " + (dir / "t10k-images-idx3-ubyte").string() + ": " + loop);
  // A data directory out of reach.
  fs::create_symlink(dir / "looping", dir / "looping");
  DD_CHECK_THROWS(data::find_fashion_mnist_dir(dir / "looping"), std::runtime_error, (dir / "looping").string(),
                  "cannot be read: " + loop);
}

BOOST_AUTO_TEST_CASE(finding_the_directory) {
  TempDir good, half, root;
  write_fake_split(good.path, data::Split::train, 3, 2, 2, true, 1);
  write_fake_split(good.path, data::Split::test, 2, 2, 2, false, 2);
  write_fake_split(half.path, data::Split::test, 2, 2, 2, false, 3);  // no train split
  fs::create_directories(root / "fashion-mnist");
  for (const auto& f : fs::directory_iterator(good.path)) fs::copy_file(f.path(), root / "fashion-mnist" / f.path().filename());

  // --data DIR: used when complete, an error otherwise (no silent fallback).
  BOOST_TEST(data::find_fashion_mnist_dir(good.path) == good.path);
  BOOST_TEST(data::find_fashion_mnist_dir(root.path) == root / "fashion-mnist");
  DD_CHECK_THROWS(data::find_fashion_mnist_dir(half.path), std::runtime_error, half.path.string(),
                  "lacks train-images-idx3-ubyte, train-labels-idx1-ubyte", "apt-get install dataset-fashion-mnist");
  DD_CHECK_THROWS(data::find_fashion_mnist_dir(good / "nope"), std::runtime_error, "is not a directory");

  // The environment: $DEFT_DATA/fashion-mnist, $DEFT_DATA, then $FASHION_MNIST_DIR.
  {
    EnvVar a("DEFT_DATA", root.path.string()), b("FASHION_MNIST_DIR", good.path.string());
    BOOST_TEST(data::find_fashion_mnist_dir() == root / "fashion-mnist");
  }
  {
    EnvVar a("DEFT_DATA", good.path.string()), b("FASHION_MNIST_DIR", std::nullopt);
    BOOST_TEST(data::find_fashion_mnist_dir() == good.path);
  }
  {
    EnvVar a("DEFT_DATA", half.path.string()), b("FASHION_MNIST_DIR", good.path.string());
    BOOST_TEST(data::find_fashion_mnist_dir() == good.path);
  }
  // Nothing usable: the error lists every place and what to do, unless the
  // Debian package is installed, which is then the answer.
  {
    EnvVar a("DEFT_DATA", half.path.string()), b("FASHION_MNIST_DIR", std::nullopt);
    const fs::path debian(data::fashion_mnist_debian_dir);
    if (data::detail::fashion_mnist_missing(debian).empty()) {
      BOOST_TEST(data::find_fashion_mnist_dir() == debian);
    } else {
      DD_CHECK_THROWS(data::find_fashion_mnist_dir(), std::runtime_error, "Fashion-MNIST not found",
                      half.path.string() + " ($DEFT_DATA): lacks train-images-idx3-ubyte",
                      "$FASHION_MNIST_DIR: not set", "/usr/share/datasets/fashion-mnist (the dataset-fashion-mnist package's",
                      "sudo apt-get install dataset-fashion-mnist");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

// --- fashion_mnist_real (Debian's dataset-fashion-mnist) ---------------------------

namespace {
// Runs the suite only where the files are found; otherwise Boost.Test reports
// it as skipped with find_fashion_mnist_dir's explanation.
struct RealDataInstalled {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    try {
      data::find_fashion_mnist_dir();
      return true;
    } catch (const std::runtime_error& e) {
      boost::test_tools::assertion_result r(false);
      r.message() << e.what();
      return r;
    }
  }
};

void check_split(data::Split split, std::int64_t n, std::int64_t per_class, double seconds_limit) {
  const auto dir = data::find_fashion_mnist_dir();
  const auto t0 = std::chrono::steady_clock::now();
  const data::FashionMnist d = data::load_fashion_mnist(dir, split);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("loaded the " << (split == data::Split::train ? "train" : "test") << " split from " << dir << " in "
                                   << s << " s");
  BOOST_TEST(s < seconds_limit);
  BOOST_TEST((d.images.shape() == deft::Shape{n, 28, 28}));
  BOOST_TEST((d.labels.shape() == deft::Shape{n}));
  std::map<std::int64_t, std::int64_t> count;
  for (std::int64_t l : d.labels.to_vector()) ++count[l];
  BOOST_TEST(count.size() == 10u);
  for (auto [label, c] : count) {
    BOOST_TEST_CONTEXT("label " << label) {
      BOOST_TEST(label >= 0);
      BOOST_TEST(label <= 9);
      BOOST_TEST(c == per_class);
    }
  }
  double lo = 1, hi = 0;
  for (float v : d.images.to_vector()) lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
  BOOST_TEST(lo == 0.0);
  BOOST_TEST(hi == 1.0);
}
}  // namespace

BOOST_AUTO_TEST_SUITE(fashion_mnist_real, *boost::unit_test::precondition(RealDataInstalled{}))

BOOST_AUTO_TEST_CASE(test_split) {
  check_split(data::Split::test, 10000, 1000, 30);
  // The first labels and the pixel total (from Python's gzip of the same files).
  const auto d = data::load_fashion_mnist(data::find_fashion_mnist_dir(), data::Split::test, data::Layout::flat);
  BOOST_TEST((d.images.shape() == deft::Shape{10000, 784}));
  const auto labels = d.labels.to_vector();
  BOOST_TEST(std::vector<std::int64_t>(labels.begin(), labels.begin() + 8) == (std::vector<std::int64_t>{9, 2, 1, 1, 6, 1, 4, 6}),
             boost::test_tools::per_element());
  std::int64_t total = 0;
  for (float v : d.images.to_vector()) total += std::int64_t(std::lround(v * 255.0f));
  BOOST_TEST(total == 573469082);
}

BOOST_AUTO_TEST_CASE(train_split) { check_split(data::Split::train, 60000, 6000, 60); }

BOOST_AUTO_TEST_SUITE_END()
