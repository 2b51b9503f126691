// gunzip for data files: gzip members (RFC 1952) holding DEFLATE streams
// (RFC 1951). Debian's dataset packages ship their IDX files gzipped. zlib
// inflates each member's DEFLATE stream (deft::deft links ZLIB::ZLIB);
// deft reads the member framing itself, so that every error names the file
// and the byte where it went wrong, checks each member's CRC-32 and length
// (a corrupt or truncated file is an error, never wrong data) and stops at
// a caller's limit before a small file inflates to gigabytes.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <zlib.h>

#include "../core/config.hpp"
#include "../core/error.hpp"

namespace deft::data {

namespace detail {

/// "0x" and `digits` upper-case hex digits of v, for magic numbers and checksums.
inline std::string hex(std::uint64_t v, int digits) {
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += "0123456789ABCDEF"[(v >> (4 * i)) & 0xF];
  return s;
}

/// CRC-32 (the gzip/zlib/PNG one) of `bytes`, continuing from `crc` (0 to start).
inline std::uint32_t crc32(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0) {
  return std::uint32_t(::crc32_z(crc, bytes.data(), bytes.size()));
}

/// A zlib stream inflating raw DEFLATE data (no zlib or gzip framing).
class RawInflater {
 public:
  RawInflater() {
    if (inflateInit2(&z_, -MAX_WBITS) != Z_OK) throw std::bad_alloc();
  }
  ~RawInflater() { inflateEnd(&z_); }
  RawInflater(const RawInflater&) = delete;
  RawInflater& operator=(const RawInflater&) = delete;

  /// Inflates the DEFLATE stream starting at q, appending to out[n, ...)
  /// (growing `out`, never past limit + 1 bytes). Returns the byte after
  /// the stream's end, or nullptr once n has passed `limit`. Raises through
  /// fail(what) for corrupt or truncated data.
  template <class Fail>
  const std::uint8_t* inflate(const std::uint8_t* q, const std::uint8_t* end, std::vector<std::uint8_t>& out,
                              std::size_t& n, std::size_t limit, Fail&& fail) {
    if (inflateReset(&z_) != Z_OK) fail("zlib could not reset its stream");
    // One byte past the limit tells that the data passes it.
    const std::size_t cap = limit == std::numeric_limits<std::size_t>::max() ? limit : limit + 1;
    constexpr std::size_t chunk = std::size_t(1) << 30;  // zlib counts in 32-bit unsigned ints
    for (;;) {
      if (n == out.size()) {
        if (n >= cap) return nullptr;
        out.resize(std::min(cap, std::max<std::size_t>(out.size() * 2, std::size_t(1) << 16)));
      }
      z_.next_in = const_cast<Bytef*>(q);
      z_.avail_in = uInt(std::min<std::size_t>(std::size_t(end - q), chunk));
      z_.next_out = out.data() + n;
      z_.avail_out = uInt(std::min(out.size() - n, chunk));
      const uInt in_before = z_.avail_in, out_before = z_.avail_out;
      const int rc = ::inflate(&z_, Z_NO_FLUSH);
      q += in_before - z_.avail_in;
      n += out_before - z_.avail_out;
      if (rc == Z_STREAM_END) return n > limit ? nullptr : q;
      if (rc == Z_MEM_ERROR) throw std::bad_alloc();
      if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR)
        fail(z_.msg ? z_.msg : "invalid DEFLATE data");
      // Z_OK or Z_BUF_ERROR: more input or more room is wanted.
      if (q == end && z_.avail_out > 0) fail("the file ends inside the compressed data (truncated file?)");
    }
  }

 private:
  z_stream z_{};
};

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
DEFT_DECL Inflated inflate_members(std::span<const std::uint8_t> bytes, const std::string& name, std::size_t limit);

}  // namespace detail

/// Decompresses gzip data: every member in `bytes` (`gzip a b > c` makes
/// several), checking each one's CRC-32 and length. Errors are
/// std::runtime_error naming `name` (the file) and what is wrong.
DEFT_DECL std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::string& name);

/// As above, for data from anyone: std::runtime_error naming `name` once the
/// output passes `max_bytes`, raised before much more than that is held (a
/// few MB of gzip can inflate to gigabytes).
DEFT_DECL std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::string& name, std::size_t max_bytes);

#if DEFT_DEFINE_RUNTIME
DEFT_DECL detail::Inflated detail::inflate_members(std::span<const std::uint8_t> bytes, const std::string& name, std::size_t limit) {
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
  detail::RawInflater inflater;
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
    q = inflater.inflate(q, end, out, n, limit, [&](const char* what) { fail(what, " (member at byte ", at, ")"); });
    if (!q) {
      out.resize(n);
      return {std::move(out), true};
    }
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

DEFT_DECL std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::string& name) {
  return detail::inflate_members(bytes, name, std::numeric_limits<std::size_t>::max()).data;
}

DEFT_DECL std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::string& name, std::size_t max_bytes) {
  detail::Inflated inflated = detail::inflate_members(bytes, name, max_bytes);
  if (inflated.passed_limit)
    deft::detail::raise<std::runtime_error>(name, ": the gzip data inflates to more than ", max_bytes,
                                            " bytes, the most the caller allows (or is damaged: its checksum comes after)");
  return std::move(inflated.data);
}
#endif

}  // namespace deft::data
