// Runs a piece of work in a forked child, so that a crash, abort or hang inside a third-party parser
// (hwloc 2.9 segfaults on some malformed XML) becomes an error in this process instead of killing it.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace gtp::topology::internal {

struct ChildOutcome {
  enum Kind { kTrue, kFalse, kDied, kTimedOut } kind;
  std::string how;  // kDied: "signal 11 (Segmentation fault)" or "exit status 1"; else empty
};

// Forks; the child runs `work` (its exceptions count as false), reports the result through a pipe and
// leaves with _exit. The parent waits at most `timeout`, then kills the child. The child shares nothing
// writable with this process, so whatever `work` corrupts there is lost with it. Throws
// std::runtime_error when fork or pipe fail.
ChildOutcome run_in_child(const std::function<bool()>& work, std::chrono::milliseconds timeout);

}  // namespace gtp::topology::internal
