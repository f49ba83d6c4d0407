// The one-GPU rig (a test double for NCCL, one_gpu_rig.h) itself: its three collectives against their
// definitions for G = 1, 2, 4, 8 (in place and not, odd sizes, two groups whose communicators
// interleave), eagerly and captured into a CUDA graph replayed between eager calls; its argument
// checks. Skips without a GPU, printing why. The runtime on the rig: one_gpu_rig_diverge_test.cc.
#include "testing/rig/one_gpu_rig.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "testing/rig/rig_ranks.h"

namespace gtp::remat {
namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

std::vector<float> values(std::int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(OneGpuRig, BadPartitionsAreRefusedBeforeAnyCudaCall) {
  EXPECT_THROW(OneGpuRig(0, 0), std::invalid_argument);
  EXPECT_THROW(OneGpuRig(0, 2, {{{0, 0}}}), std::invalid_argument);     // rank 0 twice, rank 1 missing
  EXPECT_THROW(OneGpuRig(0, 2, {{{0}}}), std::invalid_argument);        // rank 1 left out
  EXPECT_THROW(OneGpuRig(0, 2, {{{0, 2}, {1}}}), std::invalid_argument);  // no rank 2
}

// What every rank of one round holds, by definition: G ranks' inputs, per collective.
struct Round {
  std::int64_t bytes_per_rank, count;  // all-gather bytes; all-reduce and reduce-scatter counts
  unsigned seed;
};

// Device buffers for check_rounds, from the rank's arena (DeviceCollectives::allocate): cudaMalloc /
// cudaFree may wait for the whole device, a peer waiting for this rank included.
struct RoundBuffers {
  unsigned char* gather = nullptr;  // recv; send in place, else `send`
  unsigned char* send = nullptr;
  float* data = nullptr;
  float* rs_send = nullptr;
  float* rs_recv = nullptr;
  RoundBuffers(int size, const std::vector<Round>& rounds, DeviceCollectives& t) {
    std::int64_t bytes = 16, count = 4;
    for (const Round& r : rounds) {
      bytes = std::max(bytes, r.bytes_per_rank);
      count = std::max(count, r.count);
    }
    gather = static_cast<unsigned char*>(t.allocate(size * bytes));
    send = static_cast<unsigned char*>(t.allocate(bytes));
    data = static_cast<float*>(t.allocate(count * 4));
    rs_send = static_cast<float*>(t.allocate(size * count * 4));
    rs_recv = static_cast<float*>(t.allocate(count * 4));
  }
};

// This rank of group `group` runs the three collectives of `rounds` through `t` (gathers and maxima on
// `stream`, reduce-scatters on `rs_stream`) and
// checks each result against the definition: the all-gather is the concatenation; the max is the
// element-wise max; the reduce-scatter the mean, summed in the host backend's ring order (rank + 1
// first), so the bits match HostComm's. Synchronizes only its own streams.
void check_rounds(DeviceCollectives& t, cudaStream_t stream, cudaStream_t rs_stream, int group,
                  const std::vector<Round>& rounds, bool in_place, RoundBuffers& b, testing::PinnedStage& stage) {
  const int size = t.size(group), rank = t.rank(group);
  for (const Round& r : rounds) {
    // All-gather: byte i of rank q is (7 q + seed + i) mod 251.
    std::vector<unsigned char> mine(r.bytes_per_rank), all(size * r.bytes_per_rank);
    for (int q = 0; q < size; ++q)
      for (std::int64_t i = 0; i < r.bytes_per_rank; ++i) all[q * r.bytes_per_rank + i] = (q * 7 + r.seed + i) % 251;
    std::memcpy(mine.data(), all.data() + rank * r.bytes_per_rank, r.bytes_per_rank);
    CUDA_OK(cudaMemsetAsync(b.gather, 0xEE, all.size(), stream));
    unsigned char* send = in_place ? b.gather + rank * r.bytes_per_rank : b.send;
    stage.upload(send, mine.data(), static_cast<std::int64_t>(mine.size()), stream);
    t.all_gather(stream, group, send, b.gather, r.bytes_per_rank);
    std::vector<unsigned char> got(all.size());
    stage.download(got.data(), b.gather, static_cast<std::int64_t>(got.size()), stream);

    // Max and mean over FP32 values of every rank.
    std::vector<std::vector<float>> inputs;
    for (int q = 0; q < size; ++q) inputs.push_back(values(size * r.count, r.seed * 31 + q));
    stage.upload(b.data, inputs[rank].data(), r.count * 4, stream);
    t.all_reduce_max(stream, group, b.data, r.count);
    std::vector<float> maxima(r.count);
    stage.download(maxima.data(), b.data, r.count * 4, stream);
    float* rs_recv = in_place ? b.rs_send + rank * r.count : b.rs_recv;
    stage.upload(b.rs_send, inputs[rank].data(), size * r.count * 4, rs_stream);
    t.reduce_scatter_mean(rs_stream, group, b.rs_send, rs_recv, r.count);
    std::vector<float> means(r.count);
    stage.download(means.data(), rs_recv, r.count * 4, rs_stream);
    CUDA_OK(cudaStreamSynchronize(rs_stream));
    stage.finish(stream);

    EXPECT_EQ(got, all) << "all-gather, rank " << rank << " of " << size << ", " << r.bytes_per_rank << " bytes";
    for (std::int64_t i = 0; i < r.count; ++i) {
      float m = inputs[0][i], sum = inputs[(rank + 1) % size][rank * r.count + i];
      for (int q = 1; q < size; ++q) m = std::max(m, inputs[q][i]);
      for (int k = 2; k <= size; ++k) sum += inputs[(rank + k) % size][rank * r.count + i];
      ASSERT_EQ(maxima[i], m) << "max element " << i << " rank " << rank << " of " << size;
      const float mean = sum / static_cast<float>(size);
      ASSERT_EQ(std::memcmp(&means[i], &mean, 4), 0) << "mean element " << i << " rank " << rank << " of " << size;
    }
  }
}

class RigCollectives : public ::testing::TestWithParam<int> {};

TEST_P(RigCollectives, MatchTheirDefinitionsEagerly) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  const int g = GetParam();
  for (OneGpuRig::Flags flags : testing::rig_flag_modes()) {
    OneGpuRig rig(0, g, {}, flags, std::chrono::seconds(20));
    std::printf("G = %d, flags by %s\n", g, rig.flags().c_str());
    std::fflush(stdout);
    auto stages = testing::pinned_stages(g, std::int64_t{32} << 20);  // before any rank runs
    const std::vector<Round> rounds = {{16, 8, 1}, {4096, 1000, 2}, {3, 1, 3}, {1000003, 77777, 4}};
    testing::on_rig_ranks(rig, [&](int rank) {
      CUDA_OK(cudaSetDevice(0));
      auto t = rig.transport(rank);
      cudaStream_t gather = nullptr, rs = nullptr;
      CUDA_OK(cudaStreamCreateWithFlags(&gather, cudaStreamNonBlocking));
      CUDA_OK(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
      {
        RoundBuffers buffers(g, rounds, *t);
        // The gather communicator's two kinds on one stream, the reduce-scatters on another (as the
        // backend issues them); ranks differ in placement (in place or not), not in order.
        check_rounds(*t, gather, rs, 0, rounds, rank % 2 == 0, buffers, *stages[rank]);
      }
      cudaStreamDestroy(gather);
      cudaStreamDestroy(rs);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, RigCollectives, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "G" + std::to_string(info.param); });

// A rank's gather and reduce-scatter communicators are separate: a reduce-scatter may run while a
// gather of the same group waits for a slow peer. Two groups over 4 ranks (pairs {0,1},{2,3} and
// {0,2},{1,3}) interleave their collectives in a different order on each rank's two streams.
TEST(OneGpuRig, CommunicatorsOfTwoGroupsAndTwoRolesInterleave) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  OneGpuRig rig(0, 4, {{{0, 1}, {2, 3}}, {{0, 2}, {1, 3}}}, testing::rig_flags_from_env());
  auto stages = testing::pinned_stages(4, std::int64_t{4} << 20);  // before any rank runs
  testing::on_rig_ranks(rig, [&](int rank) {
    CUDA_OK(cudaSetDevice(0));
    auto t = rig.transport(rank);
    ASSERT_EQ(t->group_count(), 2);
    EXPECT_EQ(t->size(0), 2);
    EXPECT_EQ(t->rank(0), rank % 2);
    EXPECT_EQ(t->rank(1), rank / 2);
    const std::vector<Round> rounds = {{64, 33, 9}, {512, 5, 10}};
    std::vector<cudaStream_t> streams(4);
    for (cudaStream_t& s : streams) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    RoundBuffers buffers(2, rounds, *t);
    for (int group : rank % 2 == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0}) {
      check_rounds(*t, streams[2 * group], streams[2 * group + 1], group, rounds, false, buffers, *stages[rank]);
    }
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
  });
}

// The flags hold no sequence number: a graph that captured collectives replays them any number of
// times, between eager collectives on the same communicator, and every replay moves that replay's data.
TEST(OneGpuRig, CapturedCollectivesReplayBetweenEagerOnes) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (OneGpuRig::Flags flags : testing::rig_flag_modes()) {
    const int g = 4;
    const std::int64_t count = 3000;
    OneGpuRig rig(0, g, {}, flags, std::chrono::seconds(20));
    std::printf("flags by %s\n", rig.flags().c_str());
    std::fflush(stdout);
    auto stages = testing::pinned_stages(g, std::int64_t{4} << 20);  // before any rank runs
    testing::on_rig_ranks(rig, [&](int rank) {
      CUDA_OK(cudaSetDevice(0));
      auto t = rig.transport(rank);
      cudaStream_t stream = nullptr;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      auto* send = static_cast<float*>(t->allocate(g * count * 4));
      auto* recv = static_cast<float*>(t->allocate(count * 4));
      auto* gathered = static_cast<float*>(t->allocate(g * count * 4));
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      t->reduce_scatter_mean(stream, 0, send, recv, count);
      t->all_gather(stream, 0, recv, gathered, count * 4);
      cudaGraph_t graph = nullptr;
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      cudaGraphExec_t exec = nullptr;
      // Instantiation may wait for the device while holding the context's lock (one_gpu_rig.h).
      rig.graph_barrier(rank);
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      rig.graph_barrier(rank);
      for (int round = 0; round < 5; ++round) {
        std::vector<float> mine = values(g * count, 100 * round + rank);
        stages[rank]->upload(send, mine.data(), static_cast<std::int64_t>(mine.size()) * 4, stream);
        if (round % 2 == 0) {
          CUDA_OK(cudaGraphLaunch(exec, stream));
        } else {
          t->reduce_scatter_mean(stream, 0, send, recv, count);
          t->all_gather(stream, 0, recv, gathered, count * 4);
        }
        std::vector<float> got(g * count);
        stages[rank]->download(got.data(), gathered, static_cast<std::int64_t>(got.size()) * 4, stream);
        stages[rank]->finish(stream);
        std::vector<std::vector<float>> inputs;
        for (int q = 0; q < g; ++q) inputs.push_back(values(g * count, 100 * round + q));
        for (int owner = 0; owner < g; ++owner) {
          for (std::int64_t i = 0; i < count; i += 7) {
            float sum = inputs[(owner + 1) % g][owner * count + i];
            for (int k = 2; k <= g; ++k) sum += inputs[(owner + k) % g][owner * count + i];
            ASSERT_EQ(got[owner * count + i], sum / g) << "round " << round << " rank " << rank << " owner " << owner;
          }
        }
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(stream);
    });
  }
}

TEST(OneGpuRig, ACommunicatorOnASecondStreamIsRefused) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  OneGpuRig rig(0, 1);
  auto t = rig.transport(0);
  EXPECT_THROW(rig.transport(0), std::invalid_argument);
  cudaStream_t a = nullptr, b = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  float* x = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&x), 16));
  t->all_reduce_max(a, 0, x, 1);
  try {
    t->all_gather(b, 0, x, x, 4);
    ADD_FAILURE() << "a second stream was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("second stream"), std::string::npos) << e.what();
  }
  t->reduce_scatter_mean(b, 0, x, x, 1);  // the reduce-scatter communicator is another one
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(x);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// CudaBackend's test-transport constructor refuses a null transport and a priority count that is not
// one per group before any CUDA call (runs without a GPU).
class OneGroup : public DeviceCollectives {
 public:
  int group_count() const override { return 1; }
  int size(int) const override { return 2; }
  int rank(int) const override { return 0; }
  void all_gather(cudaStream_t, int, const void*, void*, std::int64_t) override { ADD_FAILURE() << "called"; }
  void all_reduce_max(cudaStream_t, int, float*, std::int64_t) override { ADD_FAILURE() << "called"; }
  void reduce_scatter_mean(cudaStream_t, int, const float*, float*, std::int64_t) override { ADD_FAILURE() << "called"; }
  void* allocate(std::int64_t) override {
    ADD_FAILURE() << "called";
    return nullptr;
  }
  void deallocate(void*) override { ADD_FAILURE() << "called"; }
};

TEST(OneGpuRig, CudaBackendRefusesABadTestTransportBeforeAnyCudaCall) {
  const auto refusal = [](std::unique_ptr<DeviceCollectives> t, std::vector<CudaStreamPriorities> p) -> std::string {
    try {
      CudaBackend backend(0, std::move(t), std::move(p));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refusal(nullptr, {}).find("test transport is null"), std::string::npos);
  EXPECT_NE(refusal(std::make_unique<OneGroup>(), {{}, {}}).find("2 stream priority sets for 1 groups"),
            std::string::npos);
}

}  // namespace
}  // namespace gtp::remat
