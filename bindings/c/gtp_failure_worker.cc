// One rank of gtp_failure_test, started by gtp-launch: a failing rank through the C ABI on the host
// backend (GTP_BOOTSTRAP_UCX_FROM_ENV). Usage: gtp_failure_worker SCENARIO [ARG]. Each rank prints
// "rank R: <what> status=<GTP_...> after=<ms> msg=<gtp_last_error>" lines the test checks, and exits 0
// (gtp-launch would stop the others at a non-zero exit). Every rank creates its context with the same
// settings (ranks that differ are refused at create since issue 21): a rank fails by what it does.
//   throw-mid-call  the last rank still holds w0 (never released it) when the ranks materialize w1;
//                   the memory budget, room for one weight, cannot hold w1 there, so its
//                   gtp_materialize throws inside the call (after 0.5 s, so the others are in the
//                   gather, with a 60 s call timeout).
//   never-joins     the last rank never creates its context; the others create with timeout_ms 2000.
//   timeout-destroy N rounds of: create, rank 1 comes late to (or, with "skip", never makes) a
//                   materialize so rank 0 times out (call timeout 1 s), both destroy; then a context
//                   that works (call timeout 20 s), to show recovery.
//   stall-mid-flight N rounds of 3+ ranks gathering megabyte weights, call timeout 1 s, while the last
//                   rank is stopped (SIGSTOP, 2 s, as by a debugger or preemption) a few ms into the
//                   steps: its peers time out, some part-way through transfers; then every rank
//                   destroys.
//   int64-max       timeout_ms = call_timeout_ms = INT64_MAX: create, a materialize, destroy succeed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtp/gtp.h"

namespace {

using Clock = std::chrono::steady_clock;

int g_rank = -1;

long long ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

void report(const char* what, gtp_status_t status, Clock::time_point start, gtp_context_t* ctx) {
  std::printf("rank %d: %s status=%s after=%lld msg=%s\n", g_rank, what, gtp_status_string(status), ms_since(start),
              gtp_last_error(ctx));
  std::fflush(stdout);
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : -1;
}

// One BF16 weight of rows x cols over the world's G ranks (no profile: G = world size).
struct Model {
  std::vector<std::uint16_t> shard;
  gtp_weight_t w{};
};

gtp_status_t setup(gtp_context_t* ctx, int world, Model& m, std::int64_t rows = 64, std::int64_t cols = 256,
                   const char* name = "w0") {
  (void)world;
  m.shard.assign(static_cast<std::size_t>(rows * cols), 0x3f80);  // 1.0; more than any rank's rows
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = name;
  desc.shard = m.shard.data();
  desc.rows = rows;
  desc.cols = cols;
  gtp_status_t status = gtp_weight_register(ctx, &desc, &m.w);
  if (status == GTP_SUCCESS) status = gtp_weights_shard_updated(ctx, &m.w, 1, nullptr);
  return status;
}

gtp_status_t materialize(gtp_context_t* ctx, const Model& m) {
  void* ptr = nullptr;
  size_t count = 0;
  return gtp_materialize(ctx, &m.w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr);
}

gtp_context_config_t ucx_config() {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.bootstrap = GTP_BOOTSTRAP_UCX_FROM_ENV;
  config.prefetch_depth = 0;
  return config;
}

void throw_mid_call(int world) {
  gtp_context_config_t config = ucx_config();
  config.timeout_ms = 20000;
  config.call_timeout_ms = 60000;  // a peer must learn of the failure long before this
  // Room for one gathered 64 x 256 BF16 weight (rows padded to G's alignment: 32 KiB at G = 2,
  // 48 KiB at G = 3), not two.
  config.memory_budget_bytes = 60 * 1024;
  gtp_context_t* ctx = nullptr;
  auto start = Clock::now();
  gtp_status_t status = gtp_context_create(&config, &ctx);
  if (status != GTP_SUCCESS) return report("create", status, start, nullptr);
  Model m0, m1;
  status = setup(ctx, world, m0);
  if (status == GTP_SUCCESS) status = setup(ctx, world, m1, 64, 256, "w1");
  if (status == GTP_SUCCESS) status = materialize(ctx, m0);
  // The last rank keeps w0 (a consumer still using it); the others release it.
  if (status == GTP_SUCCESS && g_rank != world - 1) status = gtp_release(ctx, &m0.w, 1, nullptr);
  if (status != GTP_SUCCESS) return report("setup", status, start, ctx);
  // Its abort must find the peers waiting for it in w1's gather, not still finishing w0's.
  if (g_rank == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  start = Clock::now();
  report("materialize", materialize(ctx, m1), start, ctx);
  start = Clock::now();
  report("check", gtp_context_check(ctx), start, ctx);
  start = Clock::now();
  report("destroy", gtp_context_destroy(ctx), start, nullptr);
}

void never_joins(int world) {
  if (g_rank == world - 1) {
    std::printf("rank %d: not joining\n", g_rank);
    return;
  }
  gtp_context_config_t config = ucx_config();
  config.timeout_ms = 2000;
  gtp_context_t* ctx = nullptr;
  const auto start = Clock::now();
  const gtp_status_t status = gtp_context_create(&config, &ctx);
  report("create", status, start, nullptr);
  if (status == GTP_SUCCESS) gtp_context_destroy(ctx);
}

// Rank 1 comes late to the failing round's materialize, or (`skip`) never makes it and destroys at
// once while rank 0 still sends it megabytes.
void timeout_destroy(int world, int rounds, bool skip) {
  for (int round = 0; round <= rounds; ++round) {
    const bool fail = round < rounds;  // the last round must work: recovery
    gtp_context_config_t config = ucx_config();
    config.timeout_ms = 20000;
    // The working round shows that a new context works, not how fast: under CI load its ranks once
    // reached the materialize 1.07 s apart (where the delay was is what the create / setup lines say).
    config.call_timeout_ms = fail ? 1000 : 20000;
    gtp_context_t* ctx = nullptr;
    auto start = Clock::now();
    gtp_status_t status = gtp_context_create(&config, &ctx);
    report("create", status, start, nullptr);
    if (status != GTP_SUCCESS) return;
    Model m;
    start = Clock::now();
    status = setup(ctx, world, m, 2048, 2048);
    report("setup", status, start, ctx);
    if (status != GTP_SUCCESS) return;
    start = Clock::now();
    // Late past rank 0's timeout and its destroy: rank 0 closes while its megabytes to rank 1 wait.
    if (fail && g_rank == 1 && !skip) std::this_thread::sleep_for(std::chrono::milliseconds(4000));
    status = fail && g_rank == 1 && skip ? GTP_ERROR_TIMEOUT : materialize(ctx, m);
    const std::string what = std::string(fail ? "failing" : "working") + " materialize";
    report(what.c_str(), status, start, ctx);
    start = Clock::now();
    status = gtp_context_destroy(ctx);
    report(fail ? "destroy after failure" : "destroy", status, start, nullptr);
  }
}

// Stops this process `after` from now for `stopped`, from a child (a stopped process runs nothing
// of its own); the child only sleeps and signals. Returns the child's pid for reap().
pid_t stop_me_later(std::chrono::milliseconds after, std::chrono::milliseconds stopped) {
  const pid_t me = getpid();
  const pid_t child = fork();
  if (child == 0) {
    usleep(static_cast<useconds_t>(after.count() * 1000));
    kill(me, SIGSTOP);
    usleep(static_cast<useconds_t>(stopped.count() * 1000));
    kill(me, SIGCONT);
    _exit(0);
  }
  return child;
}

void reap(pid_t child) {
  if (child > 0) waitpid(child, nullptr, 0);
}

// The last rank is stopped a few milliseconds into steps of megabyte gathers: its peers time out
// (some with megabytes in flight to or from it), it fails when it resumes; then every rank destroys.
// Rounds of it, each printing its statuses.
void stall_mid_flight(int world, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    gtp_context_config_t config = ucx_config();
    config.timeout_ms = 20000;
    config.call_timeout_ms = 1000;
    config.prefetch_depth = 2;
    gtp_context_t* ctx = nullptr;
    auto start = Clock::now();
    gtp_status_t status = gtp_context_create(&config, &ctx);
    if (status != GTP_SUCCESS) return report("create", status, start, nullptr);
    std::vector<Model> models(6);
    for (std::size_t i = 0; i < models.size() && status == GTP_SUCCESS; ++i) {
      const std::string name = "w" + std::to_string(i);
      status = setup(ctx, world, models[i], 1024, 1024, name.c_str());
    }
    const pid_t stopper = g_rank == world - 1 && status == GTP_SUCCESS
                              ? stop_me_later(std::chrono::milliseconds(20 + 15 * round), std::chrono::milliseconds(2000))
                              : -1;
    start = Clock::now();
    // Steps until one fails (bounded): the stop lands inside them whatever this machine's speed.
    for (int step = 0; step < 10000 && status == GTP_SUCCESS && ms_since(start) < 10000; ++step) {
      for (std::size_t i = 0; i < models.size() && status == GTP_SUCCESS; ++i) {
        status = materialize(ctx, models[i]);
        if (status == GTP_SUCCESS) status = gtp_release(ctx, &models[i].w, 1, nullptr);
      }
      if (status == GTP_SUCCESS) status = gtp_drain(ctx, nullptr);
    }
    report("stalled steps", status, start, ctx);
    start = Clock::now();
    report("destroy after stall", gtp_context_destroy(ctx), start, nullptr);
    reap(stopper);
  }
}

void int64_max(int world) {
  gtp_context_config_t config = ucx_config();
  config.timeout_ms = INT64_MAX;
  config.call_timeout_ms = INT64_MAX;
  gtp_context_t* ctx = nullptr;
  auto start = Clock::now();
  gtp_status_t status = gtp_context_create(&config, &ctx);
  report("create", status, start, nullptr);
  if (status != GTP_SUCCESS) return;
  Model m;
  status = setup(ctx, world, m);
  if (status == GTP_SUCCESS) status = materialize(ctx, m);
  if (status == GTP_SUCCESS) status = gtp_release(ctx, &m.w, 1, nullptr);
  report("materialize", status, start, ctx);
  report("destroy", gtp_context_destroy(ctx), start, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  g_rank = env_int("GTP_RANK");
  const int world = env_int("GTP_WORLD_SIZE");
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "throw-mid-call") {
    throw_mid_call(world);
  } else if (scenario == "never-joins") {
    never_joins(world);
  } else if (scenario == "timeout-destroy") {
    timeout_destroy(world, argc > 2 ? std::atoi(argv[2]) : 3, argc > 3 && std::string(argv[3]) == "skip");
  } else if (scenario == "stall-mid-flight") {
    stall_mid_flight(world, argc > 2 ? std::atoi(argv[2]) : 3);
  } else if (scenario == "int64-max") {
    int64_max(world);
  } else {
    std::fprintf(stderr,
                 "usage: gtp_failure_worker throw-mid-call | never-joins | timeout-destroy [ROUNDS [late|skip]] | "
                 "stall-mid-flight [ROUNDS] | int64-max\n");
    return 2;
  }
  std::printf("rank %d: done\n", g_rank);
  return 0;
}
