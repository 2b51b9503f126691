// gunzip for data files: gzip members (RFC 1952) holding DEFLATE streams
// (RFC 1951). Debian's dataset packages ship their IDX files gzipped; a small
// inflater here keeps deft free of a zlib dependency (a header-only library
// cannot make its users link -lz). Every member's CRC-32 and length are
// checked, so a corrupt or truncated file is an error, never wrong data.
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../core/error.hpp"

namespace deft::data {

namespace detail {

/// "0x" and `digits` upper-case hex digits of v, for magic numbers and checksums.
inline std::string hex(std::uint64_t v, int digits) {
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += "0123456789ABCDEF"[(v >> (4 * i)) & 0xF];
  return s;
}

/// CRC-32 (the gzip/zlib/PNG one, reflected polynomial 0xEDB88320) of `bytes`,
/// continuing from `crc` (0 to start). Slicing by 8: the train images are 47 MB.
inline std::uint32_t crc32(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0) {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  crc = ~crc;
  const std::uint8_t* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; p += 8, n -= 8) {
    const std::uint32_t lo = crc ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24);
    const std::uint32_t hi = std::uint32_t(p[4]) | std::uint32_t(p[5]) << 8 | std::uint32_t(p[6]) << 16 | std::uint32_t(p[7]) << 24;
    crc = tables[7][lo & 0xFF] ^ tables[6][(lo >> 8) & 0xFF] ^ tables[5][(lo >> 16) & 0xFF] ^ tables[4][lo >> 24] ^
          tables[3][hi & 0xFF] ^ tables[2][(hi >> 8) & 0xFF] ^ tables[1][(hi >> 16) & 0xFF] ^ tables[0][hi >> 24];
  }
  for (; n; ++p, --n) crc = tables[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

/// Thrown for corrupt data inside the inflater; gunzip() adds the file name.
struct InflateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown by the inflater once its output has passed the caller's limit.
struct OutputLimitReached {};

/// Reads DEFLATE's little-endian bit stream. Bits past the end of the input
/// read as zeros, but consuming them is an error: that is how truncation is
/// found without a bounds check on every peek.
class BitReader {
 public:
  BitReader(const std::uint8_t* begin, const std::uint8_t* end) : p_(begin), end_(end) {}

  /// The next n <= 32 bits without consuming them (zeros past the end).
  std::uint32_t peek(int n) {
    if (count_ < n) refill();
    return std::uint32_t(buf_ & ((std::uint64_t(1) << n) - 1));
  }
  void consume(int n) {
    if (n > count_) throw InflateError("the compressed data ends in the middle of a block (truncated file?)");
    buf_ >>= n;
    count_ -= n;
  }
  std::uint32_t bits(int n) {
    const std::uint32_t v = peek(n);
    consume(n);
    return v;
  }
  /// Drops the bits up to the next byte boundary and returns the position of
  /// the next unread byte (stored blocks and the gzip trailer are byte-aligned).
  const std::uint8_t* align() {
    consume(count_ % 8);
    const std::uint8_t* at = p_ - count_ / 8;
    buf_ = 0;
    count_ = 0;
    p_ = at;
    return at;
  }
  void seek(const std::uint8_t* at) { p_ = at; }

 private:
  void refill() {
    if (end_ - p_ >= 8) {  // fast path: one 8-byte load, keep whole bytes that fit
      std::uint64_t w = 0;
      if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(&w, p_, 8);
      } else {
        for (int i = 7; i >= 0; --i) w = w << 8 | p_[i];
      }
      const int take = (63 - count_) / 8;  // whole bytes that fit (count_ < 32 here)
      buf_ = (buf_ | w << count_) & ((std::uint64_t(1) << (count_ + take * 8)) - 1);
      p_ += take;
      count_ += take * 8;
      return;
    }
    while (count_ <= 56 && p_ < end_) {
      buf_ |= std::uint64_t(*p_++) << count_;
      count_ += 8;
    }
  }

  const std::uint8_t* p_;
  const std::uint8_t* end_;
  std::uint64_t buf_ = 0;
  int count_ = 0;
};

/// A canonical Huffman code: a 10-bit lookup table for the common short codes
/// and the counts per length for a bit-by-bit walk of the rare longer ones.
class Huffman {
 public:
  static constexpr int max_bits = 15;
  static constexpr int fast_bits = 10;

  /// Builds the code from code lengths (0 = symbol unused). An over-subscribed
  /// set is an error; so is an incomplete one, except a single code of length
  /// one (which RFC 1951 allows for a distance code), as zlib decides.
  void build(const std::uint8_t* lengths, int n, const char* what) {
    count_.fill(0);
    for (int s = 0; s < n; ++s) ++count_[lengths[s]];
    count_[0] = 0;
    int left = 1, max_len = 0;
    for (int len = 1; len <= max_bits; ++len) {
      left = left * 2 - count_[len];
      if (left < 0) throw InflateError(std::string("over-subscribed ") + what + " code");
      if (count_[len]) max_len = len;
    }
    if (left > 0 && max_len > 1) throw InflateError(std::string("incomplete ") + what + " code");
    std::array<std::uint16_t, max_bits + 2> offset{};
    for (int len = 1; len <= max_bits; ++len) offset[len + 1] = std::uint16_t(offset[len] + count_[len]);
    for (int s = 0; s < n; ++s)
      if (lengths[s]) symbol_[offset[lengths[s]]++] = std::uint16_t(s);
    // Fast table: each code of length <= fast_bits, bit-reversed (DEFLATE
    // sends Huffman codes most significant bit first), fills every entry that
    // starts with it. Entry = length << 9 | symbol; 0 = walk the slow way.
    fast_.fill(0);
    int code = 0, index = 0;
    for (int len = 1; len <= fast_bits; ++len, code <<= 1) {
      for (int k = 0; k < count_[len]; ++k, ++code, ++index) {
        int rev = 0;
        for (int b = 0; b < len; ++b) rev |= ((code >> b) & 1) << (len - 1 - b);
        for (int e = rev; e < (1 << fast_bits); e += 1 << len) fast_[e] = std::uint16_t(len << 9 | symbol_[index]);
      }
    }
  }

  int decode(BitReader& in) const {
    const std::uint32_t bits = in.peek(max_bits);
    if (const std::uint16_t e = fast_[bits & ((1u << fast_bits) - 1)]) {
      in.consume(e >> 9);
      return e & 511;
    }
    // Canonical walk (as zlib's puff): codes of each length are consecutive.
    int code = 0, first = 0, index = 0;
    for (int len = 1; len <= max_bits; ++len) {
      code |= int(bits >> (len - 1)) & 1;
      const int count = count_[len];
      if (code - first < count) {
        in.consume(len);
        return symbol_[index + code - first];
      }
      index += count;
      first = (first + count) << 1;
      code <<= 1;
    }
    in.consume(max_bits);  // past the end this reports truncation rather than a bad code
    throw InflateError("a Huffman code that the block's table does not define");
  }

 private:
  std::array<std::uint16_t, max_bits + 1> count_{};
  std::array<std::uint16_t, 288> symbol_{};
  std::array<std::uint16_t, 1 << fast_bits> fast_{};
};

/// Inflates one raw DEFLATE stream from `in`, appending to out[0, n) (out may
/// be longer: spare capacity, trimmed by the caller). Returns after the final
/// block; the reader then stands inside the stream's last byte. Throws
/// OutputLimitReached at the first write after n has passed `limit`, so
/// that the output (and its buffer) stays within a block of the limit.
inline void inflate(BitReader& in, const std::uint8_t* in_end, std::vector<std::uint8_t>& out, std::size_t& n,
                    std::size_t member_start, std::size_t limit) {
  static constexpr std::uint16_t len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                                 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
  static constexpr std::uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                                 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
  static constexpr std::uint16_t dist_base[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                                  193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
  static constexpr std::uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                                  6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
  static const auto fixed = [] {
    // 32 distance codes, so that the code is complete; 30 and 31 never occur
    // in valid data and are rejected when decoded.
    std::array<std::uint8_t, 288 + 32> l{};
    std::fill(l.begin(), l.begin() + 144, 8);
    std::fill(l.begin() + 144, l.begin() + 256, 9);
    std::fill(l.begin() + 256, l.begin() + 280, 7);
    std::fill(l.begin() + 280, l.begin() + 288, 8);
    std::fill(l.begin() + 288, l.end(), 5);
    std::array<Huffman, 2> h;
    h[0].build(l.data(), 288, "fixed literal/length");
    h[1].build(l.data() + 288, 32, "fixed distance");
    return h;
  }();

  auto reserve = [&](std::size_t more) {
    if (n > limit) throw OutputLimitReached{};
    if (out.size() - n >= more) return;
    const std::size_t grown = std::max(out.size() * 2, n + more + (std::size_t(1) << 16));
    const std::size_t ceiling = limit < std::numeric_limits<std::size_t>::max() ? limit + 1 : limit;
    out.resize(std::min(grown, std::max(n + more, ceiling)));
  };

  Huffman dyn_lit, dyn_dist;
  bool last = false;
  while (!last) {
    last = in.bits(1);
    const std::uint32_t type = in.bits(2);
    if (type == 0) {  // stored: LEN, NLEN (its complement), LEN raw bytes
      const std::uint8_t* p = in.align();
      if (in_end - p < 4) throw InflateError("the compressed data ends in a stored block's header (truncated file?)");
      const std::uint32_t len = p[0] | p[1] << 8, nlen = p[2] | p[3] << 8;
      if (len != (~nlen & 0xFFFF)) throw InflateError("a stored block's length does not match its complement");
      p += 4;
      if (std::size_t(in_end - p) < len) throw InflateError("the compressed data ends inside a stored block (truncated file?)");
      reserve(len);
      if (len) std::memcpy(out.data() + n, p, len);
      n += len;
      in.seek(p + len);
      continue;
    }
    if (type == 3) throw InflateError("a block of the reserved type 3");
    const Huffman* lit = &fixed[0];
    const Huffman* dist = &fixed[1];
    if (type == 2) {  // dynamic: the block first sends its own code tables
      const int nlit = int(in.bits(5)) + 257, ndist = int(in.bits(5)) + 1, ncode = int(in.bits(4)) + 4;
      if (nlit > 286 || ndist > 30) throw InflateError("a dynamic block declares too many literal/length or distance codes");
      static constexpr std::uint8_t order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
      std::array<std::uint8_t, 19> clen{};
      for (int i = 0; i < ncode; ++i) clen[order[i]] = std::uint8_t(in.bits(3));
      Huffman lencode;
      lencode.build(clen.data(), 19, "code-length");
      std::array<std::uint8_t, 286 + 30> lengths{};
      for (int i = 0; i < nlit + ndist;) {
        const int sym = lencode.decode(in);
        if (sym < 16) {
          lengths[i++] = std::uint8_t(sym);
          continue;
        }
        std::uint8_t value = 0;
        int repeat;
        if (sym == 16) {
          if (i == 0) throw InflateError("a code-length repeat with no previous length");
          value = lengths[i - 1];
          repeat = 3 + int(in.bits(2));
        } else if (sym == 17) {
          repeat = 3 + int(in.bits(3));
        } else {
          repeat = 11 + int(in.bits(7));
        }
        if (i + repeat > nlit + ndist) throw InflateError("code-length repeats run past the declared number of codes");
        while (repeat--) lengths[i++] = value;
      }
      if (lengths[256] == 0) throw InflateError("a dynamic block without an end-of-block code");
      dyn_lit.build(lengths.data(), nlit, "literal/length");
      dyn_dist.build(lengths.data() + nlit, ndist, "distance");
      lit = &dyn_lit;
      dist = &dyn_dist;
    }
    for (;;) {
      const int sym = lit->decode(in);
      if (sym < 256) {
        reserve(1);
        out[n++] = std::uint8_t(sym);
        continue;
      }
      if (sym == 256) break;
      if (sym > 285) throw InflateError("an invalid literal/length code");
      const std::size_t len = len_base[sym - 257] + in.bits(len_extra[sym - 257]);
      const int dsym = dist->decode(in);
      if (dsym > 29) throw InflateError("an invalid distance code");
      const std::size_t d = dist_base[dsym] + in.bits(dist_extra[dsym]);
      if (d > n - member_start) throw InflateError("a back-reference to before the start of the data");
      reserve(len);
      std::uint8_t* dst = out.data() + n;
      const std::uint8_t* src = dst - d;
      if (d >= len) std::memcpy(dst, src, len);
      else for (std::size_t k = 0; k < len; ++k) dst[k] = src[k];  // overlapping: a run
      n += len;
    }
  }
}

}  // namespace detail

/// True when `bytes` starts like a gzip file (magic 1F 8B).
inline bool is_gzip(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1F && bytes[1] == 0x8B;
}

namespace detail {

/// What inflate_members() made: the data, and whether it stopped early
/// because the output passed the limit (then `data` holds more than `limit`
/// bytes, the first of them exact, and the rest of the file was not checked).
struct Inflated {
  std::vector<std::uint8_t> data;
  bool passed_limit = false;
};

/// gunzip()'s work, stopping as soon as the output passes `limit` bytes: a
/// small file can inflate to gigabytes (1032:1 is DEFLATE's ratio), so a
/// caller who knows how much data to expect reads no more than that.
inline Inflated inflate_members(std::span<const std::uint8_t> bytes, const std::string& name, std::size_t limit) {
  const std::uint8_t* const begin = bytes.data();
  const std::uint8_t* const end = begin + bytes.size();
  auto fail = [&](const auto&... what) -> void { deft::detail::raise<std::runtime_error>(name, ": corrupt gzip data: ", what...); };
  auto le32 = [](const std::uint8_t* q) { return std::uint32_t(q[0]) | std::uint32_t(q[1]) << 8 | std::uint32_t(q[2]) << 16 | std::uint32_t(q[3]) << 24; };

  std::vector<std::uint8_t> out;
  // The last 4 bytes are the (last) member's length mod 2^32: a good first
  // guess for one member. Trusted only up to 16:1 (data sets compress far
  // less; more grows the buffer as it goes), so that a truncated file, whose
  // last bytes are any compressed data, does not zero-fill gigabytes before
  // its error is found.
  constexpr std::size_t trusted_ratio = 16, trusted_min = std::size_t(1) << 20;
  if (bytes.size() >= 18)
    out.resize(std::min({std::size_t(le32(end - 4)), std::max(bytes.size() * trusted_ratio, trusted_min), limit}));
  std::size_t n = 0;
  const std::uint8_t* p = begin;
  do {
    const std::size_t at = std::size_t(p - begin);
    if (end - p < 18) {
      if (p == begin) fail("the file is ", bytes.size(), " bytes long, shorter than any gzip file (18 bytes)");
      fail(end - p, " bytes after the last gzip member at byte ", at, " are not a complete gzip member");
    }
    if (p[0] != 0x1F || p[1] != 0x8B) fail("bytes after the gzip member ending at byte ", at, " are not gzip data");
    if (p[2] != 8) fail("compression method ", int(p[2]), " at byte ", at + 2, " (gzip defines only 8, deflate)");
    const std::uint8_t flags = p[3];
    if (flags & 0xE0) fail("reserved header flags are set at byte ", at + 3);
    const std::uint8_t* q = p + 10;
    auto need = [&](std::ptrdiff_t k) {
      if (end - q < k) fail("the file ends inside a gzip header (truncated file?)");
    };
    if (flags & 4) {  // FEXTRA: 2-byte length, then that many bytes
      need(2);
      const std::size_t xlen = q[0] | q[1] << 8;
      q += 2;
      need(std::ptrdiff_t(xlen));
      q += xlen;
    }
    for (int field : {8, 16}) {  // FNAME, FCOMMENT: zero-terminated
      if (!(flags & field)) continue;
      const std::uint8_t* z = std::find(q, end, std::uint8_t(0));
      if (z == end) fail("the file ends inside a gzip header (truncated file?)");
      q = z + 1;
    }
    if (flags & 2) {  // FHCRC: the low 16 bits of the header's CRC-32
      need(2);
      if ((detail::crc32({p, std::size_t(q - p)}) & 0xFFFF) != std::uint32_t(q[0] | q[1] << 8))
        fail("the header checksum of the member at byte ", at, " does not match");
      q += 2;
    }
    const std::size_t start = n;
    detail::BitReader in(q, end);
    try {
      detail::inflate(in, end, out, n, start, limit);
    } catch (const detail::InflateError& e) {
      fail(e.what(), " (member at byte ", at, ")");
    } catch (const detail::OutputLimitReached&) {
      out.resize(n);
      return {std::move(out), true};
    }
    q = in.align();
    if (end - q < 8) fail("the file ends before the gzip trailer (truncated file?)");
    const std::uint32_t crc = detail::crc32({out.data() + start, n - start});
    if (crc != le32(q))
      fail("CRC-32 mismatch (stored ", detail::hex(le32(q), 8), ", computed ", detail::hex(crc, 8), "): the data is damaged");
    if (std::uint32_t(n - start) != le32(q + 4))
      fail("length mismatch (stored ", le32(q + 4), " mod 2^32, decompressed ", n - start, " bytes)");
    p = q + 8;
  } while (p != end);
  out.resize(n);
  return {std::move(out), n > limit};
}

}  // namespace detail

/// Decompresses gzip data: every member in `bytes` (`gzip a b > c` makes
/// several), checking each one's CRC-32 and length. Errors are
/// std::runtime_error naming `name` (the file) and what is wrong.
inline std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::string& name) {
  return detail::inflate_members(bytes, name, std::numeric_limits<std::size_t>::max()).data;
}

/// As above, for data from anyone: std::runtime_error naming `name` once the
/// output passes `max_bytes`, raised before much more than that is held (a
/// few MB of gzip can inflate to gigabytes).
inline std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::string& name, std::size_t max_bytes) {
  detail::Inflated inflated = detail::inflate_members(bytes, name, max_bytes);
  if (inflated.passed_limit)
    deft::detail::raise<std::runtime_error>(name, ": the gzip data inflates to more than ", max_bytes,
                                            " bytes, the most the caller allows (or is damaged: its checksum comes after)");
  return std::move(inflated.data);
}

}  // namespace deft::data
