// gtp-launch: starts N processes of one command on this host, the way mpirun would, for tests and
// benchmarks. Each gets GTP_RANK, GTP_WORLD_SIZE and GTP_ROOT_ADDR (127.0.0.1 and a free port); their
// output lines are forwarded with a "[rank] " prefix; when one fails, the others are stopped.
// --share-gpu makes the N processes real NCCL peers on ONE GPU (shared_gpu_environment): a
// correctness configuration, never one for timings (docs/real-peers.md).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace gtp::comm {

struct LaunchOptions {
  int world_size = 0;
  std::chrono::milliseconds timeout{0};  // 0: no limit
  bool share_gpu = false;                // every rank a host of its own on the one visible GPU
  std::vector<std::string> command;
};

// What --share-gpu sets in rank `rank`'s environment, on top of GTP_RANK / GTP_WORLD_SIZE /
// GTP_ROOT_ADDR: a distinct NCCL_HOSTID per rank (unique to this launch, `launch_id`), so NCCL sees
// G hosts and neither refuses the duplicate GPU nor tries P2P / shared memory between the ranks, and
// connects them with its socket transport over loopback (NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1);
// NCCL_NVLS_ENABLE=0; LOCAL_RANK / GTP_LOCAL_RANK 0 and LOCAL_WORLD_SIZE 1 (each rank is alone on its
// "host", so programs that pick their device by local rank take the one GPU); GTP_SHARED_GPU=1, which
// benchmarks read to mark their timings meaningless. Values the caller already exported are replaced.
std::vector<std::pair<std::string, std::string>> shared_gpu_environment(int rank, const std::string& launch_id);

// Parses `-n N [--timeout S] [--share-gpu] -- CMD ARGS...` (argv without the program name). Throws
// std::invalid_argument with the usage on bad input.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// Runs the job and returns the launcher's exit status: 0 when every rank exited 0; else the status of
// the first rank that failed (128 + signal number for a signal); 124 when the timeout expired.
// SIGINT / SIGTERM to the launcher stop every rank.
int launch(const LaunchOptions& options);

}  // namespace gtp::comm
