// IDX files: the format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/).
//
//   bytes 0-1  zero
//   byte  2    element type: 0x08 unsigned byte (the only one these data sets use;
//              0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64 exist)
//   byte  3    number of dimensions r
//   then       r big-endian uint32 extents, then the elements, row-major
//
// So images start with 0x00000803 (N, rows, cols) and labels with 0x00000801
// (N). A file may also be gzipped (as Debian's dataset packages ship them):
// read_idx() recognises gzip by its magic number, not by the name.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../io/file.hpp"
#include "gzip.hpp"

namespace deft::data {

/// The contents of an IDX file of unsigned bytes.
struct IdxArray {
  std::vector<std::int64_t> dims;  ///< extents, outermost first (e.g. 10000, 28, 28)
  std::vector<std::uint8_t> data;  ///< the elements, row-major; data.size() == size()

  /// Number of elements (the product of the extents).
  std::int64_t size() const {
    std::int64_t n = 1;
    for (std::int64_t d : dims) n *= d;
    return n;
  }
  /// The extents as a deft::Shape.
  Shape shape() const { return Shape(dims); }
};

namespace detail {

/// The name of an IDX element type code, or nullptr for an unknown code.
inline const char* idx_type_name(std::uint8_t code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return nullptr;
  }
}

/// The whole file as bytes; std::runtime_error naming the file when it cannot be read.
DEFT_DECL std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& file);

}  // namespace detail

namespace detail {

/// An IDX header, checked: everything parse_idx() needs before the data.
struct IdxHeader {
  std::vector<std::int64_t> dims;
  std::uint64_t elements = 1;  ///< the product of dims: the data's bytes
  std::size_t bytes = 0;       ///< the header's own length
  std::string dims_text;       ///< "60000 x 28 x 28", for messages

  /// The whole file's length that the header declares.
  std::uint64_t file_bytes() const { return bytes + elements; }
  /// The end of every size message: what the header declares.
  std::string declares() const {
    return "the header says " + dims_text + " = " + std::to_string(elements) + " bytes of data after the " +
           std::to_string(bytes) + "-byte header";
  }
};

/// Checks the header at the start of `bytes` (the file or its first bytes);
/// throws std::runtime_error naming `name` for a bad magic number, an
/// element type other than unsigned byte, no dimensions, a zero or too large
/// extent, or a header cut short.
DEFT_DECL IdxHeader parse_idx_header(std::span<const std::uint8_t> bytes, const std::string& name);

}  // namespace detail

/// Parses the bytes of an (uncompressed) IDX file; `name` names it in errors.
/// Throws std::runtime_error for a bad magic number, an element type other
/// than unsigned byte, no dimensions, a zero or too large extent, and data
/// that is shorter (truncated) or longer (trailing bytes) than the header says.
DEFT_DECL IdxArray parse_idx(std::vector<std::uint8_t> bytes, const std::string& name);

/// Reads an IDX file of unsigned bytes, plain or gzipped. Every problem is a
/// std::runtime_error whose message names the file and what is wrong (see parse_idx;
/// also: no such file, not readable, corrupt or truncated gzip data, gzip
/// data that inflates to more than the IDX header declares).
DEFT_DECL IdxArray read_idx(const std::filesystem::path& file);

#if DEFT_DEFINE_RUNTIME
DEFT_DECL std::vector<std::uint8_t> detail::read_file_bytes(const std::filesystem::path& file) {
  std::ifstream in = deft::detail::open_input(file);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) deft::detail::raise<std::runtime_error>(file.string(), ": cannot determine the file's size");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size))
    deft::detail::raise<std::runtime_error>(file.string(), ": read error after ", in.gcount(), " of ", size, " bytes");
  return bytes;
}

DEFT_DECL detail::IdxHeader detail::parse_idx_header(std::span<const std::uint8_t> bytes, const std::string& name) {
  auto fail = [&](const auto&... what) { deft::detail::raise<std::runtime_error>(name, ": ", what...); };
  if (bytes.size() < 4)
    fail("too short for an IDX file (", bytes.size(), " bytes; the magic number alone takes 4)");
  const std::uint32_t magic = std::uint32_t(bytes[0]) << 24 | std::uint32_t(bytes[1]) << 16 | std::uint32_t(bytes[2]) << 8 | bytes[3];
  if (bytes[0] != 0 || bytes[1] != 0)
    fail("bad magic number ", hex(magic, 8),
         ": not an IDX file (IDX files start with 0x0000TTRR: two zero bytes, the element type, the number of dimensions;"
         " e.g. 0x00000803 for images, 0x00000801 for labels)");
  const std::uint8_t type = bytes[2];
  const int rank = bytes[3];
  if (type != 0x08) {
    if (const char* t = idx_type_name(type))
      fail("element type ", hex(type, 2), " (", t, ") is not supported: deft reads IDX files of unsigned bytes (type 0x08)");
    fail("unknown IDX element type code ", hex(type, 2), " in magic number ", hex(magic, 8),
         " (IDX defines 0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E)");
  }
  if (rank == 0) fail("the header declares no dimensions (magic number ", hex(magic, 8), ")");
  if (rank > max_rank) fail(rank, " dimensions, more than a deft tensor has (", max_rank, ")");
  IdxHeader h;
  h.bytes = 4 + 4 * std::size_t(rank);
  if (bytes.size() < h.bytes)
    fail("truncated header: ", rank, " dimensions need ", h.bytes, " header bytes but the file has ", bytes.size());
  for (int i = 0; i < rank; ++i) {
    const std::uint8_t* q = bytes.data() + 4 + 4 * i;
    const std::int64_t d = std::int64_t(q[0]) << 24 | std::int64_t(q[1]) << 16 | std::int64_t(q[2]) << 8 | q[3];
    h.dims.push_back(d);
    h.dims_text += (i ? " x " : "") + std::to_string(d);
    // 0 would make an empty data set, which no IDX file of a data set has;
    // the product of up to 8 uint32 extents can pass 2^63.
    if (d == 0) fail("dimension ", i, " has extent 0 (an empty array)");
    if (__builtin_mul_overflow(h.elements, std::uint64_t(d), &h.elements) ||
        h.elements > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
      fail("extents ", h.dims_text, "... have more elements than fit in 64 bits");
  }
  return h;
}

DEFT_DECL IdxArray parse_idx(std::vector<std::uint8_t> bytes, const std::string& name) {
  detail::IdxHeader h = detail::parse_idx_header(bytes, name);
  const std::size_t payload = bytes.size() - h.bytes;
  if (h.elements > payload)
    deft::detail::raise<std::runtime_error>(name, ": truncated: ", h.declares(), " but the file has ", payload);
  if (h.elements < payload)
    deft::detail::raise<std::runtime_error>(name, ": ", payload - h.elements, " trailing bytes: ", h.declares(),
                                            " but the file has ", payload);
  bytes.erase(bytes.begin(), bytes.begin() + std::ptrdiff_t(h.bytes));
  IdxArray a;
  a.dims = std::move(h.dims);
  a.data = std::move(bytes);
  return a;
}

DEFT_DECL IdxArray read_idx(const std::filesystem::path& file) {
  std::vector<std::uint8_t> bytes = detail::read_file_bytes(file);
  if (!is_gzip(bytes)) return parse_idx(std::move(bytes), file.string());
  // Errors in the IDX data of a sound gzip file say so.
  const std::string inflated = file.string() + " (after gunzip)";
  // The header first, then no more data than it declares: a file of a few
  // MB can inflate to gigabytes, which must be an error, not an allocation.
  const std::size_t longest_header = 4 + 4 * std::size_t(max_rank);
  const detail::Inflated head = detail::inflate_members(bytes, file.string(), longest_header);
  const detail::IdxHeader h = detail::parse_idx_header(head.data, inflated);
  if (!head.passed_limit) return parse_idx(std::move(head.data), inflated);  // all of it, checked
  const std::uint64_t declared = h.file_bytes();
  detail::Inflated all = detail::inflate_members(
      bytes, file.string(), std::size_t(std::min<std::uint64_t>(declared, std::numeric_limits<std::size_t>::max())));
  if (all.passed_limit)
    deft::detail::raise<std::runtime_error>(inflated, ": more data than the header declares (", h.declares(),
                                            "); the gzip data holds more, or is damaged (its checksum comes after)");
  return parse_idx(std::move(all.data), inflated);
}
#endif

}  // namespace deft::data
