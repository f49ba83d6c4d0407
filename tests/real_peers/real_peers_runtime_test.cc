// The runtime's CUDA backend on real NCCL peers sharing one GPU: `gtp-launch --share-gpu -n G` starts
// G ranks of runtime_worker (each checks its views against the host backend's bit for bit), at
// G = 2, 4 and 8 (GTP_REAL_PEERS_SIZES=2,4 picks). Without a GPU every rank must report that it
// skipped, and why. Arguments: the paths of gtp-launch and runtime_worker.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>

#include "comm/internal/process.h"
#include "kernels/cuda_kernels.h"

namespace {

std::string g_launcher, g_worker;
constexpr int kCases = 5;  // runtime_worker's TESTs

bool wanted(int g) {
  const char* sizes = std::getenv("GTP_REAL_PEERS_SIZES");
  if (sizes == nullptr || *sizes == '\0') return true;
  std::stringstream list(sizes);
  for (std::string item; std::getline(list, item, ',');) {
    if (item == std::to_string(g)) return true;
  }
  return false;
}

void expect_every_rank_passes(int g) {
  if (!wanted(g)) GTEST_SKIP() << "G = " << g << " is not in GTP_REAL_PEERS_SIZES";
  // The workers must not write this test's own report files (XML, premature-exit marker).
  const auto result = gtp::comm::internal::run_shell(
      "env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE " + g_launcher + " --share-gpu -n " +
      std::to_string(g) + " --timeout 1500 -- " + g_worker);
  ASSERT_EQ(result.status, 0) << result.output;
  std::string why;
  const bool gpu = gtp::kernels::cuda_device_available(&why);
  for (int r = 0; r < g; ++r) {
    const std::string prefix = "\\[" + std::to_string(r) + "\\] ";
    if (gpu) {
      const std::regex passed(prefix + "\\[  PASSED  \\] " + std::to_string(kCases) + " tests\\.");
      EXPECT_TRUE(std::regex_search(result.output, passed)) << "rank " << r << " did not pass:\n" << result.output;
    } else {
      const std::regex skipped(prefix + "\\[  SKIPPED \\] " + std::to_string(kCases) + " tests");
      const std::regex said(prefix + "real_peers_runtime_worker: every case skips: no CUDA device: .+");
      EXPECT_TRUE(std::regex_search(result.output, skipped)) << result.output;
      EXPECT_TRUE(std::regex_search(result.output, said)) << result.output;
    }
  }
  if (!gpu) std::printf("no CUDA device (%s): the workers skipped every case, as they must\n", why.c_str());
}

TEST(RealPeersRuntime, G2) { expect_every_rank_passes(2); }
TEST(RealPeersRuntime, G4) { expect_every_rank_passes(4); }
TEST(RealPeersRuntime, G8) { expect_every_rank_passes(8); }

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: real_peers_runtime_test GTP_LAUNCH RUNTIME_WORKER\n");
    return 2;
  }
  g_launcher = argv[1];
  g_worker = argv[2];
  return RUN_ALL_TESTS();
}
