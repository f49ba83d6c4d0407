// The C ABI across real processes: gtp-launch starts the ranks of gtp_groups_worker on loopback, each
// creating its context with GTP_BOOTSTRAP_UCX_FROM_ENV on a TP x G x DP grid.
// Arguments: the paths of gtp-launch and gtp_groups_worker.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>

#include "comm/internal/process.h"

namespace {

std::string g_launcher, g_worker;

void expect_grid_passes(int world, int tp, int g, int dp) {
  // The workers must not write this test's own report files (XML, premature-exit marker).
  const auto result = gtp::comm::internal::run_shell(
      "env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE " + g_launcher + " -n " + std::to_string(world) +
      " --timeout 240 -- " + g_worker + " " + std::to_string(world) + " " + std::to_string(tp) + " " + std::to_string(g) +
      " " + std::to_string(dp));
  EXPECT_EQ(result.status, 0) << result.output;
  for (int r = 0; r < world; ++r) {
    const std::regex passed("\\[" + std::to_string(r) + "\\] \\[  PASSED  \\] 1 test\\.");
    EXPECT_TRUE(std::regex_search(result.output, passed)) << "rank " << r << " did not pass:\n" << result.output;
  }
}

TEST(CAbiMultiProcess, World4Tp2G2) { expect_grid_passes(4, 2, 2, 1); }
TEST(CAbiMultiProcess, World8Tp2G2Dp2) { expect_grid_passes(8, 2, 2, 2); }

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: gtp_multiprocess_test GTP_LAUNCH GTP_GROUPS_WORKER\n");
    return 2;
  }
  g_launcher = argv[1];
  g_worker = argv[2];
  return RUN_ALL_TESTS();
}
