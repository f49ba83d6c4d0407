// A full training step through Runtime + CudaBackend captured into a CUDA graph and replayed: forward
// materialize -> consumer kernel -> release, backward materialize -> grad_buffer -> wgrad add ->
// release -> finalize, drain. Two eager warm-up steps, one captured step, then replays; every step
// re-packs new shards (eagerly, between replays, in changing orders and one weight at a time: packs
// captured in the graph read each weight's own amax slot) and feeds new inputs. Grad buffers are the
// zero-filled pool's or, on this size-1 group, the main grads themselves (GradInit::kUndefined).
// Asserts that outputs and main grads equal an eager run bit for bit, that capture and replay allocate
// nothing, that materialized addresses are stable, that captured grad-ready callbacks fire on every
// replay, and that the runtime's stats count the capture once. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "testing/remat/consumer_kernels.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using std::chrono::milliseconds;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

struct LayerSpec {
  std::int64_t rows, cols;
  kernels::SourceDtype dtype;
  kernels::WireSpec wire;
};
// act[l + 1] = W_l act[l], so rows of layer l = cols of layer l + 1. BF16, FP8 and NVFP4 wires.
const std::vector<LayerSpec>& layers() {
  static const std::vector<LayerSpec> specs = {
      {64, 128, kernels::SourceDtype::kBF16, {kernels::WireFormat::kBF16}},
      {96, 64, kernels::SourceDtype::kFP32, {kernels::WireFormat::kFP8}},
      {128, 96, kernels::SourceDtype::kBF16, {kernels::WireFormat::kNVFP4}},
  };
  return specs;
}
constexpr int kSteps = 8;
constexpr int kWarmup = 2;  // eager steps before the captured one: recording, then the first prefetching step

std::uint16_t to_bf16(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<std::uint16_t>(bits >> 16);
}

// The shard of `layer` at `step` (G = 1: the whole weight) as raw bytes of its source dtype.
std::vector<unsigned char> shard_bytes(int layer, int step) {
  const LayerSpec& s = layers()[layer];
  std::mt19937 rng(97 * step + layer);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const std::int64_t n = s.rows * s.cols;
  std::vector<unsigned char> out;
  if (s.dtype == kernels::SourceDtype::kFP32) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    out.resize(n * 4);
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    std::vector<std::uint16_t> v(n);
    for (std::uint16_t& x : v) x = to_bf16(normal(rng));
    out.resize(n * 2);
    std::memcpy(out.data(), v.data(), out.size());
  }
  return out;
}

std::vector<float> random_vector(std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng);
  return v;
}

// What one step leaves behind: activations, input gradients and main grads, copied to the host.
struct StepResult {
  std::vector<std::vector<float>> act, grad_in, main_grad;
  bool operator==(const StepResult& o) const { return act == o.act && grad_in == o.grad_in && main_grad == o.main_grad; }
};

// The first element where two results differ, in words (for failure messages).
std::string first_difference(const StepResult& got, const StepResult& want) {
  const auto find = [](const char* what, const std::vector<std::vector<float>>& a,
                       const std::vector<std::vector<float>>& b) -> std::string {
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
      for (std::size_t j = 0; j < a[i].size() && j < b[i].size(); ++j)
        if (std::memcmp(&a[i][j], &b[i][j], 4) != 0) {
          return std::string(what) + "[" + std::to_string(i) + "][" + std::to_string(j) + "] = " +
                 std::to_string(a[i][j]) + ", expected " + std::to_string(b[i][j]);
        }
    return "";
  };
  for (const std::string& d : {find("act", got.act, want.act), find("grad_in", got.grad_in, want.grad_in),
                               find("main_grad", got.main_grad, want.main_grad)}) {
    if (!d.empty()) return d;
  }
  return "no element differs";
}

// One rank's model on the CUDA backend: device buffers and the runtime.
// grad_init kUndefined: on this size-1 group each grad buffer is the main grad itself
// (grads_into_main_grad), added into; kZero: the pooled buffer, its reduce-scatter and deferred add.
class Model {
 public:
  Model(const CudaGroup& comms, int depth, std::int64_t fill_graphs = 0, GradInit grad_init = GradInit::kZero)
      : backend_(0, {comms}, milliseconds(30000)), runtime_(backend_, config(depth, fill_graphs)),
        grad_init_(grad_init) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    const int n = static_cast<int>(layers().size());
    act_.resize(n + 1);
    grad_in_.resize(n + 1);
    act_[0] = device_floats(layers()[0].cols);
    grad_in_[n] = device_floats(layers()[n - 1].rows);
    for (int l = 0; l < n; ++l) {
      const LayerSpec& s = layers()[l];
      act_[l + 1] = device_floats(s.rows);
      grad_in_[l] = device_floats(s.cols);
      shards_.push_back(device_bytes(s.rows * s.cols * (s.dtype == kernels::SourceDtype::kFP32 ? 4 : 2)));
      main_grads_.push_back(device_floats(s.rows * s.cols));
      EXPECT_EQ(cudaMemset(main_grads_.back(), 0, s.rows * s.cols * 4), cudaSuccess);
      WeightDesc desc;
      desc.name = "layer" + std::to_string(l);
      desc.shard = shards_.back();
      desc.dtype = s.dtype;
      desc.rows = s.rows;
      desc.cols = s.cols;
      desc.wire = s.wire;
      desc.main_grad = main_grads_.back();
      ids_.push_back(runtime_.register_weight(desc));
    }
  }
  ~Model() {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    for (void* p : owned_) cudaFree(p);
  }

  Runtime& runtime() { return runtime_; }
  CudaBackend& backend() { return backend_; }
  cudaStream_t stream() const { return stream_; }
  int grads_ready() const { return grads_ready_.load(); }

  // Eager, between steps (and between replays): the optimizer's new shards, re-packed, and new inputs.
  // The re-pack names the weights in layer order, in reverse, or one call per weight (last first).
  enum class Repack { kInOrder, kReversed, kOneByOne };
  void prepare(int step, Repack repack = Repack::kInOrder) {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    for (std::size_t l = 0; l < layers().size(); ++l) {
      const auto bytes = shard_bytes(static_cast<int>(l), step);
      CUDA_OK(cudaMemcpy(shards_[l], bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    }
    std::vector<WeightId> order = ids_;
    if (repack != Repack::kInOrder) std::reverse(order.begin(), order.end());
    if (repack == Repack::kOneByOne) {
      for (WeightId id : order) runtime_.shard_updated(&id, 1, stream_);
    } else {
      runtime_.shard_updated(order.data(), static_cast<std::int64_t>(order.size()), stream_);
    }
    const auto x = random_vector(layers().front().cols, 1000 + step);
    const auto dy = random_vector(layers().back().rows, 2000 + step);
    CUDA_OK(cudaMemcpy(act_.front(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(grad_in_.back(), dy.data(), dy.size() * 4, cudaMemcpyHostToDevice));
  }

  // The step's libgtp calls and consumer kernels, all on stream(): run eagerly or under capture.
  // Returns the materialized addresses in call order.
  std::vector<void*> step() {
    std::vector<void*> addresses;
    const int n = static_cast<int>(layers().size());
    for (int l = 0; l < n; ++l) {
      const LayerSpec& s = layers()[l];
      const auto w = runtime_.materialize(&ids_[l], 1, Phase::kForward, 0, Layout::kBF16, stream_);
      testing::forward_cuda(w[0], act_[l], act_[l + 1], s.rows, s.cols, stream_);
      runtime_.release(&ids_[l], 1, stream_);
      addresses.push_back(w[0]);
    }
    for (int l = n - 1; l >= 0; --l) {
      const LayerSpec& s = layers()[l];
      const auto w = runtime_.materialize(&ids_[l], 1, Phase::kBackward, 0, Layout::kBF16, stream_);
      const GradBuffer buffer = runtime_.grad_buffer(ids_[l], stream_, grad_init_);
      EXPECT_FALSE(buffer.overwrite);  // zero-filled, or the main grad: the kernel below adds
      EXPECT_EQ(buffer.data == main_grads_[l], grad_init_ == GradInit::kUndefined);
      float* g = buffer.data;
      testing::weight_grad_cuda(grad_in_[l + 1], act_[l], g, s.rows, s.cols, stream_);
      testing::input_grad_cuda(w[0], grad_in_[l + 1], grad_in_[l], s.rows, s.cols, stream_);
      runtime_.release(&ids_[l], 1, stream_);
      runtime_.finalize(&ids_[l], 1, /*last_microbatch=*/true, stream_);
      addresses.push_back(w[0]);
      addresses.push_back(g);
    }
    runtime_.drain(stream_);
    return addresses;
  }

  StepResult result() {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    StepResult r;
    const int n = static_cast<int>(layers().size());
    for (int i = 0; i <= n; ++i) {
      r.act.push_back(host_copy(act_[i], i == 0 ? layers()[0].cols : layers()[i - 1].rows));
      r.grad_in.push_back(host_copy(grad_in_[i], i == n ? layers()[n - 1].rows : layers()[i].cols));
    }
    for (int l = 0; l < n; ++l) r.main_grad.push_back(host_copy(main_grads_[l], layers()[l].rows * layers()[l].cols));
    return r;
  }

 private:
  RuntimeConfig config(int depth, std::int64_t fill_graphs) {
    RuntimeConfig c;
    c.depth = depth;
    c.fill_graphs = fill_graphs;
    c.grads.grad_ready = [this](WeightId) { ++grads_ready_; };
    return c;
  }
  void* device_bytes(std::int64_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    owned_.push_back(p);
    return p;
  }
  float* device_floats(std::int64_t n) { return static_cast<float*>(device_bytes(n * 4)); }
  static std::vector<float> host_copy(const float* p, std::int64_t n) {
    std::vector<float> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

  std::atomic<int> grads_ready_{0};
  CudaBackend backend_;
  Runtime runtime_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> owned_;
  std::vector<void*> shards_;
  std::vector<float*> main_grads_;
  std::vector<float*> act_, grad_in_;
  std::vector<WeightId> ids_;
  GradInit grad_init_;
};

// (depth, fill graphs): with fill graphs the eager steps launch each fill as a graph captured on the
// runtime's side stream, and the caller's captured step fills without them (inside its capture).
class CudaGraph : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(CudaGraph, CapturedStepReplaysBitExact) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  const int depth = std::get<0>(GetParam());
  const std::int64_t fill_graphs = std::get<1>(GetParam()) ? 64 : 0;
  const GradInit grad_init = std::get<2>(GetParam()) ? GradInit::kUndefined : GradInit::kZero;
  auto bootstrap = comm::ThreadBootstrap::create_group(1, milliseconds(30000));
  comm::NcclComm nccl = comm::NcclComm::create_world(*bootstrap[0], milliseconds(30000));
  comm::NcclComm reduce_scatter = nccl.split({{0}}, {}, milliseconds(30000));
  const CudaGroup comms{&nccl, &reduce_scatter};

  std::vector<StepResult> eager;  // the reference: every step (and one more) run eagerly
  {
    Model model(comms, depth, 0, grad_init);
    for (int step = 0; step <= kSteps; ++step) {
      model.prepare(step);
      model.step();
      eager.push_back(model.result());
    }
    EXPECT_EQ(model.runtime().stats().chain_mismatches, 0) << model.runtime().stats().last_mismatch;
  }
  // The comparisons below are not vacuous: the reference has non-zero outputs and main grads.
  const auto nonzero = [](const std::vector<float>& v) {
    return std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; });
  };
  ASSERT_TRUE(nonzero(eager.back().act.back()) && nonzero(eager.back().grad_in.front()));
  for (const auto& g : eager.back().main_grad) ASSERT_TRUE(nonzero(g));

  Model model(comms, depth, fill_graphs, grad_init);
  std::vector<void*> warm_addresses;
  for (int step = 0; step < kWarmup; ++step) {
    model.prepare(step);
    warm_addresses = model.step();
    const StepResult got = model.result();
    ASSERT_TRUE(got == eager[step]) << "eager warm-up step " << step << ": " << first_difference(got, eager[step]);
  }
  const std::int64_t allocations = model.backend().memory().allocations;
  const RuntimeStats before = model.runtime().stats();

  // Thread-local mode: only this thread's unsafe calls (cudaMalloc, synchronization) break the capture;
  // NCCL's and CUDA's own threads keep working.
  model.prepare(kWarmup);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // pre-capture work complete (the rule for waits on it)
  CUDA_OK(cudaStreamBeginCapture(model.stream(), cudaStreamCaptureModeThreadLocal));
  std::vector<void*> captured_addresses;
  try {
    captured_addresses = model.step();
  } catch (const std::exception& e) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(model.stream(), &broken);
    if (broken != nullptr) cudaGraphDestroy(broken);
    FAIL() << "capture failed: " << e.what();
  }
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(model.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(captured_addresses, warm_addresses) << "materialized or grad-buffer addresses moved";
  EXPECT_EQ(model.backend().memory().allocations, allocations) << "allocated during capture";

  const int per_step = static_cast<int>(layers().size());
  for (int step = kWarmup; step < kSteps; ++step) {
    if (step > kWarmup) {
      model.prepare(step, step % 2 == 0 ? Model::Repack::kReversed : Model::Repack::kOneByOne);
      model.runtime().drain(model.stream());  // orders the launch stream after the eager re-pack
    }
    CUDA_OK(cudaGraphLaunch(exec, model.stream()));
    const StepResult got = model.result();
    ASSERT_TRUE(got == eager[step]) << "replay of step " << step << " differs from the eager step: "
                                    << first_difference(got, eager[step]);
    EXPECT_EQ(model.grads_ready(), (step + 1) * per_step) << "captured grad-ready callbacks did not fire on replay";
  }
  EXPECT_EQ(model.backend().memory().allocations, allocations) << "allocated during replay";

  // Host-side bookkeeping ran once, at capture: the stats count the capture, not the replays.
  const RuntimeStats after = model.runtime().stats();
  EXPECT_EQ(after.materializations - before.materializations, 2 * per_step);
  EXPECT_EQ(after.chain_mismatches, 0) << after.last_mismatch;
  EXPECT_GT(after.prefetch_hits, before.prefetch_hits);

  // After the last replay has finished, eager steps continue where the graph left off.
  model.prepare(kSteps);
  model.step();
  const StepResult got = model.result();
  EXPECT_TRUE(got == eager[kSteps]) << "the eager step after the replays differs: " << first_difference(got, eager[kSteps]);
  EXPECT_EQ(model.runtime().stats().chain_mismatches, 0) << model.runtime().stats().last_mismatch;
  if (fill_graphs > 0) {
    const GroupStats g = model.runtime().group_stats(0);
    EXPECT_GT(g.graph_fills, g.graph_recordings) << model.runtime().stats_json();  // launched, and again
  }

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Depths, CudaGraph,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool, bool>>& info) {
                           return "depth" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_fill_graphs" : "") +
                                  (std::get<2>(info.param) ? "_into_main_grad" : "");
                         });

}  // namespace
}  // namespace gtp::remat
