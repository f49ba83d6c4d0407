// Ranks that fail or disagree on real NCCL peers sharing one GPU: `gtp-launch --share-gpu -n G` runs
// failure_worker's scenarios (a peer killed, a peer stopped, ranks gathering different weights) at
// G = 2 and 4, and every live rank must end in a clear error within the call timeout and destroy
// cleanly. Without a GPU every rank must report that it skipped. Arguments: gtp-launch, failure_worker.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "comm/internal/process.h"
#include "kernels/cuda_kernels.h"

namespace {

std::string g_launcher, g_worker;
constexpr long long kCallTimeoutMs = 3000;  // failure_worker's
// Past the deadline: the watchdog's polling and the ranks' time slices on the shared GPU.
constexpr long long kSlackMs = 3000;

struct Line {
  std::string status, message;
  long long after = -1;
};

// Rank r's "<what> status=... after=... msg=..." line, or an empty Line.
Line find(const std::string& output, int r, const std::string& what) {
  const std::regex line("\\[" + std::to_string(r) + "\\] rank " + std::to_string(r) + ": " + what +
                        " status=(\\S+) after=([0-9]+) msg=([^\\n]*)");
  std::smatch match;
  if (!std::regex_search(output, match, line)) return {};
  return {match[1], match[3], std::stoll(match[2])};
}

// A hang shows as gtp-launch's timeout (exit 124) with every rank's lines printed.
std::string run(int g, const std::string& scenario, int timeout_s = 150) {
  const auto result = gtp::comm::internal::run_shell("env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE " +
                                                     g_launcher + " --share-gpu -n " + std::to_string(g) +
                                                     " --timeout " + std::to_string(timeout_s) + " -- " + g_worker + " " + scenario);
  EXPECT_EQ(result.status, 0) << result.output;
  return result.output;
}

bool skipped(const std::string& output, int g) {
  std::string why;
  if (gtp::kernels::cuda_device_available(&why)) return false;
  for (int r = 0; r < g; ++r) {
    EXPECT_TRUE(std::regex_search(output, std::regex("\\[" + std::to_string(r) + "\\] rank " + std::to_string(r) +
                                                     ": skipped: no CUDA device: .+")))
        << output;
  }
  return true;
}

void expect_live_ranks_fail_in_time(int g, bool killed) {
  const std::string output = run(g, killed ? "peer-killed" : "peer-stopped");
  if (skipped(output, g)) GTEST_SKIP() << "no CUDA device: every rank skipped, as it must";
  for (int r = 0; r < g; ++r) {
    ASSERT_EQ(find(output, r, "create").status, "GTP_SUCCESS") << output;
  }
  for (int r = 0; r + 1 < g; ++r) {
    const Line live = find(output, r, "live step");
    EXPECT_NE(live.status, "") << "rank " << r << " printed no live step:\n" << output;
    EXPECT_NE(live.status, "GTP_SUCCESS") << "rank " << r << " never noticed its failed peer:\n" << output;
    EXPECT_LE(live.after, kCallTimeoutMs + kSlackMs) << "rank " << r << " noticed too late:\n" << output;
    EXPECT_FALSE(live.message.empty()) << output;
    EXPECT_EQ(find(output, r, "destroy").status, "GTP_SUCCESS") << output;
    if (!killed) {  // nothing closed a socket: only the watchdog's deadline can have caught it
      EXPECT_EQ(live.status, "GTP_ERROR_TIMEOUT") << output;
    }
  }
  if (killed) {
    EXPECT_TRUE(std::regex_search(output, std::regex("rank " + std::to_string(g - 1) +
                                                     ": the failing rank ended by signal 9")))
        << output;
  } else {
    const Line resumed = find(output, g - 1, "resumed step");
    EXPECT_NE(resumed.status, "") << output;
    EXPECT_NE(resumed.status, "GTP_SUCCESS") << "the stopped rank went on as if nothing happened:\n" << output;
    EXPECT_EQ(find(output, g - 1, "destroy").status, "GTP_SUCCESS") << output;
  }
}

TEST(RealPeersFailure, KilledPeerG2) { expect_live_ranks_fail_in_time(2, true); }
TEST(RealPeersFailure, KilledPeerG4) { expect_live_ranks_fail_in_time(4, true); }
TEST(RealPeersFailure, StoppedPeerG2) { expect_live_ranks_fail_in_time(2, false); }
TEST(RealPeersFailure, StoppedPeerG4) { expect_live_ranks_fail_in_time(4, false); }

// The step's check (default) and the per-fill one: either way every rank raises DIVERGED naming both
// weights and the check that found it, and destroys cleanly.
void expect_every_rank_diverged(const char* scenario, const char* found_by) {
  const int g = 2;
  const std::string output = run(g, scenario);
  if (skipped(output, g)) GTEST_SKIP() << "no CUDA device: every rank skipped, as it must";
  for (int r = 0; r < g; ++r) {
    const Line after = find(output, r, "after the diverging step");
    EXPECT_EQ(after.status, "GTP_ERROR_DIVERGED") << output;
    EXPECT_NE(after.message.find("w0"), std::string::npos) << output;
    EXPECT_NE(after.message.find("w1"), std::string::npos) << output;
    EXPECT_NE(after.message.find(found_by), std::string::npos) << output;
    EXPECT_EQ(find(output, r, "destroy").status, "GTP_SUCCESS") << output;
  }
}

TEST(RealPeersFailure, RanksGatheringDifferentWeightsAllRaiseDivergedAtTheStepCheck) {
  expect_every_rank_diverged("diverge", "the step's check at drain");
}

TEST(RealPeersFailure, RanksGatheringDifferentWeightsAllRaiseDivergedWithCheckEveryFill) {
  expect_every_rank_diverged("diverge-every-fill", "found on the device after the gather");
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: real_peers_failure_test GTP_LAUNCH FAILURE_WORKER\n");
    return 2;
  }
  g_launcher = argv[1];
  g_worker = argv[2];
  return RUN_ALL_TESTS();
}
