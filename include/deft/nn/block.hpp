// Blocks: the pieces a network is built from (Gluon's Block). A block maps a
// float32 tensor to a float32 tensor, owns named parameters and may contain
// child blocks. Parameters whose shape depends on the input (a Dense layer's
// input size) are created at the first forward call: deferred initialization.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../autograd/meta.hpp"
#include "../core/error.hpp"
#include "../engine/engine.hpp"
#include "../engine/replay.hpp"
#include "../tensor.hpp"
#include "init.hpp"

namespace deft::detail {
/// A task writing a copy of `source` into its output (`bytes` long), its
/// reads declared, not yet recorded: what a replay refills a trace's
/// placeholder with, or copies a value out with (Trace::copy_out).
template <class T>
std::shared_ptr<Task> copy_task(const char* name, std::size_t bytes, const Tensor<T>& source) {
  auto t = make_task(name, bytes, EvaluateInto<Leaf<T>>(source.leaf()));
  add_leaf_inputs<Leaf<T>>(*t);
  return t;
}

/// The value a trace's run computed into `traced`, as the caller gets it:
/// `made`, the new buffer its step wrote in a replay (detail::replay), or
/// else a copy, which the next replay waits for before overwriting `traced`.
template <class T>
Tensor<T> traced_result(Trace& trace, std::shared_ptr<Buffer> made, const Tensor<T>& traced) {
  if (made) return tensor_from_buffer<T>(std::move(made), traced.shape(), traced.leaf().offset);
  Tensor<T> out = traced.clone();
  trace.last_replay().push_back(out.leaf().buffer->producer);
  return out;
}
}  // namespace deft::detail

namespace deft::nn {

/// An extent of a parameter's shape that its block learns from the first
/// input (a Dense layer's input features; Gluon writes 0).
inline constexpr std::int64_t inferred_extent = -1;

/// A trainable tensor with a name, an initializer and an attached gradient.
/// It holds one copy per device it was initialized on (data parallelism:
/// each device runs the network on its part of the batch with its own copy;
/// the Trainer keeps the copies equal).
class Parameter {
 public:
  /// A parameter called `name` whose value `init` will draw once its shape
  /// is known; `declared` gives its extents as far as the block knows them
  /// before the first input (inferred_extent for the others; empty when it
  /// knows none), so that a value loaded before then is checked.
  /// A parameter that is not `trainable` is state a block updates itself
  /// (BatchNorm's running statistics; Gluon's grad_req 'null'): it has no
  /// gradient, a Trainer leaves it alone, and parameter files keep it.
  Parameter(std::string name, Initializer init, std::vector<std::int64_t> declared = {}, bool trainable = true)
      : name_(std::move(name)), init_(std::move(init)), declared_(std::move(declared)), trainable_(trainable) {}

  /// The full name, e.g. "dense0.weight" (the key in parameter files).
  const std::string& name() const { return name_; }
  /// Whether a Trainer updates it from a gradient (see the constructor).
  bool trainable() const { return trainable_; }
  /// True once the value exists (after the first forward pass).
  bool initialized() const { return ready_.load(std::memory_order_acquire); }
  /// The value on the first device; throws until the block has seen its first input.
  Tensor<float>& data() { return data(devices_.front()); }
  /// The value (read-only); throws like data().
  const Tensor<float>& data() const { return const_cast<Parameter*>(this)->data(); }
  /// The copy on `device`; std::invalid_argument when the parameter has none there.
  Tensor<float>& data(Device device) {
    if (values_.empty())
      detail::raise<std::logic_error>("parameter '", name_,
                                      "' has no value yet: call initialize() on the network and run one forward pass "
                                      "(its shape is inferred from the first input)");
    return values_[index_of(device)];
  }
  /// Every copy, in the order of devices().
  std::vector<Tensor<float>> list_data() {
    (void)data();  // the same error before the first forward pass
    return values_;
  }
  /// The gradient the last backward() wrote (on the first device).
  Tensor<float> grad() const { return data().grad(); }
  /// The gradient of the copy on `device`.
  Tensor<float> grad(Device device) { return data(device).grad(); }
  /// Every copy's gradient, in the order of devices().
  std::vector<Tensor<float>> list_grad() {
    std::vector<Tensor<float>> out;
    for (auto& v : list_data()) out.push_back(v.grad());
    return out;
  }
  /// The value's shape; throws like data() before the first forward pass.
  Shape shape() const { return data().shape(); }
  /// The extents the block declared (see the constructor); empty if none.
  const std::vector<std::int64_t>& declared_extents() const { return declared_; }
  /// The devices holding a copy (cpu() unless set by Block::initialize).
  const std::vector<Device>& devices() const { return devices_; }
  /// Whether there is a copy on `device`.
  bool holds(Device device) const { return std::ranges::find(devices_, device) != devices_.end(); }

  /// Moves the parameter to `devices` (Gluon's reset_ctx): an existing value
  /// is copied from the first device to each of them. std::invalid_argument
  /// for an empty list or a device named twice.
  void reset_devices(const std::vector<Device>& devices) {
    if (devices.empty()) detail::raise("parameter '", name_, "': no devices given");
    for (std::size_t i = 0; i < devices.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (devices[i] == devices[j]) detail::raise("parameter '", name_, "': device ", devices[i], " is listed twice");
    for (const Device& d : devices) detail::require_backend(d, "Parameter::reset_devices");
    const Tensor<float> current = values_.empty() ? Tensor<float>() : values_.front().detach();
    devices_ = devices;
    if (current) spread(current);
  }

  /// Draws the value for `shape` (once; later calls must agree on the shape).
  /// Safe from several threads: the first call of a block from two threads
  /// at once draws the value once. A block calls it on every forward, even
  /// when the value exists (one loaded from a file): that call fixes the
  /// shape, which later values must then have.
  void materialize(const Shape& shape) {
    std::unique_lock lock(materialize_mutex_, std::defer_lock);
    if (!ready_.load(std::memory_order_acquire)) lock.lock();  // every later call: no lock
    if (!values_.empty()) {
      if (!(values_.front().shape() == shape))
        detail::raise("parameter '", name_, "' has shape ", values_.front().shape().to_string(), " but the input now needs ",
                      shape.to_string());
    } else {
      if (!init_)
        detail::raise<std::logic_error>("parameter '", name_, "': the network was not initialized; call net.initialize() first");
      spread(init_(shape));
    }
    if (!fixed_.load(std::memory_order_acquire)) fixed_.store(true, std::memory_order_release);
  }
  /// Replaces the value on every device (loading saved parameters); the shape must match once known.
  void set_data(const Tensor<float>& value) { commit(stage(value)); }

  /// A new value's copies, one per device, made without changing the
  /// parameter (checked as set_data checks it); commit() then installs them
  /// and cannot fail. load_parameters stages every parameter first, so that
  /// a failure midway changes none.
  class Staged {
    friend class Parameter;
    std::vector<Tensor<float>> copies;
  };
  /// The copies of `value` for every device; the parameter is unchanged.
  /// std::invalid_argument where the shape differs from the value's once a
  /// forward pass has fixed it, and before that where it differs from the
  /// declared extents (a value loaded before the first forward may be
  /// replaced by one of other inferred extents: the first forward checks).
  Staged stage(const Tensor<float>& value) const {
    if (const std::string conflict = shape_conflict(value.shape()); !conflict.empty())
      detail::raise("parameter '", name_, "' ", conflict, " but the value given has shape ", value.shape().to_string());
    return copies_of(value);
  }
  /// Empty where a value of `shape` may replace this one (see stage());
  /// else what the parameter's shape is ("has shape (?, 10) (? is ...)").
  std::string shape_conflict(const Shape& shape) const {
    if (fixed_.load(std::memory_order_acquire))
      return values_.front().shape() == shape ? std::string() : "has shape " + values_.front().shape().to_string();
    if (declared_.empty() || fits_declared(shape)) return {};
    return "has shape " + deft::detail::extents_text(declared_) + " (? is inferred from the first input)";
  }
  /// Installs staged copies as the value.
  void commit(Staged&& staged) noexcept {
    values_ = std::move(staged.copies);
    ready_.store(true, std::memory_order_release);
  }
  /// How the value will be drawn (used before it exists).
  void set_initializer(Initializer init) { init_ = std::move(init); }

 private:
  std::size_t index_of(Device device) const {
    const auto it = std::ranges::find(devices_, device);
    if (it != devices_.end()) return std::size_t(it - devices_.begin());
    detail::raise("parameter '", name_, "' has no copy on ", device, "; it lives on ", detail::device_list(devices_),
                  " (initialize the network with that device, or move the input there)");
  }
  bool fits_declared(const Shape& shape) const {
    if (std::size_t(shape.rank()) != declared_.size()) return false;
    for (std::size_t i = 0; i < declared_.size(); ++i)
      if (declared_[i] != inferred_extent && declared_[i] != shape[int(i)]) return false;
    return true;
  }
  // One fresh copy of `value` per device, each a variable of its own.
  Staged copies_of(const Tensor<float>& value) const {
    Staged staged;
    for (const Device& d : devices_) {
      Tensor<float> v = d == value.device() ? value.clone() : value.to(d);
      if (trainable_) v.attach_grad();
      staged.copies.push_back(std::move(v));
    }
    return staged;
  }
  void spread(const Tensor<float>& value) { commit(copies_of(value)); }

  std::string name_;
  Initializer init_;
  std::vector<std::int64_t> declared_;  // extents known before the first input
  bool trainable_;
  std::vector<Device> devices_{deft::cpu()};
  std::vector<Tensor<float>> values_;  // one per device, once initialized
  std::atomic<bool> ready_{false};     // values_ is set (read without the lock by initialized())
  std::atomic<bool> fixed_{false};     // a forward pass has drawn or used values_'s shape
  std::mutex materialize_mutex_;
};

/// A parameter and its path in a network (Block::named_params).
struct NamedParameter {
  std::string path;      ///< e.g. "1.weight": child 1's parameter "weight"
  Parameter* parameter;  ///< the parameter, whose name() is "dense1.weight"
};

/// How Block::hybridize() replays a traced forward.
struct HybridizeOptions {
  /// On a GPU, record the traced kernels into one CUDA graph at the first
  /// replay and launch that graph in later ones (one launch per forward,
  /// not one per kernel). Forwards that copy from or to the host inside,
  /// or use several devices, replay kernel by kernel anyway.
  bool cuda_graph = true;
  /// How many input shapes keep their traced graph, per device (at least
  /// 1): a new shape beyond that drops the least recently used one's graph
  /// and the memory its intermediate values hold.
  std::size_t shapes = 4;
};

/// A network or a part of one (Gluon's Block): a forward function, its
/// parameters and child blocks. Not copyable; hold blocks by shared_ptr.
class Block {
 public:
  /// A block named `name` (the prefix of its parameters' names).
  explicit Block(std::string name) : name_(std::move(name)) {}
  // Defined out of the class: the key function, so that in the compiled
  // mode every layer's vtable and forward pass are compiled once, where
  // deft/nn_src.hpp is included (core/config.hpp).
  virtual ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  /// Runs the block (deferred like any deft expression). Hybridized, it
  /// replays the graph traced at the first call (see hybridize()).
  Tensor<float> operator()(const Tensor<float>& x) {
    // Traced graphs are forwards in prediction mode: training mode runs the
    // layers' other branches (Dropout's mask, BatchNorm's batch statistics).
    if (!hybridized_.load(std::memory_order_relaxed) || autograd::is_recording() || autograd::is_training() ||
        detail::active_trace())
      return forward(x);
    std::lock_guard lock(caches_mutex_);  // calls from several threads take turns at the traced graphs
    return cached_call(x);
  }
  /// The computation itself, written imperatively with deft's operations.
  virtual Tensor<float> forward(const Tensor<float>& x) = 0;

  /// Gluon's hybridize(): the next call traces forward() into a graph of
  /// tasks; later calls with an input of the same shape replay it (the same
  /// kernels on the same, already allocated buffers, without building any
  /// expression again). A new input shape is traced too, and its graph kept
  /// beside the others (HybridizeOptions::shapes); changing any parameter's
  /// value (a Trainer step, load_parameters) traces again. Inside autograd::record,
  /// and in training mode (autograd::train_mode), the block runs imperatively. A forward
  /// that reads values (to_vector, item, printing, branching on data) cannot
  /// be traced: the first call throws std::logic_error saying so.
  /// On a GPU, the replays run the traced kernels as one CUDA graph
  /// (recorded at the first replay) unless `options` says otherwise.
  void hybridize(bool on = true, HybridizeOptions options = {}) {
    if (options.shapes == 0)
      detail::raise<std::invalid_argument>("hybridize: HybridizeOptions::shapes is 0; keep at least one traced shape");
    std::lock_guard lock(caches_mutex_);
    hybridized_ = on;
    options_ = options;
    caches_.clear();
  }
  /// Whether hybridize() is on.
  bool hybridized() const { return hybridized_.load(std::memory_order_relaxed); }
  /// How many times the forward was traced (1 + re-traces), for tests and tuning.
  std::int64_t traces() const { return traces_; }
  /// How many of the current traced forwards (one per device the block is
  /// called on and input shape) replay as one CUDA graph: recorded at their first replay on
  /// a GPU, unless the forward cannot be recorded (see HybridizeOptions).
  int cuda_graphs() const {
    std::lock_guard lock(caches_mutex_);
    return int(std::ranges::count_if(caches_, [](const auto& c) { return c->trace.recorded_program(); }));
  }

  /// The block's name, e.g. "dense0".
  const std::string& name() const { return name_; }

  /// Every parameter of this block and its children, in a stable order,
  /// each once: a block added twice (`net.add(d, d)`, shared weights) lists
  /// its parameters where it first appears, so a Trainer updates them once
  /// and save_parameters writes them once.
  std::vector<Parameter*> collect_params() {
    std::vector<Parameter*> out;
    for (const NamedParameter& n : named_params()) out.push_back(n.parameter);
    return out;
  }
  /// collect_params() with each parameter's path in this block: its short
  /// name after the indices of the children that lead to it ("1.weight" is
  /// the weight of the second child). Paths depend on the structure alone,
  /// not on the blocks' names, so a file saved from one network loads into
  /// another built the same way (Gluon's structural names).
  std::vector<NamedParameter> named_params();
  /// Sets how parameters start (default Xavier for weights; biases keep zeros);
  /// values are drawn when each parameter's shape is known.
  void initialize(const Initializer& weights = init::xavier()) { apply_initializer(weights); }
  /// The same, with a copy of every parameter on each of `devices` (Gluon's
  /// initialize(ctx=[...])): call the network on any of them, typically on
  /// the parts split_and_load gives, and a Trainer keeps the copies equal.
  void initialize(const Initializer& weights, const std::vector<Device>& devices) {
    apply_initializer(weights);
    for (auto* p : collect_params()) p->reset_devices(devices);
  }
  /// Calls f(block) on every block under this one, children first, then on
  /// this block (Gluon's Block.apply): to configure layers of one kind
  /// across a network, e.g. with a dynamic_cast.
  template <class F>
  void apply(F&& f) {
    for (auto& c : children_) c->apply(f);
    f(*this);
  }

 protected:
  /// Appends this block's parameters, their paths `path` and their short
  /// names, then its children's, child i's under `path` + "i.".
  virtual void collect(const std::string& path, std::vector<NamedParameter>& out) {
    for (auto& p : params_) out.push_back({path + p->name().substr(name_.size() + 1), p.get()});
    for (std::size_t i = 0; i < children_.size(); ++i) children_[i]->collect(path + std::to_string(i) + ".", out);
  }
  /// Gives every ".weight" parameter `weights` and the others zeros, recursively.
  virtual void apply_initializer(const Initializer& weights) {
    for (auto& p : params_)
      if (p->name().ends_with(".weight")) p->set_initializer(weights);
      else p->set_initializer(init::zeros());
    for (auto& c : children_) c->apply_initializer(weights);
  }
  /// Declares a parameter named "<block name>.<short_name>" (for layers'
  /// constructors), with the extents known before the first input
  /// (inferred_extent for the others), which a loaded value must have.
  Parameter& add_parameter(const std::string& short_name, std::vector<std::int64_t> declared = {},
                           bool trainable = true) {
    params_.push_back(std::make_unique<Parameter>(name_ + "." + short_name, nullptr, std::move(declared), trainable));
    return *params_.back();
  }
  /// Adds a child block (its parameters become this block's too).
  void add_child(std::shared_ptr<Block> child) {
    structure_version().fetch_add(1, std::memory_order_relaxed);
    children_.push_back(std::move(child));
  }
  /// The child blocks, in the order they were added.
  const std::vector<std::shared_ptr<Block>>& children() const { return children_; }

 private:
  // One traced forward: its input placeholder, its output and the versions
  // of the parameters it read.
  struct CachedGraph {
    detail::Trace trace;
    Tensor<float> input, output;
    std::shared_ptr<detail::Buffer> input_buffer;   // the placeholder's storage, refilled per call
    std::size_t output_step = detail::Trace::none;  // the step a replay gives a new output buffer
    std::vector<std::pair<Parameter*, const detail::Buffer*>> params;
    std::uint64_t structure = structure_version().load(std::memory_order_relaxed);  // a layer added since retraces
    bool fits(const Tensor<float>& x) const { return x.device() == input.device() && x.shape() == input.shape(); }
    bool stale() const {
      if (structure != structure_version().load(std::memory_order_relaxed)) return true;
      for (const auto& [p, version] : params)
        if (!p->initialized() || !p->holds(input.device()) || p->data(input.device()).storage() != version)
          return true;
      return false;
    }
  };

  // Bumped whenever any block gains a child: a traced graph of it or of a
  // block holding it (at any depth) no longer runs what forward() would.
  // One count for all blocks; a child added elsewhere costs one retrace.
  static std::atomic<std::uint64_t>& structure_version() {
    static std::atomic<std::uint64_t> version{0};
    return version;
  }

  // One traced graph per device the block is called on (data parallelism
  // calls it on several in turn) and input shape (an epoch's last, shorter
  // batch), at most options_.shapes per device, the least recently used
  // last to go.
  Tensor<float> cached_call(const Tensor<float>& x);

  std::string name_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::shared_ptr<Block>> children_;
  std::atomic<bool> hybridized_{false};  // read without caches_mutex_ by every call
  HybridizeOptions options_;
  std::vector<std::unique_ptr<CachedGraph>> caches_;
  mutable std::mutex caches_mutex_;
  std::atomic<std::int64_t> traces_{0};
};

/// A unique default name per block kind: dense0, dense1, ...
inline std::string auto_name(const std::string& kind) {
  static std::mutex m;
  static std::vector<std::pair<std::string, int>> counts;
  std::lock_guard lk(m);
  for (auto& [k, n] : counts)
    if (k == kind) return kind + std::to_string(n++);
  counts.emplace_back(kind, 1);
  return kind + "0";
}

/// Children run one after another (Gluon's Sequential).
class Sequential : public Block {
 public:
  ~Sequential() override;
  /// An empty network named "sequentialN".
  Sequential() : Block(auto_name("sequential")) {}
  /// Appends layers: `net.add(std::make_shared<nn::Dense>(256, nn::Act::relu), ...)`.
  template <class... Blocks>
  Sequential& add(std::shared_ptr<Blocks>... blocks) {
    (add_child(std::move(blocks)), ...);
    return *this;
  }
  /// Runs the children in order; std::logic_error when none was added.
  Tensor<float> forward(const Tensor<float>& x) override;
  /// Number of layers added.
  std::size_t size() const { return children().size(); }
};

#if DEFT_DEFINE_NN
DEFT_DECL Block::~Block() = default;
DEFT_DECL Sequential::~Sequential() = default;

DEFT_DECL Tensor<float> Block::cached_call(const Tensor<float>& x) {
  const auto it = std::ranges::find_if(caches_, [&](const auto& c) { return c->fits(x); });
  if (it != caches_.end() && !(*it)->stale()) {
    std::rotate(it, it + 1, caches_.end());  // the most recently used last
    CachedGraph* cache = caches_.back().get();
    // Refill the input placeholder (after the previous replay's last reads).
    auto refill = detail::copy_task("hybridized input", cache->input_buffer->bytes, x);
    auto made = detail::replay(cache->trace, {{std::move(refill), cache->input_buffer}}, cache->output_step).output;
    return detail::traced_result(cache->trace, std::move(made), cache->output);
  }
  // Deferred initialization runs untraced: replays must not draw the weights again.
  for (auto* p : collect_params())
    if (!p->initialized()) return forward(x);
  // Graphs that read older parameters would only hold their memory; a
  // device's least recently used shape makes room for the new one.
  // (A replay in flight keeps its plan alive.)
  const auto on_device = [&](const auto& c) { return c->input.device() == x.device(); };
  std::erase_if(caches_, [&](const auto& c) { return on_device(c) && (c->fits(x) || c->stale()); });
  if (std::size_t(std::ranges::count_if(caches_, on_device)) >= options_.shapes)
    caches_.erase(std::ranges::find_if(caches_, on_device));
  auto graph = std::make_unique<CachedGraph>();
  graph->trace.programs_allowed = options_.cuda_graph;
  graph->input = x.clone();  // the placeholder later calls refill
  {
    detail::TraceScope scope(graph->trace);
    graph->output = forward(graph->input);
  }
  for (auto* p : collect_params()) graph->params.emplace_back(p, p->data(x.device()).storage());
  graph->input_buffer = graph->input.leaf().buffer;
  graph->output_step = graph->trace.sole_unread_writer(graph->output.storage());
  ++traces_;
  Tensor<float> out = detail::traced_result(graph->trace, nullptr, graph->output);
  caches_.push_back(std::move(graph));
  return out;
}

DEFT_DECL std::vector<NamedParameter> Block::named_params() {
  std::vector<NamedParameter> all, out;
  collect("", all);
  std::unordered_set<const Parameter*> seen;
  for (NamedParameter& n : all)
    if (seen.insert(n.parameter).second) out.push_back(std::move(n));
  return out;
}

DEFT_DECL Tensor<float> Sequential::forward(const Tensor<float>& x) {
  if (children().empty()) detail::raise<std::logic_error>(name(), ": no layers were added");
  Tensor<float> h = x;
  for (auto& c : children()) h = (*c)(h);
  return h;
}
#endif

}  // namespace deft::nn
