// gtp-launch: starts N processes of one command on this host, the way mpirun would, for tests and
// benchmarks. Each gets GTP_RANK, GTP_WORLD_SIZE and GTP_ROOT_ADDR (127.0.0.1 and a free port); their
// output lines are forwarded with a "[rank] " prefix; when one fails, the others are stopped.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gtp::comm {

struct LaunchOptions {
  int world_size = 0;
  std::chrono::milliseconds timeout{0};  // 0: no limit
  std::vector<std::string> command;
};

// Parses `-n N [--timeout S] -- CMD ARGS...` (argv without the program name). Throws
// std::invalid_argument with the usage on bad input.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// Runs the job and returns the launcher's exit status: 0 when every rank exited 0; else the status of
// the first rank that failed (128 + signal number for a signal); 124 when the timeout expired.
// SIGINT / SIGTERM to the launcher stop every rank.
int launch(const LaunchOptions& options);

}  // namespace gtp::comm
