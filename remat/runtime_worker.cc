// One rank of runtime_multiprocess_test, started by gtp-launch: the three-layer model trained through
// the remat runtime on the host backend over real processes, and every wire format (UCX bootstrap from the environment).
#include <gtest/gtest.h>

#include <memory>

#include "comm/host.h"
#include "comm/ucx_bootstrap.h"
#include "testing/remat/test_model.h"

namespace gtp::remat {
namespace {

std::unique_ptr<comm::UcxBootstrap> g_bootstrap;
constexpr std::chrono::milliseconds kTimeout{120000};

TEST(RuntimeAcrossProcesses, TrainingMatchesTheSingleProcessReferenceDepth1) {
  comm::HostComm comm(*g_bootstrap, kTimeout);
  testing::train_and_check(comm, testing::TrainOptions{});
}

TEST(RuntimeAcrossProcesses, TrainingMatchesTheSingleProcessReferenceDepth2Accumulating) {
  comm::HostComm comm(*g_bootstrap, kTimeout);
  testing::TrainOptions options;
  options.config.depth = 2;
  options.microbatches = 3;
  options.config.grads.accumulate_microbatches = true;
  testing::train_and_check(comm, options);
}

// Prefetches in batches of 2, each distinct fill recorded once and launched afterwards (fill graphs:
// the host backend makes a recording's calls, collectives included, again at each launch).
TEST(RuntimeAcrossProcesses, TrainingWithFillGraphsMatchesTheSingleProcessReference) {
  comm::HostComm comm(*g_bootstrap, kTimeout);
  testing::TrainOptions options;
  options.config.depth = 3;
  options.config.prefetch_batch = 2;
  options.config.fill_graphs = 128;
  testing::TrainReport report;
  testing::train_and_check(comm, options, &report);
  EXPECT_GT(report.group.graph_fills, report.group.graph_recordings);
  EXPECT_GT(report.group.graph_recordings, 0);
}

TEST(RuntimeAcrossProcesses, EveryWireFormatMatchesTheReferenceDecode) {
  comm::HostComm comm(*g_bootstrap, kTimeout);
  for (const kernels::WireSpec& spec : testing::all_wire_specs()) {
    SCOPED_TRACE(kernels::to_string(spec.format));
    testing::check_wire_format(comm, spec);
  }
}

}  // namespace
}  // namespace gtp::remat

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  using gtp::remat::g_bootstrap;
  g_bootstrap = std::make_unique<gtp::comm::UcxBootstrap>(gtp::comm::UcxBootstrapConfig::from_env());
  const int status = RUN_ALL_TESTS();
  g_bootstrap.reset();
  return status;
}
