// Work over several devices (Gluon's split_and_load and the kvstore's
// allreduce): a batch split into one part per device, and a sum of
// per-device tensors written back to every device. Both are deferred: they
// record copies and sums, and return at once.
#pragma once
#include <cstdint>
#include <vector>

#include "../autograd/meta.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../expr/operators.hpp"
#include "../tensor.hpp"

namespace deft {

/// Splits `batch` along its first axis into one part per device, in order,
/// and copies each part to its device (a part already there is a view).
/// Parts differ by at most one row, the first ones being larger; with
/// `even_split` the rows must divide evenly. std::invalid_argument for no
/// devices, a scalar, fewer rows than devices, or an uneven even split.
template <Element T>
std::vector<Tensor<T>> split_and_load(const Tensor<T>& batch, const std::vector<Device>& devices,
                                      bool even_split = false) {
  if (devices.empty()) detail::raise("split_and_load: no devices given");
  if (batch.rank() == 0) detail::raise("split_and_load: a scalar tensor has no rows to split");
  const std::int64_t rows = batch.shape()[0], parts = std::int64_t(devices.size());
  if (rows < parts)
    detail::raise("split_and_load: ", rows, " rows (shape ", batch.shape().to_string(), ") cannot give each of ", parts,
                  " devices (", detail::device_list(devices), ") at least one");
  if (even_split && rows % parts != 0)
    detail::raise("split_and_load: ", rows, " rows do not split evenly over ", parts, " devices (",
                  detail::device_list(devices), "); pass even_split = false for parts that differ by one row");
  std::vector<Tensor<T>> out;
  out.reserve(devices.size());
  std::int64_t begin = 0;
  for (std::int64_t i = 0; i < parts; ++i) {
    const std::int64_t end = begin + rows / parts + (i < rows % parts ? 1 : 0);
    out.push_back(batch.rows(begin, end).to(devices[std::size_t(i)]));
    begin = end;
  }
  return out;
}

/// Sums tensors of one shape (a gradient on each of several devices) and
/// writes the sum into every one of them, in place. The sum is formed once,
/// on the first tensor's device, in the order given, and copied to the
/// others, so every device holds the same bits. Not differentiated.
template <Element T>
void allreduce(std::vector<Tensor<T>>& parts) {
  if (parts.empty()) return;
  for (std::size_t i = 1; i < parts.size(); ++i)
    if (!(parts[i].shape() == parts[0].shape()))
      detail::raise("allreduce: part ", i, " has shape ", parts[i].shape().to_string(), " but part 0 has shape ",
                    parts[0].shape().to_string());
  if (parts.size() == 1) return;
  autograd::pause no_recording;
  const Device home = parts[0].device();
  Tensor<T> total = parts[0] + parts[1].to(home);
  for (std::size_t i = 2; i < parts.size(); ++i) total = total + parts[i].to(home);
  for (auto& p : parts) p.assign(total.to(p.device()));
}

}  // namespace deft
