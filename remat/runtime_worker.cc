// One rank of runtime_multiprocess_test, started by gtp-launch: the three-layer model trained through
// the remat runtime on the host backend over real processes, and every wire format (UCX bootstrap from the environment).
#include <gtest/gtest.h>

#include <memory>

#include "comm/host.h"
#include "comm/ucx_bootstrap.h"
#include "remat/internal/test_model.h"

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
