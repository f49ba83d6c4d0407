// The runtime on the CUDA backend with a size-1 NCCL group, end to end: register, re-pack,
// materialize (bit-identical to the shard), gradients into the main grad (also an undefined grad buffer
// over poisoned memory: padding rows zeroed, rows written by the consumer; main grads declared zero,
// written or copied; on this size-1 group, by
// default, the main grad itself as the buffer); the GEMM-ready layout of
// every wire format (unpack_gemm_cuda) and a key of many quantized weights (one unpack_many per wire)
// against the CPU reference; the side streams per role and the communicator per role; batched
// size-1 all-gathers, eagerly and under graph capture. The argument checks run anywhere; the rest
// skips without a GPU.
#include "remat/cuda_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "kernels/reference.h"
#include "testing/remat/cuda_reference_weights.h"
#include "testing/remat/cuda_test_group.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using std::chrono::milliseconds;
using testing::ReferenceWeights;
using testing::SizeOneGroup;
using testing::reference_chunk;
using testing::to_host;

// The constructor's message for `groups`, which must be refused with std::invalid_argument.
std::string refusal(std::vector<CudaGroup> groups, std::vector<CudaStreamPriorities> priorities = {}) {
  try {
    CudaBackend backend(0, std::move(groups), milliseconds(1000), std::move(priorities));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

// Runs without a GPU: every check here comes before the first CUDA or NCCL call. The borrowed
// handles only stand for distinct communicators; the checks compare them and never use them.
TEST(CudaBackend, BadCommunicatorListsAreRefusedBeforeAnyCudaCall) {
  int stand_ins[3] = {};
  comm::NcclComm a = comm::NcclComm::borrow(reinterpret_cast<ncclComm_t>(&stand_ins[0]));
  comm::NcclComm b = comm::NcclComm::borrow(reinterpret_cast<ncclComm_t>(&stand_ins[1]));
  comm::NcclComm c = comm::NcclComm::borrow(reinterpret_cast<ncclComm_t>(&stand_ins[2]));
  comm::NcclComm a_again = comm::NcclComm::borrow(a.get());
  comm::NcclComm empty;

  EXPECT_NE(refusal({}).find("no groups"), std::string::npos);
  EXPECT_NE(refusal({{nullptr, &b}}).find("group 0's gather communicator is null or empty"), std::string::npos);
  EXPECT_NE(refusal({{&empty, &b}}).find("group 0's gather communicator is null or empty"), std::string::npos);
  EXPECT_NE(refusal({{&a, nullptr}}).find("group 0's reduce-scatter communicator is null or empty"), std::string::npos);
  EXPECT_NE(refusal({{&a, &b}, {&c, &empty}}).find("group 1's reduce-scatter communicator is null or empty"),
            std::string::npos);
  const std::string same = refusal({{&a, &a}});
  EXPECT_NE(same.find("group 0's reduce-scatter communicator is the gather communicator of group 0"), std::string::npos)
      << same;
  EXPECT_NE(same.find("split the gather communicator once more"), std::string::npos) << same;
  EXPECT_NE(refusal({{&a, &a_again}}).find("group 0's reduce-scatter communicator is the gather communicator of group 0"),
            std::string::npos);  // another NcclComm over the same ncclComm_t
  EXPECT_NE(refusal({{&a, &b}, {&c, &a}}).find("group 1's reduce-scatter communicator is the gather communicator of group 0"),
            std::string::npos);
  const std::string priorities = refusal({{&a, &b}}, {CudaStreamPriorities{}, CudaStreamPriorities{}});
  EXPECT_NE(priorities.find("2 stream priority sets for 1 groups; pass one per group"), std::string::npos) << priorities;
}

// Each role's collectives go through its own communicator: with one of the two aborted, that role's
// collectives fail and the other role's still deliver correct results. The aborted one is always the
// child of the split, so that the abort cannot reach the other one.
TEST(CudaBackend, GathersAndReduceScattersUseTheirOwnCommunicators) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::int64_t n = 256;
  std::vector<float> values(n);
  for (std::int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i) - 100.5f;
  float* send = nullptr;
  float* recv = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), n * sizeof(float)), cudaSuccess);
  const auto reset = [&] {
    ASSERT_EQ(cudaMemcpy(send, values.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(recv, 0, n * sizeof(float)), cudaSuccess);
  };
  const auto received = [&](Stream stream) {
    EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), cudaSuccess);
    std::vector<float> got(n);
    EXPECT_EQ(cudaMemcpy(got.data(), recv, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return got;
  };

  for (const Role aborted : {Role::kReduceScatter, Role::kGather}) {
    SCOPED_TRACE(std::string("aborted: ") + to_string(aborted));
    auto bootstrap = comm::ThreadBootstrap::create_group(1, milliseconds(30000));
    comm::NcclComm parent = comm::NcclComm::create_world(*bootstrap[0], milliseconds(30000));
    comm::NcclComm child = parent.split({{0}}, {}, milliseconds(30000));
    ASSERT_NE(parent.get(), child.get());
    const CudaGroup comms = aborted == Role::kGather ? CudaGroup{&child, &parent} : CudaGroup{&parent, &child};
    CudaBackend backend(0, {comms}, milliseconds(30000));
    EXPECT_EQ(backend.group_size(0), 1);
    EXPECT_EQ(backend.group_rank(0), 0);
    const Stream gather = backend.side_stream(0, Role::kGather);
    const Stream reduce_scatter = backend.side_stream(0, Role::kReduceScatter);

    // Both roles work while both communicators do (a group of one: the gather copies, the mean is x / 1).
    reset();
    backend.all_gather(gather, 0, send, recv, n * sizeof(float));
    EXPECT_EQ(received(gather), values);
    reset();
    backend.reduce_scatter_mean(reduce_scatter, 0, send, recv, n);
    EXPECT_EQ(received(reduce_scatter), values);

    child.abort();
    reset();
    if (aborted == Role::kGather) {
      EXPECT_THROW(backend.all_gather(gather, 0, send, recv, n * sizeof(float)), CudaError);
      EXPECT_THROW(backend.all_reduce_max(gather, 0, send, n), CudaError);
      backend.reduce_scatter_mean(reduce_scatter, 0, send, recv, n);
      EXPECT_EQ(received(reduce_scatter), values);
    } else {
      EXPECT_THROW(backend.reduce_scatter_mean(reduce_scatter, 0, send, recv, n), CudaError);
      backend.all_gather(gather, 0, send, recv, n * sizeof(float));
      EXPECT_EQ(received(gather), values);
      backend.all_reduce_max(gather, 0, send, n);  // in place; the max over one rank is the value
      EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(gather)), cudaSuccess);
      std::vector<float> maxima(n);
      EXPECT_EQ(cudaMemcpy(maxima.data(), send, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(maxima, values);
    }
  }
  cudaFree(send);
  cudaFree(recv);
}

// Needs two GPUs: a reduce-scatter communicator over other ranks, or the same ranks in another order,
// than the gather communicator is refused, naming the group.
TEST(CudaBackend, ReduceScatterCommunicatorOverOtherRanksIsRefused) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices;
  auto bootstraps = comm::ThreadBootstrap::create_group(2, milliseconds(120000));
  comm::internal::rethrow_first(comm::internal::run_ranks(2, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    comm::NcclComm world = comm::NcclComm::create_world(*bootstraps[rank], milliseconds(120000));
    comm::NcclComm alone = world.split({{0}, {1}}, {}, milliseconds(120000));
    comm::NcclComm reversed = world.split({{1, 0}}, {}, milliseconds(120000));
    comm::NcclComm same = world.split({{0, 1}}, {}, milliseconds(120000));
    const std::string smaller = refusal({{&world, &alone}});
    EXPECT_NE(smaller.find("group 0's reduce-scatter communicator spans 1 ranks"), std::string::npos) << smaller;
    const std::string reordered = refusal({{&world, &reversed}});
    EXPECT_NE(reordered.find("group 0's reduce-scatter communicator spans 2 ranks with this one at " +
                             std::to_string(1 - rank)),
              std::string::npos)
        << reordered;
    CudaBackend backend(rank, {CudaGroup{&world, &same}}, milliseconds(120000));
    EXPECT_EQ(backend.group_size(0), 2);
    EXPECT_EQ(backend.group_rank(0), rank);
  }));
}

// A 40 x 64 BF16 weight on the device: its shard holding `host`, an FP32 main grad filled with
// `main_grad_value`, and a non-blocking stream; registered with register_in, freed with the test.
struct DeviceWeight {
  static constexpr std::int64_t kRows = 40, kCols = 64;  // BF16, G = 1: 48 padded rows
  explicit DeviceWeight(std::vector<std::uint16_t> shard_values, float main_grad_value = 0.0f)
      : host(std::move(shard_values)) {
    must(cudaMalloc(&shard, host.size() * 2));
    must(cudaMalloc(reinterpret_cast<void**>(&main_grad), kRows * kCols * sizeof(float)));
    must(cudaMemcpy(shard, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    const std::vector<float> initial(kRows * kCols, main_grad_value);
    must(cudaMemcpy(main_grad, initial.data(), initial.size() * sizeof(float), cudaMemcpyHostToDevice));
    must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~DeviceWeight() {
    cudaStreamDestroy(stream);
    cudaFree(shard);
    cudaFree(main_grad);
  }
  DeviceWeight(const DeviceWeight&) = delete;
  DeviceWeight& operator=(const DeviceWeight&) = delete;

  WeightId register_in(Runtime& runtime) const {
    WeightDesc desc;
    desc.name = "w";
    desc.shard = shard;
    desc.rows = kRows;
    desc.cols = kCols;
    desc.main_grad = main_grad;
    return runtime.register_weight(desc);
  }
  std::vector<float> main_grad_on_host() const {
    std::vector<float> out(kRows * kCols);
    must(cudaMemcpy(out.data(), main_grad, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
  static void must(cudaError_t status) {
    if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + cudaGetErrorString(status));
  }

  std::vector<std::uint16_t> host;
  void* shard = nullptr;
  float* main_grad = nullptr;
  cudaStream_t stream = nullptr;
};

TEST(CudaBackend, SizeOneNcclGroupEndToEnd) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  Runtime runtime(backend, RuntimeConfig{});
  std::vector<std::uint16_t> values(DeviceWeight::kRows * DeviceWeight::kCols);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::uint16_t>(0x3C00 + (i % 512));
  const DeviceWeight weight(values);
  const cudaStream_t stream = weight.stream;
  const WeightId id = weight.register_in(runtime);
  runtime.shard_updated(&id, 1, stream);
  for (int step = 0; step < 3; ++step) {
    const auto out = runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, stream);
    std::vector<std::uint16_t> got(values.size());
    ASSERT_EQ(cudaMemcpyAsync(got.data(), out[0], got.size() * 2, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    runtime.release(&id, 1, stream);
    float* grad = runtime.grad_buffer(id, stream).data;  // zero-filled: add
    std::vector<float> ones(values.size(), 1.0f);
    ASSERT_EQ(cudaMemcpyAsync(grad, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
    runtime.finalize(&id, 1, true, stream);
    runtime.drain(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(std::memcmp(got.data(), values.data(), values.size() * 2), 0) << "step " << step;
  }
  for (float g : weight.main_grad_on_host()) ASSERT_EQ(g, 3.0f);
  EXPECT_GT(runtime.stats().prefetch_hits, 0);
}

// Refills every reduced grad buffer with NaN bytes (on its stream, once its rows are dead), so a
// buffer handed out again holds NaN wherever the runtime does not fill it.
class PoisoningCudaBackend : public CudaBackend {
 public:
  using CudaBackend::CudaBackend;
  // The reduction is in place: everything but this rank's result is dead once it ran, and the result
  // once the main-grad add read it.
  void reduce_scatter_mean(Stream stream, int group, const float* send, float* recv, std::int64_t recv_count) override {
    CudaBackend::reduce_scatter_mean(stream, group, send, recv, recv_count);
    const std::int64_t before = recv - send, after = group_size(group) * recv_count - before - recv_count;
    fill(stream, const_cast<float*>(send), 0xFF, before * static_cast<std::int64_t>(sizeof(float)));
    fill(stream, recv + recv_count, 0xFF, after * static_cast<std::int64_t>(sizeof(float)));
  }
  void add(Stream stream, const float* src, float* dst, std::int64_t count) override {
    CudaBackend::add(stream, src, dst, count);
    fill(stream, const_cast<float*>(src), 0xFF, count * static_cast<std::int64_t>(sizeof(float)));
  }
};

TEST(CudaBackend, UndefinedGradBufferZeroesOnlyItsPaddingRowsAndIsWrittenByTheConsumer) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  PoisoningCudaBackend backend(0, group.groups(), milliseconds(30000));
  RuntimeConfig config;
  config.grads_into_main_grad = false;  // the buffer path of larger groups, on this size-1 group
  Runtime runtime(backend, config);
  const std::int64_t rows = DeviceWeight::kRows, cols = DeviceWeight::kCols;
  const DeviceWeight weight(std::vector<std::uint16_t>(rows * cols, 0x3F80));
  const cudaStream_t stream = weight.stream;
  const WeightId id = weight.register_in(runtime);
  const std::int64_t padded_rows = runtime.registry().get(id).geometry.padded_rows;
  ASSERT_GT(padded_rows, rows);
  runtime.shard_updated(&id, 1, stream);
  const std::vector<float> ones(rows * cols, 1.0f);
  for (int step = 0; step < 3; ++step) {  // from step 1 on the pool hands back poisoned buffers
    const GradBuffer grad = runtime.grad_buffer(id, stream, GradInit::kUndefined);
    EXPECT_TRUE(grad.overwrite);
    std::vector<float> padding((padded_rows - rows) * cols, -1.0f);
    ASSERT_EQ(cudaMemcpyAsync(padding.data(), grad.data + rows * cols, padding.size() * sizeof(float),
                              cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(grad.data, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
              cudaSuccess);  // the consumer's write (a GEMM with beta = 0)
    EXPECT_FALSE(runtime.grad_buffer(id, stream, GradInit::kUndefined).overwrite);
    runtime.finalize(&id, 1, true, stream);
    runtime.drain(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (float v : padding) ASSERT_EQ(v, 0.0f) << "padding row not zeroed, step " << step;
  }
  for (float g : weight.main_grad_on_host()) ASSERT_EQ(g, 3.0f);
}

// Size-1 group, grads_into_main_grad (the default): the buffer is the main grad, the consumer's adds on
// its stream accumulate there over steps, and finalize moves nothing; the grad-ready callback runs
// after the consumer's add, on the reduce-scatter stream.
TEST(CudaBackend, UndefinedGradBufferOfASizeOneGroupIsTheMainGrad) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  std::atomic<int> ready{0};
  RuntimeConfig config;
  config.grads.grad_ready = [&ready](WeightId) { ++ready; };
  Runtime runtime(backend, config);
  const std::int64_t count = DeviceWeight::kRows * DeviceWeight::kCols;
  const DeviceWeight weight(std::vector<std::uint16_t>(count, 0x3F80), 0.5f);
  const DeviceWeight wgrad(std::vector<std::uint16_t>(count), 1.0f);  // its main grad: the wgrad, all ones
  const cudaStream_t stream = weight.stream;
  const WeightId id = weight.register_in(runtime);
  runtime.shard_updated(&id, 1, stream);
  for (int step = 0; step < 3; ++step) {
    const GradBuffer grad = runtime.grad_buffer(id, stream, GradInit::kUndefined);
    EXPECT_EQ(grad.data, weight.main_grad);
    EXPECT_FALSE(grad.overwrite);
    backend.add(stream, wgrad.main_grad, grad.data, count);  // the consumer's wgrad, added (beta = 1)
    runtime.finalize(&id, 1, true, stream);
    runtime.drain(stream);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(ready.load(), 3);
  EXPECT_EQ(runtime.grads_stats().reduce_scatters, 0);
  EXPECT_EQ(runtime.grads_stats().pool_buffers, 0);
  for (float g : weight.main_grad_on_host()) ASSERT_EQ(g, 3.5f);
}

// Main grads declared zero on CUDA, size-1 group: the first separate buffer is the main grad (written),
// or, with grads_into_main_grad off, a pooled buffer whose rows are copied (CudaBackend::copy); the
// second microbatch adds as before.
TEST(CudaBackend, MainGradsDeclaredZeroAreWrittenOrCopiedNotAdded) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (bool into : {true, false}) {
    SCOPED_TRACE(into ? "into the main grad" : "copied");
    SizeOneGroup group;
    PoisoningCudaBackend backend(0, group.groups(), milliseconds(30000));
    RuntimeConfig config;
    config.grads_into_main_grad = into;
    Runtime runtime(backend, config);
    const std::int64_t count = DeviceWeight::kRows * DeviceWeight::kCols;
    const DeviceWeight weight(std::vector<std::uint16_t>(count, 0x3F80), 9.0f);
    const DeviceWeight wgrad(std::vector<std::uint16_t>(count), 1.5f);
    const cudaStream_t stream = weight.stream;
    const WeightId id = weight.register_in(runtime);
    runtime.shard_updated(&id, 1, stream);
    ASSERT_EQ(cudaMemsetAsync(weight.main_grad, 0, count * sizeof(float), stream), cudaSuccess);
    runtime.main_grads_zeroed(&id, 1);
    for (int mb = 0; mb < 2; ++mb) {
      const GradBuffer grad = runtime.grad_buffer(id, stream, GradInit::kUndefinedSeparate);
      EXPECT_EQ(grad.data == weight.main_grad, into && mb == 0) << "mb " << mb;
      EXPECT_TRUE(grad.overwrite) << "mb " << mb;
      ASSERT_EQ(cudaMemcpyAsync(grad.data, wgrad.main_grad, count * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                cudaSuccess);  // the consumer's write (beta = 0)
      runtime.finalize(&id, 1, true, stream);
    }
    runtime.drain(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (float g : weight.main_grad_on_host()) ASSERT_EQ(g, 3.0f);
    EXPECT_EQ(runtime.grads_stats().zeroed_handouts, into ? 1 : 0);
    EXPECT_EQ(runtime.grads_stats().zeroed_copies, into ? 0 : 1);
  }
}

TEST(CudaBackend, GemmLayoutOfEveryWireFormatMatchesTheCpuReference) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  using kernels::WireFormat;
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  EXPECT_NE(backend.side_stream(0, Role::kGather), backend.side_stream(0, Role::kReduceScatter));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const std::int64_t rows = 40, cols = 64;
  const std::vector<kernels::WireSpec> specs = {
      {WireFormat::kBF16},
      {WireFormat::kFP8},
      {WireFormat::kMXFP8, kernels::ScaleRounding::kRceil},
      {WireFormat::kMXFP8, kernels::ScaleRounding::kFloor},
      {WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k1D},
      {WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k2D}};
  for (const kernels::WireSpec& spec : specs) {
    const std::string name = kernels::to_string(spec.format) + "/" + kernels::to_string(spec.nvfp4_blocks) + "/" +
                             kernels::to_string(spec.mx_rounding);
    Runtime runtime(backend, RuntimeConfig{});
    std::vector<float> full(rows * cols);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& v : full) v = normal(rng);
    const auto geometry = kernels::weight_geometry(spec.format, rows, cols, 1);
    float* shard = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&shard), full.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(shard, full.data(), full.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    WeightDesc desc;
    desc.name = "w";
    desc.shard = shard;
    desc.dtype = kernels::SourceDtype::kFP32;
    desc.rows = rows;
    desc.cols = cols;
    desc.wire = spec;
    const WeightId id = runtime.register_weight(desc);
    runtime.shard_updated(&id, 1, stream);

    // The CPU reference of the same chunk: pack with the weight's amax, then both unpacks.
    const kernels::ChunkLayout layout = runtime.registry().get(id).layout;
    std::vector<unsigned char> chunk = reference_chunk(spec, full, rows, cols, layout);
    const kernels::GatheredChunks in{chunk.data(), layout.chunk_bytes, geometry};
    std::vector<std::uint16_t> bf16(rows * cols);
    kernels::unpack_reference(spec, in, bf16.data(), rows * cols * 2);

    for (int step = 0; step < 2; ++step) {  // the second step is a prefetch hit
      const auto gemm = runtime.materialize_views(&id, 1, Phase::kForward, 0, Layout::kGemm, stream);
      const auto plain = runtime.materialize_views(&id, 1, Phase::kForward, 0, Layout::kBF16, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto got_bf16 = to_host(plain[0].data, rows * cols * 2);
      EXPECT_EQ(std::memcmp(got_bf16.data(), bf16.data(), got_bf16.size()), 0) << name << " bf16 step " << step;
      const Materialized& m = gemm[0];
      if (spec.format == WireFormat::kBF16) {
        EXPECT_EQ(m.layout, Layout::kBF16) << name;
        EXPECT_EQ(to_host(m.data, rows * cols * 2), to_host(plain[0].data, rows * cols * 2)) << name;
      } else {
        const auto sizes = kernels::gemm_layout_sizes(spec, geometry);
        std::vector<unsigned char> data(sizes.data_bytes), scales(sizes.scales_bytes),
            data_t(sizes.transpose_supported ? sizes.transposed_data_bytes : 0),
            scales_t(sizes.transpose_supported ? sizes.transposed_scales_bytes : 0);
        std::vector<float> decode(sizes.decode_scale_count);
        kernels::GemmOutputs out;
        out.data = data.data();
        out.data_capacity = sizes.data_bytes;
        out.scales = scales.empty() ? nullptr : scales.data();
        out.scales_capacity = sizes.scales_bytes;
        out.transposed_data = data_t.empty() ? nullptr : data_t.data();
        out.transposed_data_capacity = static_cast<std::int64_t>(data_t.size());
        out.transposed_scales = scales_t.empty() ? nullptr : scales_t.data();
        out.transposed_scales_capacity = static_cast<std::int64_t>(scales_t.size());
        out.decode_scales = decode.empty() ? nullptr : decode.data();
        out.decode_scales_capacity = sizes.decode_scale_count;
        kernels::unpack_gemm_reference(spec, in, out);
        EXPECT_EQ(m.layout, Layout::kGemm) << name;
        EXPECT_EQ(to_host(m.data, sizes.data_bytes), data) << name << " data step " << step;
        EXPECT_EQ(to_host(m.scales, static_cast<std::int64_t>(scales.size())), scales) << name << " scales";
        EXPECT_EQ(to_host(m.transposed_data, static_cast<std::int64_t>(data_t.size())), data_t) << name << " data_t";
        EXPECT_EQ(to_host(m.transposed_scales, static_cast<std::int64_t>(scales_t.size())), scales_t) << name;
        const auto got = to_host(m.decode_scales, static_cast<std::int64_t>(decode.size() * sizeof(float)));
        EXPECT_EQ(std::memcmp(got.data(), decode.data(), got.size()), 0) << name << " decode scales";
        EXPECT_EQ(m.transposed_data == nullptr, data_t.empty()) << name;
      }
      runtime.release(&id, 1, stream, Layout::kGemm);
      runtime.release(&id, 1, stream, Layout::kBF16);
      runtime.drain(stream);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_GT(runtime.stats().prefetch_hits, 0) << name;
    runtime.unregister_weight(id);
    cudaFree(shard);
  }
  cudaStreamDestroy(stream);
}

// An MoE-style key: twelve weights of different shapes over three quantized wires, materialized in
// one call, so the fill unpacks each wire's weights with one unpack_many (unpack_many_cuda). Every
// weight must equal the CPU reference of its chunk, bit for bit, on the exposed fill and on a hit.
TEST(CudaBackend, AKeyOfManyQuantizedWeightsUnpacksEachToTheCpuReference) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Runtime runtime(backend, RuntimeConfig{});
  ReferenceWeights weights(runtime);
  const std::vector<WeightId>& ids = weights.ids;
  runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
  for (int step = 0; step < 2; ++step) {  // the second step is a prefetch hit
    const auto views = runtime.materialize_views(ids.data(), static_cast<std::int64_t>(ids.size()), Phase::kForward,
                                                 0, Layout::kBF16, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (std::size_t i = 0; i < ids.size(); ++i) weights.expect_equal(i, views[i].data, "step " + std::to_string(step));
    runtime.release(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
    runtime.drain(stream);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_GT(runtime.stats().prefetch_hits, 0);
  for (WeightId id : ids) runtime.unregister_weight(id);
  cudaStreamDestroy(stream);
}

// The same weights as one key each, prefetched four ahead in batches of 2 and 4: each batch's
// all-gathers go out as one NCCL group and its unpacks as one launch per wire over several slots.
// Every weight of every step equals the CPU reference, every consume after the recording step hits,
// and each batch carries k keys (12 consumes a step).
TEST(CudaBackend, BatchedPrefetchesMatchTheCpuReference) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (int batch : {2, 4}) {
    SizeOneGroup group;
    CudaBackend backend(0, group.groups(), milliseconds(30000));
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    RuntimeConfig config;
    config.depth = 4;
    config.prefetch_batch = batch;
    Runtime runtime(backend, config);
    ReferenceWeights weights(runtime);
    const std::vector<WeightId>& ids = weights.ids;
    runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
    constexpr int kSteps = 3;
    for (int step = 0; step < kSteps; ++step) {
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const auto out = runtime.materialize(&ids[i], 1, Phase::kForward, 0, Layout::kBF16, stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        weights.expect_equal(i, out[0], "batch " + std::to_string(batch) + ", step " + std::to_string(step));
        runtime.release(&ids[i], 1, stream);
      }
      runtime.drain(stream);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const RuntimeStats s = runtime.stats();
    EXPECT_EQ(s.prefetch_hits, (kSteps - 1) * ReferenceWeights::kCount) << runtime.stats_json();
    EXPECT_EQ(s.prefetch_batches * batch, s.prefetches) << runtime.stats_json();
    for (WeightId id : ids) runtime.unregister_weight(id);
    cudaStreamDestroy(stream);
  }
}

// The main-grad add (16-byte path with a scalar tail, scalar path off a 16-byte boundary) equals the
// FP32 sum computed on the host, bit for bit, for fresh random values and counts around the vector width.
TEST(CudaBackend, MainGradAddEqualsTheHostSumForEveryCountAndAlignment) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> value(0.0f, 3.0f);
  for (const std::int64_t count : {1, 3, 4, 5, 7, 8, 1023, 1025, 300001}) {
    for (const int offset : {0, 1, 3}) {  // floats from a 256-byte-aligned allocation
      SCOPED_TRACE("count " + std::to_string(count) + ", offset " + std::to_string(offset));
      std::vector<float> src(static_cast<std::size_t>(count + offset)), dst(src.size());
      for (std::size_t i = 0; i < src.size(); ++i) {
        src[i] = value(rng);
        dst[i] = value(rng);
      }
      float* d_src = nullptr;
      float* d_dst = nullptr;
      ASSERT_EQ(cudaMalloc(&d_src, src.size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_dst, dst.size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_src, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_dst, dst.data(), dst.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      add_fp32_cuda(d_src + offset, d_dst + offset, count, nullptr);
      std::vector<float> got(dst.size());
      ASSERT_EQ(cudaMemcpy(got.data(), d_dst, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      cudaFree(d_src);
      cudaFree(d_dst);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const float want = i < static_cast<std::size_t>(offset) ? dst[i] : dst[i] + src[i];
        ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0) << "value " << i << ": " << got[i] << " != " << want;
      }
    }
  }
}

TEST(CudaBackend, StreamPrioritiesOutsideTheDeviceRangeAreRefused) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  const comm::StreamPriorityRange range = comm::stream_priority_range(0);
  CudaStreamPriorities priorities;
  priorities.reduce_scatter = range.least;
  CudaBackend backend(0, group.groups(), milliseconds(30000), {priorities});
  int priority = 0;
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(backend.side_stream(0, Role::kReduceScatter)), &priority),
            cudaSuccess);
  EXPECT_EQ(priority, range.least);
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(backend.side_stream(0, Role::kGather)), &priority),
            cudaSuccess);
  EXPECT_EQ(priority, range.greatest);
  priorities.gather = range.least + 1;
  EXPECT_THROW(CudaBackend(0, group.groups(), milliseconds(30000), {priorities}), std::invalid_argument);
}

TEST(CudaBackend, EachGroupsSideStreamsTakeThatGroupsPriorities) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  const comm::StreamPriorityRange range = comm::stream_priority_range(0);
  // Two groups over the same communicators (as the C ABI builds them when the expert grid group
  // equals the dense one), each with its own priorities.
  std::vector<CudaGroup> groups = {group.groups()[0], group.groups()[0]};
  CudaStreamPriorities dense, expert;
  dense.gather = range.greatest;
  dense.reduce_scatter = range.least;
  expert.gather = range.least;
  expert.reduce_scatter = range.greatest;
  CudaBackend backend(0, groups, milliseconds(30000), {dense, expert});
  const auto priority_of = [&](int g, Role role) {
    int priority = 0;
    EXPECT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(backend.side_stream(g, role)), &priority), cudaSuccess);
    return priority;
  };
  EXPECT_EQ(priority_of(0, Role::kGather), range.greatest);
  EXPECT_EQ(priority_of(0, Role::kReduceScatter), range.least);
  EXPECT_EQ(priority_of(1, Role::kGather), range.least);
  EXPECT_EQ(priority_of(1, Role::kReduceScatter), range.greatest);
}

}  // namespace
}  // namespace gtp::remat
