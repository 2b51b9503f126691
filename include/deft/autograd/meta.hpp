// What autograd attaches to tensors: the recording switch, the per-handle
// gradient record (Meta) and the graph node (Node) that produced a value.
// The operations that fill them are in autograd/graph.hpp; only what Tensor
// and the expression leaves must name is declared here.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "../core/dtype.hpp"

namespace deft {

template <Element T>
class Tensor;
namespace detail {
template <Element T>
struct Leaf;
struct ConvGeom;
struct PoolGeom;
enum class PoolKind;
}

namespace autograd {

/// What backward() does with an attached variable's gradient.
enum class GradReq {
  write,  ///< overwrite x.grad() with the new gradient (MXNet's 'write')
  add,    ///< add it to x.grad() (accumulate over several backward passes)
  null    ///< no gradient for this variable
};

namespace detail {

struct Node;

/// The autograd state of one value: an attached variable (attach_grad) or
/// the output of a recorded operation (grad_fn set).
struct MetaBase {
  virtual ~MetaBase() = default;
  std::shared_ptr<Node> grad_fn;  // the recorded operation that produced the value
  bool attached = false;
  GradReq req = GradReq::write;
  // Set when backward() hands this variable a gradient, cleared by the
  // Trainer step that uses it: a step can tell a new gradient from an old one.
  bool fresh_grad = false;
  // Set when a backward() without retain_graph freed grad_fn: a later
  // backward() through this value would find no way to its inputs.
  bool graph_freed = false;

  // The gradient gathered for this value during one backward pass.
  virtual bool has_pending() const = 0;
  virtual void clear_pending() = 0;
  /// Hands the gathered gradient to grad() as `req` says (attached variables).
  virtual void deliver() = 0;
};

/// A recorded operation: backward() reads the gradient of its output and
/// adds the gradients of its inputs (inputs' metas listed for graph walks).
struct Node {
  explicit Node(const char* op) : name(op) {}
  virtual ~Node() = default;
  /// `out` is the meta of this node's output, with its gradient gathered.
  virtual void backward(MetaBase& out) = 0;
  /// Raises what backward() would raise for want of a derivative (a
  /// deft::map): backward() asks every node before any gradient moves.
  virtual void check_differentiable() const {}
  const char* name;
  std::vector<std::shared_ptr<MetaBase>> inputs;
};

inline bool& recording_flag() {
  thread_local bool on = false;
  return on;
}
inline bool& training_flag() {
  thread_local bool on = false;
  return on;
}

// Tensor's autograd entry points, defined in autograd/graph.hpp.
template <class T>
void attach_grad(Tensor<T>& x, GradReq req);
template <class T>
Tensor<T> grad_of(const Tensor<T>& x);
template <class T>
void backward(const Tensor<T>& y, const Tensor<T>* head, bool retain_graph);
template <class T, class E>
void track_elementwise(Tensor<T>& out, E&& e);
template <class Reducer, class T, class E>
void track_reduce(Tensor<T>& out, const E& in, int axis, bool all, bool keepdims);
template <class T>
void track_dot(Tensor<T>& out, const deft::detail::Leaf<T>& a, const deft::detail::Leaf<T>& b);
template <class T>
void track_transpose(Tensor<T>& out, const deft::detail::Leaf<T>& in, const std::vector<int>& perm);
template <class T>
void track_view(Tensor<T>& view, const Tensor<T>& source, std::int64_t row_begin, std::int64_t row_end);
template <class T>
void track_copy(Tensor<T>& out, const deft::detail::Leaf<T>& in);
// Defined in autograd/conv.hpp.
template <class T>
void track_conv2d(Tensor<T>& out, const deft::detail::Leaf<T>& x, const deft::detail::Leaf<T>& w,
                  const deft::detail::Leaf<T>* b, const deft::detail::ConvGeom& g);
template <deft::detail::PoolKind Kind, class T>
void track_pool2d(Tensor<T>& out, const deft::detail::Leaf<T>& x, const deft::detail::PoolGeom& g);
// Defined in autograd/indexing.hpp.
template <class T>
void track_slice(Tensor<T>& out, const deft::detail::Leaf<T>& in, int axis, std::int64_t begin);
template <class T>
void track_concat(Tensor<T>& out, const std::vector<deft::detail::Leaf<T>>& parts, int axis);
// Defined in autograd/softmax.hpp.
template <class T>
void track_softmax(Tensor<T>& out, std::shared_ptr<MetaBase> in, int axis, bool log);
template <class T>
void track_softmax_cross_entropy(Tensor<T>& loss, const deft::detail::Leaf<T>& scores, Tensor<T> max,
                                 Tensor<T> log_sum, Tensor<T> onehot);

}  // namespace detail

/// Whether operations on this thread are being recorded for backward().
inline bool is_recording() { return detail::recording_flag(); }
/// Whether layers on this thread run in training mode (MXNet's
/// autograd.is_training()): Dropout masks and BatchNorm uses the batch's
/// statistics. `record` turns it on by default, `pause` off; outside both
/// it is off (prediction), unless a `train_mode` scope says otherwise.
inline bool is_training() { return detail::training_flag(); }

namespace detail {
/// Sets the recording and training flags of this thread for a scope, and
/// puts the previous ones back when it ends.
class FlagScope {
 public:
  FlagScope(bool recording, bool training) : recording_(recording_flag()), training_(training_flag()) {
    recording_flag() = recording;
    training_flag() = training;
  }
  ~FlagScope() {
    recording_flag() = recording_;
    training_flag() = training_;
  }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;

 private:
  bool recording_, training_;
};
}  // namespace detail

/// Records the operations of its scope (MXNet's `with autograd.record():`):
/// `{ autograd::record r; auto loss = ...; loss.backward(); }`. Layers run
/// in training mode inside it unless `train_mode` is false (a validation
/// pass that needs gradients, a BatchNorm whose statistics stay frozen).
class record : detail::FlagScope {
 public:
  /// Starts recording, in training mode unless `train_mode` is false.
  explicit record(bool train_mode = true) : FlagScope(true, train_mode) {}
};

/// Stops recording within a recorded scope (MXNet's autograd.pause()); layers
/// run in prediction mode inside it unless `train_mode` is true.
class pause : detail::FlagScope {
 public:
  /// Stops recording, in prediction mode unless `train_mode` is true.
  explicit pause(bool train_mode = false) : FlagScope(false, train_mode) {}
};

/// Sets the layers' mode for its scope, recording or not (MXNet's
/// train_mode() and predict_mode()): `Training` true runs them as in
/// training, false as in prediction.
template <bool Training>
class mode_scope : detail::FlagScope {
 public:
  /// Sets the mode until the scope ends.
  mode_scope() : FlagScope(detail::recording_flag(), Training) {}
};
/// Training mode within its scope: `{ autograd::train_mode t; net(x); }`.
using train_mode = mode_scope<true>;
/// Prediction mode within its scope, e.g. a validation pass inside `record`.
using predict_mode = mode_scope<false>;

}  // namespace autograd
}  // namespace deft
