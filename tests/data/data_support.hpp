// Helpers for the data tests: a temporary directory, IDX and gzip writers,
// and a check that an expression throws a given type with a given text.
#pragma once
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <deft/data/gzip.hpp>

namespace dd {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

/// A fresh directory under the system's temp directory, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = fs::temp_directory_path() /
           ("deft_data_test_" + std::to_string(stamp) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path / name; }
};

inline void write_file(const fs::path& p, std::span<const std::uint8_t> bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  BOOST_REQUIRE_MESSAGE(out.good(), "could not write " << p);
}

/// An IDX file: magic (0, 0, type, rank), big-endian extents, payload.
inline Bytes idx_bytes(const std::vector<std::uint32_t>& dims, std::span<const std::uint8_t> payload,
                       std::uint8_t type = 0x08) {
  Bytes b{0, 0, type, std::uint8_t(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(std::uint8_t(d >> s));
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

/// `n` bytes from a seeded generator (the same on every platform).
inline Bytes random_bytes(std::size_t n, std::uint64_t seed, unsigned modulo = 256) {
  std::mt19937_64 g(seed);
  Bytes b(n);
  for (auto& x : b) x = std::uint8_t(g() % modulo);
  return b;
}

inline void put_le32(Bytes& b, std::uint32_t v) {
  for (int s = 0; s < 32; s += 8) b.push_back(std::uint8_t(v >> s));
}

/// A gzip member holding `data` in stored (uncompressed) DEFLATE blocks of at
/// most `block` bytes; `flags` adds FEXTRA (4), FNAME (8), FCOMMENT (16) and
/// FHCRC (2) header fields, to cover the header parser.
inline Bytes gzip_stored(std::span<const std::uint8_t> data, std::uint8_t flags = 0, std::size_t block = 65535) {
  Bytes g{0x1F, 0x8B, 8, flags, 1, 2, 3, 4, 0, 3};
  if (flags & 4) g.insert(g.end(), {3, 0, 'x', 'y', 'z'});
  if (flags & 8) g.insert(g.end(), {'f', '.', 'i', 'd', 'x', 0});
  if (flags & 16) g.insert(g.end(), {'h', 'i', 0});
  if (flags & 2) {
    const std::uint32_t c = deft::data::detail::crc32(g);
    g.push_back(std::uint8_t(c));
    g.push_back(std::uint8_t(c >> 8));
  }
  std::size_t at = 0;
  do {
    const std::size_t len = std::min(block, data.size() - at);
    g.push_back(at + len == data.size() ? 1 : 0);  // BFINAL, BTYPE 00
    g.insert(g.end(), {std::uint8_t(len), std::uint8_t(len >> 8), std::uint8_t(~len), std::uint8_t(~len >> 8)});
    g.insert(g.end(), data.begin() + std::ptrdiff_t(at), data.begin() + std::ptrdiff_t(at + len));
    at += len;
  } while (at < data.size());
  put_le32(g, deft::data::detail::crc32(data));
  put_le32(g, std::uint32_t(data.size()));
  return g;
}

/// `whole` as consecutive gzip members of stored blocks, cut at `cuts`
/// (ascending): what `gzip a b > c` makes.
inline Bytes gzip_members(std::span<const std::uint8_t> whole, std::vector<std::size_t> cuts) {
  Bytes g;
  std::size_t from = 0;
  cuts.push_back(whole.size());
  for (const std::size_t to : cuts) {
    const Bytes m = gzip_stored(whole.subspan(from, to - from));
    g.insert(g.end(), m.begin(), m.end());
    from = to;
  }
  return g;
}

/// DEFLATE's bit stream: fields least significant bit first, Huffman codes
/// most significant bit first.
class BitWriter {
 public:
  void field(std::uint32_t v, int n) {
    acc_ |= std::uint64_t(v) << bits_;
    for (bits_ += n; bits_ >= 8; bits_ -= 8, acc_ >>= 8) out_.push_back(std::uint8_t(acc_));
  }
  void code(std::uint32_t c, int n) {
    std::uint32_t reversed = 0;
    for (int i = 0; i < n; ++i) reversed |= ((c >> i) & 1u) << (n - 1 - i);
    field(reversed, n);
  }
  Bytes finish() {
    if (bits_) out_.push_back(std::uint8_t(acc_));
    return std::move(out_);
  }

 private:
  Bytes out_;
  std::uint64_t acc_ = 0;
  int bits_ = 0;
};

/// A sound gzip member of `prefix` then `zeros` zero bytes: one
/// fixed-Huffman block whose zeros are 258-byte back-references, 13 bits
/// each (about 160:1 here; DEFLATE allows 1032:1). How a file of a few MB
/// inflates to gigabytes. Without `checksum` the trailer's CRC-32 is 0
/// (for data never inflated to its end).
inline Bytes gzip_zeros(std::span<const std::uint8_t> prefix, std::size_t zeros, bool checksum = true) {
  BitWriter w;
  w.field(1, 1);  // BFINAL
  w.field(1, 2);  // BTYPE 01: fixed Huffman codes
  auto literal = [&](std::uint8_t b) { b < 144 ? w.code(0x30u + b, 8) : w.code(0x190u + (b - 144u), 9); };
  for (std::uint8_t b : prefix) literal(b);
  std::size_t left = zeros;
  if (left) literal(0), --left;  // a byte for the first back-reference to copy
  for (; left >= 258; left -= 258) {
    w.code(0xC5, 8);  // length 258 (symbol 285)
    w.code(0, 5);     // distance 1 (symbol 0)
  }
  for (; left; --left) literal(0);
  w.code(0, 7);  // end of block (symbol 256)
  Bytes g{0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 3};
  const Bytes body = w.finish();
  g.insert(g.end(), body.begin(), body.end());
  std::uint32_t crc = deft::data::detail::crc32(prefix);
  const Bytes chunk(std::size_t(1) << 16, 0);
  for (std::size_t k = checksum ? zeros : 0; k; k -= std::min(k, chunk.size()))
    crc = deft::data::detail::crc32(std::span(chunk).first(std::min(k, chunk.size())), crc);
  if (!checksum) crc = 0;
  put_le32(g, crc);
  put_le32(g, std::uint32_t(prefix.size() + zeros));
  return g;
}

inline Bytes from_hex(const std::string& h) {
  Bytes b;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) b.push_back(std::uint8_t(std::stoi(h.substr(i, 2), nullptr, 16)));
  return b;
}

}  // namespace dd

namespace dd {

/// Checks that f() throws `Type` (or a subclass) whose what() contains every
/// one of `parts`; `what` names the call in failure messages.
template <class Type, class F>
void check_throws(F&& f, const std::vector<std::string>& parts, const char* what) {
  try {
    f();
  } catch (const Type& e) {
    const std::string msg = e.what();
    BOOST_TEST_MESSAGE(what << " threw: " << msg);
    for (const std::string& p : parts)
      BOOST_CHECK_MESSAGE(msg.find(p) != std::string::npos, what << ": the message \"" << msg << "\" lacks \"" << p << "\"");
    return;
  } catch (const std::exception& e) {
    BOOST_ERROR(what << " threw another exception type: " << e.what());
    return;
  }
  BOOST_ERROR(what << " did not throw");
}

}  // namespace dd

/// DD_CHECK_THROWS(expr, Type, "substring", ...): expr throws Type with every substring in its message.
#define DD_CHECK_THROWS(expr, Type, ...) \
  ::dd::check_throws<Type>([&] { (void)(expr); }, std::vector<std::string>{__VA_ARGS__}, #expr)
