// A stand-in for the CUDA backend, for tests on machines without a GPU (CI):
// two "GPUs" whose memory is host memory from pools of their own and whose
// kernels run through Thrust's C++ backend, on the calling thread. Tensors on
// gpu(0) and gpu(1) then take every path a CUDA build takes: the engine,
// on_device's GPU executor, the device pools, copies through the backend,
// the lanes and their waits (checked by LaneClockChecker: kernels run at
// once here, so a missing wait would otherwise go unseen).
// Lives with the tests and is not installed: eval/gpu/executor.hpp includes
// it in test targets that define DEFT_GPU_EMULATION and
// THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP and put this folder on
// their include path.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <thrust/system/cpp/execution_policy.h>

#include <deft/core/config.hpp>
#include <deft/core/error.hpp>
#include <deft/device/allocator.hpp>
#include <deft/device/backend.hpp>
#include <deft/core/thresholds.hpp>
#include <deft/device/cuda/free_gate.hpp>
#include <deft/eval/gpu/elementwise.hpp>
#include <deft/eval/gpu/gemm.hpp>
#include <deft/device/cuda/lanes.hpp>
#include <deft/device/cuda/staging.hpp>

namespace deft::detail::gpu {

/// A device's lanes as a real GPU could run them, for checking the waits
/// LaneTracker makes: each lane keeps a vector clock of the work it is known
/// to run after (its own, what it waited for, what the host saw finish),
/// and each piece of work queued is checked against the earlier uses of its
/// blocks on other lanes. Work not ordered after one of them could run
/// before it on a GPU: a race, counted in `races` (the first described in
/// first_race()). LaneTracker's Queue through LaneClockChecker::Ref.
class LaneClockChecker {
 public:
  explicit LaneClockChecker(int lanes)
      : clocks_(std::size_t(lanes), std::vector<std::uint64_t>(std::size_t(lanes), 0)),
        host_(std::size_t(lanes), 0), marks_(std::size_t(lanes)) {}

  void add_block(const void* base, std::size_t bytes) {
    std::lock_guard lk(m_);
    record_.add_block(base, bytes);
  }
  void remove_block(const void* base, std::size_t bytes) {
    std::lock_guard lk(m_);
    record_.remove_block(base, bytes);
  }
  void reissue(const void* base, std::size_t bytes) {
    std::lock_guard lk(m_);
    record_.reissue(base, bytes);
  }
  /// Lane `to` waits for what lane `from` queued so far.
  void order(int from, int to) {
    std::lock_guard lk(m_);
    join(clocks_[std::size_t(to)], clocks_[std::size_t(from)]);
  }
  /// A mark on `lane` after its first `count` pieces of work: what a wait
  /// for it orders after is the lane's clock now.
  void marked(int lane, std::uint64_t count) {
    std::lock_guard lk(m_);
    auto& kept = marks_[std::size_t(lane)];
    if (kept.size() == kept_marks) kept.erase(kept.begin());
    kept.emplace_back(count, clocks_[std::size_t(lane)]);
  }
  /// The host saw the mark on `lane` after its first `count` pieces of work
  /// finish: work queued later, on any lane, runs after what it covers.
  void finished_at(int lane, std::uint64_t count) {
    std::lock_guard lk(m_);
    join_mark(host_, lane, count, "the host");
  }
  /// Lane `to` waits for the mark on lane `from` after its first `count`
  /// pieces of work.
  void order_at(int from, std::uint64_t count, int to) {
    std::lock_guard lk(m_);
    join_mark(clocks_[std::size_t(to)], from, count, "lane " + std::to_string(to));
  }
  /// The host saw what `lane` queued so far finish: work queued later, on
  /// any lane, runs after it.
  void host_waited(int lane) {
    std::lock_guard lk(m_);
    join(host_, clocks_[std::size_t(lane)]);
  }
  void queued(int lane, const MemoryUses& uses) {
    std::lock_guard lk(m_);
    auto& clock = clocks_[std::size_t(lane)];
    join(clock, host_);
    record_.for_each_conflict(uses, [&](const LaneUse& u) {
      if (u.lane < 0 || u.lane == lane || clock[std::size_t(u.lane)] >= u.count) return;
      race("work on lane " + std::to_string(lane) + " is not ordered after work " + std::to_string(u.count) +
           " on lane " + std::to_string(u.lane) + " that used the same block");
    });
    record_.record({lane, ++clock[std::size_t(lane)]}, uses);
  }
  /// Work reading (or writing) `p` while the uses in `declared` are
  /// declared: a race unless one of them names p's block (a read may be
  /// declared as a write). An undeclared use would go unordered on a GPU,
  /// and unseen here, where the kernels run in order.
  void check_declared(const void* p, bool write, const std::vector<const MemoryUses*>& declared, const char* what) {
    std::lock_guard lk(m_);
    const void* block = record_.block_start(p);
    if (!block) return;  // not device memory the pools handed out (an empty operand)
    auto names_block = [&](const std::vector<const void*>& ptrs) {
      return std::ranges::any_of(ptrs, [&](const void* q) { return record_.block_start(q) == block; });
    };
    for (const MemoryUses* u : declared)
      if (names_block(u->writes) || (!write && names_block(u->reads))) return;
    race(std::string(what) + (write ? " writes" : " reads") + " a block that no use declared by its work names");
  }
  std::string first_race() {
    std::lock_guard lk(m_);
    return first_race_;
  }
  std::atomic<long> races{0};

  /// LaneTracker's Queue: forwards to a checker.
  struct Ref {
    LaneClockChecker* checker;
    void order(int from, int to) const { checker->order(from, to); }
    void order_at(int from, std::uint64_t count, const std::shared_ptr<void>&, int to) const {
      checker->order_at(from, count, to);
    }
    void marked(int lane, std::uint64_t count) const { checker->marked(lane, count); }
    void finished_at(int lane, std::uint64_t count) const { checker->finished_at(lane, count); }
    void queued(int lane, const MemoryUses& uses) const { checker->queued(lane, uses); }
  };

 private:
  static void join(std::vector<std::uint64_t>& into, const std::vector<std::uint64_t>& from) {
    for (std::size_t i = 0; i < into.size(); ++i) into[i] = std::max(into[i], from[i]);
  }
  // Joins the clock `lane` had at its mark after `count` pieces into `into`;
  // waiting (`who`) for a mark the checker was not told of is a race.
  void join_mark(std::vector<std::uint64_t>& into, int lane, std::uint64_t count, const std::string& who) {
    for (const auto& [c, clock] : marks_[std::size_t(lane)])
      if (c == count) return join(into, clock);
    race(who + " waits for an unknown mark " + std::to_string(count) + " on lane " + std::to_string(lane));
  }
  // Counts a race; the first one's description is kept.
  void race(std::string what) {
    if (races.fetch_add(1) == 0) first_race_ = std::move(what);
  }
  // At least as many marks per lane as a tracker keeps.
  static constexpr std::size_t kept_marks = 2 * lane_marks_kept;
  std::mutex m_;
  UseRecord record_;
  std::vector<std::vector<std::uint64_t>> clocks_;
  std::vector<std::uint64_t> host_;
  std::vector<std::vector<std::pair<std::uint64_t, std::vector<std::uint64_t>>>> marks_;  // per lane: (count, clock)
  std::string first_race_;
};

/// The emulated devices' side of a staged copy: the "DMA" is a memcpy, done
/// at once. (tests/gpu checks StagingArea with DMAs that finish later.)
struct EmulatedUploadQueue {
  using Mark = int;
  void copy(void* to, const void* staged, std::size_t n) { std::memcpy(to, staged, n); }
  static Mark mark() { return 0; }
  static bool finished(Mark) { return true; }
  static void wait(Mark) {}
};

/// The emulated devices' side of a staged copy into pageable host memory.
struct EmulatedDownloadQueue {
  using Mark = int;
  void fetch(void* staged, const void* from, std::size_t n) { std::memcpy(staged, from, n); }
  static Mark mark() { return 0; }
  static void wait(Mark) {}
  void copy_unstaged(void* to, const void* from, std::size_t n) { std::memcpy(to, from, n); }
};

class EmulatedBackend final : public DeviceBackend {
 public:
  static constexpr int devices = 2;
  // Lanes per device, numbered as CUDA's streams are (LaneLayout).
  static constexpr LaneLayout layout{3};
  static constexpr int compute_lanes = layout.compute, collective_lane = layout.collective(),
                       lanes_per_device = layout.tracked();
  // Small chunks, so that the tests' tensors take several (CUDA's are 4 MiB).
  static constexpr std::size_t staging_chunk_bytes = std::size_t(16) << 10;

  const char* name() const override { return "emulated"; }
  int device_count() override { return devices; }
  std::shared_ptr<engine::HostAllocator> memory(int index) override {
    if (exact_memory) return blocks_.at(std::size_t(index));
    return pools_.at(std::size_t(index));
  }
  /// Whether new device buffers and scratch are exact host allocations
  /// (each block its own, so AddressSanitizer reports a kernel that writes
  /// past its block, as it would not inside a pool's segment) rather than
  /// the caching pools'. The default in ASan builds (DEFT_ASAN).
  std::atomic<bool> exact_memory{DEFT_ASAN != 0};
  /// A mark that names its device, so a copy or wait ordered after another
  /// device's mark (a wrong buffer's) is caught.
  std::shared_ptr<void> mark(int index) override {
    return tracker_.mark(global_lane(index, current_lane(index)), [index] { return std::make_shared<int>(index); });
  }
  std::shared_ptr<engine::HostAllocator> pinned_memory() override { return pinned_; }
  void copy(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes) override {
    const bool from_host = from_device.type == DeviceType::cpu, to_host = to_device.type == DeviceType::cpu;
    if (from_host) {  // on the calling thread's lane of the destination
      LaneAccess access(*this, to_device.index, {{}, {to}});
      EmulatedUploadQueue queue;
      staging_.upload(to, from, bytes, queue);
      ++staged_uploads;
    } else if (to_host) {  // on the copy lane of the source's writer, waited for
      const int k = layout.copy_after(tracker_.writer_lane(from));
      {
        LaneScope on_copy(from_device.index, k);
        LaneAccess access(*this, from_device.index, {{from}, {}});
        if (pinned_blocks_->holds(to)) {
          if (bytes) std::memcpy(to, from, bytes);
        } else {  // staged, as CUDA's copies into pageable memory are
          EmulatedDownloadQueue queue;
          staging_.download(to, from, bytes, queue);
          ++staged_downloads;
        }
        ++copies_to_host[std::size_t(from_device.index * compute_lanes + k - compute_lanes)];
      }
      host_waits_for(global_lane(from_device.index, k));
    } else {  // on the calling thread's lane of the destination
      LaneAccess access(*this, to_device.index, {{from}, {to}});
      if (bytes) std::memcpy(to, from, bytes);
    }
  }
  void synchronize(int index) override {
    for (int k = 0; k < lanes_per_device; ++k) host_waits_for(global_lane(index, k));
  }
  void wait_for(int index, const void* mark) override {
    if (!mark) return synchronize(index);
    check_mark(index, mark);
    ++marked_waits;
    tracker_.finished_mark(mark, global_lane(index, 0), lanes_per_device);
  }
  void synchronize_all() override {
    for (int i = 0; i < devices; ++i) synchronize(i);
  }
  int lanes() override { return compute_lanes; }
  void before_work(int index, int lane, const MemoryUses& uses) override {
    tracker_.before(global_lane(index, lane), uses);
    declared_here().push_back({index, &uses});
  }
  void after_work(int index, int lane, const MemoryUses& uses) override {
    tracker_.after(global_lane(index, lane), uses);
    auto& here = declared_here();
    if (auto it = std::ranges::find(here, std::pair{index, &uses}); it != here.end()) here.erase(it);
    if (lane < compute_lanes) ++lane_work[std::size_t(index * compute_lanes + lane)];
  }
  /// Checks that the work in progress on this thread declared the device
  /// memory a kernel is handed (`what`: the kernel): each pointer lies in a
  /// block one of its live LaneAccess objects names. Work recorded into a
  /// program is checked by its launches instead (ProgramCapture).
  void check_declared(int index, const char* what, std::initializer_list<const void*> reads,
                      std::initializer_list<const void*> writes) {
    if (ProgramCapture::active()) return;
    std::vector<const MemoryUses*> declared;
    for (const auto& [device, uses] : declared_here())
      if (device == index) declared.push_back(uses);
    for (const void* p : reads) checker_.check_declared(p, false, declared, what);
    for (const void* p : writes) checker_.check_declared(p, true, declared, what);
  }

  /// Emulated collectives (NCCL's allreduce): every device here is host
  /// memory, so the sum is one loop, in the parts' order, on the devices'
  /// collective lanes. `collectives` off makes allreduce sum through copies.
  bool sums_across(const std::vector<int>& devices) override { return collectives.load() && devices.size() >= 2; }
  void sum_across(const std::vector<SumPart>& parts, std::size_t count, DType dtype) override {
    const auto uses = declare_sum(*this, parts, collective_lane);
    switch (dtype) {
      case DType::float32: return sum_parts<float>(parts, count);
      case DType::float64: return sum_parts<double>(parts, count);
      case DType::int32: return sum_parts<std::int32_t>(parts, count);
      case DType::int64: return sum_parts<std::int64_t>(parts, count);
    }
  }
  std::atomic<bool> collectives{true};
  /// Sums across devices queued (sum_across calls).
  std::atomic<long> collective_sums{0};

  /// Emulated programs: `work` runs now, its uses collected, and each launch
  /// runs it again, checked to use the memory it was recorded with (a CUDA
  /// graph's kernels keep their addresses). On the lanes, the recording and
  /// each launch are one piece of work, as a graph launch is.
  std::unique_ptr<DeviceProgram> record(int index, const std::function<void()>& work) override {
    auto program = std::make_unique<Program>(*this, index, work);
    {
      FreeGate::Capturing device_frees_wait(upstream(index)), pinned_frees_wait(*pinned_blocks_);
      ProgramCapture capture(index, program->memory, ProgramCapture::Mode::record);
      work();  // kernels run at once here: a failure leaves some done (record's contract allows it)
    }
    LaneAccess launched(*this, index, program->memory.uses);
    ++programs_recorded;
    return program;
  }

  /// Programs recorded and launched since (not counting the recording's run).
  std::atomic<long> programs_recorded{0}, program_launches{0};
  /// Host waits for a buffer's mark (wait_to_read); copies to a device
  /// (each staged through pinned blocks); copies to the host staged so
  /// (those into memory that is not the stand-in for page-locked memory).
  std::atomic<long> marked_waits{0}, staged_uploads{0}, staged_downloads{0};
  /// Kernels and copies queued on each compute lane (device * compute_lanes + lane).
  std::array<std::atomic<long>, devices * compute_lanes> lane_work{};
  /// Copies to the host on each copy lane (device * compute_lanes + the
  /// compute lane it pairs with).
  std::array<std::atomic<long>, devices * compute_lanes> copies_to_host{};

  static void check_mark(int device, const void* mark) {
    if (*static_cast<const int*>(mark) != device)
      raise<std::logic_error>("emulated gpu(", device, "): ordered after a mark of gpu(", *static_cast<const int*>(mark),
                              ")");
  }

  /// The pool of emulated device `index`, for tests of its caching.
  engine::CachingHostAllocator& pool(int index) { return *pools_.at(std::size_t(index)); }
  /// The memory under that pool: its frees wait for recordings.
  FreeGate& upstream(int index) { return *blocks_.at(std::size_t(index)); }
  /// The stand-in for page-locked memory (a pool of its own), and the
  /// memory under it (its frees wait for a recording on any device).
  engine::CachingHostAllocator& pinned_pool() { return *pinned_; }
  FreeGate& pinned_upstream() { return *pinned_blocks_; }
  /// The lanes' record and waits, and the checker of those waits.
  LaneTracker<LaneClockChecker::Ref>& tracker() { return tracker_; }
  LaneClockChecker& checker() { return checker_; }
  static int global_lane(int device, int k) { return device * lanes_per_device + k; }

 private:
  // Host blocks standing in for a device's memory, known to the lanes'
  // record and its checker, or (no backend) for page-locked memory. Their
  // frees wait for recordings, as cudaFree's and cudaFreeHost's do (FreeGate).
  class HostBlocks final : public engine::HostAllocator, public FreeGate {
   public:
    explicit HostBlocks(EmulatedBackend* b) : b_(b) {}
    void* allocate(std::size_t bytes, std::size_t align) override {
      void* p = heap_.allocate(bytes, align);
      if (!p) return p;
      try {
        std::lock_guard lk(m_);
        live_.emplace(static_cast<const std::byte*>(p), bytes);
      } catch (...) {
        heap_.deallocate(p, bytes, align);
        throw;
      }
      if (b_) b_->tracker_.add_block(p, bytes), b_->checker_.add_block(p, bytes);
      return p;
    }
    /// Whether p lies in a block allocated here and not yet released.
    bool holds(const void* p) const {
      const auto* at = static_cast<const std::byte*>(p);
      std::lock_guard lk(m_);
      const auto next = live_.upper_bound(at);
      return next != live_.begin() && at < std::prev(next)->first + std::prev(next)->second;
    }
    void deallocate(void* p, std::size_t bytes, std::size_t align) noexcept override {
      free_or_park(p, bytes, align);
    }
    void reissue(void* p, std::size_t bytes) override {
      if (b_) b_->tracker_.reissue(p, bytes), b_->checker_.reissue(p, bytes);
    }

   private:
    void release(void* p, std::size_t bytes, std::size_t align) noexcept override {
      if (b_) b_->tracker_.remove_block(p, bytes), b_->checker_.remove_block(p, bytes);
      {
        std::lock_guard lk(m_);
        live_.erase(static_cast<const std::byte*>(p));
      }
      heap_.deallocate(p, bytes, align);
    }
    EmulatedBackend* b_;
    engine::DefaultHostAllocator heap_;
    mutable std::mutex m_;
    std::map<const std::byte*, std::size_t> live_;  // start, bytes
  };
  struct Program final : DeviceProgram {
    Program(EmulatedBackend& b, int d, std::function<void()> w) : backend(b), device(d), work(std::move(w)) {}
    void launch() override {
      LaneAccess access(backend, device, memory.uses);
      ProgramCapture repeat(device, memory, ProgramCapture::Mode::repeat);
      work();
      ++backend.program_launches;
    }
    EmulatedBackend& backend;
    int device;
    std::function<void()> work;
    ProgramMemory memory;
  };
  template <class T>
  void sum_parts(const std::vector<SumPart>& parts, std::size_t count) {
    std::vector<T> total(count, T(0));  // every `from` is read before any `to` is written
    for (const SumPart& p : parts)
      for (std::size_t i = 0; i < count; ++i) total[i] += static_cast<const T*>(p.from)[i];
    for (const SumPart& p : parts) std::copy(total.begin(), total.end(), static_cast<T*>(p.to));
    ++collective_sums;
  }
  // The uses declared by the LaneAccess objects alive on this thread, with
  // their devices (before_work to after_work), for check_declared.
  static std::vector<std::pair<int, const MemoryUses*>>& declared_here() {
    thread_local std::vector<std::pair<int, const MemoryUses*>> live;
    return live;
  }
  void host_waits_for(int lane) {
    tracker_.host_waits(lane, [&] { checker_.host_waited(lane); });
  }

  LaneClockChecker checker_{devices * lanes_per_device};
  LaneTracker<LaneClockChecker::Ref> tracker_{devices * lanes_per_device, LaneClockChecker::Ref{&checker_}};
  std::shared_ptr<HostBlocks> pinned_blocks_ = std::make_shared<HostBlocks>(nullptr);
  std::shared_ptr<engine::CachingHostAllocator> pinned_ =
      std::make_shared<engine::CachingHostAllocator>(pinned_blocks_, std::size_t(64) << 20, 0);
  StagingArea<EmulatedUploadQueue> staging_{pinned_, staging_chunk_bytes};
  // Cached as CUDA's pools are, so that blocks change lanes as they do there.
  std::array<std::shared_ptr<HostBlocks>, devices> blocks_{std::make_shared<HostBlocks>(this),
                                                           std::make_shared<HostBlocks>(this)};
  std::array<std::shared_ptr<engine::CachingHostAllocator>, devices> pools_{make_pool(0), make_pool(1)};
  std::shared_ptr<engine::CachingHostAllocator> make_pool(int index) {
    return std::make_shared<engine::CachingHostAllocator>(blocks_[std::size_t(index)], thresholds::gpu_cache_max_bytes,
                                                          thresholds::gpu_cache_min_bytes, engine::BlockReuse::split);
  }
};

inline EmulatedBackend& emulated_backend() {
  static auto* backend = new EmulatedBackend();  // leaked: buffers may be freed during static destruction
  return *backend;
}

inline const bool emulated_backend_registered = register_gpu_backend(&emulated_backend());

/// Executor<gpu>'s launch context: Thrust's sequential host policy, the
/// work's uses declared on the calling thread's lane. A product's operands
/// are checked against the declared uses (the Thrust kernels' pointers are
/// inside their functors, out of reach).
class Launch {
 public:
  Launch(int device, MemoryUses uses) : access_(backend_for(device), device, std::move(uses)), device_(device) {}
  static auto policy() { return thrust::cpp::par; }
  template <class T>
  void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const T* b, T* c, bool trans_a,
            bool trans_b) const {
    emulated_backend().check_declared(device_, "a matrix product", {a, b}, {c});
    naive_gemm(policy(), m, n, k, a, b, c, trans_a, trans_b);
  }

 private:
  static EmulatedBackend& backend_for(int device) {
    if (device < 0 || device >= EmulatedBackend::devices) raise("no device ", deft::gpu(device), " in the emulation");
    return emulated_backend();
  }
  LaneAccess access_;
  int device_;
};

}  // namespace deft::detail::gpu
