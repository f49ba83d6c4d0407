// gtp-overlap-bench-rig: the overlap benchmark's chain at G > 1 on ONE GPU, through the one-GPU rig
// (a test double for NCCL, remat/one_gpu_rig.h): G ranks as threads, each with its own consumer
// stream, cuBLAS handle, activations and CudaBackend + Runtime (no C ABI), its 1/G of every weight's
// rows. The point is the reduce-scatter in backward, which a one-rank run never issues: each
// configuration runs twice in the same process, with the runtime as it is ("current") and with the
// consumer stream made to wait, at every grad buffer, for everything on the reduce-scatter stream
// ("rs-wait", what grad_buffer did before issue 23 item 1). Exposed time per step is measured as in
// gtp-overlap-bench (events around materialize, grad_buffer and drain on the consumer stream),
// per rank; printed as the median over ranks. All ranks share the GPU's SMs, so step times are not
// those of G GPUs; the comparison between the two orders is the result.
//
// Flags: --ranks G (2..8, default 4) and --rig-flags auto|memops|kernels first; every other flag is
// gtp-overlap-bench's (--m is required here: there is no auto-sizing over G ranks on one GPU;
// --priorities, --keep-gathered, --grads-into-main-grad, --repack, --bootstrap are ignored).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/overlap/chain.h"
#include "bench/overlap/device_chain.h"
#include "bench/overlap/overlap_options.h"
#include "remat/cuda_backend.h"
#include "remat/internal/rig_ranks.h"
#include "remat/one_gpu_rig.h"
#include "remat/runtime.h"

namespace gtp::bench::overlap {
namespace {

using remat::Phase;

// The chain's weights through one rank's Runtime. `rs_wait`: the consumer waits for the whole
// reduce-scatter stream before each grad buffer (the order before issue 23 item 1).
class RigWeights : public WeightSource {
 public:
  RigWeights(remat::Runtime& runtime, remat::Backend& backend, std::vector<remat::WeightId> ids, cudaStream_t stream,
             bool rs_wait)
      : runtime_(runtime), backend_(backend), ids_(std::move(ids)), stream_(stream), rs_wait_(rs_wait) {}
  const void* acquire(int layer, gtp_phase_t phase) override {
    return runtime_.materialize(&ids_[layer], 1, phase == GTP_PHASE_FORWARD ? Phase::kForward : Phase::kBackward, 0,
                                remat::Layout::kBF16, stream_)[0];
  }
  void release(int layer) override { runtime_.release(&ids_[layer], 1, stream_); }
  GradTarget grad(int layer) override {
    if (rs_wait_) backend_.order(stream_, backend_.side_stream(0, remat::Role::kReduceScatter));
    const remat::GradBuffer g = runtime_.grad_buffer(ids_[layer], stream_, remat::GradInit::kUndefined);
    return GradTarget{g.data, g.overwrite};
  }
  void finalize(int layer, bool last) override { runtime_.finalize(&ids_[layer], 1, last, stream_); }
  void end_step() override { runtime_.drain(stream_); }

 private:
  remat::Runtime& runtime_;
  remat::Backend& backend_;
  std::vector<remat::WeightId> ids_;
  cudaStream_t stream_;
  bool rs_wait_;
};

// The ranks' setup meets here before any collective: its cudaMalloc calls and cuBLAS's first GEMMs
// may wait for the whole device, and so for a peer already waiting for this rank
// (remat/one_gpu_rig.h). A harness barrier, not part of any collective.
class SetupBarrier {
 public:
  explicit SetupBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (++arrived_ == n_) {
      all_.notify_all();
      return;
    }
    all_.wait(lock, [&] { return arrived_ == n_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_;
  int n_, arrived_ = 0;
};

// One rank: its stream, GEMMs, activations, rows, backend and runtime; the timed steps.
StepTimes run_rank(remat::OneGpuRig& rig, SetupBarrier& setup, int rank, int ranks, const Options& o,
                   kernels::WireFormat wire, int depth, bool rs_wait, const std::vector<std::uint16_t>& host_weight) {
  CUDA(cudaSetDevice(0));
  int least = 0, greatest = 0;
  CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  CUDA(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, least));
  cublasHandle_t handle = nullptr;
  CUBLAS(cublasCreate(&handle));
  CUBLAS(cublasSetStream(handle, stream));
  StepTimes t;
  {
    Activations acts = make_activations(o, o.m);
    const Gemms gemms(handle, o.m);
    // cuBLAS's workspace is ours, and every GEMM of the chain has run once, before any collective.
    DeviceBuffer workspace(64ll << 20);
    CUBLAS(cublasSetWorkspace(handle, workspace.ptr, 64ull << 20));
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    std::vector<remat::WeightDesc> descs;
    for (int i = 0; i < o.layers; ++i) {
      const LayerShape s = layer_shape(o, i);
      const auto geometry = kernels::weight_geometry(wire, s.out_features, s.in_features, ranks);
      const std::int64_t rows = geometry.valid_rows(rank), held = std::max<std::int64_t>(rows, 1);
      buffers.push_back(std::make_unique<DeviceBuffer>(held * s.in_features * 2));
      if (rows > 0) {
        CUDA(cudaMemcpyAsync(buffers.back()->ptr, host_weight.data() + rank * geometry.shard_rows * s.in_features,
                             static_cast<size_t>(rows * s.in_features * 2), cudaMemcpyHostToDevice, stream));
      }
      remat::WeightDesc desc;
      desc.name = "layer" + std::to_string(i);
      desc.shard = buffers.back()->ptr;
      desc.rows = s.out_features;
      desc.cols = s.in_features;
      desc.wire = kernels::WireSpec{wire};
      buffers.push_back(std::make_unique<DeviceBuffer>(held * s.in_features * 4));
      CUDA(cudaMemsetAsync(buffers.back()->ptr, 0, static_cast<size_t>(held * s.in_features * 4), stream));
      desc.main_grad = buffers.back()->as<float>();
      descs.push_back(desc);
    }
    DeviceBuffer scratch(static_cast<std::int64_t>(o.n) * o.k * 4);
    for (int i = 0; i < std::min(o.layers, 2); ++i) {
      const LayerShape s = layer_shape(o, i);
      gemms.forward(scratch.ptr, acts.x[i]->ptr, acts.x[i + 1]->ptr, s);
      gemms.dgrad(scratch.ptr, acts.dx[1]->ptr, acts.dx[0]->ptr, s);  // dx buffers: M x max(N, K)
      gemms.wgrad(acts.x[i]->ptr, acts.dx[1]->ptr, GradTarget{scratch.as<float>(), true}, s);
    }
    CUDA(cudaStreamSynchronize(stream));
    setup.arrive_and_wait();
    remat::CudaBackend backend(0, rig.transport(rank));
    remat::RuntimeConfig config;
    config.depth = depth;
    config.grads.accumulate_microbatches = o.microbatches > 1;
    remat::Runtime runtime(backend, config);
    std::vector<remat::WeightId> ids;
    for (const remat::WeightDesc& desc : descs) ids.push_back(runtime.register_weight(desc));
    runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
    RigWeights weights(runtime, backend, ids, stream, rs_wait);
    // No cudaMemGetInfo between steps (watch_memory false): nothing that might wait for the device
    // while a peer waits for this rank.
    std::int64_t least_free = 0;
    t = run_steps(o, gemms, acts, weights, stream, 0, least_free, false);
    CUDA(cudaStreamSynchronize(stream));
  }
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  return t;
}

double median_of(const std::vector<StepTimes>& ts, double StepTimes::*field) {
  std::vector<double> v;
  for (const StepTimes& t : ts) v.push_back(t.*field);
  return median(v);
}

int run(int ranks, remat::OneGpuRig::Flags flags, const Options& o, int argc, char** argv) {
  if (o.m <= 0) throw std::invalid_argument("--m is required (no auto-sizing over rig ranks); give e.g. --m 2048");
  const std::int64_t elements = o.n * o.k;
  const std::vector<std::uint16_t> host_weight =
      random_bf16(elements, 1.0f / std::sqrt(static_cast<float>(std::max(o.n, o.k))), 11);
  cudaDeviceProp prop{};
  CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("gtp-overlap-bench-rig on %s: %d ranks on one GPU (the one-GPU rig, a test double for NCCL); M %lld, "
              "N %lld, K %lld, %d layers, %d microbatch(es)\n",
              prop.name, ranks, (long long)o.m, (long long)o.n, (long long)o.k, o.layers, o.microbatches);
  json configs = json::array();
  std::string rig_flags;
  for (kernels::WireFormat wire : o.wires) {
    for (int depth : o.depths) {
      for (bool rs_wait : {true, false}) {
        // Each rank's backend memory comes from an arena allocated up front: its slots, chunks and
        // pooled FP32 grad buffers stay well under 16 FP32 weights.
        const std::int64_t arena = std::max<std::int64_t>(std::int64_t{2} << 30, 16 * o.n * o.k * 4);
        remat::OneGpuRig rig(0, ranks, {}, flags, std::chrono::seconds(30), arena);
        if (rig_flags.empty()) std::printf("rig flags: %s\n", rig.flags().c_str());
        rig_flags = rig.flags();
        std::vector<StepTimes> per_rank(ranks);
        SetupBarrier setup(ranks);
        remat::testing::on_rig_ranks(rig, [&](int rank) {
          per_rank[rank] = run_rank(rig, setup, rank, ranks, o, wire, depth, rs_wait, host_weight);
        });
        const double step = median_of(per_rank, &StepTimes::step);
        const double mat = median_of(per_rank, &StepTimes::exposed_materialize);
        const double grad = median_of(per_rank, &StepTimes::exposed_grad_buffer);
        const double drain = median_of(per_rank, &StepTimes::exposed_drain);
        const char* order = rs_wait ? "rs-wait" : "current";
        std::printf("%-7s %-6s depth %d  step %9.1f us  exposed %8.1f us (materialize %7.1f, grad_buffer %7.1f, "
                    "drain %7.1f)  %5.2f %% of step\n",
                    order, kernels::to_string(wire).c_str(), depth, step, mat + grad + drain, mat, grad, drain,
                    step > 0 ? 100.0 * (mat + grad + drain) / step : 0.0);
        json ranks_json = json::array();
        for (const StepTimes& t : per_rank) ranks_json.push_back(step_json(t));
        configs.push_back({{"grad_buffer_order", order},
                           {"wire", kernels::to_string(wire)},
                           {"prefetch_depth", depth},
                           {"median_over_ranks",
                            {{"step_us", step},
                             {"exposed_us", {{"materialize", mat}, {"grad_buffer", grad}, {"drain", drain},
                                             {"total", mat + grad + drain}}}}},
                           {"ranks", ranks_json}});
      }
    }
  }
  if (!o.json_path.empty()) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    const char* commit = std::getenv("GTP_COMMIT");
    const json doc = {{"tool", "gtp-overlap-bench-rig"},
                      {"gpu", prop.name},
                      {"commit", commit ? commit : "unknown"},
                      {"command", command},
                      {"ranks_on_one_gpu", ranks},
                      {"rig_flags", rig_flags},
                      {"sizes", {{"m", o.m}, {"n", o.n}, {"k", o.k}, {"layers", o.layers}, {"microbatches", o.microbatches}}},
                      {"measurement",
                       "per rank as gtp-overlap-bench (events on the consumer stream around materialize, grad_buffer "
                       "and drain; medians over the timed steps), then the median over ranks; rs-wait: the consumer "
                       "waits for the whole reduce-scatter stream at each grad buffer (the order before issue 23 "
                       "item 1), current: the runtime as it is"},
                      {"configs", configs}};
    std::ofstream(o.json_path) << doc.dump(2) << "\n";
    std::printf("wrote %s\n", o.json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace gtp::bench::overlap

int main(int argc, char** argv) {
  using namespace gtp::bench::overlap;
  int ranks = 4;
  gtp::remat::OneGpuRig::Flags flags = gtp::remat::OneGpuRig::Flags::kAuto;
  std::vector<const char*> rest = {argv[0]};
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if ((flag == "--ranks" || flag == "--rig-flags") && i + 1 >= argc) {
        throw std::invalid_argument(flag + " needs a value");
      }
      if (flag == "--ranks") {
        const std::string v = argv[++i];
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || std::stoi(v) < 2 || std::stoi(v) > 8) {
          throw std::invalid_argument("--ranks '" + v + "' is not a whole number in 2..8");
        }
        ranks = std::stoi(v);
      } else if (flag == "--rig-flags") {
        const std::string v = argv[++i];
        if (v == "memops") {
          flags = gtp::remat::OneGpuRig::Flags::kStreamMemOps;
        } else if (v == "kernels") {
          flags = gtp::remat::OneGpuRig::Flags::kKernels;
        } else if (v != "auto") {
          throw std::invalid_argument("--rig-flags '" + v + "' is not auto, memops or kernels");
        }
      } else {
        rest.push_back(argv[i]);
      }
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-overlap-bench-rig: %s\n", e.what());
    return 1;
  }
  Options o;
  try {
    o = parse_options(static_cast<int>(rest.size()), rest.data());
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-overlap-bench-rig: %s\n", e.what());
    return 1;
  }
  if (o.help) {
    std::printf("usage: gtp-overlap-bench-rig [--ranks G] [--rig-flags auto|memops|kernels] --m M [the flags of "
                "gtp-overlap-bench]\n%s", usage().c_str());
    return 0;
  }
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gtp-overlap-bench-rig: no CUDA device (%s)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0");
    return 2;
  }
  try {
    return run(ranks, flags, o, argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-overlap-bench-rig: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gtp-overlap-bench-rig: %s\n", e.what());
    return 3;
  }
}
