// Host overhead of gtp_materialize + gtp_release through the C ABI, per weight, on the prefetch-hit
// path: host backend, G = 1, tiny BF16 weights, 1 / 8 / 64 weights per call, depth 1..4. Reported as
// us_per_weight (target <= 3 us), with allocations after warm-up (must be 0) and the cache's slot
// bytes against the (depth + 1) x largest-group bound as counters.
//   bazel run -c opt //bench/remat:c_abi_overhead_bench -- --benchmark_out=$PWD/out.json
#include <benchmark/benchmark.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/remat/overhead_model.h"
#include "gtp/gtp.h"

namespace gtp::bench::remat {
namespace {

// One rank: every bootstrap collective is a copy.
gtp_bootstrap_result_t allgather(void*, const void* send, void* recv, size_t bytes, int64_t) {
  std::memcpy(recv, send, bytes);
  return GTP_BOOTSTRAP_OK;
}
gtp_bootstrap_result_t broadcast(void*, void*, size_t, int32_t, int64_t) { return GTP_BOOTSTRAP_OK; }
gtp_bootstrap_result_t barrier(void*, int64_t) { return GTP_BOOTSTRAP_OK; }

void ok(gtp_status_t status, gtp_context_t* ctx, const char* what) {
  if (status != GTP_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": " + gtp_status_string(status) + ": " + gtp_last_error(ctx));
  }
}

nlohmann::json stats(gtp_context_t* ctx) {
  size_t len = 0;
  ok(gtp_stats_json(ctx, nullptr, 0, &len) == GTP_ERROR_INVALID_ARGUMENT ? GTP_SUCCESS : GTP_ERROR_INTERNAL, ctx,
     "gtp_stats_json size");
  std::string text(len + 1, '\0');
  ok(gtp_stats_json(ctx, text.data(), text.size(), &len), ctx, "gtp_stats_json");
  text.resize(len);
  return nlohmann::json::parse(text);
}

void BM_CAbiMaterializeRelease(benchmark::State& state) {
  const int per_call = static_cast<int>(state.range(0));
  const int depth = static_cast<int>(state.range(1));
  gtp_bootstrap_callbacks_t callbacks;
  std::memset(&callbacks, 0, sizeof callbacks);
  callbacks.struct_size = sizeof callbacks;
  callbacks.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  callbacks.rank = 0;
  callbacks.world_size = 1;
  callbacks.allgather = allgather;
  callbacks.broadcast = broadcast;
  callbacks.barrier = barrier;
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.prefetch_depth = depth;
  gtp_context_t* ctx = nullptr;
  ok(gtp_context_create(&config, &ctx), nullptr, "gtp_context_create");

  std::vector<std::uint16_t> shard(kRows * kCols, 0x3F80);
  std::vector<gtp_weight_t> weights(static_cast<std::size_t>(kCallsPerStep) * per_call);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    const std::string name = "w" + std::to_string(i);
    desc.name = name.c_str();
    desc.shard = shard.data();
    desc.rows = kRows;
    desc.cols = kCols;
    ok(gtp_weight_register(ctx, &desc, &weights[i]), ctx, "gtp_weight_register");
  }
  ok(gtp_weights_shard_updated(ctx, weights.data(), weights.size(), nullptr), ctx, "gtp_weights_shard_updated");
  std::vector<void*> out(per_call);
  size_t count = 0;
  const auto step = [&] {
    for (int c = 0; c < kCallsPerStep; ++c) {
      const gtp_weight_t* ws = weights.data() + static_cast<std::size_t>(c) * per_call;
      ok(gtp_materialize(ctx, ws, per_call, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, out.data(), out.size(), &count,
                         nullptr),
         ctx, "gtp_materialize");
      ok(gtp_release(ctx, ws, per_call, nullptr), ctx, "gtp_release");
    }
  };
  for (int s = 0; s < kWarmupSteps; ++s) {
    step();
    ok(gtp_drain(ctx, nullptr), ctx, "gtp_drain");
  }
  const nlohmann::json warm = stats(ctx);
  for (auto _ : state) {
    step();
    state.PauseTiming();  // the drain (end of step, head prefetch) is not part of the per-call cost
    ok(gtp_drain(ctx, nullptr), ctx, "gtp_drain");
    state.ResumeTiming();
  }
  const nlohmann::json end = stats(ctx);
  const double weights_per_iteration = static_cast<double>(kCallsPerStep) * per_call;
  state.counters["us_per_weight"] =
      benchmark::Counter(weights_per_iteration * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                           benchmark::Counter::kInvert);
  state.counters["hit_fraction"] =
      (end["materialize"]["prefetch_hits"].get<double>() - warm["materialize"]["prefetch_hits"].get<double>()) /
      (end["materialize"]["calls"].get<double>() - warm["materialize"]["calls"].get<double>());
  state.counters["allocations_after_warmup"] =
      end["memory"]["allocations"].get<double>() - warm["memory"]["allocations"].get<double>();
  state.counters["materialized_bytes"] = end["cache"]["slot_bytes"].get<double>();
  state.counters["materialized_bound"] = static_cast<double>((depth + 1) * group_bytes(per_call, 1));
  ok(gtp_context_destroy(ctx), nullptr, "gtp_context_destroy");
}
BENCHMARK(BM_CAbiMaterializeRelease)->Apply(overhead_args<benchmark::internal::Benchmark>)->ArgNames({"weights", "depth"});

}  // namespace
}  // namespace gtp::bench::remat

BENCHMARK_MAIN();
