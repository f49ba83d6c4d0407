// What the fill-tag check (docs/reliability.md, "Ranks that disagree") costs the host backend at
// G = 2: two thread ranks over the C ABI, tiny BF16 weights, a fixed number of steps (both ranks must
// make the same calls, so no adaptive iteration counts), materialize + release per call, a drain per
// step. Prints per configuration rank 0's wall and CPU time per weight, checking once per step at
// drain (the default) and at every fill (check_every_fill). At G = 1 nothing is checked
// (c_abi_overhead_bench measures that case).
//   bazel run -c opt //bench/remat:fill_tag_overhead_bench
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "gtp/gtp.h"

namespace {

using gtp::comm::Bootstrap;

gtp_bootstrap_result_t guarded(void* user, const std::function<void(Bootstrap&)>& body) {
  try {
    body(*static_cast<Bootstrap*>(user));
    return GTP_BOOTSTRAP_OK;
  } catch (...) {
    return GTP_BOOTSTRAP_ERROR;
  }
}

gtp_bootstrap_callbacks_t callbacks_for(Bootstrap& b) {
  gtp_bootstrap_callbacks_t c{};
  c.struct_size = sizeof(c);
  c.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  c.rank = b.rank();
  c.world_size = b.world_size();
  c.user_data = &b;
  c.allgather = [](void* u, const void* s, void* r, size_t n, int64_t) {
    return guarded(u, [&](Bootstrap& x) { x.allgather(s, r, n); });
  };
  c.broadcast = [](void* u, void* buf, size_t n, int32_t root, int64_t) {
    return guarded(u, [&](Bootstrap& x) { x.broadcast(buf, n, root); });
  };
  c.barrier = [](void* u, int64_t) { return guarded(u, [](Bootstrap& x) { x.barrier(); }); };
  return c;
}

void ok(gtp_status_t status, gtp_context_t* ctx, const char* what) {
  if (status != GTP_SUCCESS) throw std::runtime_error(std::string(what) + ": " + gtp_last_error(ctx));
}

double thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

constexpr int kCallsPerStep = 8, kWarmSteps = 3, kSteps = 200;
constexpr int64_t kRows = 32, kCols = 64;  // 16 rows per rank

// Rank 0's (wall, cpu) microseconds per weight.
std::pair<double, double> run(int per_call, int depth, bool every_fill) {
  std::pair<double, double> result;
  auto group = gtp::comm::ThreadBootstrap::create_group(2, std::chrono::milliseconds(60000));
  gtp::comm::internal::rethrow_first(gtp::comm::internal::run_ranks(2, [&](int rank) {
    const gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[rank]);
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    config.prefetch_depth = depth;
    config.check_every_fill = every_fill ? 1 : 0;
    gtp_context_t* ctx = nullptr;
    ok(gtp_context_create(&config, &ctx), nullptr, "gtp_context_create");
    const std::vector<uint16_t> shard(kRows / 2 * kCols, 0x3F80);
    std::vector<gtp_weight_t> ws(kCallsPerStep * per_call);
    for (size_t i = 0; i < ws.size(); ++i) {
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      const std::string name = "w" + std::to_string(i);
      desc.name = name.c_str();
      desc.shard = shard.data();
      desc.rows = kRows;
      desc.cols = kCols;
      desc.wire = GTP_WIRE_BF16;
      ok(gtp_weight_register(ctx, &desc, &ws[i]), ctx, "gtp_weight_register");
    }
    ok(gtp_weights_shard_updated(ctx, ws.data(), ws.size(), nullptr), ctx, "gtp_weights_shard_updated");
    std::vector<void*> out(per_call);
    const auto step = [&] {
      for (int c = 0; c < kCallsPerStep; ++c) {
        size_t count = 0;
        ok(gtp_materialize(ctx, &ws[c * per_call], per_call, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, out.data(),
                           out.size(), &count, nullptr),
           ctx, "gtp_materialize");
        ok(gtp_release(ctx, &ws[c * per_call], per_call, nullptr), ctx, "gtp_release");
      }
      ok(gtp_drain(ctx, nullptr), ctx, "gtp_drain");
    };
    for (int s = 0; s < kWarmSteps; ++s) step();
    const auto wall0 = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu_us();
    for (int s = 0; s < kSteps; ++s) step();
    const double cpu = thread_cpu_us() - cpu0;
    const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wall0).count();
    const double weights = static_cast<double>(kSteps) * ws.size();
    if (rank == 0) result = {wall / weights, cpu / weights};
    ok(gtp_context_destroy(ctx), nullptr, "gtp_context_destroy");
  }));
  return result;
}

}  // namespace

int main() {
  for (int per_call : {1, 8}) {
    for (int depth : {0, 1, 2}) {
      for (bool every_fill : {false, true}) {
        const auto [wall, cpu] = run(per_call, depth, every_fill);
        std::printf("{\"G\": 2, \"weights_per_call\": %d, \"depth\": %d, \"check_every_fill\": %s, "
                    "\"wall_us_per_weight\": %.2f, \"cpu_us_per_weight\": %.2f}\n",
                    per_call, depth, every_fill ? "true" : "false", wall, cpu);
      }
    }
  }
  return 0;
}
