// Ranks that fail, across real processes (gtp-launch on loopback, host backend, UCX bootstrap): no
// hang, a clear error on every rank, recovery by destroy (docs/reliability.md, "Failing ranks").
// Arguments: the paths of gtp-launch and gtp_failure_worker.
#include <gtest/gtest.h>

#include <cstdio>
#include <iterator>
#include <regex>
#include <string>

#include "comm/internal/process.h"

namespace {

std::string g_launcher, g_worker;

std::string run(int world, const std::string& args) {
  // The workers must not write this test's own report files (XML, premature-exit marker).
  const auto result = gtp::comm::internal::run_shell(
      "env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE " + g_launcher + " -n " +
      std::to_string(world) + " --timeout 120 -- " + g_worker + " " + args);
  EXPECT_EQ(result.status, 0) << result.output;
  return result.output;
}

// The line "rank R: WHAT status=S after=MS msg=..." of rank r, or "" when it is missing.
std::string line_of(const std::string& output, int r, const std::string& what) {
  const std::regex line("\\[" + std::to_string(r) + "\\] rank " + std::to_string(r) + ": " + what + " status=[^\\n]*");
  std::smatch match;
  return std::regex_search(output, match, line) ? match.str() : "";
}

long long after_ms(const std::string& line) {
  std::smatch match;
  return std::regex_search(line, match, std::regex("after=(\\d+)")) ? std::stoll(match[1]) : -1;
}

// A rank throwing inside gtp_materialize (its memory budget is full of a weight it still holds): every
// peer fails within seconds (not at its 60 s call timeout), its message naming the failed call, the
// group and the rank; destroy is clean everywhere.
void expect_peers_fail_fast(int world) {
  const std::string output = run(world, "throw-mid-call");
  const int failing = world - 1;
  const std::string own = line_of(output, failing, "materialize");
  EXPECT_NE(own.find("status=GTP_ERROR_SYSTEM"), std::string::npos) << output;
  EXPECT_NE(own.find("memory budget"), std::string::npos) << output;
  for (int r = 0; r < world; ++r) {
    const std::string line = line_of(output, r, "materialize");
    ASSERT_FALSE(line.empty()) << "rank " << r << " did not report its materialize:\n" << output;
    EXPECT_EQ(line.find("status=GTP_SUCCESS"), std::string::npos) << line;
    EXPECT_LT(after_ms(line), 15000) << line;
    const std::string names[] = {"gtp_materialize", "gtp_remat", "rank " + std::to_string(failing), "memory budget"};
    for (const std::string& name : names) {
      EXPECT_NE(line.find(name), std::string::npos) << "rank " << r << "'s error does not name " << name << ": "
                                                    << line;
    }
    EXPECT_NE(line_of(output, r, "check").find("status=GTP_ERROR_INVALID_STATE"), std::string::npos) << output;
    EXPECT_NE(line_of(output, r, "destroy").find("status=GTP_SUCCESS"), std::string::npos) << output;
  }
}

TEST(FailingRanks, ThrowMidCallFailsEveryPeerWith2Processes) { expect_peers_fail_fast(2); }
TEST(FailingRanks, ThrowMidCallFailsEveryPeerWith3Processes) { expect_peers_fail_fast(3); }

// A rank that never joins: the others fail within timeout_ms (2 s, not the 60 s default), naming it.
TEST(FailingRanks, RankThatNeverJoinsIsNamedWithinTimeoutMs) {
  const int world = 3;
  const std::string output = run(world, "never-joins");
  for (int r = 0; r < world - 1; ++r) {
    const std::string line = line_of(output, r, "create");
    ASSERT_FALSE(line.empty()) << output;
    EXPECT_NE(line.find("status=GTP_ERROR_TIMEOUT"), std::string::npos) << line;
    EXPECT_LT(after_ms(line), 10000) << line;
    EXPECT_NE(line.find("rank(s) 2 to join"), std::string::npos) << "rank " << r << " must name rank 2: " << line;
  }
}

std::ptrdiff_t count(const std::string& output, const std::string& pattern) {
  const std::regex re(pattern);
  return std::distance(std::sregex_iterator(output.begin(), output.end(), re), std::sregex_iterator());
}

// Destroy after a timeout, again and again, then a context that works: the recovery path. Rank 1
// comes late (after rank 0 destroyed) or never calls (and destroys while rank 0 still sends to it).
void expect_destroy_after_timeout_recovers(const std::string& mode) {
  const int rounds = 4;
  const std::string output = run(2, "timeout-destroy " + std::to_string(rounds) + " " + mode);
  EXPECT_EQ(output.find("Assertion"), std::string::npos) << output;
  for (int r = 0; r < 2; ++r) {
    const std::string rank = "\\[" + std::to_string(r) + "\\] rank " + std::to_string(r);
    EXPECT_EQ(count(output, rank + ": failing materialize status=GTP_ERROR_(TIMEOUT|SYSTEM)"), rounds) << output;
    EXPECT_EQ(count(output, rank + ": destroy after failure status=GTP_SUCCESS"), rounds) << output;
    EXPECT_EQ(count(output, rank + ": create status=GTP_SUCCESS"), rounds + 1) << output;
    EXPECT_EQ(count(output, rank + ": setup status=GTP_SUCCESS"), rounds + 1) << output;
    EXPECT_NE(line_of(output, r, "working materialize").find("status=GTP_SUCCESS"), std::string::npos) << output;
    EXPECT_NE(output.find("[" + std::to_string(r) + "] rank " + std::to_string(r) + ": done"), std::string::npos)
        << output;
  }
  // Rank 0's first failure is its own timeout, or, when the peer's teardown reaches it first (seen
  // once in four runs under load), UCX's report of the lost endpoint: both name why it failed.
  const std::string first = line_of(output, 0, "failing materialize");
  EXPECT_TRUE(first.find("timed out") != std::string::npos || first.find("Endpoint timeout") != std::string::npos)
      << output;
}

TEST(FailingRanks, DestroyAfterTimeoutWithALatePeerIsCleanAndRecovers) {
  expect_destroy_after_timeout_recovers("late");
}
TEST(FailingRanks, DestroyAfterTimeoutWithAnAbsentPeerIsCleanAndRecovers) {
  expect_destroy_after_timeout_recovers("skip");
}

// Transfers given up mid-flight: the last of 3 ranks is stopped (SIGSTOP, 2 s) inside steps of
// megabyte gathers, so its peers time out part-way through transfers to or from it. Destroying then
// tripped UCX's "ucs_hlist_is_empty(proto_reqs)" assertion in ucp_worker_destroy (SIGABRT in 8 of 8
// runs of 3 rounds before the fix, then reached by ranks with prefetch depth = rank, which create now
// refuses as a divergence). It came back in 3 of 16 runs where a flush finished with a rendezvous send
// to the stopped rank still in flight, and fixing that exposed a SIGSEGV (3 of 24 runs): the stopped
// rank's RTR made UCX read the send's data from a buffer the failed call had freed. Every destroy
// must now return, three rounds (0 of 24 runs, two at a time, after both fixes).
// Where the stop lands depends on timing: on a loaded machine it can come before any data moves (the
// peers then time out waiting for the stopped rank), so the scenario runs up to three times, each run
// checked in full, until one gave up a transfer part-way (unloaded: 6 of 6 runs did, 2 or more each).
TEST(FailingRanks, DestroyAfterTransfersGivenUpMidFlightIsClean) {
  const int world = 3, rounds = 3;
  std::ptrdiff_t given_up = 0;
  for (int attempt = 0; attempt < 3 && given_up == 0; ++attempt) {
    const std::string output = run(world, "stall-mid-flight " + std::to_string(rounds));
    EXPECT_EQ(output.find("Assertion"), std::string::npos) << output;
    for (int r = 0; r < world; ++r) {
      const std::string prefix = "\\[" + std::to_string(r) + "\\] rank " + std::to_string(r) + ": ";
      EXPECT_EQ(count(output, prefix + "stalled steps status=GTP_ERROR_"), rounds) << "every round fails:\n" << output;
      EXPECT_EQ(count(output, prefix + "destroy after stall status=GTP_SUCCESS"), rounds) << output;
      EXPECT_EQ(count(output, prefix + "done"), 1) << output;
    }
    EXPECT_GE(count(output, "stalled steps status=GTP_ERROR_TIMEOUT"), 1) << "no rank timed out:\n" << output;
    given_up = count(output, "timed out after 1 s moving data with rank");
  }
  EXPECT_GE(given_up, 1) << "in three runs no rank gave up a transfer part-way: the scenario did not happen";
}

// INT64_MAX timeouts mean "very long", not "at once".
TEST(FailingRanks, Int64MaxTimeoutsWork) {
  const std::string output = run(2, "int64-max");
  for (int r = 0; r < 2; ++r) {
    for (const char* what : {"create", "materialize", "destroy"}) {
      EXPECT_NE(line_of(output, r, what).find("status=GTP_SUCCESS"), std::string::npos) << what << ":\n" << output;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: gtp_failure_test GTP_LAUNCH GTP_FAILURE_WORKER\n");
    return 2;
  }
  g_launcher = argv[1];
  g_worker = argv[2];
  return RUN_ALL_TESTS();
}
