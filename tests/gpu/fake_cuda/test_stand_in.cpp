// The stand-in itself: deft's GPU work reaches it through the CUDA calls
// the device tests mean to exercise, and it refuses what CUDA refuses, so
// that a mistake in deft's backend fails here as it would on a GPU.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cmath>
#include <future>
#include <thread>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include <deft/deft.hpp>
#include <deft/nn.hpp>
#include <deft/device/cuda/runtime.hpp>

#include "fake_cuda.hpp"

namespace {

namespace gk = deft::detail::gpu;

/// A stream of the current device, for the stand-in's own checks.
cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  return s;
}
cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  BOOST_REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  return e;
}

/// Work that holds its stream until open() is called.
struct Gate {
  std::promise<void> opened;
  std::shared_future<void> is_open = opened.get_future().share();
  void hold(cudaStream_t s) {
    BOOST_REQUIRE(fake_cuda::launch(s, [f = is_open] { f.wait(); }, "a gate") == cudaSuccess);
  }
  void open() { opened.set_value(); }
};

unsigned long long kernels() { return fake_cuda::calls("transform") + fake_cuda::calls("for_each"); }

}  // namespace

BOOST_AUTO_TEST_SUITE(fake_cuda_stand_in)

BOOST_AUTO_TEST_CASE(deft_reaches_the_stand_in_through_cuda) {
  BOOST_TEST_REQUIRE(gk::device_count() == 2);
  const auto kernels_before = kernels(), peer_before = fake_cuda::calls("cudaMemcpyPeerAsync"),
             sums_before = fake_cuda::calls("ncclAllReduce"), uploads_before = fake_cuda::calls("cudaMemcpyAsync");
  const std::vector<float> values{1.5f, -2.0f, 3.25f, 0.5f};
  const deft::Tensor<float> a = deft::Tensor<float>(values, {4}).to(deft::gpu(0));
  const deft::Tensor<float> twice = a * 2.0f + 1.0f;
  const deft::Tensor<float> b = twice.to(deft::gpu(1)) * 3.0f;
  const auto got = b.to_vector();
  for (std::size_t i = 0; i < values.size(); ++i) BOOST_TEST(got[i] == (values[i] * 2.0f + 1.0f) * 3.0f);
  std::vector<deft::Tensor<float>> parts{deft::Tensor<float>(values, {4}).to(deft::gpu(0)),
                                         deft::Tensor<float>(values, {4}).to(deft::gpu(1))};
  deft::allreduce(parts);
  for (const auto& p : parts) {
    const auto sum = p.to_vector();
    for (std::size_t i = 0; i < values.size(); ++i) BOOST_TEST(sum[i] == 2.0f * values[i]);
  }
  BOOST_TEST(kernels() >= kernels_before + 2);
  BOOST_TEST(fake_cuda::calls("cudaMemcpyPeerAsync") >= peer_before + 1);
  BOOST_TEST(fake_cuda::calls("ncclAllReduce") == sums_before + 2);  // NCCL (the stand-in's), not copies
  BOOST_TEST(fake_cuda::calls("cudaMemcpyAsync") >= uploads_before + 4);
}

// Stream order and waits, as deft's lanes rely on them.
BOOST_AUTO_TEST_CASE(streams_run_in_order_and_after_the_events_they_wait_for) {
  gk::DeviceGuard on(0);
  const cudaStream_t a = new_stream(), b = new_stream();
  const cudaEvent_t e = new_event();
  Gate gate;
  auto order = std::make_shared<std::vector<int>>();
  gate.hold(a);
  BOOST_REQUIRE(fake_cuda::launch(a, [order] { order->push_back(1); }, "a step") == cudaSuccess);
  BOOST_REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  BOOST_TEST(cudaEventQuery(e) == cudaErrorNotReady);
  (void)cudaGetLastError();
  BOOST_REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  BOOST_REQUIRE(fake_cuda::launch(b, [order] { order->push_back(2); }, "a step") == cudaSuccess);
  gate.open();
  BOOST_TEST(cudaStreamSynchronize(b) == cudaSuccess);
  BOOST_TEST(*order == std::vector<int>({1, 2}), boost::test_tools::per_element());
  BOOST_TEST(cudaEventQuery(e) == cudaSuccess);
}

// cudaFree need not wait for the device: deft's pool waits for every lane
// before it gives a block back (DeviceMemory::release). Here a copy into
// the block is still queued, behind a gate, when the block is released.
BOOST_AUTO_TEST_CASE(memory_given_back_to_cuda_waits_for_the_work_queued_on_it) {
  gk::DeviceContext& ctx = gk::context(0);
  gk::DeviceGuard on(0);
  const std::size_t bytes = std::size_t(3) << 20;  // an allocation of its own class: release() frees it
  const std::vector<float> values(bytes / sizeof(float), 1.5f);
  void* block = ctx.memory->allocate(bytes, 256);
  Gate gate;
  gate.hold(ctx.stream(0));  // the lane of this thread's copies
  gk::cuda_backend().copy(block, deft::gpu(0), values.data(), deft::cpu(), bytes);
  ctx.memory->deallocate(block, bytes, 256);
  std::thread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    gate.open();
  });
  ctx.memory->release();
  opener.join();
  BOOST_TEST(cudaStreamSynchronize(ctx.stream(0)) == cudaSuccess);  // cudaErrorIllegalAddress had the copy run after the free
}

// A free during a recording would end the capture (cudaFree may wait for
// the device): deft parks it until the recording is over (FreeGate).
BOOST_AUTO_TEST_CASE(frees_during_a_recording_wait_for_its_end) {
  gk::DeviceContext& ctx = gk::context(0);
  void* device = ctx.upstream->allocate(4096, 256);
  void* pinned = gk::pinned_upstream()->allocate(4096, 256);
  std::size_t parked = 0;
  const auto program = gk::cuda_backend().record(0, [&] {
    ctx.upstream->deallocate(device, 4096, 256);
    gk::pinned_upstream()->deallocate(pinned, 4096, 256);
    parked = ctx.upstream->parked() + gk::pinned_upstream()->parked();
  });
  BOOST_TEST(parked == 2u);
  BOOST_TEST(ctx.upstream->parked() + gk::pinned_upstream()->parked() == 0u);  // freed once it ended
  BOOST_TEST(fake_cuda::device_memory_of(device, 4096) == -1);
}

// While NCCL queues a group, a cudaMalloc or cudaFree on another thread
// may wait for a kernel whose partners are not launched yet (a hang on
// GPUs; the stand-in refuses such calls). deft holds collective_launches()
// around both: here a stand-in group is open under that lock while another
// thread allocates and frees device and page-locked memory.
BOOST_AUTO_TEST_CASE(allocations_wait_for_an_nccl_group_being_queued) {
  gk::DeviceContext& ctx = gk::context(0);
  std::promise<void> group_open;
  std::thread nccl([&] {
    std::lock_guard launches(gk::collective_launches());
    fake_cuda::collective_group(true);
    group_open.set_value();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fake_cuda::collective_group(false);
  });
  group_open.get_future().wait();
  BOOST_CHECK_NO_THROW({
    void* device = ctx.upstream->allocate(4096, 256);
    void* pinned = gk::pinned_upstream()->allocate(4096, 256);
    ctx.upstream->deallocate(device, 4096, 256);
    gk::pinned_upstream()->deallocate(pinned, 4096, 256);
  });
  nccl.join();
  void* unguarded = nullptr;  // the stand-in's rule itself: refused while another thread's group is open
  deft::wait_all();           // (no worker of deft's allocates meanwhile)
  std::thread([] { fake_cuda::collective_group(true); }).join();
  BOOST_TEST(cudaMalloc(&unguarded, 64) == cudaErrorNotPermitted);
  std::thread([] { fake_cuda::collective_group(false); }).join();
  (void)cudaGetLastError();
  BOOST_TEST(cudaMalloc(&unguarded, 64) == cudaSuccess);
  BOOST_TEST(cudaFree(unguarded) == cudaSuccess);
}

BOOST_AUTO_TEST_CASE(captures_refuse_what_cuda_refuses) {
  gk::DeviceGuard on(0);
  const cudaStream_t s = new_stream(), other = new_stream();
  const cudaEvent_t outside = new_event(), inside = new_event();
  cudaGraph_t graph = nullptr;
  BOOST_REQUIRE(cudaEventRecord(outside, other) == cudaSuccess);

  BOOST_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  BOOST_TEST(cudaEventRecord(inside, s) == cudaSuccess);
  BOOST_TEST(cudaEventQuery(inside) == cudaErrorCapturedEvent);
  BOOST_TEST(cudaEventSynchronize(inside) == cudaErrorCapturedEvent);
  BOOST_TEST(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
  BOOST_TEST(graph == nullptr);

  BOOST_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  BOOST_TEST(cudaStreamWaitEvent(s, outside, 0) == cudaErrorStreamCaptureIsolation);
  BOOST_TEST(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);

  std::vector<float> pageable(4, 1.0f);
  void* device = nullptr;
  BOOST_REQUIRE(cudaMalloc(&device, 16) == cudaSuccess);
  BOOST_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  BOOST_TEST(cudaMemcpyAsync(device, pageable.data(), 16, cudaMemcpyHostToDevice, s) ==
             cudaErrorStreamCaptureUnsupported);
  BOOST_TEST(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);

  BOOST_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  BOOST_TEST(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported);
  BOOST_TEST(fake_cuda::launch(s, [] {}, "a step") == cudaErrorStreamCaptureInvalidated);
  BOOST_TEST(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);

  // cudaFree may wait for the device, which a capture there forbids (deft parks such frees).
  BOOST_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  BOOST_TEST(cudaFree(device) == cudaErrorStreamCaptureUnsupported);
  BOOST_TEST(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
  BOOST_TEST(cudaFree(device) == cudaSuccess);
}

// A launch runs after the same graph's earlier launches, on any stream (CUDA's rule).
BOOST_AUTO_TEST_CASE(a_graph_replays_its_capture_in_order) {
  gk::DeviceGuard on(0);
  const cudaStream_t s = new_stream(), lane = new_stream(), other = new_stream();
  auto order = std::make_shared<std::vector<int>>();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BOOST_REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  for (int i = 0; i < 3; ++i) BOOST_REQUIRE(fake_cuda::launch(s, [order, i] { order->push_back(i); }, "a step") == cudaSuccess);
  BOOST_REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  BOOST_TEST(order->empty());  // captured, not run
  BOOST_REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  BOOST_REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  Gate gate;
  gate.hold(lane);
  BOOST_REQUIRE(cudaGraphLaunch(exec, lane) == cudaSuccess);
  BOOST_REQUIRE(cudaGraphLaunch(exec, other) == cudaSuccess);  // waits for the launch behind the gate
  BOOST_REQUIRE(cudaGraphExecDestroy(exec) == cudaSuccess);   // CUDA lets queued launches finish
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  BOOST_TEST(order->empty());
  gate.open();
  BOOST_TEST(cudaStreamSynchronize(other) == cudaSuccess);
  BOOST_TEST(*order == std::vector<int>({0, 1, 2, 0, 1, 2}), boost::test_tools::per_element());
  BOOST_TEST(cudaStreamSynchronize(lane) == cudaSuccess);
}

BOOST_AUTO_TEST_CASE(work_is_queued_only_where_its_device_is_current) {
  cudaStream_t on_1 = nullptr;
  {
    gk::DeviceGuard on(1);
    on_1 = new_stream();
  }
  gk::DeviceGuard on(0);
  const cudaEvent_t of_0 = new_event();
  BOOST_TEST(fake_cuda::launch(on_1, [] {}, "a step") == cudaErrorInvalidResourceHandle);
  BOOST_TEST(cudaEventRecord(of_0, on_1) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
}

BOOST_AUTO_TEST_SUITE_END()

// Faults leave a device failed for good, as on a GPU: these run in a
// process of their own (CTest's gpu_backend_fake_faults), each on a GPU the
// ones before it left working.
BOOST_AUTO_TEST_SUITE(fake_cuda_faults)

// A kernel's fault on gpu(1): deft's next sync points for gpu(1) raise the
// CUDA error, nothing hangs, and the host and gpu(0) compute on.
BOOST_AUTO_TEST_CASE(a_faulted_gpu_raises_at_sync_points_and_the_rest_goes_on) {
  const std::vector<float> values{1.5f, -2.0f, 3.25f, 0.5f, 7.0f, -1.0f, 0.25f, 4.0f};
  const auto doubled = [&](const std::vector<float>& got) {
    BOOST_REQUIRE(got.size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i) BOOST_TEST(got[i] == 2.0f * values[i]);
  };
  const deft::Tensor<float> x = deft::Tensor<float>(values, {8}).to(deft::gpu(1));
  doubled(deft::Tensor<float>(x * 2.0f).to_vector());
  {
    gk::DeviceGuard on(1);
    const cudaStream_t lane = gk::context(1).stream(0);
    BOOST_REQUIRE(fake_cuda::launch(lane, [] { throw std::runtime_error("an injected fault"); }, "a faulting kernel") ==
                  cudaSuccess);
    BOOST_TEST(cudaStreamSynchronize(lane) == cudaErrorLaunchFailure);
    (void)cudaGetLastError();
  }
  const auto names_the_fault = [](const std::exception& e) {
    BOOST_TEST_MESSAGE("raised: " << e.what());
    return std::string(e.what()).find("LaunchFailure") != std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(deft::Tensor<float>(x * 3.0f).to_vector(), std::exception, [&](const std::exception& e) {
    return names_the_fault(e) && std::string(e.what()).find("a kernel on gpu(1)") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(deft::Tensor<float>(values, {8}).to(deft::gpu(1)).to_vector(), std::exception, names_the_fault);
  BOOST_CHECK_EXCEPTION(deft::wait_all(), std::exception, names_the_fault);
  doubled(deft::Tensor<float>(deft::Tensor<float>(values, {8}) * 2.0f).to_vector());
  doubled(deft::Tensor<float>(deft::Tensor<float>(values, {8}).to(deft::gpu(0)) * 2.0f).to_vector());
}

BOOST_AUTO_TEST_CASE(a_copy_of_memory_freed_before_it_ran_faults_its_device) {
  gk::DeviceGuard on(0);
  const cudaStream_t s = new_stream();
  void* device = nullptr;
  void* pinned = nullptr;
  BOOST_REQUIRE(cudaMalloc(&device, 64) == cudaSuccess);
  BOOST_REQUIRE(cudaHostAlloc(&pinned, 64, cudaHostAllocPortable) == cudaSuccess);
  Gate gate;
  gate.hold(s);
  BOOST_REQUIRE(cudaMemcpyAsync(pinned, device, 64, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  BOOST_REQUIRE(cudaFree(device) == cudaSuccess);  // does not wait for s: CUDA's need not
  gate.open();
  BOOST_TEST(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
  BOOST_TEST(cudaMalloc(&device, 64) == cudaErrorIllegalAddress);  // sticky, as on a GPU
  BOOST_TEST(cudaFreeHost(pinned) == cudaErrorIllegalAddress);     // (with gpu(0) current)
  (void)cudaGetLastError();
}

BOOST_AUTO_TEST_SUITE_END()

// Which GPUs get a CUDA context (hundreds of MiB each on a real one): a
// program that uses only gpu(1) must not make one on gpu(0), though every
// thread that never chose a device reads 0 as its current one. This runs
// in a process of its own (CTest's gpu_backend_fake_contexts): the other
// suites use gpu(0).
BOOST_AUTO_TEST_SUITE(fake_cuda_contexts)

BOOST_AUTO_TEST_CASE(work_on_gpu_1_alone_makes_no_context_on_gpu_0) {
  BOOST_TEST_REQUIRE(!fake_cuda::has_context(0));  // nothing before this case used a GPU
  const deft::Device dev = deft::gpu(1);
  const std::vector<float> values{1.5f, -2.0f, 3.25f, 0.5f, 7.0f, -1.0f};
  const deft::Tensor<float> a = deft::Tensor<float>(values, {2, 3}).to(dev);  // staged through pinned memory
  const deft::Tensor<float> t = deft::transpose(a);
  const deft::Tensor<float> product = deft::matmul(a, t);  // cuBLAS
  const deft::Tensor<float> total = deft::sum(deft::exp(a) * 0.5f);
  const deft::Tensor<float> on_host = product.to(deft::cpu());  // a page-locked host buffer
  double expected = 0;
  for (float v : values) expected += 0.5 * std::exp(double(v));
  BOOST_TEST(total.item() == expected, boost::test_tools::tolerance(1e-5));
  const auto got = on_host.to_vector();
  BOOST_TEST(got[0] == 1.5f * 1.5f + 2.0f * 2.0f + 3.25f * 3.25f);
  std::thread([&] {  // a user thread of its own: its waits and copies need a context too
    product.wait_to_read();
    BOOST_TEST(deft::Tensor<float>(a * 2.0f).to_vector()[2] == 6.5f);
  }).join();

  auto net = std::make_shared<deft::nn::Sequential>();  // a hybridized forward: one CUDA graph
  net->add(std::make_shared<deft::nn::Dense>(4, deft::nn::Act::relu), std::make_shared<deft::nn::Dense>(2));
  net->initialize(deft::nn::init::xavier(), {dev});
  (void)(*net)(a).to_vector();
  net->hybridize(true, {.cuda_graph = true});
  for (int call = 0; call < 3; ++call) (void)(*net)(a).to_vector();
  BOOST_TEST(net->cuda_graphs() == 1);
  net.reset();
  deft::wait_all();
  deft::engine::release_cached_memory(dev);
  deft::engine::release_cached_memory(deft::cpu());

  BOOST_TEST(fake_cuda::has_context(1));
  BOOST_TEST(!fake_cuda::has_context(0));
}

// Where the earlier device's context exists, the thread gets it back.
BOOST_AUTO_TEST_CASE(a_thread_keeps_the_device_it_chose) {
  BOOST_REQUIRE(cudaSetDevice(0) == cudaSuccess);
  const deft::Tensor<float> x = deft::Tensor<float>(std::vector<float>{1.0f, 2.0f}, {2}).to(deft::gpu(1));
  BOOST_TEST(deft::Tensor<float>(x + 1.0f).to_vector()[1] == 3.0f);
  int current = -1;
  BOOST_TEST(cudaGetDevice(&current) == cudaSuccess);
  BOOST_TEST(current == 0);
}

BOOST_AUTO_TEST_SUITE_END()
