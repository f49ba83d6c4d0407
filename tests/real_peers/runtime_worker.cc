// One rank of real_peers_runtime_test, started by `gtp-launch --share-gpu -n G`: G processes that are
// real NCCL peers on ONE GPU (docs/real-peers.md). Every case of the runtime's multi-rank scenario
// (testing/remat/runtime_scenario.h) runs twice per rank: on the host backend over UCX (the
// reference) and on the CUDA backend over real NCCL communicators built from the same bootstrap, and
// this rank's materialized weights and main grads must be equal bit for bit. Cases: the four wires
// with the GEMM-ready backward and ranks holding only padding rows; undefined grads reduced every
// microbatch in one and two groups; keep_gathered; fill graphs; a step captured into a CUDA graph
// (collectives included) and replayed. Without a GPU every case skips, printing why.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/host.h"
#include "comm/nccl.h"
#include "comm/ucx_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/host_backend.h"
#include "testing/remat/runtime_scenario.h"

namespace gtp::remat {
namespace {

using testing::ScenarioCase;
using testing::Seen;

std::unique_ptr<comm::UcxBootstrap> g_bootstrap;
// Loopback sockets between time-sliced processes: a collective takes milliseconds, a communicator's
// creation up to seconds; the limit only bounds a hang.
constexpr std::chrono::milliseconds kTimeout{240000};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// The communicators of `groups` backend groups over every rank (as the C ABI builds a group: a
// gather communicator and a reduce-scatter one, split from the world).
struct PeerGroups {
  comm::NcclComm world;
  std::vector<std::unique_ptr<comm::NcclComm>> comms;
  std::vector<CudaGroup> groups;

  explicit PeerGroups(int count) : world(comm::NcclComm::create_world(*g_bootstrap, kTimeout)) {
    std::vector<int> all(g_bootstrap->world_size());
    for (int r = 0; r < static_cast<int>(all.size()); ++r) all[r] = r;
    for (int g = 0; g < count; ++g) {
      comm::NcclGroupConfig config;
      config.comm_name = "real_peers_group" + std::to_string(g);
      comms.push_back(std::make_unique<comm::NcclComm>(world.split({all}, config, kTimeout)));
      comms.push_back(std::make_unique<comm::NcclComm>(world.split({all}, config, kTimeout)));
      groups.push_back(CudaGroup{comms[comms.size() - 2].get(), comms.back().get()});
    }
  }
};

Seen run_on_nccl(const ScenarioCase& c, int rank) {
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  Seen seen;
  {
    PeerGroups peers(c.two_groups ? 2 : 1);
    CudaBackend backend(0, peers.groups, kTimeout);
    testing::ScenarioDevice device;
    device.stream = stream;
    // Pageable copies on the rank's own stream: with one CUDA context per process nothing of a peer
    // waits on this process's driver staging (the one-GPU rig needs its pinned stage for that).
    device.upload = [&](void* dst, const void* src, std::int64_t bytes) {
      EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
    };
    device.download = [&](void* dst, const void* src, std::int64_t bytes) {
      EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    };
    device.sync = [&] { EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess); };
    seen = testing::run_scenario_rank(backend, &device, rank, c);
  }
  cudaStreamDestroy(stream);
  return seen;
}

void compare(const ScenarioCase& c) {
  const int rank = g_bootstrap->rank();
  SCOPED_TRACE(testing::describe(c));
  Seen host;
  {
    comm::HostComm comm(*g_bootstrap, kTimeout);
    // Both groups over the same ranks: one communicator serves both on the host.
    HostBackend backend(c.two_groups ? std::vector<comm::HostComm*>{&comm, &comm} : std::vector<comm::HostComm*>{&comm});
    ScenarioCase eager = c;
    eager.capture = false;  // the reference runs every step eagerly
    host = testing::run_scenario_rank(backend, nullptr, rank, eager);
  }
  const Seen nccl = run_on_nccl(c, rank);
  testing::expect_same_as_host(c, rank, nccl, host, "real NCCL");
  g_bootstrap->barrier();  // no rank starts the next case's communicators while a peer still compares
}

#define SKIP_WITHOUT_GPU()                                                  \
  do {                                                                      \
    std::string why;                                                        \
    if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

// The shared case lists (runtime_scenario.h) at G = the world size.
TEST(RealPeersRuntime, EveryWireMatchesTheHostBackend) {
  SKIP_WITHOUT_GPU();
  for (const ScenarioCase& c : testing::every_wire_cases(g_bootstrap->world_size())) {
    const auto geometry = kernels::weight_geometry(c.wire.format, testing::scenario_shapes()[1].rows,
                                                   testing::scenario_shapes()[1].cols, c.ranks);
    ASSERT_EQ(geometry.valid_rows(0), 5);
    ASSERT_EQ(geometry.valid_rows(c.ranks - 1), 0) << "the last rank must hold only padding rows of layer 1";
    compare(c);
  }
}

TEST(RealPeersRuntime, UndefinedGradsPerMicrobatchMatchTheHostBackend) {
  SKIP_WITHOUT_GPU();
  for (const ScenarioCase& c : testing::undefined_grad_cases(g_bootstrap->world_size())) compare(c);
}

TEST(RealPeersRuntime, KeepGatheredMatchesTheHostBackend) {
  SKIP_WITHOUT_GPU();
  for (const ScenarioCase& c : testing::keep_gathered_cases(g_bootstrap->world_size())) compare(c);
}

TEST(RealPeersRuntime, FillGraphsMatchTheHostBackend) {
  SKIP_WITHOUT_GPU();
  for (const ScenarioCase& c : testing::fill_graph_cases(g_bootstrap->world_size())) compare(c);
}

TEST(RealPeersRuntime, CapturedStepReplaysMatchTheHostBackend) {
  SKIP_WITHOUT_GPU();
  for (const ScenarioCase& c : testing::captured_step_cases(g_bootstrap->world_size())) compare(c);
}

}  // namespace
}  // namespace gtp::remat

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) {
    // No bootstrap without a GPU: every rank skips alike, and nothing waits for a peer.
    std::printf("real_peers_runtime_worker: every case skips: no CUDA device: %s\n", why.c_str());
    return RUN_ALL_TESTS();
  }
  gtp::remat::g_bootstrap =
      std::make_unique<gtp::comm::UcxBootstrap>(gtp::comm::UcxBootstrapConfig::from_env());
  const int status = RUN_ALL_TESTS();
  gtp::remat::g_bootstrap->barrier();
  gtp::remat::g_bootstrap.reset();
  return status;
}
