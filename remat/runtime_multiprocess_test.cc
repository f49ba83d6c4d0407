// The remat runtime across real processes: gtp-launch starts N ranks of runtime_worker on loopback.
// Arguments: the paths of gtp-launch and runtime_worker.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "comm/internal/process.h"

namespace gtp::remat {
namespace {

std::string g_launcher, g_worker;

void expect_training_passes(int n) {
  // The workers must not write this test's own report files (XML, premature-exit marker).
  const auto result = comm::internal::run_shell("env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE " +
                                                g_launcher + " -n " + std::to_string(n) + " --timeout 240 -- " + g_worker);
  EXPECT_EQ(result.status, 0) << result.output;
  for (int r = 0; r < n; ++r) {
    const std::regex passed("\\[" + std::to_string(r) + "\\] \\[  PASSED  \\] 4 tests\\.");
    EXPECT_TRUE(std::regex_search(result.output, passed)) << "rank " << r << " did not pass all 4 tests:\n" << result.output;
  }
}

TEST(RuntimeMultiProcess, TrainingWith2Processes) { expect_training_passes(2); }
TEST(RuntimeMultiProcess, TrainingWith4Processes) { expect_training_passes(4); }
TEST(RuntimeMultiProcess, TrainingWith8Processes) { expect_training_passes(8); }

}  // namespace
}  // namespace gtp::remat

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: runtime_multiprocess_test GTP_LAUNCH RUNTIME_WORKER\n");
    return 2;
  }
  gtp::remat::g_launcher = argv[1];
  gtp::remat::g_worker = argv[2];
  return RUN_ALL_TESTS();
}
