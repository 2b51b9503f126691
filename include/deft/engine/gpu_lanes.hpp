// The engine's lane policy: which stream ("lane") of its GPU a task runs on.
// Lanes only spread independent work; the order between tasks comes from
// the lanes' record of what each buffer waits for (device/cuda/lanes.hpp).
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>

#include "buffer.hpp"
#include "../device/backend.hpp"
#include "task.hpp"
#include "../core/thresholds.hpp"

namespace deft::detail {

class GpuLanes {
 public:
  /// Independent work spreads over at most n streams of each GPU.
  void set_count(int n) { count_.store(n, std::memory_order_relaxed); }

  /// Runs GPU task t on a lane of its device (pick), its output marked there.
  void run(Task& t, Buffer& out) {
    DeviceBackend& b = backend_of(out.device);
    const int lane = pick(t, out, std::min(b.lanes(), count_.load(std::memory_order_relaxed)));
    LaneScope on(out.device.index, lane);
    out.allocate();
    t.execute(out);
    out.ready_mark = b.mark(out.device.index);
    out.lane = lane;
    out.lane_taken.store(false, std::memory_order_relaxed);
    t.for_each_other_output([&](Buffer& other) {
      if (other.device != out.device) return;  // (a mark is one device's)
      other.ready_mark = out.ready_mark;
      other.lane = lane;
      other.lane_taken.store(false, std::memory_order_relaxed);
    });
  }

 private:
  // Where a GPU task runs, for speed only (the lanes' record orders the
  // work, device/cuda/lanes.hpp): a write in place stays on its buffer's lane;
  // a reader goes on on the lane its input was written on, unless another
  // reader went on there already; that fork, and work reading no GPU
  // buffer, takes the next lane in turn. Chains thus stay on one lane and
  // independent subtrees spread over them.
  int pick(const Task& t, Buffer& out, int lanes) {
    if (lanes <= 1) return 0;
    if (out.data && out.lane >= 0 && out.lane < lanes) return out.lane;
    int forked_from = -1;
    for (Buffer* in : t.gpu_inputs)
      if (in && in->device == out.device && in->lane >= 0 && in->lane < lanes) {
        if (!in->lane_taken.exchange(true, std::memory_order_relaxed)) return in->lane;
        if (forked_from < 0) forked_from = in->lane;
      }
    auto& turn = next_[std::size_t(out.device.index) % next_.size()];
    const int next = int(turn.fetch_add(1, std::memory_order_relaxed) % unsigned(lanes));
    return next == forked_from ? (next + 1) % lanes : next;
  }

  std::atomic<int> count_{thresholds::gpu_lanes};  // read without the engine's lock
  // Each GPU's turn of lanes (devices past the 16th share): one shared turn
  // would leave lanes idle on a device whose tasks alternate with another's.
  std::array<std::atomic<unsigned>, 16> next_{};
};

}  // namespace deft::detail
