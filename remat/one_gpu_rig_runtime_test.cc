// Every multi-rank device path of the runtime on ONE GPU, through the one-GPU rig (a test double for
// NCCL, remat/one_gpu_rig.h): G = 2, 4, 8 ranks as threads, each with its own CudaBackend, run the
// same calls on the same inputs as G host-backend ranks (HostBackend over HostComm, the reference),
// and every rank's materialized weights (every materialize of every step) and main grads must equal
// the host's bit for bit. The same scenario (remat/internal/runtime_scenario.h) runs on real NCCL
// peers in tests/real_peers; this one stays for what those cannot show: every rank in one process
// under compute-sanitizer (memcheck, racecheck, synccheck across ranks; docs/real-peers.md).
// Cases: the four wires (BF16, FP8, MXFP8, NVFP4); a weight of 5 rows, so ranks hold only padding
// rows; the pooled grad path (zero-filled buffers, reduce-scatter mean) and undefined buffers written
// by the consumer; wgrads accumulated over microbatches or reduced each; keep_gathered; lazy packs
// (every step re-packs, in varying orders); fill graphs; a step captured into a CUDA graph and
// replayed. Skips without a GPU, printing why.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/host.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/host_backend.h"
#include "remat/internal/rig_ranks.h"
#include "remat/internal/runtime_scenario.h"
#include "remat/one_gpu_rig.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using testing::ScenarioCase;
using testing::Seen;
using Case = ScenarioCase;
const std::vector<testing::ScenarioShape>& shapes() { return testing::scenario_shapes(); }

// Runs the case on G host ranks and on G rig ranks and compares every rank's view.
void compare(const Case& c) {
  SCOPED_TRACE(testing::describe(c));
  std::vector<Seen> host(c.ranks), rig_seen(c.ranks);
  {
    const auto timeout = std::chrono::milliseconds(60000);
    auto group = comm::ThreadBootstrap::create_group(c.ranks, timeout);
    comm::internal::rethrow_first(comm::internal::run_ranks(c.ranks, [&](int rank) {
      comm::HostComm comm(*group[rank], timeout);
      // Both groups over the same ranks: one communicator serves both on the host.
      HostBackend backend(c.two_groups ? std::vector<comm::HostComm*>{&comm, &comm}
                                       : std::vector<comm::HostComm*>{&comm});
      Case eager = c;
      eager.capture = false;  // the reference runs every step eagerly
      host[rank] = testing::run_scenario_rank(backend, nullptr, rank, eager);
    }));
  }
  std::vector<int> all(c.ranks);
  for (int r = 0; r < c.ranks; ++r) all[r] = r;
  std::vector<std::vector<std::vector<int>>> groups = {{all}};
  if (c.two_groups) groups.push_back({all});
  OneGpuRig rig(0, c.ranks, groups, testing::rig_flags_from_env());
  auto stages = testing::pinned_stages(c.ranks, std::int64_t{8} << 20);  // before any rank runs
  testing::on_rig_ranks(rig, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    {
      CudaBackend backend(0, rig.transport(rank));
      testing::PinnedStage& stage = *stages[rank];
      testing::ScenarioDevice device;
      device.stream = stream;
      device.upload = [&](void* dst, const void* src, std::int64_t bytes) { stage.upload(dst, src, bytes, stream); };
      device.download = [&](void* dst, const void* src, std::int64_t bytes) { stage.download(dst, src, bytes, stream); };
      device.sync = [&] { stage.finish(stream); };
      // Instantiation may wait for the device while holding the context's lock (docs/rig.md).
      device.around_instantiate = [&] { rig.graph_barrier(rank); };
      rig_seen[rank] = testing::run_scenario_rank(backend, &device, rank, c);
    }
    cudaStreamDestroy(stream);
  });
  for (int rank = 0; rank < c.ranks; ++rank) {
    testing::expect_same_as_host(c, rank, rig_seen[rank], host[rank], "rig");
  }
}

bool skip(std::string* why) { return !kernels::cuda_device_available(why); }

class RigRuntime : public ::testing::TestWithParam<int> {};

// The shared case lists (runtime_scenario.h), G = the test's parameter.
TEST_P(RigRuntime, EveryWireMatchesTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const Case& c : testing::every_wire_cases(GetParam())) {
    const auto geometry = kernels::weight_geometry(c.wire.format, shapes()[1].rows, shapes()[1].cols, c.ranks);
    ASSERT_EQ(geometry.valid_rows(0), 5);
    ASSERT_EQ(geometry.valid_rows(c.ranks - 1), 0) << "the last rank must hold only padding rows of layer 1";
    compare(c);
  }
}

TEST_P(RigRuntime, UndefinedGradsPerMicrobatchMatchTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const Case& c : testing::undefined_grad_cases(GetParam())) {
    // Five streams a rank with two groups: past G = 4 they would outnumber the 32 hardware queues
    // (remat/one_gpu_rig.h), and two ranks' streams could share one.
    if (c.two_groups && c.ranks > 4) continue;
    compare(c);
  }
}

TEST_P(RigRuntime, KeepGatheredMatchesTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const Case& c : testing::keep_gathered_cases(GetParam())) compare(c);
}

TEST_P(RigRuntime, FillGraphsMatchTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const Case& c : testing::fill_graph_cases(GetParam())) compare(c);
}

TEST_P(RigRuntime, CapturedStepReplaysMatchTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const Case& c : testing::captured_step_cases(GetParam())) compare(c);
}

INSTANTIATE_TEST_SUITE_P(Ranks, RigRuntime, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "G" + std::to_string(info.param); });

}  // namespace
}  // namespace gtp::remat
