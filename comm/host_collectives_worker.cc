// One rank of the multi-process host transport test, started by gtp-launch (see
// host_multiprocess_test.cc): real processes, a UCX bootstrap from the environment, random data checked
// against a single-process reference. Every rank runs the same tests in the same order.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>

#include "comm/host.h"
#include "comm/internal/host_checks.h"
#include "comm/internal/test_util.h"
#include "comm/ucx_bootstrap.h"

namespace gtp::comm {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<UcxBootstrap> g_bootstrap;
std::uint64_t g_seed = 0;
constexpr milliseconds kTimeout{60000};

TEST(Bootstrap, CollectivesAcrossProcesses) { internal::exercise_bootstrap(*g_bootstrap); }

TEST(HostComm, AllGather) {
  HostComm comm(*g_bootstrap, kTimeout);
  internal::check_all_gather(comm, g_seed);
}

TEST(HostComm, ReduceScatterFp32Sum) {
  HostComm comm(*g_bootstrap, kTimeout);
  internal::check_reduce_scatter(comm, g_seed + 1, HostDataType::kFloat32, HostReduceOp::kSum);
}

TEST(HostComm, ReduceScatterFp32Mean) {
  HostComm comm(*g_bootstrap, kTimeout);
  internal::check_reduce_scatter(comm, g_seed + 2, HostDataType::kFloat32, HostReduceOp::kMean);
}

TEST(HostComm, ReduceScatterBf16Sum) {
  HostComm comm(*g_bootstrap, kTimeout);
  internal::check_reduce_scatter(comm, g_seed + 3, HostDataType::kBFloat16, HostReduceOp::kSum);
}

TEST(HostComm, ReduceScatterBf16Mean) {
  HostComm comm(*g_bootstrap, kTimeout);
  internal::check_reduce_scatter(comm, g_seed + 4, HostDataType::kBFloat16, HostReduceOp::kMean);
}

TEST(HostComm, AllReduceMax) {
  HostComm comm(*g_bootstrap, kTimeout);
  internal::check_all_reduce_max(comm, g_seed + 5);
}

TEST(HostComm, BarrierThenMoreCollectivesOnOneCommunicator) {
  HostComm comm(*g_bootstrap, kTimeout);
  for (int i = 0; i < 3; ++i) {
    comm.barrier();
    internal::check_all_reduce_max(comm, g_seed + 6 + i);
  }
}

TEST(HostComm, MismatchedCountsFailOnEveryRank) {
  HostComm comm(*g_bootstrap, kTimeout);
  internal::check_mismatched_reduce_scatter_fails(comm);
  // Keeps this rank's comm until every rank has failed: a rank that is slow to connect would otherwise
  // find the first one gone and fail in the constructor (HostComm.PeerGoneBeforeConnecting).
  g_bootstrap->barrier();
}

}  // namespace
}  // namespace gtp::comm

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  using gtp::comm::g_bootstrap;
  g_bootstrap = std::make_unique<gtp::comm::UcxBootstrap>(gtp::comm::UcxBootstrapConfig::from_env());
  // Rank 0 picks the seed and prints it, so a failure can be replayed.
  if (g_bootstrap->rank() == 0) gtp::comm::g_seed = std::random_device{}();
  g_bootstrap->broadcast(&gtp::comm::g_seed, sizeof(gtp::comm::g_seed), 0);
  std::printf("rank %d of %d, seed %llu\n", g_bootstrap->rank(), g_bootstrap->world_size(),
              static_cast<unsigned long long>(gtp::comm::g_seed));
  const int status = RUN_ALL_TESTS();
  g_bootstrap.reset();
  return status;
}
