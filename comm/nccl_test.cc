#include "comm/nccl.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "comm/errors.h"
#include "comm/internal/cuda_test_util.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"

namespace gtp::comm {
namespace {

using internal::rethrow_first;
using internal::run_ranks;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{120000};

TEST(SplitAssignment, ColorIsTheGroupAndKeyThePosition) {
  const std::vector<std::vector<int>> groups = {{0, 2, 4}, {5, 3, 1}};
  EXPECT_EQ(split_assignment(groups, 4, 6).color, 0);
  EXPECT_EQ(split_assignment(groups, 4, 6).key, 2);
  EXPECT_EQ(split_assignment(groups, 5, 6).color, 1);
  EXPECT_EQ(split_assignment(groups, 5, 6).key, 0);
  EXPECT_EQ(split_assignment(groups, 1, 6).key, 2);
  EXPECT_EQ(split_assignment({{0, 1}}, 3, 4).color, NCCL_SPLIT_NOCOLOR);
}

TEST(SplitAssignment, RejectsMalformedGroups) {
  EXPECT_THROW(split_assignment({{0, 1}, {1, 2}}, 0, 4), std::invalid_argument);  // rank 1 twice
  EXPECT_THROW(split_assignment({{0, 4}}, 0, 4), std::invalid_argument);          // outside the parent
  EXPECT_THROW(split_assignment({{0}, {}}, 0, 4), std::invalid_argument);         // empty group
  EXPECT_THROW(split_assignment({{-1}}, 0, 4), std::invalid_argument);
}

// NCCL all-gather of one int per rank on `comm`; returns what arrived.
std::vector<int> gather_ints(NcclComm& comm, int value) {
  const int n = comm.size();
  int *send = nullptr, *recv = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&send), sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&recv), n * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(send, &value, sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ncclResult_t result = ncclAllGather(send, recv, 1, ncclInt32, comm.get(), stream);
  EXPECT_TRUE(result == ncclSuccess || result == ncclInProgress) << ncclGetErrorString(result);
  comm.wait_enqueued(kTimeout);  // a non-blocking communicator may still be enqueuing
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<int> gathered(n);
  EXPECT_EQ(cudaMemcpy(gathered.data(), recv, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaStreamDestroy(stream);
  cudaFree(send);
  cudaFree(recv);
  return gathered;
}

TEST(NcclComm, WorldOfOneSplitsAndGathers) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto bootstrap = ThreadBootstrap::create_group(1, kTimeout);
  NcclComm world = NcclComm::create_world(*bootstrap[0], kTimeout, {-1, -1, -1, "", "world"});
  ASSERT_TRUE(world.valid());
  EXPECT_TRUE(world.owned());
  EXPECT_EQ(world.rank(), 0);
  EXPECT_EQ(world.size(), 1);
  EXPECT_NO_THROW(world.check_async_error());

  NcclGroupConfig config;
  config.comm_name = "gtp_remat";
  config.min_ctas = 1;
  config.max_ctas = 4;
  NcclComm group = world.split({{0}}, config, kTimeout);
  ASSERT_TRUE(group.valid());
  EXPECT_EQ(group.size(), 1);
  EXPECT_EQ(gather_ints(group, 42), std::vector<int>{42});

  NcclComm outside = world.split({}, config, kTimeout);  // no group contains rank 0
  EXPECT_FALSE(outside.valid());
  EXPECT_NO_THROW(world.check_async_error());
}

TEST(NcclComm, BorrowedCommunicatorIsNeverDestroyed) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto bootstrap = ThreadBootstrap::create_group(1, kTimeout);
  NcclComm world = NcclComm::create_world(*bootstrap[0], kTimeout);
  {
    NcclComm borrowed = NcclComm::borrow(world.get());
    EXPECT_FALSE(borrowed.owned());
    EXPECT_EQ(borrowed.size(), 1);
  }
  EXPECT_EQ(gather_ints(world, 7), std::vector<int>{7});  // still alive after the borrower went away
  EXPECT_THROW(NcclComm::borrow(nullptr), std::invalid_argument);
}

// Rank 0 of a world of two whose rank 1 never shows up: the broadcast of the unique id is local.
class LonelyRootBootstrap : public Bootstrap {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  void allgather(const void*, void*, std::size_t) override { throw CommError("not used", false); }
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override { throw CommError("not used", false); }
};

TEST(NcclComm, InitThatCannotCompleteIsAbortedAtTheTimeout) {
  GTP_REQUIRE_CUDA_DEVICES(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  LonelyRootBootstrap bootstrap;
  const auto start = std::chrono::steady_clock::now();
  try {
    NcclComm::create_world(bootstrap, milliseconds(3000));
    FAIL() << "init completed without rank 1";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out()) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(30000));
}

TEST(NcclComm, EveryVisibleGpuJoinsAndSplitsIntoEvenAndOddRanks) {
  GTP_REQUIRE_CUDA_DEVICES(2);
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  auto bootstraps = ThreadBootstrap::create_group(n, kTimeout);
  rethrow_first(run_ranks(n, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    NcclComm world = NcclComm::create_world(*bootstraps[rank], kTimeout);
    EXPECT_EQ(world.size(), n);
    std::vector<std::vector<int>> groups(2);
    for (int r = 0; r < n; ++r) groups[r % 2].push_back(r);
    NcclGroupConfig config;
    config.comm_name = "parity";
    NcclComm group = world.split(groups, config, kTimeout);
    ASSERT_TRUE(group.valid());
    EXPECT_EQ(group.rank(), rank / 2);
    EXPECT_EQ(gather_ints(group, rank * 100), [&] {
      std::vector<int> expected;
      for (int member : groups[rank % 2]) expected.push_back(member * 100);
      return expected;
    }());
    world.check_async_error();
  }));
}

}  // namespace
}  // namespace gtp::comm
