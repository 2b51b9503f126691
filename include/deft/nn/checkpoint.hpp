// Checkpoints: everything a training run needs to go on as if it had not
// stopped. A checkpoint holds the network's parameters and block state
// (BatchNorm's running statistics), the Trainer's optimizer state
// (momentum, Adam's moments and its bias-correction powers, bit for bit),
// its step count and learning rate, and deft::random's state, so that the
// same steps after a load compute the same bits as without the stop.
//
// The file: "DEFTCKP1", the byte-order mark (uint32 0x01020304), the
// optimizer (uint8: 0 SGD, 1 Adam), the step count (uint64), the learning
// rate (float32), random's seed and call count (uint64 each), the entry
// count (uint64), then per entry its key (uint32 length + bytes), element
// type (uint8: 0 float32, 1 float64), rank (uint32), extents (int64 each)
// and values. Keys: "param/<path>" per parameter (Block::named_params),
// "m/<path>" and "v/<path>" for its optimizer state, "clock/<path>" for
// Adam's (count, beta1^t, beta2^t) of it.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "../core/random_state.hpp"
#include "serialize.hpp"
#include "trainer.hpp"

namespace deft::nn {

namespace detail_io {
inline constexpr char checkpoint_magic[8] = {'D', 'E', 'F', 'T', 'C', 'K', 'P', '1'};

// One entry's values as read, before they become tensors.
struct Entry {
  bool is_double = false;
  Shape shape;
  std::vector<float> f;
  std::vector<double> d;
};

// What save_checkpoint and load_checkpoint reach inside a Trainer.
struct CheckpointAccess {
  static void save(std::ofstream& out, Block& net, const Trainer& t);
  static void load(Block& net, Trainer& t, const std::filesystem::path& file);
};
}  // namespace detail_io

/// Writes `net`'s parameters and block state and `trainer`'s state to
/// `file`, atomically (a crash midway leaves the previous file whole).
/// Call it between steps; it waits for the values it writes.
DEFT_DECL void save_checkpoint(Block& net, const Trainer& trainer, const std::filesystem::path& file);

/// Restores what save_checkpoint wrote into `net` and `trainer`, built as
/// the saved ones were (the same structure and optimizer): the next steps
/// then compute what the saved run's next steps would have. The whole file
/// is checked first: another network's checkpoint (a missing, extra or
/// misshapen entry), another optimizer, or a truncated or corrupt file
/// raises std::runtime_error naming the file and the entry, and changes nothing.
DEFT_DECL void load_checkpoint(Block& net, Trainer& trainer, const std::filesystem::path& file);

#if DEFT_DEFINE_NN
namespace detail_io {
template <class T>
void put_entry(std::ofstream& out, const std::string& key, const Shape& shape, const std::vector<T>& values) {
  put(out, std::uint32_t(key.size()));
  out.write(key.data(), std::streamsize(key.size()));
  put(out, std::uint8_t(std::is_same_v<T, double> ? 1 : 0));
  put(out, std::uint32_t(shape.rank()));
  for (int d = 0; d < shape.rank(); ++d) put(out, std::int64_t(shape[d]));
  out.write(reinterpret_cast<const char*>(values.data()), std::streamsize(values.size() * sizeof(T)));
}

DEFT_DECL void CheckpointAccess::save(std::ofstream& out, Block& net, const Trainer& t) {
  const auto params = net.named_params();
  std::map<const Parameter*, std::string> path_of;
  for (const NamedParameter& p : params) path_of[p.parameter] = p.path;
  std::vector<std::pair<std::string, Tensor<float>>> floats;
  std::vector<std::pair<std::string, std::vector<double>>> clocks;
  for (const NamedParameter& p : params) floats.emplace_back("param/" + p.path, p.parameter->data());
  for (std::size_t i = 0; i < t.params_.size(); ++i) {
    const auto found = path_of.find(t.params_[i]);
    if (found == path_of.end())
      deft::detail::raise("save_checkpoint: the trainer's parameter '", t.params_[i]->name(), "' is not in the network");
    for (const Trainer::State& s : t.state_[i])
      if (s.m) {  // the copies' states are equal: the first one's
        floats.emplace_back("m/" + found->second, s.m);
        if (s.v) floats.emplace_back("v/" + found->second, s.v);
        break;
      }
    if (t.clock_of_[i] != Trainer::no_clock) {
      const Trainer::Clock& c = t.clocks_[t.clock_of_[i]];
      if (c.on.empty()) continue;
      clocks.emplace_back("clock/" + found->second, std::vector<double>{double(c.count), c.on.front().beta1_t.item(),
                                                                      c.on.front().beta2_t.item()});
    }
  }
  std::vector<std::vector<float>> values;
  for (const auto& [key, v] : floats) values.push_back(v.to_vector());  // throws for a parameter without a value
  const auto [seed, calls] = [] {
    auto& r = deft::detail::RandomState::get();
    std::lock_guard lock(r.m);
    return std::pair{r.seed, r.calls};
  }();
  out.write(checkpoint_magic, sizeof checkpoint_magic);
  put(out, byte_order);
  put(out, std::uint8_t(std::holds_alternative<Adam>(t.opt_) ? 1 : 0));
  put(out, std::uint64_t(t.steps_));
  put(out, t.learning_rate());
  put(out, seed);
  put(out, calls);
  put(out, std::uint64_t(floats.size() + clocks.size()));
  for (std::size_t i = 0; i < floats.size(); ++i) put_entry(out, floats[i].first, floats[i].second.shape(), values[i]);
  for (const auto& [key, v] : clocks) put_entry(out, key, Shape{3}, v);
}

DEFT_DECL void CheckpointAccess::load(Block& net, Trainer& t, const std::filesystem::path& file) {
  const std::string where = file.string();
  const auto params = net.named_params();
  require_unique_paths(params, "load_checkpoint", "a checkpoint cannot say which is which");
  Reader r{deft::detail::open_input(file, "load_checkpoint: "), where, "load_checkpoint: "};
  auto corrupt = [&](const auto&... what) {
    deft::detail::raise<std::runtime_error>("load_checkpoint: ", where, " ", what...);
  };
  char m[8];
  r.bytes(m, sizeof m, "the header");
  if (std::memcmp(m, checkpoint_magic, sizeof m) != 0) corrupt("is not a deft checkpoint (bad magic)");
  if (r.get<std::uint32_t>("the byte-order mark") != byte_order) corrupt("was written with another byte order");
  const auto kind = r.get<std::uint8_t>("the optimizer");
  const auto steps = r.get<std::uint64_t>("the step count");
  const auto rate = r.get<float>("the learning rate");
  const auto seed = r.get<std::uint64_t>("random's seed");
  const auto calls = r.get<std::uint64_t>("random's call count");
  const auto count = r.get<std::uint64_t>("the entry count");
  if (kind > 1 || !(rate > 0) || !std::isfinite(rate) || steps > (std::uint64_t(1) << 62)) corrupt("is corrupt (its header)");
  const char* kinds[] = {"SGD", "Adam"};
  const std::uint8_t expected = std::holds_alternative<Adam>(t.opt_) ? 1 : 0;
  if (kind != expected) corrupt("was saved from a trainer with ", kinds[kind], " but this one uses ", kinds[expected]);
  std::map<std::string, Entry> entries;
  for (std::uint64_t i = 0; i < count; ++i) {
    const auto len = r.get<std::uint32_t>("a key length");
    if (len > max_name_bytes + 16) corrupt("is corrupt (a key of ", len, " bytes)");
    std::string key(len, '\0');
    r.bytes(key.data(), len, "a key");
    Entry e;
    const auto type = r.get<std::uint8_t>("the type of '" + key + "'");
    const auto rank = r.get<std::uint32_t>("the rank of '" + key + "'");
    if (type > 1 || rank > std::uint32_t(max_rank)) corrupt("is corrupt (entry '", key, "')");
    e.is_double = type == 1;
    std::vector<std::int64_t> dims(rank);
    std::uint64_t n = 1;
    for (auto& d : dims) {
      d = r.get<std::int64_t>("the shape of '" + key + "'");
      if (d < 0 || d > (std::int64_t(1) << 40) || (d != 0 && n > (std::uint64_t(1) << 40) / std::uint64_t(d)))
        corrupt("is corrupt (entry '", key, "' has extent ", d, ")");
      n *= std::uint64_t(d);
    }
    // The values must be in the file before anything is allocated for them.
    const std::size_t size = e.is_double ? sizeof(double) : sizeof(float);
    if (const auto left = r.remaining(); left && n > *left / size)
      corrupt("is truncated (entry '", key, "' has extents ", deft::detail::extents_text(dims), ")");
    e.shape = Shape(dims);
    if (e.is_double) e.d.resize(n), r.bytes(e.d.data(), n * size, "the values of '" + key + "'");
    else e.f.resize(n), r.bytes(e.f.data(), n * size, "the values of '" + key + "'");
    if (!entries.emplace(key, std::move(e)).second) corrupt("holds entry '", key, "' twice");
  }
  if (r.in.peek() != std::char_traits<char>::eof()) corrupt("has trailing bytes after ", count, " entries");

  // Everything is checked, and every new value made, before anything changes.
  std::map<const Parameter*, Shape> shape_of;
  std::vector<Parameter::Staged> staged;
  for (const NamedParameter& p : params) {
    const auto it = entries.find("param/" + p.path);
    if (it == entries.end() || it->second.is_double)
      corrupt("has no parameter '", p.path, "' (", p.parameter->name(), ")");
    if (const std::string conflict = p.parameter->shape_conflict(it->second.shape); !conflict.empty())
      deft::detail::raise<std::runtime_error>("load_checkpoint: parameter '", p.path, "' (", p.parameter->name(), ") ",
                                              conflict, " in the network but ", it->second.shape.to_string(), " in ", where);
    shape_of.emplace(p.parameter, it->second.shape);
    staged.push_back(p.parameter->stage(Tensor<float>(it->second.f, it->second.shape)));
    entries.erase(it);
  }
  std::vector<std::vector<Trainer::State>> state(t.params_.size());
  std::vector<Trainer::Clock> clocks;
  std::vector<std::array<double, 3>> clock_values;  // per clock: the count and the powers it was saved with
  std::vector<std::size_t> clock_of(t.params_.size(), Trainer::no_clock);
  for (std::size_t i = 0; i < t.params_.size(); ++i) {
    Parameter* p = t.params_[i];
    const auto found = std::ranges::find(params, p, &NamedParameter::parameter);
    if (found == params.end())
      deft::detail::raise("load_checkpoint: the trainer's parameter '", p->name(), "' is not in the network");
    const std::string& path = found->path;
    const Shape& shape = shape_of.at(p);
    const auto em = entries.extract("m/" + path), ev = entries.extract("v/" + path), ec = entries.extract("clock/" + path);
    for (const auto* e : {&em, &ev})
      if (*e && (e->mapped().is_double || !(e->mapped().shape == shape)))
        corrupt("is corrupt (the optimizer state of '", path, "')");
    if (bool(ev) != (bool(em) && kind == 1)) corrupt("is corrupt (the optimizer state of '", path, "' is incomplete)");
    const std::vector<Device>& devices = p->devices();
    state[i].resize(devices.size());
    for (std::size_t c = 0; em && c < (t.updates_each_copy(i) ? devices.size() : 1); ++c) {
      state[i][c].m = Tensor<float>(em.mapped().f, shape, devices[c]);
      if (ev) state[i][c].v = Tensor<float>(ev.mapped().f, shape, devices[c]);
    }
    if (!ec) continue;
    const Entry& e = ec.mapped();
    if (kind != 1 || !e.is_double || !(e.shape == Shape{3}) || !(e.d[0] >= 0 && e.d[0] < 9e15) || e.d[0] != std::floor(e.d[0]))
      corrupt("is corrupt (the clock of '", path, "')");
    // Parameters saved with the same count and powers share a clock again.
    const std::array<double, 3> values{e.d[0], e.d[1], e.d[2]};
    std::size_t k = 0;
    while (k < clocks.size() && std::memcmp(clock_values[k].data(), values.data(), sizeof values) != 0) ++k;
    if (k == clocks.size()) {
      clocks.push_back({std::int64_t(values[0]), {}, {}});
      clock_values.push_back(values);
    }
    clocks[k].params.push_back(i);
    clock_of[i] = k;
    const Device d = devices.front();
    if (std::ranges::find(clocks[k].on, d, &Trainer::DeviceClock::device) == clocks[k].on.end())
      clocks[k].on.push_back({d, Tensor<double>({values[1]}, Shape{}, d), Tensor<double>({values[2]}, Shape{}, d), {}, {}});
  }
  if (!entries.empty()) corrupt("has entry '", entries.begin()->first, "', which the network and trainer do not have");

  for (std::size_t i = 0; i < params.size(); ++i) params[i].parameter->commit(std::move(staged[i]));
  t.state_ = std::move(state);
  t.clocks_ = std::move(clocks);
  t.clock_of_ = std::move(clock_of);
  t.steps_ = std::int64_t(steps);
  t.reduced_.reset();
  t.set_learning_rate(rate);
  t.restart_rates();  // a schedule counts on from steps_
  auto& random_state = deft::detail::RandomState::get();
  std::lock_guard lock(random_state.m);
  random_state.seed = seed;
  random_state.calls = calls;
}
}  // namespace detail_io

DEFT_DECL void save_checkpoint(Block& net, const Trainer& trainer, const std::filesystem::path& file) {
  deft::detail::write_atomically(file, "save_checkpoint: ",
                                 [&](std::ofstream& out) { detail_io::CheckpointAccess::save(out, net, trainer); });
}

DEFT_DECL void load_checkpoint(Block& net, Trainer& trainer, const std::filesystem::path& file) {
  detail_io::CheckpointAccess::load(net, trainer, file);
}
#endif

}  // namespace deft::nn
