// DataLoader: mini-batches of an in-memory data set, as Gluon's DataLoader.
//
//   deft::data::DataLoader loader(images, labels, 64, {.seed = 42});
//   for (int epoch = 0; epoch < 10; ++epoch)
//     for (const auto& [x, y] : loader) train_step(x, y);
//
// Each range-for (each begin()) is one epoch: a fresh order, shuffled with a
// generator seeded by (seed, epoch number), so runs are reproducible and do
// not depend on the standard library (the shuffle is written out here; the
// standard leaves std::shuffle's algorithm open). While the caller trains on
// one batch, a background thread gathers the next into new host tensors.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <future>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../tensor.hpp"

namespace deft::data {

/// What to do with the samples left over when N is not a multiple of the batch size.
enum class LastBatch {
  keep,      // a last, smaller batch
  discard,   // drop them (every batch is full)
  rollover,  // carry them into the next epoch, where they come first (Gluon's "rollover")
};

/// How a DataLoader orders and batches its samples.
struct LoaderOptions {
  bool shuffle = true;       ///< false: samples in order 0..N-1 every epoch
  std::uint64_t seed = 0;    ///< with the epoch number, determines each epoch's order
  LastBatch last_batch = LastBatch::keep;  ///< what happens to a last, smaller batch
  bool prefetch = true;      ///< gather the next batch on a background thread
  /// Data parallelism across processes: with num_shards > 1, each batch is
  /// the batch one process would get (same seed, same order), of which this
  /// loader yields part `shard` (rows [shard * b / num_shards, (shard + 1) *
  /// b / num_shards) of its b rows), so that the shards of each batch are
  /// disjoint and together make it. Every shard yields the same number of
  /// batches: a last batch with fewer samples than shards is dropped.
  int num_shards = 1;
  int shard = 0;  ///< this loader's part, 0..num_shards-1 (dist::rank())
};

/// One mini-batch: x of shape (b, sample shape...), y of shape (b,).
/// `auto [x, y] = batch` binds x and y (Batch is a pair for structured
/// bindings; rows is read by name).
struct Batch {
  Tensor<float> x;         ///< the samples, batch first
  Tensor<std::int64_t> y;  ///< their labels
  /// The rows of the whole batch, all shards together (x's rows unless
  /// sharded): what Trainer::step takes.
  std::int64_t rows = 0;

  /// Element I of the pair (x, y), for structured bindings.
  template <std::size_t I>
  auto& get() & {
    if constexpr (I == 0) return x;
    else return y;
  }
  /// Element I of the pair (x, y), for structured bindings.
  template <std::size_t I>
  const auto& get() const& {
    if constexpr (I == 0) return x;
    else return y;
  }
  /// Element I of the pair (x, y), for structured bindings.
  template <std::size_t I>
  auto&& get() && {
    if constexpr (I == 0) return std::move(x);
    else return std::move(y);
  }
};

/// Mini-batches of (features, labels) for a range-for, one epoch per loop
/// (Gluon's DataLoader); see docs/data.md.
class DataLoader {
  // The data set, shared with running epochs so that an epoch stays valid
  // even if the loader is moved or destroyed under it.
  struct Data {
    std::vector<float> features;
    std::vector<std::int64_t> labels;
    Shape sample_shape;     // the shape of one sample (the features' shape without axis 0)
    std::int64_t row = 0;   // floats per sample
  };

  // One pass: the sample order, the current batch and the one being gathered.
  struct Epoch {
    std::shared_ptr<const Data> data;
    std::vector<std::int64_t> order;  // batch k is order[k * batch, (k + 1) * batch) (the last may be short)
    std::int64_t batch = 0, batches = 0, index = 0;  // index: the current batch
    int shard = 0, num_shards = 1;
    bool prefetch = true;
    Batch current;
    std::future<Batch> next;  // batch index + 1, when prefetching

    ~Epoch() {
      // The gathering task reads `order` and `data`: it must end before they
      // go (a std::async future would also wait, but saying so is clearer).
      if (next.valid()) next.wait();
    }
    Batch gather(std::int64_t k) const {
      const std::int64_t lo = k * batch, hi = std::min<std::int64_t>(lo + batch, std::int64_t(order.size()));
      const std::int64_t n = hi - lo, from = lo + n * shard / num_shards, to = lo + n * (shard + 1) / num_shards;
      Batch b = DataLoader::gather(*data, std::span(order).subspan(std::size_t(from), std::size_t(to - from)));
      b.rows = n;
      return b;
    }
    void start_next() {
      if (!prefetch || index + 1 >= batches) return;
      try {
        next = std::async(std::launch::async, [this, k = index + 1] { return gather(k); });
      } catch (const std::system_error&) {
        // No thread to be had: the next batch is gathered when it is needed.
      }
    }
    // A failed gather leaves the iterator on the batch before: the next
    // ++ gathers the failed batch again (here, on the calling thread), so
    // a caller that catches the failure and goes on loses no samples.
    void advance() {
      const std::int64_t k = index + 1;
      if (k >= batches) {
        index = k;
        current = Batch{};
        return;
      }
      Batch b = next.valid() ? next.get() : gather(k);  // get() rethrows a failure of the background gather
      index = k;
      current = std::move(b);
      start_next();
    }
  };

 public:
  /// Mini-batches of (features[i], labels[i]); features have shape (N, ...),
  /// labels (N,). Reads both to the host once (a sync point). Throws
  /// std::invalid_argument for batch_size < 1, a scalar feature tensor,
  /// labels that are not 1-D, or a different number of features and labels.
  DEFT_DECL DataLoader(const Tensor<float>& features, const Tensor<std::int64_t>& labels, std::int64_t batch_size,
                       LoaderOptions options = {});

  /// An input iterator over one epoch's batches (end() is a sentinel).
  class Iterator {
   public:
    using value_type = Batch;                ///< what the iterator yields
    using difference_type = std::ptrdiff_t;  ///< required of input iterators

    Iterator() = default;
    /// The current batch.
    const Batch& operator*() const { return epoch_->current; }
    /// The current batch's members.
    const Batch* operator->() const { return &epoch_->current; }
    /// Moves to the next batch (waiting for its background gather).
    Iterator& operator++() {
      epoch_->advance();
      return *this;
    }
    /// Moves to the next batch.
    void operator++(int) { ++*this; }
    friend bool operator==(const Iterator& it, std::default_sentinel_t) { return !it.epoch_ || it.epoch_->index >= it.epoch_->batches; }

   private:
    friend class DataLoader;
    explicit Iterator(std::unique_ptr<Epoch> e) : epoch_(std::move(e)) {}
    std::unique_ptr<Epoch> epoch_;  // destroying the iterator (say, on break) waits for the background gather
  };

  /// Starts the next epoch: fixes its order (and, with rollover, the samples
  /// it carries into the epoch after, so breaking out early drops the rest)
  /// and gathers the first batch.
  DEFT_DECL Iterator begin();
  /// The end of an epoch.
  std::default_sentinel_t end() const { return {}; }

  /// The number of samples N.
  std::int64_t size() const { return std::int64_t(data_->labels.size()); }
  /// Samples per batch.
  std::int64_t batch_size() const { return batch_; }
  /// The options the loader was made with.
  const LoaderOptions& options() const { return options_; }
  /// The number of batches the next epoch yields (with rollover it depends on
  /// the samples carried over).
  std::int64_t num_batches() const {
    return batches_of(size() + std::int64_t(carry_.size()));
  }
  /// The number of the next epoch (0 for the first begin()).
  std::uint64_t epoch() const { return epoch_; }
  /// Makes the next begin() produce epoch e's order (to resume a run). Samples
  /// carried over by rollover stay.
  void set_epoch(std::uint64_t e) { epoch_ = e; }

  /// Epoch e's order of the N samples: 0..N-1, shuffled when options().shuffle.
  DEFT_DECL std::vector<std::int64_t> order_of(std::uint64_t e) const;

 private:
  // The batches an epoch of `total` samples yields (a short last one only
  // with LastBatch::keep); no overflow for a batch size near INT64_MAX.
  std::int64_t batches_of(std::int64_t total) const {
    const bool short_one = options_.last_batch == LastBatch::keep && total % batch_ >= options_.num_shards;
    return total / batch_ + (short_one ? 1 : 0);
  }
  static DEFT_DECL Batch gather(const Data& d, std::span<const std::int64_t> idx);

  std::shared_ptr<const Data> data_;
  std::int64_t batch_;
  LoaderOptions options_;
  std::uint64_t epoch_ = 0;
  std::vector<std::int64_t> carry_;  // rollover: samples carried into the next epoch
};

#if DEFT_DEFINE_RUNTIME
DEFT_DECL DataLoader::DataLoader(const Tensor<float>& features, const Tensor<std::int64_t>& labels,
                                 std::int64_t batch_size, LoaderOptions options)
    : batch_(batch_size), options_(options) {
  if (batch_size < 1) deft::detail::raise("DataLoader: batch_size must be at least 1, got ", batch_size);
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards)
    deft::detail::raise("DataLoader: shard ", options.shard, " of ", options.num_shards,
                        " shards; needs num_shards >= 1 and 0 <= shard < num_shards");
  if (batch_size < options.num_shards)
    deft::detail::raise("DataLoader: batch_size ", batch_size, " is smaller than num_shards ", options.num_shards,
                        "; every shard needs at least one row of each batch");
  if (features.rank() < 1)
    deft::detail::raise("DataLoader: features need a sample axis (shape (N, ...)), got shape ", features.shape().to_string());
  if (labels.rank() != 1)
    deft::detail::raise("DataLoader: labels need shape (N,), got shape ", labels.shape().to_string());
  if (features.shape()[0] != labels.shape()[0])
    deft::detail::raise("DataLoader: ", features.shape()[0], " samples of features (shape ", features.shape().to_string(),
                        ") but ", labels.shape()[0], " labels (shape ", labels.shape().to_string(), ")");
  auto d = std::make_shared<Data>();
  d->features = features.to_vector();
  d->labels = labels.to_vector();
  d->sample_shape = features.shape().without(0);
  d->row = d->sample_shape.size();
  data_ = std::move(d);
}

DEFT_DECL DataLoader::Iterator DataLoader::begin() {
  auto e = std::make_unique<Epoch>();
  e->data = data_;
  e->batch = batch_;
  e->prefetch = options_.prefetch;
  e->shard = options_.shard;
  e->num_shards = options_.num_shards;
  // Nothing of the loader changes until batch 0 is gathered: a failure
  // there (an allocation) leaves the epoch and the carried samples for a retry.
  e->order = carry_;
  const std::vector<std::int64_t> perm = order_of(epoch_);
  e->order.insert(e->order.end(), perm.begin(), perm.end());
  const std::int64_t total = std::int64_t(e->order.size());
  e->batches = batches_of(total);
  std::vector<std::int64_t> carry;
  if (options_.last_batch == LastBatch::rollover) carry.assign(e->order.begin() + e->batches * batch_, e->order.end());
  e->order.resize(std::size_t(std::min(total, e->batches * batch_)));
  e->index = -1;
  e->advance();  // batch 0 now (nothing to overlap with yet), batch 1 in the background
  carry_ = std::move(carry);
  ++epoch_;
  return Iterator(std::move(e));
}

DEFT_DECL std::vector<std::int64_t> DataLoader::order_of(std::uint64_t e) const {
  std::vector<std::int64_t> order(static_cast<std::size_t>(size()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = std::int64_t(i);
  if (!options_.shuffle) return order;
  const std::uint64_t s = options_.seed;
  std::seed_seq seq{std::uint32_t(s), std::uint32_t(s >> 32), std::uint32_t(e), std::uint32_t(e >> 32)};
  std::mt19937_64 gen(seq);
  // Fisher-Yates with an unbiased bounded draw (rejection of the top
  // 2^64 mod bound values), both fixed here for portable orders.
  for (std::size_t i = order.size(); i > 1; --i) {
    const std::uint64_t bound = i, reject_below = (0 - bound) % bound;
    std::uint64_t r;
    do r = gen();
    while (r < reject_below);
    std::swap(order[i - 1], order[std::size_t(r % bound)]);
  }
  return order;
}

DEFT_DECL Batch DataLoader::gather(const Data& d, std::span<const std::int64_t> idx) {
  const std::size_t row = std::size_t(d.row);
  std::vector<float> x(idx.size() * row);
  std::vector<std::int64_t> y(idx.size());
  for (std::size_t k = 0; k < idx.size(); ++k) {
    if (row) std::memcpy(x.data() + k * row, d.features.data() + std::size_t(idx[k]) * row, row * sizeof(float));
    y[k] = d.labels[std::size_t(idx[k])];
  }
  Shape xs{std::int64_t(idx.size())};
  for (std::int64_t e : d.sample_shape) xs.push_back(e);
  return Batch{Tensor<float>(std::move(x), xs), Tensor<std::int64_t>(std::move(y), Shape{std::int64_t(idx.size())}),
               std::int64_t(idx.size())};
}
#endif

}  // namespace deft::data

// Batch binds as the pair (x, y): `for (const auto& [x, y] : loader)`.
/// @cond
namespace std {
template <>
struct tuple_size<deft::data::Batch> : integral_constant<size_t, 2> {};
template <size_t I>
struct tuple_element<I, deft::data::Batch> {
  using type = conditional_t<I == 0, deft::Tensor<float>, deft::Tensor<int64_t>>;
};
}  // namespace std
/// @endcond
