// Multi-process host transport tests: gtp-launch starts N real processes on loopback.
// Arguments: the paths of gtp-launch, host_collectives_worker and peer_exit_worker.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>

#include "comm/internal/process.h"

namespace gtp::comm {
namespace {

using internal::run_shell;

std::string g_launcher, g_collectives_worker, g_peer_exit_worker;

// The workers must not write this test's own report files (XML, premature-exit marker).
std::string launch(int n, const std::string& worker) {
  return "env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE " + g_launcher + " -n " + std::to_string(n) + " --timeout 240 -- " +
         worker;
}

void expect_collectives_pass(int n) {
  const auto result = run_shell(launch(n, g_collectives_worker));
  EXPECT_EQ(result.status, 0) << result.output;
  for (int r = 0; r < n; ++r) {
    const std::regex passed("\\[" + std::to_string(r) + "\\] \\[  PASSED  \\] 9 tests\\.");
    EXPECT_TRUE(std::regex_search(result.output, passed)) << "rank " << r << " did not pass all 9 tests:\n"
                                                          << result.output;
  }
}

TEST(HostCommMultiProcess, CollectivesMatchTheReferenceWith2Processes) { expect_collectives_pass(2); }
TEST(HostCommMultiProcess, CollectivesMatchTheReferenceWith3Processes) { expect_collectives_pass(3); }
TEST(HostCommMultiProcess, CollectivesMatchTheReferenceWith4Processes) { expect_collectives_pass(4); }
TEST(HostCommMultiProcess, CollectivesMatchTheReferenceWith8Processes) { expect_collectives_pass(8); }

void expect_peer_exit_detected(int n) {
  const auto result = run_shell(launch(n, g_peer_exit_worker));
  EXPECT_EQ(result.status, 0) << result.output;
  for (int r = 0; r < n - 1; ++r) {
    for (const char* what : {"host comm all_gather", "bootstrap barrier"}) {
      const std::string line = "[" + std::to_string(r) + "] rank " + std::to_string(r) + ": detected in " + what;
      EXPECT_NE(result.output.find(line), std::string::npos) << line << " missing:\n" << result.output;
    }
  }
  EXPECT_EQ(result.output.find("FAILED"), std::string::npos) << result.output;
}

TEST(HostCommMultiProcess, PeerThatExitsEarlyIsDetectedWith2Processes) { expect_peer_exit_detected(2); }
TEST(HostCommMultiProcess, PeerThatExitsEarlyIsDetectedWith4Processes) { expect_peer_exit_detected(4); }

}  // namespace
}  // namespace gtp::comm

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 4) {
    std::fprintf(stderr, "usage: host_multiprocess_test GTP_LAUNCH COLLECTIVES_WORKER PEER_EXIT_WORKER\n");
    return 2;
  }
  gtp::comm::g_launcher = argv[1];
  gtp::comm::g_collectives_worker = argv[2];
  gtp::comm::g_peer_exit_worker = argv[3];
  return RUN_ALL_TESTS();
}
