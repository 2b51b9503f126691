// deft_bench_gpu: deft on one CUDA GPU against what the same GPU does with no
// library in between, in one process on the same data.
//   - bandwidth: a device-to-device copy (the ceiling), a hand-written fused
//     kernel, deft's fused tree and the same tree as single-op passes, at
//     2^26 floats: GB/s counting bytes read and written;
//   - products: deft's matmul against cublasSgemm called directly;
//   - column sums (sum along axis 0, as a bias gradient): deft against
//     cublasSgemv with a vector of ones, GB/s of the matrix read;
//   - copies: the host to the GPU and back, deft's to() against cudaMemcpy
//     from pageable and from pinned memory (GB/s), and how long a copy to a
//     busy GPU holds its caller (raw pageable) or deft's worker (staged);
//   - launch cost per deferred op: a chain of `y += 1` on a small tensor,
//     against the same number of bare Thrust launches;
//   - lanes: four independent chains of small kernels on 1 and 4 streams,
//     bare Thrust and deft (engine::Limits::gpu_lanes);
//   - the seeds' MLP step and the batch-1 forward (imperative; hybridized
//     kernel by kernel and as one CUDA graph) on gpu(0), with PyTorch's step on the same GPU when `python3 -c "import
//     torch"` works (bench/gpu_torch_step.py, a child process);
//   - the data-parallel step on the host and gpu(0) (and on two GPUs where
//     there are two), gradients summed in buckets and one per parameter.
// Each row is the median of repeats; every timed call ends with the device
// idle (a sync point), so host clocks measure device work. Ratios are
// printed last.
#include <deft/deft.hpp>
#include <deft/nn.hpp>

#include <cub/device/device_reduce.cuh>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data_parallel.hpp"
#include "dense_net.hpp"
#include "harness.hpp"

namespace {

using namespace deft;
using bench::add;
using bench::add_time;
using bench::measure;
using bench::Summary;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// A raw device array of floats (the hand-written rows' operands).
struct DeviceFloats {
  float* p = nullptr;
  std::size_t n = 0;
  explicit DeviceFloats(std::size_t count) : n(count) { cuda_check(cudaMalloc(&p, n * sizeof(float)), "cudaMalloc"); }
  ~DeviceFloats() { cudaFree(p); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void upload(const std::vector<float>& v) {
    cuda_check(cudaMemcpy(p, v.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  std::vector<float> download() const {
    std::vector<float> v(n);
    cuda_check(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }
};

// z = a * b + c * 2 - a: three reads and one write per element.
__global__ void fused_kernel(const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                             float* __restrict__ z, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    z[i] = a[i] * b[i] + c[i] * 2.0f - a[i];
}

struct AddOne {
  __host__ __device__ float operator()(float x) const { return x + 1.0f; }
};

double worst_rel(const std::vector<float>& x, const std::vector<float>& y) {
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(double(x[i]) - y[i]) / std::max(1.0, std::abs(double(y[i]))));
  return worst;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  random::seed(seed);
  return random::uniform<float>(-1, 1, {std::int64_t(n)}).to_vector();
}

// --- bandwidth -------------------------------------------------------------------

void bandwidth_rows() {
  const char* g = "gpu_fused";
  constexpr std::int64_t n = std::int64_t(1) << 26;
  constexpr int calls = 10;  // per timed repeat, one sync at the end
  const std::string size = "2^26";
  const double fused_bytes = 16.0 * n, copy_bytes = 8.0 * n;

  const auto va = random_floats(n, 1), vb = random_floats(n, 2), vc = random_floats(n, 3);
  DeviceFloats a(n), b(n), c(n), z(n);
  a.upload(va), b.upload(vb), c.upload(vc);
  cudaStream_t s;
  cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");

  const Summary copy = measure([&] {
    for (int i = 0; i < calls; ++i) cudaMemcpyAsync(z.p, a.p, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    cuda_check(cudaStreamSynchronize(s), "copy");
  });
  const Summary hand = measure([&] {
    for (int i = 0; i < calls; ++i) fused_kernel<<<132 * 16, 256, 0, s>>>(a.p, b.p, c.p, z.p, n);
    cuda_check(cudaStreamSynchronize(s), "fused_kernel");
  });
  const auto hand_out = z.download();

  const Device dev = gpu(0);
  const Tensor<float> ta = Tensor<float>(va, {n}, dev), tb = Tensor<float>(vb, {n}, dev), tc = Tensor<float>(vc, {n}, dev);
  std::vector<Tensor<float>> outs(calls);  // all kept: none of the work is dead
  const Summary fused = measure([&] {
    for (auto& o : outs) o = ta * tb + tc * 2.0f - ta;
    wait_all();
  });
  std::printf("%-12s deft fused vs hand-written kernel: max rel diff %.2e\n", g,
              worst_rel(outs.back().to_vector(), hand_out));
  const Summary unfused = measure([&] {
    for (auto& o : outs) {
      Tensor<float> ab = ta * tb;
      Tensor<float> c2 = tc * 2.0f;
      Tensor<float> sum = ab + c2;
      o = sum - ta;
    }
    wait_all();
  });

  auto gbs = [&](const Summary& t, double bytes) { return bytes * calls / t.median / 1e9; };
  auto gbs_best = [&](const Summary& t, double bytes) { return bytes * calls / t.min / 1e9; };
  add(g, "device-to-device copy", "cuda", 1, size, "GB/s", gbs(copy, copy_bytes), gbs_best(copy, copy_bytes));
  add(g, "a*b + c*2 - a", "hand kernel", 1, size, "GB/s", gbs(hand, fused_bytes), gbs_best(hand, fused_bytes));
  add(g, "a*b + c*2 - a", "deft", 1, size, "GB/s", gbs(fused, fused_bytes), gbs_best(fused, fused_bytes));
  // Unfused: 4 passes moving 12 + 8 + 12 + 12 bytes per element.
  add(g, "a*b + c*2 - a, one pass per op", "deft", 1, size, "GB/s", gbs(unfused, 44.0 * n),
      gbs_best(unfused, 44.0 * n));
  std::printf("%-12s deft fused: %.0f%% of the copy's bandwidth, %.0f%% of the hand kernel's; "
              "%.2fx faster than one pass per op\n",
              g, 100 * gbs(fused, fused_bytes) / gbs(copy, copy_bytes),
              100 * gbs(fused, fused_bytes) / gbs(hand, fused_bytes), unfused.median / fused.median);
  cudaStreamDestroy(s);
}

// --- matrix products -------------------------------------------------------------

/// A cuBLAS handle bound to a stream of its own (the rows that call cuBLAS directly).
struct CublasOnStream {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  CublasOnStream() {
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    if (cudaStreamCreate(&stream) != cudaSuccess) {
      cublasDestroy(handle);
      throw std::runtime_error("cudaStreamCreate failed");
    }
    cublasSetStream(handle, stream);
  }
  ~CublasOnStream() {
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
  }
  CublasOnStream(const CublasOnStream&) = delete;
  CublasOnStream& operator=(const CublasOnStream&) = delete;
};

void gemm_rows() {
  const char* g = "gpu_gemm";
  const CublasOnStream blas;
  const cublasHandle_t h = blas.handle;
  const cudaStream_t s = blas.stream;
  for (const std::int64_t m : {256, 1024, 4096}) {
    const int calls = m >= 4096 ? 10 : 50;
    const std::string size = std::to_string(m) + "^3";
    const auto va = random_floats(m * m, 4), vb = random_floats(m * m, 5);
    DeviceFloats a(m * m), b(m * m), c(m * m);
    a.upload(va), b.upload(vb);
    const float one = 1, zero = 0;
    // Row-major C = A B is column-major C^T = B^T A^T.
    const Summary direct = measure([&] {
      for (int i = 0; i < calls; ++i)
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, int(m), int(m), int(m), &one, b.p, int(m), a.p, int(m), &zero, c.p,
                    int(m));
      cuda_check(cudaStreamSynchronize(s), "cublasSgemm");
    });
    const Tensor<float> ta = Tensor<float>(va, {m, m}, gpu(0)), tb = Tensor<float>(vb, {m, m}, gpu(0));
    std::vector<Tensor<float>> outs(static_cast<std::size_t>(calls));
    const Summary d = measure([&] {
      for (auto& o : outs) o = matmul(ta, tb);
      wait_all();
    });
    // The host's share: recording and queueing the products, the device's
    // wait left out (when this is near the row above, the host is the limit).
    const Summary host = bench::measure_split(
        [&] {
          for (auto& o : outs) o = matmul(ta, tb);
          detail::Engine::get().wait_all();  // every task queued, the device not waited for
        },
        [] { wait_all(); });
    add_time(g, "sgemm, queueing only", "deft", 1, size, "us", host, calls);
    std::printf("%-12s %s: deft vs cublasSgemm max rel diff %.2e\n", g, size.c_str(),
                worst_rel(outs.back().to_vector(), c.download()));
    const double flops = 2.0 * double(m) * m * m;
    add_time(g, "sgemm", "cublas", 1, size, "us", direct, calls);
    add_time(g, "sgemm", "deft", 1, size, "us", d, calls);
    std::printf("%-12s %s: cublas %.1f TFLOP/s, deft %.1f TFLOP/s, deft/cublas time %.3f\n", g, size.c_str(),
                flops * calls / direct.median / 1e12, flops * calls / d.median / 1e12, d.median / direct.median);
  }
}

// --- reductions along an axis -----------------------------------------------------

/// Column sums of a row-major matrix (a bias gradient: a sum over the
/// batch): deft's sum(x, 0) against cuBLAS's gemv with a vector of ones, in
/// GB/s of the matrix read. Tall shapes are what AxisPlan cuts into parts.
void reduce_rows() {
  const char* g = "gpu_reduce";
  const CublasOnStream blas;
  const cublasHandle_t h = blas.handle;
  const cudaStream_t s = blas.stream;
  constexpr int calls = 20;
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{256, 256}, {1 << 16, 10}, {1 << 20, 16}, {1 << 14, 1024}}) {
    const std::string size = std::to_string(rows) + "x" + std::to_string(cols);
    const auto n = static_cast<std::size_t>(rows * cols), r = static_cast<std::size_t>(rows);
    const auto vx = random_floats(n, 6);
    DeviceFloats x(n), ones(r), y(static_cast<std::size_t>(cols));
    x.upload(vx), ones.upload(std::vector<float>(r, 1.0f));
    const float one = 1, zero = 0;
    // Row-major rows x cols is column-major cols x rows: the sums are M * ones.
    const Summary direct = measure([&] {
      for (int i = 0; i < calls; ++i)
        cublasSgemv(h, CUBLAS_OP_N, int(cols), int(rows), &one, x.p, int(cols), ones.p, 1, &zero, y.p, 1);
      cuda_check(cudaStreamSynchronize(s), "cublasSgemv");
    });
    const Tensor<float> tx = Tensor<float>(vx, {rows, cols}, gpu(0));
    std::vector<Tensor<float>> outs(static_cast<std::size_t>(calls));
    const Summary d = measure([&] {
      for (auto& o : outs) o = sum(tx, 0);
      wait_all();
    });
    std::printf("%-12s %s: deft vs cublasSgemv max rel diff %.2e\n", g, size.c_str(),
                worst_rel(outs.back().to_vector(), y.download()));
    const double bytes = 4.0 * double(rows * cols) * calls;
    add(g, "sum along axis 0", "cublas gemv", 1, size, "GB/s", bytes / direct.median / 1e9, bytes / direct.min / 1e9);
    add(g, "sum along axis 0", "deft", 1, size, "GB/s", bytes / d.median / 1e9, bytes / d.min / 1e9);
    std::printf("%-12s %s: deft/cublas gemv time %.2f\n", g, size.c_str(), d.median / direct.median);
  }
  // argmax of all elements: cub::DeviceReduce::ArgMax (first largest, as deft; queued, no wait) is its peer.
  const std::int64_t n = std::int64_t(1) << 24;
  const auto vx = random_floats(std::size_t(n), 7);
  DeviceFloats x{std::size_t(n)}, best{1};
  x.upload(vx);
  std::int64_t* best_index = nullptr;
  cuda_check(cudaMalloc(&best_index, sizeof(std::int64_t)), "cudaMalloc");
  std::size_t temp_bytes = 0;
  cuda_check(cub::DeviceReduce::ArgMax(nullptr, temp_bytes, x.p, best.p, best_index, n, s), "cub ArgMax");
  void* temp = nullptr;
  cuda_check(cudaMalloc(&temp, temp_bytes), "cudaMalloc");
  const Summary direct = measure([&] {
    for (int i = 0; i < calls; ++i) cub::DeviceReduce::ArgMax(temp, temp_bytes, x.p, best.p, best_index, n, s);
    cuda_check(cudaStreamSynchronize(s), "cub ArgMax");
  });
  std::int64_t peer_index = -1;
  cuda_check(cudaMemcpy(&peer_index, best_index, sizeof peer_index, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(temp), cudaFree(best_index);
  const Tensor<float> tx = Tensor<float>(vx, {n}, gpu(0));
  std::vector<Tensor<std::int64_t>> outs(static_cast<std::size_t>(calls));
  const Summary d = measure([&] {
    for (auto& o : outs) o = argmax(tx);
    wait_all();
  });
  const std::int64_t index = outs.back().item();
  std::printf("%-12s argmax of 2^24: deft index %lld, cub ArgMax %lld%s\n", g, static_cast<long long>(index),
              static_cast<long long>(peer_index), index == peer_index ? "" : " (DIFFERENT)");
  const double bytes = 4.0 * double(n) * calls;
  add(g, "argmax of all", "cub", 1, "2^24", "GB/s", bytes / direct.median / 1e9, bytes / direct.min / 1e9);
  add(g, "argmax of all", "deft", 1, "2^24", "GB/s", bytes / d.median / 1e9, bytes / d.min / 1e9);
  std::printf("%-12s argmax of 2^24: deft/cub ArgMax time %.2f\n", g, d.median / direct.median);
}

// --- copies between the host and the GPU -----------------------------------------

/// Page-locked host floats (the hand-written rows' pinned buffers).
struct PinnedFloats {
  float* p = nullptr;
  explicit PinnedFloats(std::size_t n) { cuda_check(cudaHostAlloc(&p, n * sizeof(float), cudaHostAllocDefault), "cudaHostAlloc"); }
  ~PinnedFloats() { cudaFreeHost(p); }
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;
};

void copy_rows() {
  const char* g = "gpu_copy";
  constexpr std::int64_t n = std::int64_t(1) << 24;  // 64 MiB of float
  const std::string size = "2^24";
  const std::size_t bytes = std::size_t(n) * sizeof(float);
  std::vector<float> pageable = random_floats(n, 7);
  PinnedFloats pinned(n);
  std::memcpy(pinned.p, pageable.data(), bytes);
  DeviceFloats d(n);
  const Tensor<float> host(pageable, {n});
  Tensor<float> on_gpu = host.to(gpu(0));
  on_gpu.wait_to_read();

  // Bandwidth: the driver from pageable and from pinned memory, and deft's
  // to() (staged through pinned blocks up; a pinned tensor down), and
  // to_vector() (staged down into a new vector, its allocation included).
  const auto up = [&](const void* from) {
    cuda_check(cudaMemcpy(d.p, from, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  };
  const auto down = [&](void* to) { cuda_check(cudaMemcpy(to, d.p, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy"); };
  const std::vector<Summary> s = bench::measure_interleaved({
      [&] { up(pageable.data()); },
      [&] { up(pinned.p); },
      [&] { host.to(gpu(0)).wait_to_read(); },
      [&] { down(pageable.data()); },
      [&] { down(pinned.p); },
      [&] { on_gpu.to(cpu()).wait_to_read(); },
      [&] { (void)on_gpu.to_vector(); },
      [&] {  // to_vector's peer: the driver's copy into a vector made for it
        std::vector<float> fresh(static_cast<std::size_t>(n));
        down(fresh.data());
      },
  });
  const char* libs[] = {"cuda pageable", "cuda pinned",    "deft", "cuda pageable", "cuda pinned", "deft",
                        "deft to_vector", "cuda new vector"};
  for (int i = 0; i < 8; ++i)
    add(g, i < 3 ? "host to device" : "device to host", libs[i], 1, size, "GB/s", double(bytes) / s[i].median / 1e9,
        double(bytes) / s[i].min / 1e9);
  std::printf("%-12s host to device GB/s: pageable %.1f, pinned %.1f, deft to() %.1f; device to host: %.1f, %.1f, %.1f, "
              "to_vector %.1f (cudaMemcpy into a new vector %.1f)\n",
              g, bytes / s[0].median / 1e9, bytes / s[1].median / 1e9, bytes / s[2].median / 1e9,
              bytes / s[3].median / 1e9, bytes / s[4].median / 1e9, bytes / s[5].median / 1e9, bytes / s[6].median / 1e9,
              bytes / s[7].median / 1e9);

  // Behind busy work: 4 MiB sent to a stream that still has ~20 ms of
  // kernels queued. From pageable memory cudaMemcpyAsync returns only once
  // the stream drained; staged, deft's copy task is done (its worker free)
  // long before.
  constexpr std::int64_t small = std::int64_t(1) << 20;
  const Tensor<float> a = random::uniform<float>(0, 1, {4096, 4096}, gpu(0)), h_small(random_floats(small, 8), {small});
  cudaStream_t st;
  cuda_check(cudaStreamCreate(&st), "cudaStreamCreate");
  // Every task goes to the workers as soon as the next one is recorded (a
  // recorded task otherwise waits for a sync point or a bound), so polling
  // is_ready() sees when the copy task was done.
  const engine::Limits saved = engine::limits();
  engine::Limits eager = saved;
  eager.max_recorded_tasks = 1;
  engine::set_limits(eager);
  const Tensor<float> one({1.0f}, {1});
  std::vector<double> raw, staged;
  for (int r = 0; r < bench::opts.repeats; ++r) {
    for (int i = 0; i < 100; ++i) thrust::transform(thrust::cuda::par_nosync.on(st), d.p, d.p + n, d.p, AddOne{});
    auto t0 = std::chrono::steady_clock::now();
    cuda_check(cudaMemcpyAsync(d.p, pageable.data(), small * sizeof(float), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
    raw.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cuda_check(cudaStreamSynchronize(st), "busy stream");

    std::vector<Tensor<float>> busy;
    for (int i = 0; i < 8; ++i) busy.push_back(dot(a, a));
    const Tensor<float> flush_busy = one + 1.0f;
    while (!busy.back().is_ready()) std::this_thread::yield();  // all queued on the device
    t0 = std::chrono::steady_clock::now();
    const Tensor<float> sent = h_small.to(gpu(0));
    const Tensor<float> flush = one + 1.0f;  // submits the copy
    while (!sent.is_ready()) std::this_thread::yield();  // the copy task is done: the DMA is queued
    staged.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    wait_all();
  }
  engine::set_limits(saved);
  cudaStreamDestroy(st);
  std::sort(raw.begin(), raw.end());
  std::sort(staged.begin(), staged.end());
  add(g, "4 MiB up behind busy stream", "cuda pageable", 1, "2^20", "us", raw[raw.size() / 2] * 1e6, raw[0] * 1e6);
  add(g, "4 MiB up behind busy stream", "deft", 1, "2^20", "us", staged[staged.size() / 2] * 1e6, staged[0] * 1e6);
}

// --- launch cost ---------------------------------------------------------------------

void launch_rows() {
  const char* g = "gpu_launch";
  constexpr int ops = 2000;
  const std::int64_t n = 1024;
  const std::string size = "1024, " + std::to_string(ops) + " ops";
  DeviceFloats x(n);
  x.upload(random_floats(n, 6));
  cudaStream_t s;
  cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
  const Summary bare = measure([&] {
    for (int i = 0; i < ops; ++i) thrust::transform(thrust::cuda::par_nosync.on(s), x.p, x.p + n, x.p, AddOne{});
    cuda_check(cudaStreamSynchronize(s), "thrust");
  });
  Tensor<float> y = Tensor<float>(random_floats(n, 6), {n}, gpu(0));
  const Summary d = measure([&] {
    for (int i = 0; i < ops; ++i) y += 1.0f;
    y.wait_to_read();
  });
  add_time(g, "y += 1 chain", "thrust", 1, size, "ns/op", bare, ops);
  add_time(g, "y += 1 chain", "deft", 1, size, "ns/op", d, ops);
  std::printf("%-12s per op: bare Thrust launch %.2f us, deft deferred op %.2f us (%.2fx)\n", g,
              bare.median / ops * 1e6, d.median / ops * 1e6, d.median / bare.median);
  cudaStreamDestroy(s);
}

// --- lanes: independent chains of small kernels --------------------------------------

// Four independent chains of small elementwise steps (2^14 floats: one
// kernel fills a sliver of the GPU). On one stream the kernels run one after
// another; on four they overlap. Bare Thrust on 1 and 4 streams against
// deft with engine::Limits::gpu_lanes 1 and 4.
void lane_rows() {
  const char* g = "gpu_lanes";
  constexpr int chains = 4, steps = 250;
  const std::int64_t n = std::int64_t(1) << 14;
  const std::string size = "4 x 2^14, " + std::to_string(steps) + " steps";
  std::vector<std::unique_ptr<DeviceFloats>> raw;
  std::vector<cudaStream_t> streams(chains);
  for (int c = 0; c < chains; ++c) {
    raw.push_back(std::make_unique<DeviceFloats>(n));
    raw.back()->upload(random_floats(n, 30 + c));
    cuda_check(cudaStreamCreateWithFlags(&streams[c], cudaStreamNonBlocking), "cudaStreamCreate");
  }
  auto bare = [&](int used) {
    return measure([&] {
      for (int i = 0; i < steps; ++i)
        for (int c = 0; c < chains; ++c)
          thrust::transform(thrust::cuda::par_nosync.on(streams[c % used]), raw[c]->p, raw[c]->p + n, raw[c]->p,
                            AddOne{});
      for (cudaStream_t st : streams) cuda_check(cudaStreamSynchronize(st), "thrust");
    });
  };
  const engine::Limits saved = engine::limits();
  auto with_lanes = [&](int lanes) {
    engine::Limits l = saved;
    l.gpu_lanes = lanes;
    engine::set_limits(l);
    std::vector<Tensor<float>> x;
    for (int c = 0; c < chains; ++c) x.push_back(Tensor<float>(random_floats(n, 30 + c), {n}, gpu(0)) * 1.0f);
    wait_all();
    const Summary s = measure([&] {
      for (int i = 0; i < steps; ++i)
        for (auto& t : x) t = t * 0.5f + 1.0f;
      wait_all();
    });
    engine::set_limits(saved);
    return s;
  };
  const Summary bare1 = bare(1), bare4 = bare(chains), deft1 = with_lanes(1), deft4 = with_lanes(chains);
  for (cudaStream_t st : streams) cudaStreamDestroy(st);
  const int ops = chains * steps;
  add_time(g, "4 independent chains, 1 stream", "thrust", 1, size, "ns/op", bare1, ops);
  add_time(g, "4 independent chains, 4 streams", "thrust", 1, size, "ns/op", bare4, ops);
  add_time(g, "4 independent chains, 1 lane", "deft", 1, size, "ns/op", deft1, ops);
  add_time(g, "4 independent chains, 4 lanes", "deft", 1, size, "ns/op", deft4, ops);
  std::printf("%-12s 4 streams over 1: Thrust %.2fx faster, deft lanes %.2fx faster\n", g, bare1.median / bare4.median,
              deft1.median / deft4.median);
}

// --- the seeds' nets on the GPU -----------------------------------------------------

using bench::dense_net;

/// Milliseconds per step that bench/gpu_torch_step.py prints, -1 when it cannot run.
double torch_step_ms(const std::string& script) {
  return bench::child_number("python3 " + script + " 2>/dev/null", "step_ms ");
}

void training_rows(const std::string& torch_script) {
  const char* g = "gpu_training";
  const Device dev = gpu(0);
  {
    constexpr std::int64_t batch = 1024;
    const std::string size = "1024x512";
    random::seed(7);
    const Tensor<float> x = random::normal<float>(0, 1, {batch, 512}, dev);
    const Tensor<float> y = ones<float>({batch}).to(dev);
    auto net = dense_net({{2048, nn::Act::relu}, {512, nn::Act::relu}, {1, nn::Act::none}});
    net->initialize(nn::init::normal(0.01), {dev});
    (void)(*net)(x).to_vector();
    nn::Trainer trainer(net->collect_params(), nn::SGD{.learning_rate = 0.005f});
    const nn::L2Loss loss;
    constexpr int steps = 20;
    const Summary d = measure([&] {
      for (int i = 0; i < steps; ++i) {
        {
          autograd::record rec;
          Tensor<float> l = loss((*net)(x), y);
          l.backward();
        }
        trainer.step(batch);
      }
      wait_all();
    });
    add_time(g, "mlp step 512-2048-512-1", "deft", 1, size, "ms", d, steps);
    const Summary host = bench::measure_split(
        [&] {
          for (int i = 0; i < steps; ++i) {
            {
              autograd::record rec;
              Tensor<float> l = loss((*net)(x), y);
              l.backward();
            }
            trainer.step(batch);
          }
          detail::Engine::get().wait_all();  // every task queued, the device not waited for
        },
        [] { wait_all(); });
    add_time(g, "mlp step, queueing only", "deft", 1, size, "ms", host, steps);
    const double torch_ms = torch_script.empty() ? -1 : torch_step_ms(torch_script);
    if (torch_ms > 0) {
      add(g, "mlp step 512-2048-512-1", "torch", 1, size, "ms", torch_ms, torch_ms);
      std::printf("%-12s mlp step: deft / torch (same GPU) %.2f\n", g, d.median / steps * 1e3 / torch_ms);
    } else {
      bench::skip(g, "torch", "python3 with a CUDA PyTorch not found");
    }
  }
  {
    constexpr int calls = 200;
    const std::string size = "1x512";
    random::seed(11);
    const Tensor<float> x = random::normal<float>(0, 1, {1, 512}, dev);
    auto net = dense_net({{256, nn::Act::relu}, {128, nn::Act::relu}, {2, nn::Act::none}});
    net->initialize(nn::init::xavier(), {dev});
    (void)(*net)(x).to_vector();
    auto loop = [&] {
      for (int i = 0; i < calls; ++i) (void)(*net)(x).to_vector();
    };
    add_time(g, "forward 512-256-128-2 imperative", "deft", 1, size, "us", measure(loop), calls);
    net->hybridize(true, {.cuda_graph = false});
    (void)(*net)(x).to_vector();
    const auto by_kernel = measure(loop);
    add_time(g, "forward 512-256-128-2 hybridized, kernel by kernel", "deft", 1, size, "us", by_kernel, calls);
    net->hybridize();
    (void)(*net)(x).to_vector();
    (void)(*net)(x).to_vector();  // the first replay records the graph
    const auto graphed = measure(loop);
    add_time(g, "forward 512-256-128-2 hybridized, one CUDA graph", "deft", 1, size, "us", graphed, calls);
    std::printf("%-12s hybridized forward: kernel by kernel / CUDA graph %.2f\n", g, by_kernel.median / graphed.median);
  }
  // Gradient buckets: each sum is DMAs between the host and the GPU here,
  // and one NCCL call per bucket (or per parameter) across two GPUs.
  bench::data_parallel_rows(g, {cpu(), dev}, "cpu,gpu0");
  // The seeds' question: the host and the GPU differ in speed, so split the
  // batch by the rows per second each manages alone.
  bench::data_parallel_shares_rows(g, {cpu(), dev}, "cpu,gpu0");
  if (num_gpus() >= 2) bench::data_parallel_rows(g, {gpu(0), gpu(1)}, "gpu0,gpu1");
  else bench::skip(g, "deft", "data-parallel step gpu0,gpu1: one GPU on this machine");
}

}  // namespace

int main(int argc, char** argv) try {
  std::string torch_script = "bench/gpu_torch_step.py";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) bench::opts.repeats = std::atoi(argv[++i]);
    else if (a == "--filter" && i + 1 < argc) bench::opts.filter = argv[++i];
    else if (a == "--torch-script" && i + 1 < argc) torch_script = argv[++i];
    else if (a == "--csv" && i + 1 < argc) bench::opts.csv = argv[++i];
    else {
      std::fprintf(stderr, "usage: deft_bench_gpu [--repeats N] [--filter GROUP] [--torch-script PATH] [--csv FILE]\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("deft_bench_gpu: no CUDA GPU on this machine\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("deft_bench_gpu on %s (%d SMs), %d host workers, median of %d repeats\n", prop.name,
              prop.multiProcessorCount, engine::num_workers(), bench::opts.repeats);
  bench::print_header();
  if (bench::selected("gpu_fused")) bandwidth_rows();
  if (bench::selected("gpu_gemm")) gemm_rows();
  if (bench::selected("gpu_reduce")) reduce_rows();
  if (bench::selected("gpu_copy")) copy_rows();
  if (bench::selected("gpu_launch")) launch_rows();
  if (bench::selected("gpu_lanes")) lane_rows();
  if (bench::selected("gpu_training")) training_rows(torch_script);
  if (!bench::opts.csv.empty()) bench::write_csv(bench::opts.csv);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "deft_bench_gpu: %s\n", e.what());
  return 1;
}
