// Work over several devices (Gluon's split_and_load and the kvstore's
// allreduce): a batch split into one part per device, and a sum of
// per-device tensors written back to every device (through the GPU
// backend's collective where it has one). Both are deferred: they record
// copies and sums, and return at once.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/meta.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../engine/api.hpp"
#include "elementwise.hpp"
#include "../tensor.hpp"

namespace deft {

namespace detail {

/// Rows per part when `rows` are shared in proportion to `shares`: each part
/// gets the whole rows of its quota, the rows left go to the largest
/// remainders (ties to the earlier part), and a part left with none takes
/// one from the largest part. Equal shares give parts that differ by at most
/// one row, the first ones larger. Needs rows >= shares.size().
inline std::vector<std::int64_t> split_rows(std::int64_t rows, const std::vector<double>& shares) {
  const std::size_t n = shares.size();
  double total = 0;
  for (double s : shares) total += s;
  // Huge finite shares (1e308) overflow the sum or the quotas: then taken
  // relative to the largest. Only then, as that rounds ties differently.
  const double largest = *std::max_element(shares.begin(), shares.end());
  const double unit = std::isfinite(total) && std::isfinite(double(rows) * largest) ? 1.0 : largest;
  if (unit != 1.0) {
    total = 0;
    for (double s : shares) total += s / unit;
  }
  std::vector<std::int64_t> counts(n);
  std::vector<std::pair<double, std::size_t>> rest(n);  // (remainder, part)
  std::int64_t given = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double quota = double(rows) * (shares[i] / unit) / total;
    counts[i] = std::min(rows, std::int64_t(quota));
    given += counts[i];
    rest[i] = {quota - double(counts[i]), i};
  }
  std::stable_sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < rows; k = (k + 1) % n, ++given) ++counts[rest[k].second];
  for (std::size_t i = 0; i < n; ++i)
    if (counts[i] == 0) {
      --*std::max_element(counts.begin(), counts.end());
      counts[i] = 1;
    }
  return counts;
}

template <Element T>
std::vector<Tensor<T>> load_rows(const Tensor<T>& batch, const std::vector<Device>& devices,
                                 const std::vector<std::int64_t>& counts) {
  std::vector<Tensor<T>> out;
  out.reserve(devices.size());
  std::int64_t begin = 0;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out.push_back(batch.rows(begin, begin + counts[i]).to(devices[i]));
    begin += counts[i];
  }
  return out;
}

template <Element T>
void check_split(const Tensor<T>& batch, const std::vector<Device>& devices) {
  if (devices.empty()) raise("split_and_load: no devices given");
  if (batch.rank() == 0) raise("split_and_load: a scalar tensor has no rows to split");
  const std::int64_t rows = batch.shape()[0], parts = std::int64_t(devices.size());
  if (rows < parts)
    raise("split_and_load: ", rows, " rows (shape ", batch.shape().to_string(), ") cannot give each of ", parts,
          " devices (", device_list(devices), ") at least one");
}

}  // namespace detail

/// Splits `batch` along its first axis into one part per device, in order,
/// and copies each part to its device (a part already there is a view).
/// Parts differ by at most one row, the first ones being larger; with
/// `even_split` the rows must divide evenly. std::invalid_argument for no
/// devices, a scalar, fewer rows than devices, or an uneven even split.
template <Element T>
std::vector<Tensor<T>> split_and_load(const Tensor<T>& batch, const std::vector<Device>& devices,
                                      bool even_split = false) {
  detail::check_split(batch, devices);
  const std::int64_t rows = batch.shape()[0], parts = std::int64_t(devices.size());
  if (even_split && rows % parts != 0)
    detail::raise("split_and_load: ", rows, " rows do not split evenly over ", parts, " devices (",
                  detail::device_list(devices), "); pass even_split = false for parts that differ by one row");
  return detail::load_rows(batch, devices, detail::split_rows(rows, std::vector<double>(devices.size(), 1.0)));
}

/// Splits `batch` over devices of different speeds (a CPU and a GPU, two
/// GPU models): device i gets a part in proportion to shares[i] (its rows
/// per second, say), rounded to whole rows with at least one row each.
/// With the loss summed over the samples and `Trainer::step(batch size)`,
/// the summed gradients are the whole batch's, however the rows are shared.
/// std::invalid_argument as above, and for a share per device missing or
/// one that is not a positive finite number.
template <Element T>
std::vector<Tensor<T>> split_and_load(const Tensor<T>& batch, const std::vector<Device>& devices,
                                      const std::vector<double>& shares) {
  detail::check_split(batch, devices);
  if (shares.size() != devices.size())
    detail::raise("split_and_load: ", shares.size(), " shares for ", devices.size(), " devices (",
                  detail::device_list(devices), ")");
  for (std::size_t i = 0; i < shares.size(); ++i)
    if (!(shares[i] > 0) || !std::isfinite(shares[i]))
      detail::raise("split_and_load: the share of ", devices[i], " is ", shares[i],
                    "; each device needs a positive share (leave a device out to give it no rows)");
  return detail::load_rows(batch, devices, detail::split_rows(batch.shape()[0], shares));
}

/// Shares for split_and_load(batch, devices, shares) from each device's own
/// speed: for each device in turn, calls step(device), which should record
/// the same work on that device (a forward and backward of one batch, say),
/// and waits for everything (wait_all), once to warm up and `repeats` times
/// timed. Returns 1 / the median seconds of each device's timed calls: the
/// steps per second it manages alone. A step's failure is rethrown; work
/// recorded before the call runs first, untimed, and its failures are left
/// for the caller's next wait_all().
/// std::invalid_argument for no devices or repeats below 1.
template <class Step>
std::vector<double> measure_shares(const std::vector<Device>& devices, Step&& step, int repeats = 3) {
  if (devices.empty()) detail::raise("measure_shares: no devices given");
  if (repeats < 1) detail::raise("measure_shares: repeats must be at least 1, got ", repeats);
  // Work recorded before is not the steps': it runs first, untimed, and a
  // failure of it stays for the caller's next wait_all().
  auto& engine = detail::Engine::get();
  const std::exception_ptr earlier = engine.quiesce_and_take_failure();
  std::vector<double> shares;
  try {
    for (const Device& d : devices) {
      std::vector<double> seconds;
      for (int i = 0; i <= repeats; ++i) {
        const auto start = std::chrono::steady_clock::now();
        step(d);
        wait_all();
        if (i > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::nth_element(seconds.begin(), seconds.begin() + std::ptrdiff_t(seconds.size() / 2), seconds.end());
      // A step too quick for the clock still gets a finite share.
      shares.push_back(1.0 / std::max(seconds[seconds.size() / 2], 1e-9));
    }
  } catch (...) {
    engine.restore_failure(earlier);
    throw;
  }
  engine.restore_failure(earlier);
  return shares;
}

namespace detail {

/// Orders the lane a GPU task runs on (where the engine marks its output
/// ready) after the sum across devices that wrote `out` on another lane.
inline void read_after_sum(Buffer& out) {
  LaneAccess access(backend_of(out.device), out.device.index, {{out.data}, {}});
}

/// The kernel of a sum across devices: the task writing the first part's
/// sum queues the backend's collective, which writes every part's sum.
struct SumAcrossDevices {
  std::vector<std::shared_ptr<Buffer>> from;  // every part's current version, in order
  // The other parts' new versions. Weak: each is the output of a task that
  // waits for this one, and a strong reference would make a cycle.
  std::vector<std::weak_ptr<Buffer>> others;
  std::size_t count;
  DType dtype;

  void operator()(Buffer& out) const {
    ProgramCapture::refuse("a sum across GPUs");
    std::vector<SumPart> parts{{out.device.index, from[0]->data, out.data}};
    std::vector<std::shared_ptr<Buffer>> held;  // alive until the sum is queued
    for (std::size_t i = 1; i < from.size(); ++i) {
      auto b = others[i - 1].lock();  // null when nobody can read that part: the sum still needs somewhere to go
      if (!b) b = std::make_shared<Buffer>(out.bytes, from[i]->device);
      b->allocate();
      parts.push_back({from[i]->device.index, from[i]->data, b->data});
      held.push_back(std::move(b));
    }
    backend_of(out.device).sum_across(parts, count, dtype);
    read_after_sum(out);
  }
};

/// The kernel of the tasks publishing the other parts' sums.
struct ReadAfterSum {
  std::shared_ptr<Buffer> collective_output;  // keeps the collective's task from being discarded
  void operator()(Buffer& out) const { read_after_sum(out); }
};

/// Raises unless every part has part 0's shape (`what` starts the message).
template <Element T>
void check_parts(const std::vector<Tensor<T>>& parts, const std::string& what) {
  for (const auto& p : parts) (void)p.device();  // an empty handle raises here, before anything is summed
  for (std::size_t i = 1; i < parts.size(); ++i)
    if (!(parts[i].shape() == parts[0].shape()))
      raise(what, "part ", i, " has shape ", parts[i].shape().to_string(), " but part 0 has shape ",
            parts[0].shape().to_string());
}

/// allreduce through the GPU backend's collective (NCCL): false, with
/// nothing recorded, unless every part covers its own storage on a
/// distinct GPU the backend can sum over. Records one task that queues the
/// collective (writing the first part's new version) and one per other
/// part, then makes those the parts' current versions: no copy is made,
/// and pending readers keep the old ones.
template <Element T>
bool sum_across_devices(std::vector<Tensor<T>>& parts) {
  // A trace replays fixed buffers (the copies are plain tasks); an empty sum has nothing to queue.
  if (active_trace() || parts[0].size() == 0) return false;
  std::vector<int> devices;
  std::vector<std::shared_ptr<Buffer>> from;
  for (const auto& p : parts) {
    if (p.device().type == DeviceType::cpu) return false;
    devices.push_back(p.device().index);
    from.push_back(whole_storage(p));
    if (!from.back()) return false;
  }
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;
  DeviceBackend* backend = gpu_backend();
  if (!backend || !backend->sums_across(devices)) return false;

  std::vector<std::shared_ptr<Buffer>> to;
  for (const auto& f : from) to.push_back(std::make_shared<Buffer>(f->bytes, f->device));
  auto collective = emplace_task<SumAcrossDevices>("allreduce", to[0]->bytes, SumAcrossDevices{
      from, std::vector<std::weak_ptr<Buffer>>(to.begin() + 1, to.end()), std::size_t(parts[0].size()), dtype_of<T>});
  for (const auto& f : from) collective->add_input(f);
  collective->hand_off = true;
  collective->output = to[0];
  to[0]->producer = collective;
  Engine::get().record(collective);
  for (std::size_t i = 1; i < to.size(); ++i) {
    auto t = emplace_task<ReadAfterSum>("allreduce", to[i]->bytes, ReadAfterSum{to[0]});
    t->add_input(to[0]);
    t->hand_off = true;
    t->output = to[i];
    to[i]->producer = t;
    Engine::get().record(t);
  }
  for (std::size_t i = 0; i < parts.size(); ++i) replace_storage(parts[i], std::move(to[i]));
  return true;
}

}  // namespace detail

/// Sums tensors of one shape (a gradient on each of several devices) and
/// writes the sum into every one of them (every handle of their storage
/// sees it), so that every device holds the same bits. Parts on distinct
/// GPUs, each a whole tensor, are summed by the GPU backend's collective
/// (NCCL's allreduce, without copies); otherwise the sum is formed on the
/// first part's device, in the order given, and copied to the others. Not
/// differentiated.
template <Element T>
void allreduce(std::vector<Tensor<T>>& parts) {
  detail::check_parts(parts, "allreduce: ");
  if (parts.size() < 2) return;
  autograd::pause no_recording;
  if (detail::sum_across_devices(parts)) return;
  const Device home = parts[0].device();
  Tensor<T> total = detail::eval_untracked(parts[0] + parts[1].to(home));
  for (std::size_t i = 2; i < parts.size(); ++i) detail::assign_untracked(total, total + parts[i].to(home));
  for (auto& p : parts) p.assign(total.to(p.device()));
}

namespace detail {

/// The kernel of a bucket's packing: copies each part (a contiguous range of
/// its storage, on the output's device) right after the one before.
template <class T>
struct PackParts {
  std::vector<Leaf<T>> parts;
  void operator()(Buffer& out) const {
    std::byte* at = out.data;
    for (const Leaf<T>& p : parts) {
      const std::size_t bytes = std::size_t(p.shape().size()) * sizeof(T);
      copy_bytes(at, out.device, p.source->template as<const T>() + p.offset, p.device(), bytes);
      at += bytes;
    }
  }
};

/// The elements of `parts`, one part after another, in one new tensor on
/// `device` (a bucket of a bucketed allreduce).
template <Element T>
Tensor<T> pack(const std::vector<Tensor<T>*>& parts, Device device) {
  std::int64_t total = 0;
  PackParts<T> pack;
  for (const Tensor<T>* p : parts) {
    total += p->size();
    pack.parts.push_back(as_expr(*p));
  }
  return record_new<T>("allreduce pack", Shape{total}, device, std::move(pack), [](KernelTask& t) {
    for (const auto& p : t.kernel<PackParts<T>>().parts) t.add_input(p.buffer);
  });
}

/// Writes each part's slice of `packed` (pack's layout) into it, on its device.
template <Element T>
void unpack(const Tensor<T>& packed, const std::vector<Tensor<T>*>& parts) {
  std::int64_t at = 0;
  for (Tensor<T>* part : parts) {
    const std::vector<std::int64_t> dims(part->shape().begin(), part->shape().end());
    part->assign(packed.rows(at, at + part->size()).reshape(dims).to(part->device()));
    at += part->size();
  }
}

/// Walks items [0, n) in buckets from the last back (a backward writes the
/// last layers' gradients first): item i - 1 joins item i's bucket when
/// `joins(i - 1, i)` and the bucket stays within `bucket_bytes`; an item of
/// no bytes, or any when `bucket_bytes` is 0, goes alone. Calls
/// `bucket(begin, end)` for each, last bucket first.
template <class BytesOf, class Joins, class Bucket>
void for_each_bucket(std::size_t n, std::size_t bucket_bytes, BytesOf bytes_of, Joins joins, Bucket bucket) {
  for (std::size_t end = n; end > 0;) {
    std::size_t begin = end - 1, bytes = bytes_of(begin);
    while (bytes > 0 && begin > 0 && joins(begin - 1, begin) && bytes + bytes_of(begin - 1) <= bucket_bytes) {
      --begin;
      bytes += bytes_of(begin);
    }
    bucket(begin, end);
    end = begin;
  }
}

/// Sums tensors[begin, end) (parts on the same devices) as one bucket: a
/// packed tensor per device, one allreduce of those, and a copy of each
/// tensor's slice of the sum back into its parts.
template <Element T>
void allreduce_bucket(std::vector<std::vector<Tensor<T>>>& tensors, std::size_t begin, std::size_t end) {
  std::vector<Tensor<T>> packed;
  std::vector<std::vector<Tensor<T>*>> parts(tensors[begin].size());
  for (std::size_t d = 0; d < parts.size(); ++d) {
    for (std::size_t i = begin; i < end; ++i) parts[d].push_back(&tensors[i][d]);
    packed.push_back(pack(parts[d], tensors[begin][d].device()));
  }
  allreduce(packed);
  for (std::size_t d = 0; d < packed.size(); ++d) unpack(packed[d], parts[d]);
}

/// Whether tensors a and b have their parts on the same devices, in order.
template <Element T>
bool same_devices(const std::vector<Tensor<T>>& a, const std::vector<Tensor<T>>& b) {
  return std::ranges::equal(a, b, {}, &Tensor<T>::device, &Tensor<T>::device);
}

}  // namespace detail

/// allreduce of many tensors at once: tensors[i] holds the parts of tensor i,
/// one per device (each parameter's gradients, as Trainer::step passes
/// them). Consecutive tensors whose parts are on the same devices are packed
/// into buckets of at most `bucket_bytes`, from the last tensor back (a
/// backward writes the last layers' gradients first); each bucket is one sum
/// across the devices (one collective, or one round of copies) and one copy
/// of each tensor's share back into its parts. Each tensor gets the sum
/// allreduce(tensors[i]) gives it. A tensor larger than `bucket_bytes`, or
/// any with `bucket_bytes` = 0, is summed alone. Every tensor's parts are
/// checked before anything is recorded.
template <Element T>
void allreduce(std::vector<std::vector<Tensor<T>>>& tensors,
               std::size_t bucket_bytes = thresholds::allreduce_bucket_bytes) {
  for (std::size_t i = 0; i < tensors.size(); ++i)
    detail::check_parts(tensors[i], "allreduce: tensor " + std::to_string(i) + ": ");
  autograd::pause no_recording;
  // A tensor with one part has nothing to sum: it goes alone, as a bucket of no bytes.
  const auto bytes_of = [&](std::size_t i) {
    return tensors[i].size() < 2 ? 0 : std::size_t(tensors[i][0].size()) * sizeof(T);
  };
  const auto joins = [&](std::size_t a, std::size_t b) {
    return tensors[a].size() >= 2 && detail::same_devices(tensors[a], tensors[b]);
  };
  detail::for_each_bucket(tensors.size(), bucket_bytes, bytes_of, joins, [&](std::size_t begin, std::size_t end) {
    if (end - begin == 1) allreduce(tensors[begin]);
    else detail::allreduce_bucket(tensors, begin, end);
  });
}

namespace detail {
/// The caching pool buffers on `d` come from; null when that allocator caches nothing.
inline std::shared_ptr<engine::CachingHostAllocator> memory_pool_of(Device d, const char* op) {
  require_backend(d, op);
  return std::dynamic_pointer_cast<engine::CachingHostAllocator>(
      d.type == DeviceType::cpu ? engine::host_allocator() : backend_of(d).memory(d.index));
}
}  // namespace detail

namespace engine {

/// What the memory pool of device `d` did so far and holds free now (a GPU's
/// pool, or the host's installed allocator); all zero where that allocator
/// caches nothing. std::invalid_argument for a device this program has not.
inline CachingHostAllocator::Stats memory_pool_stats(Device d) {
  const auto pool = deft::detail::memory_pool_of(d, "memory_pool_stats");
  return pool ? pool->stats() : CachingHostAllocator::Stats{};
}

/// Frees the blocks the memory pool of device `d` keeps for reuse (PyTorch's
/// empty_cache), for other processes or libraries to use. Memory of live
/// tensors stays. On a GPU this is cudaFree, which waits for the device's
/// queued work; the next allocations of those sizes call cudaMalloc again.
inline void release_cached_memory(Device d) {
  if (const auto pool = deft::detail::memory_pool_of(d, "release_cached_memory")) pool->release();
}

}  // namespace engine

}  // namespace deft
