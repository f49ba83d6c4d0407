#include "comm/streams.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/internal/cuda_test_util.h"

namespace gtp::comm {
namespace {

TEST(StreamRole, NamesMatchTheDesign) {
  EXPECT_STREQ(role_name(StreamRole::kAllGatherForward), "ag_fwd");
  EXPECT_STREQ(role_name(StreamRole::kAllGatherBackward), "ag_bwd");
  EXPECT_STREQ(role_name(StreamRole::kAllGatherRecompute), "ag_recompute");
  EXPECT_STREQ(role_name(StreamRole::kReduceScatterBackward), "rs_bwd");
}

TEST(StreamPool, DefaultsToTheGreatestPriorityAndReusesStreams) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  StreamPool pool(0);
  const StreamPriorityRange range = pool.priority_range();
  EXPECT_LE(range.greatest, range.least);

  cudaStream_t gather = pool.get("gtp_remat", StreamRole::kAllGatherForward);
  int priority = 1234;
  ASSERT_EQ(cudaStreamGetPriority(gather, &priority), cudaSuccess);
  EXPECT_EQ(priority, range.greatest);
  unsigned int flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(gather, &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking);

  EXPECT_EQ(pool.get("gtp_remat", StreamRole::kAllGatherForward), gather);
  EXPECT_NE(pool.get("gtp_remat", StreamRole::kAllGatherBackward), gather);
  EXPECT_NE(pool.get("tp", StreamRole::kAllGatherForward), gather);

  cudaStream_t low = pool.get("dp", StreamRole::kReduceScatterBackward, range.least);
  ASSERT_EQ(cudaStreamGetPriority(low, &priority), cudaSuccess);
  EXPECT_EQ(priority, range.least);
}

TEST(StreamPool, RejectsPrioritiesOutsideTheRangeOrConflicting) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  StreamPool pool(0);
  const StreamPriorityRange range = pool.priority_range();
  EXPECT_THROW(pool.get("g", StreamRole::kAllGatherForward, range.least + 1), std::invalid_argument);
  EXPECT_THROW(pool.get("g", StreamRole::kAllGatherForward, range.greatest - 1), std::invalid_argument);
  pool.get("g", StreamRole::kAllGatherForward, range.least);
  if (range.least != range.greatest) {
    EXPECT_THROW(pool.get("g", StreamRole::kAllGatherForward, range.greatest), std::invalid_argument);
  }
}

TEST(EventPool, ReusesReleasedEvents) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  EventPool events(0);
  events.reserve(2);
  EXPECT_EQ(events.created(), 2u);
  cudaEvent_t a = events.acquire();
  events.release(a);
  EXPECT_EQ(events.acquire(), a);
  events.acquire();
  events.acquire();  // the pool grows past its reservation
  EXPECT_EQ(events.created(), 3u);
}

// 64 MiB so that, without the ordering, the side copy would very likely read the buffer before the
// producer's memset finished.
constexpr std::size_t kBytes = std::size_t{64} << 20;

struct Buffers {
  unsigned char* a = nullptr;
  unsigned char* b = nullptr;
  Buffers() {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&a), kBytes), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&b), kBytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(b, 0, kBytes), cudaSuccess);
  }
  ~Buffers() {
    cudaFree(a);
    cudaFree(b);
  }
  void expect_b_filled_with(unsigned char value) const {
    std::vector<unsigned char> host(kBytes);
    ASSERT_EQ(cudaMemcpy(host.data(), b, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (std::size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(host[i], value) << "byte " << i;
    EXPECT_EQ(host[kBytes - 1], value);
  }
};

TEST(RunOrdered, SideStreamSeesTheProducersWorkAndTheConsumerSeesTheSides) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  StreamPool pool(0);
  EventPool events(0);
  cudaStream_t producer = nullptr, consumer = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  Buffers buffers;
  for (unsigned char value : {0x11, 0x22, 0x33}) {
    ASSERT_EQ(cudaMemsetAsync(buffers.a, value, kBytes, producer), cudaSuccess);
    run_ordered(events, producer, pool.get("gtp_remat", StreamRole::kAllGatherForward), consumer,
                [&](cudaStream_t side) {
                  ASSERT_EQ(cudaMemcpyAsync(buffers.b, buffers.a, kBytes, cudaMemcpyDeviceToDevice, side), cudaSuccess);
                });
    ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
    buffers.expect_b_filled_with(value);
  }
  EXPECT_LE(events.created(), 2u);  // events are recycled, not created per call
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

TEST(RunOrdered, IsCapturableIntoACudaGraphAfterWarmUp) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  StreamPool pool(0);
  EventPool events(0);
  events.reserve(4);
  cudaStream_t side = pool.get("gtp_remat", StreamRole::kAllGatherForward);  // created before capture
  cudaStream_t origin = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), cudaSuccess);
  Buffers buffers;

  ASSERT_EQ(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaMemsetAsync(buffers.a, 0x5A, kBytes, origin);
  run_ordered(events, origin, side, origin, [&](cudaStream_t s) {
    cudaMemcpyAsync(buffers.b, buffers.a, kBytes, cudaMemcpyDeviceToDevice, s);
  });
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(origin, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, origin), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(origin), cudaSuccess);
  buffers.expect_b_filled_with(0x5A);
  EXPECT_EQ(events.created(), 4u);  // nothing was created during capture
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(origin);
}

}  // namespace
}  // namespace gtp::comm
