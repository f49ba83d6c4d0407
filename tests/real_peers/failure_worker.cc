// One rank of real_peers_failure_test, started by `gtp-launch --share-gpu -n G`: ranks that fail or
// disagree, through the C ABI on the CUDA backend with real NCCL peers sharing one GPU
// (docs/real-peers.md, docs/reliability.md). Usage: failure_worker SCENARIO. Every rank prints
// "rank R: <what> status=<GTP_...> after=<ms> msg=<gtp_last_error>" lines that the test checks, and
// exits 0 (gtp-launch would stop the others at a non-zero exit). call_timeout_ms is kCallTimeoutMs.
//   peer-killed   the last rank kills itself (SIGKILL) at step 3 of gathering steps; the live ranks
//                 must end in an error, each within the call timeout of the step it was in, and
//                 destroy cleanly.
//   peer-stopped  the last rank is stopped (SIGSTOP) at step 3 for 4 call timeouts, then continued:
//                 the live ranks must fail by the watchdog within the call timeout (the hang case:
//                 nothing closes a socket), the stopped one when it resumes; every rank destroys.
//   diverge       rank 1 gathers w1 where every other rank gathers w0 (same shape), in a step that
//                 ends with a drain: the step's check (the default) finds it on the device, and
//                 every rank's next call fails with GTP_ERROR_DIVERGED naming both weights.
//   diverge-every-fill  the same with check_every_fill: the diverging gather's own check finds it
//                 (before the drain) and the same next call fails the same way.
// Without a GPU it prints that it skips, and why.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtp/gtp.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kCallTimeoutMs = 3000;
int g_rank = -1;

long long ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

void report(const char* what, gtp_status_t status, Clock::time_point start, gtp_context_t* ctx) {
  std::printf("rank %d: %s status=%s after=%lld msg=%s\n", g_rank, what, gtp_status_string(status), ms_since(start),
              ctx != nullptr ? gtp_last_error(ctx) : "");
  std::fflush(stdout);
}

// One BF16 weight of 1024 x 1024 over the world's G ranks (no profile: G = world size), its shard in
// device memory (more rows than any rank's share, filled with 1.0).
struct Weight {
  void* shard = nullptr;
  gtp_weight_t w{};
};

gtp_status_t add_weight(gtp_context_t* ctx, Weight& weight, const char* name) {
  const std::int64_t rows = 1024, cols = 1024;
  if (cudaMalloc(&weight.shard, rows * cols * 2) != cudaSuccess) return GTP_ERROR_CUDA;
  std::vector<std::uint16_t> ones(static_cast<std::size_t>(rows * cols), 0x3f80);
  if (cudaMemcpy(weight.shard, ones.data(), ones.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
    return GTP_ERROR_CUDA;
  }
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = name;
  desc.shard = weight.shard;
  desc.rows = rows;
  desc.cols = cols;
  return gtp_weight_register(ctx, &desc, &weight.w);
}

gtp_context_t* create(Clock::time_point& start, bool check_every_fill = false) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.check_every_fill = check_every_fill ? 1 : 0;
  config.bootstrap = GTP_BOOTSTRAP_UCX_FROM_ENV;
  config.backend = GTP_BACKEND_CUDA;
  config.timeout_ms = 120000;  // creation over loopback sockets, ranks time-sliced
  config.call_timeout_ms = kCallTimeoutMs;
  config.prefetch_depth = 1;
  gtp_context_t* ctx = nullptr;
  start = Clock::now();
  const gtp_status_t status = gtp_context_create(&config, &ctx);
  report("create", status, start, nullptr);
  return status == GTP_SUCCESS ? ctx : nullptr;
}

// Waits for `stream` without blocking on it: polls the watchdog (gtp_context_check) until the stream
// is idle, a check fails, or `limit` passes (then TIMEOUT: the watchdog missed its deadline).
gtp_status_t wait_watched(gtp_context_t* ctx, cudaStream_t stream, std::chrono::milliseconds limit) {
  const auto start = Clock::now();
  for (;;) {
    const cudaError_t query = cudaStreamQuery(stream);
    if (query == cudaSuccess) return gtp_context_check(ctx);
    if (query != cudaErrorNotReady) return GTP_ERROR_CUDA;
    const gtp_status_t status = gtp_context_check(ctx);
    if (status != GTP_SUCCESS) return status;
    if (Clock::now() - start > limit) return GTP_ERROR_TIMEOUT;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// A step: every weight materialized and released on `stream`, then drained.
gtp_status_t step(gtp_context_t* ctx, std::vector<Weight>& weights, cudaStream_t stream) {
  gtp_status_t status = GTP_SUCCESS;
  for (Weight& weight : weights) {
    void* ptr = nullptr;
    size_t count = 0;
    status = gtp_materialize(ctx, &weight.w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, stream);
    if (status == GTP_SUCCESS) status = gtp_release(ctx, &weight.w, 1, stream);
    if (status != GTP_SUCCESS) return status;
  }
  return gtp_drain(ctx, stream);
}

pid_t stop_me_later(std::chrono::milliseconds stopped) {
  const pid_t me = getpid();
  const pid_t child = fork();
  if (child == 0) {
    kill(me, SIGSTOP);
    usleep(static_cast<useconds_t>(stopped.count() * 1000));
    kill(me, SIGCONT);
    _exit(0);
  }
  return child;
}

void peer_fails(int world, bool kill_it) {
  Clock::time_point start;
  gtp_context_t* ctx = create(start);
  if (ctx == nullptr) return;
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<Weight> weights(4);
  gtp_status_t status = GTP_SUCCESS;
  for (std::size_t i = 0; i < weights.size() && status == GTP_SUCCESS; ++i) {
    status = add_weight(ctx, weights[i], ("w" + std::to_string(i)).c_str());
  }
  std::vector<gtp_weight_t> handles;
  for (const Weight& weight : weights) handles.push_back(weight.w);
  if (status == GTP_SUCCESS) status = gtp_weights_shard_updated(ctx, handles.data(), handles.size(), stream);
  report("setup", status, start, ctx);
  if (status != GTP_SUCCESS) return;
  const bool failing = g_rank == world - 1;
  pid_t stopper = -1;
  for (int s = 0; s < 20 && status == GTP_SUCCESS; ++s) {
    if (failing && s == 3) {
      std::printf("rank %d: %s at step %d\n", g_rank, kill_it ? "killing myself" : "stopping myself", s);
      std::fflush(stdout);
      if (kill_it) raise(SIGKILL);
      stopper = stop_me_later(std::chrono::milliseconds(4 * kCallTimeoutMs));
      // Stopped here until the child continues this process.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    start = Clock::now();
    status = step(ctx, weights, stream);
    if (status == GTP_SUCCESS) status = wait_watched(ctx, stream, std::chrono::milliseconds(30 * kCallTimeoutMs));
  }
  report(failing ? "resumed step" : "live step", status, start, ctx);
  start = Clock::now();
  report("destroy", gtp_context_destroy(ctx), start, nullptr);
  if (stopper > 0) waitpid(stopper, nullptr, 0);
  // The stream's work ended with the aborted communicators; nothing is left waiting on a peer.
  cudaStreamDestroy(stream);
}

void diverge(bool check_every_fill) {
  Clock::time_point start;
  gtp_context_t* ctx = create(start, check_every_fill);
  if (ctx == nullptr) return;
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<Weight> weights(2);
  gtp_status_t status = add_weight(ctx, weights[0], "w0");
  if (status == GTP_SUCCESS) status = add_weight(ctx, weights[1], "w1");
  gtp_weight_t both[2] = {weights[0].w, weights[1].w};
  if (status == GTP_SUCCESS) status = gtp_weights_shard_updated(ctx, both, 2, stream);
  if (status == GTP_SUCCESS) status = wait_watched(ctx, stream, std::chrono::milliseconds(60000));
  report("setup", status, start, ctx);
  if (status != GTP_SUCCESS) return;
  std::vector<Weight> mine = {weights[g_rank == 1 ? 1 : 0]};
  start = Clock::now();
  status = step(ctx, mine, stream);
  report("diverging step", status, start, ctx);
  if (status == GTP_SUCCESS) status = wait_watched(ctx, stream, std::chrono::milliseconds(60000));
  report("stream after the diverging step", status, start, ctx);
  // The device found the mismatch; the next call (here the watchdog poll) raises it.
  if (status == GTP_SUCCESS) status = gtp_context_check(ctx);
  report("after the diverging step", status, start, ctx);
  start = Clock::now();
  report("destroy", gtp_context_destroy(ctx), start, nullptr);
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank = std::getenv("GTP_RANK");
  const char* world = std::getenv("GTP_WORLD_SIZE");
  g_rank = rank != nullptr ? std::atoi(rank) : -1;
  const int world_size = world != nullptr ? std::atoi(world) : -1;
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario != "peer-killed" && scenario != "peer-stopped" && scenario != "diverge" &&
      scenario != "diverge-every-fill") {
    std::fprintf(stderr,
                 "usage: failure_worker peer-killed | peer-stopped | diverge | diverge-every-fill (under gtp-launch "
                 "--share-gpu)\n");
    return 2;
  }
  if (scenario == "peer-killed" && g_rank == world_size - 1) {
    // The rank that dies runs in a child, so that this process exits 0 and gtp-launch lets the live
    // ranks finish (it stops every rank when one exits non-zero). Before any CUDA call: CUDA does not
    // survive a fork.
    const pid_t child = fork();
    if (child > 0) {
      int wait_status = 0;
      waitpid(child, &wait_status, 0);
      std::printf("rank %d: the failing rank ended by %s %d\n", g_rank, WIFSIGNALED(wait_status) ? "signal" : "exit",
                  WIFSIGNALED(wait_status) ? WTERMSIG(wait_status) : WEXITSTATUS(wait_status));
      return 0;
    }
  }
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::printf("rank %d: skipped: no CUDA device: %s\n", g_rank,
                error != cudaSuccess ? cudaGetErrorString(error) : "cudaGetDeviceCount returned 0");
    return 0;
  }
  if (scenario == "peer-killed" || scenario == "peer-stopped") {
    peer_fails(world_size, scenario == "peer-killed");
  } else {
    diverge(scenario == "diverge-every-fill");
  }
  std::printf("rank %d: done\n", g_rank);
  return 0;
}
