// Saving and loading a network's parameters (Gluon's save_parameters /
// load_parameters). The file: "DEFTPRM1", a byte-order mark (uint32
// 0x01020304), the count (uint64), then per parameter its name (uint32
// length + bytes), rank (uint32), extents (int64 each) and float32 values.
// The names are the parameters' paths in the network ("1.weight",
// Block::named_params), so that a file loads into any network built the
// same way; files of deft's earlier format hold the global names
// ("dense1.weight"), which load_parameters still matches.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../io/file.hpp"
#include "block.hpp"

namespace deft::nn {

/// Writes every parameter of `net` (all must have values) to `file`,
/// atomically: a crash or error midway leaves the file that was there.
DEFT_DECL void save_parameters(Block& net, const std::filesystem::path& file);

/// Reads `file` into the parameters of `net`, matching them by path
/// (Block::named_params; a file of global names, deft's earlier format, by
/// name). The whole file is checked, and every parameter's
/// new copies made, before any parameter changes: a missing, extra,
/// misshapen or truncated entry, or a failure while copying, leaves the
/// network as it was.
DEFT_DECL void load_parameters(Block& net, const std::filesystem::path& file);

// Compiled once in the compiled mode (deft/nn_src.hpp), as the checkpoints are.
#if DEFT_DEFINE_NN
namespace detail_io {
inline constexpr char magic[8] = {'D', 'E', 'F', 'T', 'P', 'R', 'M', '1'};
inline constexpr std::uint32_t byte_order = 0x01020304u;
inline constexpr std::uint32_t max_name_bytes = 4096;
// Values read at a time from a stream of unknown length (a pipe): memory
// grows only as the values arrive, whatever the extents claim.
inline constexpr std::size_t chunk_values = std::size_t(1) << 22;  // 16 MiB

/// The first of `params` whose key (its path, or its name) an earlier one
/// has too: a file keyed so could not tell the two apart.
template <class Key>
const NamedParameter* first_repeat(const std::vector<NamedParameter>& params, Key key) {
  std::set<std::string_view> seen;
  for (const NamedParameter& p : params)
    if (!seen.insert(key(p)).second) return &p;
  return nullptr;
}

/// Refuses a network that repeats a path; `who` names the caller.
inline void require_unique_paths(const std::vector<NamedParameter>& params, const char* who, const char* why) {
  if (const NamedParameter* p = first_repeat(params, [](const NamedParameter& q) -> std::string_view { return q.path; }))
    deft::detail::raise(who, ": the network has two parameters named '", p->parameter->name(), "' (both at '", p->path,
                        "'); ", why);
}

template <class V>
void put(std::ofstream& out, const V& v) { out.write(reinterpret_cast<const char*>(&v), sizeof v); }

struct Reader {
  std::ifstream in;
  std::string file;
  std::string who = "load_parameters: ";  // the caller, which errors name
  template <class V>
  V get(const std::string& what) {
    V v{};
    if (!in.read(reinterpret_cast<char*>(&v), sizeof v))
      deft::detail::raise<std::runtime_error>(who, file, " is truncated (while reading ", what, ")");
    return v;
  }
  /// The bytes after the read position; none known for a stream that
  /// cannot seek (a pipe), which is then read as it comes.
  std::optional<std::uint64_t> remaining() {
    const auto here = in.tellg();
    if (here < 0) {
      in.clear();
      return std::nullopt;
    }
    in.seekg(0, std::ios::end);
    const auto end = in.tellg();
    in.clear();
    in.seekg(here);
    if (end < here) return std::nullopt;
    return std::uint64_t(end - here);
  }
  void bytes(void* dst, std::size_t n, const std::string& what) {
    if (!in.read(static_cast<char*>(dst), std::streamsize(n)))
      deft::detail::raise<std::runtime_error>(who, file, " is truncated (while reading ", what, ")");
  }
};
}  // namespace detail_io

DEFT_DECL void save_parameters(Block& net, const std::filesystem::path& file) {
  const auto params = net.named_params();
  detail_io::require_unique_paths(params, "save_parameters", "a parameter file names each once (give them distinct names)");
  for (const NamedParameter& p : params)
    if (p.path.size() > detail_io::max_name_bytes)
      deft::detail::raise("save_parameters: parameter path '", p.path.substr(0, 64), "...' is ", p.path.size(),
                          " bytes long; a parameter file holds names of up to ", detail_io::max_name_bytes);
  std::vector<std::vector<float>> values;
  for (const NamedParameter& p : params) values.push_back(p.parameter->data().to_vector());  // throws without a value
  deft::detail::write_atomically(file, "save_parameters: ", [&](std::ofstream& out) {
    out.write(detail_io::magic, sizeof detail_io::magic);
    detail_io::put(out, detail_io::byte_order);
    detail_io::put(out, std::uint64_t(params.size()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].path;
      const Shape s = params[i].parameter->shape();
      detail_io::put(out, std::uint32_t(name.size()));
      out.write(name.data(), std::streamsize(name.size()));
      detail_io::put(out, std::uint32_t(s.rank()));
      for (int d = 0; d < s.rank(); ++d) detail_io::put(out, std::int64_t(s[d]));
      out.write(reinterpret_cast<const char*>(values[i].data()), std::streamsize(values[i].size() * sizeof(float)));
    }
  });
}

DEFT_DECL void load_parameters(Block& net, const std::filesystem::path& file) {
  const auto params = net.named_params();
  detail_io::require_unique_paths(params, "load_parameters", "a parameter file cannot say which is which");
  detail_io::Reader r{deft::detail::open_input(file, "load_parameters: "), file.string()};
  char m[8];
  r.bytes(m, sizeof m, "the header");
  if (std::memcmp(m, detail_io::magic, sizeof m) != 0)
    deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " is not a deft parameter file (bad magic)");
  if (r.get<std::uint32_t>("the byte-order mark") != detail_io::byte_order)
    deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " was written with another byte order");
  const auto count = r.get<std::uint64_t>("the parameter count");
  std::map<std::string, Tensor<float>> loaded;
  for (std::uint64_t i = 0; i < count; ++i) {
    const auto len = r.get<std::uint32_t>("a name length");
    if (len > detail_io::max_name_bytes) deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " is corrupt (a name of ", len, " bytes)");
    std::string name(len, '\0');
    r.bytes(name.data(), len, "a name");
    const auto rank = r.get<std::uint32_t>("the rank of '" + name + "'");
    if (rank > std::uint32_t(max_rank))
      deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " is corrupt (parameter '", name, "' has rank ", rank, ")");
    std::vector<std::int64_t> dims(rank);
    for (auto& d : dims) {
      d = r.get<std::int64_t>("the shape of '" + name + "'");
      if (d < 0 || d > (std::int64_t(1) << 40))
        deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " is corrupt (parameter '", name, "' has extent ", d, ")");
    }
    // The values must be in the file before anything is allocated for them:
    // a corrupt extent would otherwise ask for terabytes. (The count is
    // checked before a Shape is made, so that its error names the file.)
    std::uint64_t n = 1;
    constexpr std::uint64_t most = std::uint64_t(std::numeric_limits<std::ptrdiff_t>::max()) / sizeof(float);
    for (const auto d : dims) {
      if (d != 0 && n > most / std::uint64_t(d))
        deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " is corrupt (parameter '", name,
                                                "' has extents ", deft::detail::extents_text(dims), ", more values than fit in memory)");
      n *= std::uint64_t(d);
    }
    const auto left = r.remaining();
    if (left && n > *left / sizeof(float))
      deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " is truncated (parameter '", name,
                                              "' has extents ", deft::detail::extents_text(dims), " but the file holds only ",
                                              *left / sizeof(float), " more values)");
    std::vector<float> values;
    while (values.size() < n) {  // at once when the length is known, else chunk by chunk
      const std::size_t have = values.size();
      const std::size_t take = left ? std::size_t(n) - have : std::min(std::size_t(n) - have, detail_io::chunk_values);
      values.resize(have + take);
      r.bytes(values.data() + have, take * sizeof(float), "the values of '" + name + "'");
    }
    const Shape s(dims);
    if (!loaded.emplace(name, Tensor<float>(std::move(values), s)).second)
      deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " holds parameter '", name, "' twice");
  }
  if (r.in.peek() != std::char_traits<char>::eof())
    deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " has trailing bytes after ", count, " parameters");
  // Each parameter's key in the file: its path, or in an older file of
  // global names (none of the paths there, some of the names), its name;
  // the checks below then name what such a file lacks or has too much.
  const bool by_name = std::ranges::none_of(params, [&](const NamedParameter& p) { return loaded.contains(p.path); }) &&
                       std::ranges::any_of(params, [&](const NamedParameter& p) { return loaded.contains(p.parameter->name()); });
  // Two blocks of one fixed name have distinct paths but would share an entry.
  if (by_name)
    if (const NamedParameter* p = detail_io::first_repeat(
            params, [](const NamedParameter& q) -> std::string_view { return q.parameter->name(); }))
      deft::detail::raise("load_parameters: ", file.string(),
                          " names parameters globally (deft's earlier format), and the network has two named '",
                          p->parameter->name(), "'; save it again from a network with distinct names");
  const auto key = [&](const NamedParameter& p) -> const std::string& { return by_name ? p.parameter->name() : p.path; };
  const auto label = [&](const NamedParameter& p) {
    return by_name ? "'" + p.parameter->name() + "'" : "'" + p.path + "' (" + p.parameter->name() + ")";
  };
  for (const NamedParameter& p : params) {
    auto it = loaded.find(key(p));
    if (it == loaded.end())
      deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " has no parameter ", label(p));
    if (const std::string conflict = p.parameter->shape_conflict(it->second.shape()); !conflict.empty())
      deft::detail::raise<std::runtime_error>("load_parameters: parameter ", label(p), " ", conflict, " in the network but ",
                                              it->second.shape().to_string(), " in ", file.string());
  }
  if (loaded.size() != params.size())
    for (const auto& entry : loaded)  // (clang before 16 cannot capture a structured binding)
      if (std::ranges::none_of(params, [&](const NamedParameter& p) { return key(p) == entry.first; }))
        deft::detail::raise<std::runtime_error>("load_parameters: ", file.string(), " has parameter '", entry.first,
                                                "', which the network does not have");
  std::vector<Parameter::Staged> staged;  // every copy made before any parameter changes
  staged.reserve(params.size());
  for (const NamedParameter& p : params) staged.push_back(p.parameter->stage(loaded.at(key(p))));
  for (std::size_t i = 0; i < params.size(); ++i) params[i].parameter->commit(std::move(staged[i]));
}
#endif

}  // namespace deft::nn
