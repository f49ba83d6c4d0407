// One rank of gtp_failure_test, started by gtp-launch: a failing rank through the C ABI on the host
// backend (GTP_BOOTSTRAP_UCX_FROM_ENV). Usage: gtp_failure_worker SCENARIO [ARG]. Each rank prints
// "rank R: <what> status=<GTP_...> after=<ms> msg=<gtp_last_error>" lines the test checks, and exits 0
// (gtp-launch would stop the others at a non-zero exit).
//   throw-mid-call  the last rank's gtp_materialize fails inside the call (its memory budget cannot
//                   hold the weight); the others are in the gather, with a 60 s call timeout.
//   never-joins     the last rank never creates its context; the others create with timeout_ms 2000.
//   timeout-destroy N rounds of: create, rank 1 comes late to (or, with "skip", never makes) a
//                   materialize so rank 0 times out (call timeout 1 s), both destroy; then a context
//                   that works, to show recovery.
//   depth-diverge N rounds of 3+ ranks with prefetch depth = rank (their gathers differ, some time
//                   out part-way through transfers), then every rank destroys.
//   int64-max       timeout_ms = call_timeout_ms = INT64_MAX: create, a materialize, destroy succeed.
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

gtp_status_t setup(gtp_context_t* ctx, int world, Model& m, std::int64_t rows = 64, std::int64_t cols = 256) {
  (void)world;
  m.shard.assign(static_cast<std::size_t>(rows * cols), 0x3f80);  // 1.0; more than any rank's rows
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "w0";
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
  // The last rank's cache cannot hold the gathered weight: its materialize throws inside the call.
  if (g_rank == world - 1) config.memory_budget_bytes = 1024;
  gtp_context_t* ctx = nullptr;
  auto start = Clock::now();
  gtp_status_t status = gtp_context_create(&config, &ctx);
  if (status != GTP_SUCCESS) return report("create", status, start, nullptr);
  Model m;
  status = setup(ctx, world, m);
  if (status != GTP_SUCCESS) return report("setup", status, start, ctx);
  start = Clock::now();
  report("materialize", materialize(ctx, m), start, ctx);
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
    config.call_timeout_ms = 1000;
    gtp_context_t* ctx = nullptr;
    auto start = Clock::now();
    gtp_status_t status = gtp_context_create(&config, &ctx);
    if (status != GTP_SUCCESS) return report("create", status, start, nullptr);
    Model m;
    status = setup(ctx, world, m, 2048, 2048);
    if (status != GTP_SUCCESS) return report("setup", status, start, ctx);
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

// Ranks with different prefetch depths (depth = rank) issue different gathers: some time out; then
// every rank destroys. Rounds of it, each printing its statuses.
void depth_diverge(int world, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    gtp_context_config_t config = ucx_config();
    config.timeout_ms = 20000;
    config.call_timeout_ms = 1000;
    config.prefetch_depth = g_rank;
    gtp_context_t* ctx = nullptr;
    auto start = Clock::now();
    gtp_status_t status = gtp_context_create(&config, &ctx);
    if (status != GTP_SUCCESS) return report("create", status, start, nullptr);
    std::vector<Model> models(6);
    for (std::size_t i = 0; i < models.size() && status == GTP_SUCCESS; ++i) {
      const std::int64_t rows = 1024, cols = 1024;
      models[i].shard.assign(static_cast<std::size_t>(rows * cols), 0x3f80);  // more than any rank's rows
      const std::string name = "w" + std::to_string(i);
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      desc.name = name.c_str();
      desc.shard = models[i].shard.data();
      desc.rows = rows;
      desc.cols = cols;
      status = gtp_weight_register(ctx, &desc, &models[i].w);
      if (status == GTP_SUCCESS) status = gtp_weights_shard_updated(ctx, &models[i].w, 1, nullptr);
    }
    for (int step = 0; step < 3 && status == GTP_SUCCESS; ++step) {
      for (std::size_t i = 0; i < models.size() && status == GTP_SUCCESS; ++i) {
        status = materialize(ctx, models[i]);
        if (status == GTP_SUCCESS) status = gtp_release(ctx, &models[i].w, 1, nullptr);
      }
      if (status == GTP_SUCCESS) status = gtp_drain(ctx, nullptr);
    }
    report("diverged steps", status, start, ctx);
    start = Clock::now();
    report("destroy after divergence", gtp_context_destroy(ctx), start, nullptr);
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
  } else if (scenario == "depth-diverge") {
    depth_diverge(world, argc > 2 ? std::atoi(argv[2]) : 3);
  } else if (scenario == "int64-max") {
    int64_max(world);
  } else {
    std::fprintf(stderr,
                 "usage: gtp_failure_worker throw-mid-call | never-joins | timeout-destroy [ROUNDS [late|skip]] | "
                 "depth-diverge [ROUNDS] | int64-max\n");
    return 2;
  }
  std::printf("rank %d: done\n", g_rank);
  return 0;
}
