// run_in_child: every way the child can end is reported, and this process is untouched by it.
#include "topology/internal/child_probe.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace gtp::topology::internal {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kLong{10000};

TEST(ChildProbe, TrueFalseAndExceptions) {
  EXPECT_EQ(run_in_child([] { return true; }, kLong).kind, ChildOutcome::kTrue);
  EXPECT_EQ(run_in_child([] { return false; }, kLong).kind, ChildOutcome::kFalse);
  EXPECT_EQ(run_in_child([]() -> bool { throw std::runtime_error("x"); }, kLong).kind, ChildOutcome::kFalse);
}

TEST(ChildProbe, CrashAbortAndExitAreDeathsNamingHow) {
  const ChildOutcome segv = run_in_child([] { return ::raise(SIGSEGV) == 0; }, kLong);
  EXPECT_EQ(segv.kind, ChildOutcome::kDied);
  EXPECT_EQ(segv.how.rfind("signal 11 (", 0), 0u) << segv.how;
  const ChildOutcome abrt = run_in_child([]() -> bool { std::abort(); }, kLong);
  EXPECT_EQ(abrt.kind, ChildOutcome::kDied);
  EXPECT_EQ(abrt.how.rfind("signal 6 (", 0), 0u) << abrt.how;
  const ChildOutcome exited = run_in_child([]() -> bool { ::_exit(3); }, kLong);
  EXPECT_EQ(exited.kind, ChildOutcome::kDied);
  EXPECT_EQ(exited.how, "exit status 3");
}

TEST(ChildProbe, WorkWritesNothingHere) {
  int value = 1;
  EXPECT_EQ(run_in_child([&] { value = 2; return true; }, kLong).kind, ChildOutcome::kTrue);
  EXPECT_EQ(value, 1);
}

TEST(ChildProbe, AHangIsKilledAtTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  const ChildOutcome hung = run_in_child([] {
    for (;;) ::pause();
    return true;
  }, milliseconds(300));
  EXPECT_EQ(hung.kind, ChildOutcome::kTimedOut);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
}

// An application that ignores SIGCHLD has its children reaped without a status: the verdict still
// comes through the pipe, only the way the child died is unknown.
TEST(ChildProbe, SigchldIgnored) {
  struct sigaction old {};
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGCHLD, &ignore, &old), 0);
  EXPECT_EQ(run_in_child([] { return true; }, kLong).kind, ChildOutcome::kTrue);
  const ChildOutcome died = run_in_child([] { return ::raise(SIGSEGV) == 0; }, kLong);
  ::sigaction(SIGCHLD, &old, nullptr);
  EXPECT_EQ(died.kind, ChildOutcome::kDied);
  EXPECT_EQ(died.how, "an unknown way (its exit status could not be read)");
}

}  // namespace
}  // namespace gtp::topology::internal
