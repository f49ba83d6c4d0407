// Runs the real gtp-launch binary (its path is the first argument) on small shell commands.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <set>
#include <string>

#include "comm/internal/process.h"
#include "comm/launcher.h"

namespace gtp::comm {
namespace {

using internal::run_shell;
using Clock = std::chrono::steady_clock;

std::string g_launcher;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Launcher, GivesEveryRankItsEnvironmentAndPrefixesItsOutput) {
  const auto result =
      run_shell(g_launcher + " -n 4 -- sh -c 'echo rank=$GTP_RANK of $GTP_WORLD_SIZE at $GTP_ROOT_ADDR; echo oops >&2'");
  ASSERT_EQ(result.status, 0) << result.output;
  std::set<std::string> addresses;
  for (int r = 0; r < 4; ++r) {
    const std::regex line("\\[" + std::to_string(r) + "\\] rank=" + std::to_string(r) + " of 4 at (127\\.0\\.0\\.1:[0-9]+)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(result.output, match, line)) << result.output;
    addresses.insert(match[1]);
    EXPECT_TRUE(contains(result.output, "[" + std::to_string(r) + "] oops")) << result.output;
  }
  EXPECT_EQ(addresses.size(), 1u) << "every rank must get the same root address";
}

// --share-gpu: each rank a host of its own for NCCL (distinct NCCL_HOSTID, distinct across launches
// too), loopback sockets, no InfiniBand, no NVLS, local rank 0; the caller's own values replaced.
TEST(Launcher, ShareGpuMakesEveryRankAHostOfItsOwnOnLoopback) {
  const std::string print =
      " -- sh -c 'echo host=$NCCL_HOSTID if=$NCCL_SOCKET_IFNAME ib=$NCCL_IB_DISABLE nvls=$NCCL_NVLS_ENABLE "
      "local=$LOCAL_RANK/$GTP_LOCAL_RANK/$LOCAL_WORLD_SIZE shared=$GTP_SHARED_GPU'";
  const std::string caller = "env NCCL_HOSTID=same NCCL_SOCKET_IFNAME=eth0 NCCL_NVLS_ENABLE=1 LOCAL_RANK=3 ";
  std::set<std::string> hosts;
  for (int launch = 0; launch < 2; ++launch) {
    const auto result = run_shell(caller + g_launcher + " -n 3 --share-gpu" + print);
    ASSERT_EQ(result.status, 0) << result.output;
    for (int r = 0; r < 3; ++r) {
      const std::regex line("\\[" + std::to_string(r) +
                            "\\] host=(gtp-shared-gpu-[0-9]+-[0-9]+-rank" + std::to_string(r) +
                            ") if=lo ib=1 nvls=0 local=0/0/1 shared=1");
      std::smatch match;
      ASSERT_TRUE(std::regex_search(result.output, match, line)) << result.output;
      hosts.insert(match[1]);
    }
  }
  EXPECT_EQ(hosts.size(), 6u) << "every rank of every launch needs its own NCCL host id";
  // Without the flag the launcher leaves NCCL's environment alone.
  const auto plain = run_shell("env -u NCCL_HOSTID -u GTP_SHARED_GPU " + g_launcher + " -n 2" + print);
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_TRUE(contains(plain.output, "[1] host= if=")) << plain.output;
  EXPECT_FALSE(contains(plain.output, "shared=1")) << plain.output;
  EXPECT_TRUE(parse_launch_args({"-n", "2", "--share-gpu", "--", "p"}).share_gpu);
  EXPECT_FALSE(parse_launch_args({"-n", "2", "--", "p"}).share_gpu);
}

TEST(Launcher, AFailingRankStopsTheOthersAndSetsTheStatus) {
  const auto start = Clock::now();
  const auto result = run_shell(g_launcher + " -n 3 -- sh -c 'if [ $GTP_RANK = 1 ]; then exit 3; fi; sleep 60'");
  EXPECT_EQ(result.status, 3) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 exited with status 3")) << result.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

TEST(Launcher, TimeoutStopsEveryRank) {
  const auto start = Clock::now();
  const auto result = run_shell(g_launcher + " -n 2 --timeout 0.5 -- sleep 60");
  EXPECT_EQ(result.status, 124) << result.output;
  EXPECT_TRUE(contains(result.output, "timed out")) << result.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
}

TEST(Launcher, RanksGetTheDefaultSigpipeBehaviour) {
  // With SIGPIPE ignored (the launcher's own setting), `yes` would complain about a broken pipe.
  const auto result = run_shell(g_launcher + " -n 1 -- sh -c 'yes | head -n 1'");
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "[0] y")) << result.output;
  EXPECT_FALSE(contains(result.output, "Broken pipe")) << result.output;
}

TEST(Launcher, ReportsACommandThatCannotRun) {
  const auto result = run_shell(g_launcher + " -n 2 -- /nonexistent/program");
  EXPECT_EQ(result.status, 127) << result.output;
  EXPECT_TRUE(contains(result.output, "cannot run /nonexistent/program")) << result.output;
}

TEST(Launcher, RejectsBadArguments) {
  EXPECT_EQ(run_shell(g_launcher + " -n 0 -- true").status, 2);
  EXPECT_EQ(run_shell(g_launcher + " -n 2 true").status, 2);
  EXPECT_EQ(run_shell(g_launcher + " -n 2 --").status, 2);
  EXPECT_THROW(parse_launch_args({"--timeout", "-1", "-n", "2", "--", "true"}), std::invalid_argument);
  const LaunchOptions options = parse_launch_args({"-n", "8", "--timeout", "1.5", "--", "prog", "-x", "--", "y"});
  EXPECT_EQ(options.world_size, 8);
  EXPECT_EQ(options.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(options.command, (std::vector<std::string>{"prog", "-x", "--", "y"}));
  EXPECT_EQ(parse_launch_args({"-n", "1", "--timeout", "0.001", "--", "p"}).timeout, std::chrono::milliseconds(1));
}

// Values that used to round to 0 ms ("no timeout") or overflow the conversion are refused, naming the range.
TEST(Launcher, RefusesTimeoutsThatAreNotAFiniteNumberOfSecondsInRange) {
  for (const char* text : {"0.0001", "1e-300", "inf", "nan", "1e30", "0", "", " 5", "5s", "0x10", "-0"}) {
    try {
      parse_launch_args({"-n", "1", "--timeout", text, "--", "true"});
      ADD_FAILURE() << "--timeout '" << text << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "pass seconds in [0.001, 31536000]")) << e.what();
    }
  }
  const auto result = run_shell(g_launcher + " -n 1 --timeout 0.0001 -- true");
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "--timeout 0.0001: pass seconds")) << result.output;
  EXPECT_THROW(parse_launch_args({"-n", "2x", "--", "true"}), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::comm

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: launcher_test PATH_TO_GTP_LAUNCH\n");
    return 2;
  }
  gtp::comm::g_launcher = argv[1];
  return RUN_ALL_TESTS();
}
