// Host overhead of gtp_materialize + gtp_release through the C ABI, per weight, on the prefetch-hit
// path: G = 1, tiny weights, 1 / 8 / 64 weights per call, depth 1..4, on the host backend (BF16 wire)
// and, where a CUDA device is present, on GTP_BACKEND_CUDA (a size-1 NCCL group) with the BF16 wire
// (gathered in place) and the FP8 wire (gather + unpack kernel), each also with the profile's
// prefetch_batch of 2 and 4 (prefetches issued together) and with the profile's fill_graphs (each
// prefetch fill one cudaGraphLaunch of a fill captured once). Reported as us_per_weight (CPU time;
// target <= 3 us), with allocations after warm-up (must be 0) and the cache's slot bytes against the
// (depth + 1) x largest-group bound as counters. BM_CAbiCapturedStep times the same step captured
// into a CUDA graph and replayed (host time per weight of one cudaGraphLaunch per step).
//   bazel run -c opt //bench/remat:c_abi_overhead_bench -- --benchmark_out=$PWD/out.json
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/remat/overhead_model.h"
#include "gtp/gtp.h"
#include "kernels/cuda_kernels.h"

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

void cuda_ok(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

// A one-GPU profile whose dense group prefetches `depth` keys ahead in batches of `batch`, its fills
// launched as graphs when `fill_graphs`.
std::string batch_profile(int depth, int batch, bool fill_graphs) {
  const nlohmann::json doc = {
      {"schema_version", 1},
      {"cluster",
       {{"template",
         {{"host_count", 1},
          {"host", {{"numa_nodes", {{{"os_index", 0}, {"cpuset", "0x1"}}}}, {"gpus", {{{"index", 0}, {"numa_node", 0}}}}}}}}}},
      {"parallel", {{"world_size", 1}}},
      {"groups",
       {{"gtp_remat", {{"prefetch_depth", depth}, {"prefetch_batch", batch}, {"fill_graphs", fill_graphs ? 1024 : 0}}}}}};
  return doc.dump();
}

// A context on one rank with kCallsPerStep x `per_call` registered tiny weights, re-packed once, and
// the benchmark's step: kCallsPerStep materialize + release calls of `per_call` weights each.
class CAbiSetup {
 public:
  // batch 1 without fill graphs: the config's depth, no profile.
  CAbiSetup(int per_call, int depth, gtp_backend_t backend, gtp_wire_t wire, int batch, bool fill_graphs = false)
      : per_call_(per_call), cuda_(backend == GTP_BACKEND_CUDA), out_(per_call) {
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
    config.backend = backend;
    const std::string profile = batch_profile(depth, batch, fill_graphs);
    if (batch > 1 || fill_graphs) {
      config.profile_json = profile.c_str();
      config.prefetch_depth = GTP_FROM_PROFILE;
    }
    ok(gtp_context_create(&config, &ctx_), nullptr, "gtp_context_create");

    shard_ = host_shard_.data();
    if (cuda_) {
      cuda_ok(cudaMalloc(&shard_, host_shard_.size() * 2), "cudaMalloc");
      cuda_ok(cudaMemcpy(shard_, host_shard_.data(), host_shard_.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
      cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    weights_.resize(static_cast<std::size_t>(kCallsPerStep) * per_call);
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      const std::string name = "w" + std::to_string(i);
      desc.name = name.c_str();
      desc.shard = shard_;
      desc.rows = kRows;
      desc.cols = kCols;
      desc.wire = wire;
      ok(gtp_weight_register(ctx_, &desc, &weights_[i]), ctx_, "gtp_weight_register");
    }
    ok(gtp_weights_shard_updated(ctx_, weights_.data(), weights_.size(), stream_), ctx_, "gtp_weights_shard_updated");
  }
  ~CAbiSetup() {
    gtp_context_destroy(ctx_);
    if (cuda_) {
      cudaFree(shard_);
      cudaStreamDestroy(stream_);
    }
  }
  CAbiSetup(const CAbiSetup&) = delete;
  CAbiSetup& operator=(const CAbiSetup&) = delete;

  gtp_context_t* ctx() const { return ctx_; }
  cudaStream_t stream() const { return stream_; }
  void step() {
    size_t count = 0;
    for (int c = 0; c < kCallsPerStep; ++c) {
      const gtp_weight_t* ws = weights_.data() + static_cast<std::size_t>(c) * per_call_;
      ok(gtp_materialize(ctx_, ws, per_call_, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, out_.data(), out_.size(), &count,
                         stream_),
         ctx_, "gtp_materialize");
      ok(gtp_release(ctx_, ws, per_call_, stream_), ctx_, "gtp_release");
    }
  }
  void drain() { ok(gtp_drain(ctx_, stream_), ctx_, "gtp_drain"); }
  void synchronize() {
    if (cuda_) cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void warm_up() {
    for (int s = 0; s < kWarmupSteps; ++s) {
      step();
      drain();
    }
    synchronize();
  }

 private:
  int per_call_;
  bool cuda_;
  std::vector<std::uint16_t> host_shard_ = std::vector<std::uint16_t>(kRows * kCols, 0x3F80);  // BF16 1.0
  gtp_context_t* ctx_ = nullptr;
  void* shard_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<gtp_weight_t> weights_;
  std::vector<void*> out_;
};

// The counters both benchmarks report, from the stats before (`warm`) and after the timed loop.
void report(benchmark::State& state, gtp_context_t* ctx, const nlohmann::json& warm, double weights_per_iteration,
            int depth, int per_call, gtp_wire_t wire) {
  const nlohmann::json end = stats(ctx);
  state.counters["us_per_weight"] =
      benchmark::Counter(weights_per_iteration * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                           benchmark::Counter::kInvert);
  const double calls = end["materialize"]["calls"].get<double>() - warm["materialize"]["calls"].get<double>();
  state.counters["hit_fraction"] =
      (end["materialize"]["prefetch_hits"].get<double>() - warm["materialize"]["prefetch_hits"].get<double>()) / calls;
  state.counters["keys_per_batch"] =
      (end["materialize"]["prefetches"].get<double>() - warm["materialize"]["prefetches"].get<double>()) /
      (end["materialize"]["prefetch_batches"].get<double>() - warm["materialize"]["prefetch_batches"].get<double>());
  state.counters["graph_fill_fraction"] =  // of the fills (prefetch batches and on-demand gathers)
      (end["groups"][0]["graph_fills"].get<double>() - warm["groups"][0]["graph_fills"].get<double>()) /
      (end["materialize"]["prefetch_batches"].get<double>() + end["materialize"]["exposed_gathers"].get<double>() -
       warm["materialize"]["prefetch_batches"].get<double>() - warm["materialize"]["exposed_gathers"].get<double>());
  state.counters["allocations_after_warmup"] =
      end["memory"]["allocations"].get<double>() - warm["memory"]["allocations"].get<double>();
  state.counters["materialized_bytes"] = end["cache"]["slot_bytes"].get<double>();
  state.counters["materialized_bound"] =
      static_cast<double>((depth + 1) * group_bytes(per_call, 1, wire == GTP_WIRE_FP8 ? kernels::WireFormat::kFP8
                                                                                     : kernels::WireFormat::kBF16));
}

// Arguments: weights per call, depth, backend (GTP_BACKEND_HOST / _CUDA), wire (GTP_WIRE_BF16 / _FP8),
// prefetch batch, fill graphs (0 / 1; batch 1 without fill graphs: the config's depth, no profile).
void BM_CAbiMaterializeRelease(benchmark::State& state) {
  const int per_call = static_cast<int>(state.range(0));
  const int depth = static_cast<int>(state.range(1));
  const auto wire = static_cast<gtp_wire_t>(state.range(3));
  CAbiSetup setup(per_call, depth, static_cast<gtp_backend_t>(state.range(2)), wire, static_cast<int>(state.range(4)),
                  state.range(5) != 0);
  setup.warm_up();
  const nlohmann::json warm = stats(setup.ctx());
  for (auto _ : state) {
    setup.step();
    // The drain (end of step, head prefetch), and keeping the device from falling behind, are not
    // part of the per-call cost.
    state.PauseTiming();
    setup.drain();
    setup.synchronize();
    state.ResumeTiming();
  }
  report(state, setup.ctx(), warm, static_cast<double>(kCallsPerStep) * per_call, depth, per_call, wire);
}

// The same step with its drain captured into a CUDA graph once (GTP_BACKEND_CUDA), then replayed:
// what a framework that captures its step pays on the host per weight, i.e. one cudaGraphLaunch per
// step shared by every weight of it. The counters cover the captured step (the replays run no
// host-side bookkeeping). Arguments: weights per call, depth, wire.
void BM_CAbiCapturedStep(benchmark::State& state) {
  constexpr int kSyncEvery = 64;  // launches between (untimed) synchronizations
  const int per_call = static_cast<int>(state.range(0));
  const int depth = static_cast<int>(state.range(1));
  const auto wire = static_cast<gtp_wire_t>(state.range(2));
  CAbiSetup setup(per_call, depth, GTP_BACKEND_CUDA, wire, 1);
  setup.warm_up();
  const nlohmann::json warm = stats(setup.ctx());
  cuda_ok(cudaStreamBeginCapture(setup.stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  setup.step();
  setup.drain();
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamEndCapture(setup.stream(), &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  int launches = 0;
  for (auto _ : state) {
    cuda_ok(cudaGraphLaunch(exec, setup.stream()), "cudaGraphLaunch");
    if (++launches % kSyncEvery == 0) {
      state.PauseTiming();
      setup.synchronize();
      state.ResumeTiming();
    }
  }
  setup.synchronize();
  report(state, setup.ctx(), warm, static_cast<double>(kCallsPerStep) * per_call, depth, per_call, wire);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace gtp::bench::remat

int main(int argc, char** argv) {
  using namespace gtp::bench::remat;
  const auto add = [](const char* name, gtp_backend_t backend, gtp_wire_t wire) {
    auto* b = benchmark::RegisterBenchmark(name, BM_CAbiMaterializeRelease);
    for (int weights : {1, 8, 64})
      for (int depth = 1; depth <= 4; ++depth) b->Args({weights, depth, backend, wire, 1, 0});
    for (int fill_graphs : {0, 1})
      for (int weights : {1, 8})
        for (const auto& [depth, batch] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 1}, std::pair{4, 2}, std::pair{4, 4}})
          if (fill_graphs == 1 || batch > 1) b->Args({weights, depth, backend, wire, batch, fill_graphs});
    b->ArgNames({"weights", "depth", "backend", "wire", "batch", "fill_graphs"});
  };
  add("BM_CAbiMaterializeRelease/host/bf16", GTP_BACKEND_HOST, GTP_WIRE_BF16);
  std::string why;
  if (gtp::kernels::cuda_device_available(&why)) {
    add("BM_CAbiMaterializeRelease/cuda/bf16", GTP_BACKEND_CUDA, GTP_WIRE_BF16);
    add("BM_CAbiMaterializeRelease/cuda/fp8", GTP_BACKEND_CUDA, GTP_WIRE_FP8);
    for (const auto& [name, wire] : {std::pair{"BM_CAbiCapturedStep/cuda/bf16", GTP_WIRE_BF16},
                                     std::pair{"BM_CAbiCapturedStep/cuda/fp8", GTP_WIRE_FP8}}) {
      auto* b = benchmark::RegisterBenchmark(name, BM_CAbiCapturedStep);
      for (int weights : {1, 8}) b->Args({weights, 2, wire});
      b->ArgNames({"weights", "depth", "wire"});
    }
  } else {
    std::printf("no CUDA device: %s; only the host backend runs\n", why.c_str());
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
