// Host overhead of Runtime::materialize + release per weight on the CUDA backend (size-1 NCCL group),
// prefetch-hit path, tiny BF16 weights: enqueueing is asynchronous, so this is the host cost of the
// bookkeeping plus enqueueing the next prefetch (NCCL all-gather + unpack kernel) and the events.
// Same shapes and counters as c_abi_overhead_bench. Without a CUDA device it says so and runs nothing.
//   tools/gpu/run.sh remat   (on the GPU machine; JSON remat/remat_overhead_gpu.json in its logs)
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/remat/overhead_model.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/runtime.h"

namespace gtp::bench::remat {
namespace {

using gtp::remat::CudaBackend;
using gtp::remat::Layout;
using gtp::remat::Phase;
using gtp::remat::Runtime;
using gtp::remat::RuntimeConfig;
using gtp::remat::WeightDesc;
using gtp::remat::WeightId;
using std::chrono::milliseconds;

void BM_CudaMaterializeRelease(benchmark::State& state) {
  const int per_call = static_cast<int>(state.range(0));
  const int depth = static_cast<int>(state.range(1));
  auto bootstrap = comm::ThreadBootstrap::create_group(1, milliseconds(30000));
  comm::NcclComm nccl = comm::NcclComm::create_world(*bootstrap[0], milliseconds(30000));
  comm::NcclComm reduce_scatter = nccl.split({{0}}, {}, milliseconds(30000));  // as the C ABI builds it
  CudaBackend backend(0, {gtp::remat::CudaGroup{&nccl, &reduce_scatter}}, milliseconds(30000));
  RuntimeConfig config;
  config.depth = depth;
  Runtime runtime(backend, config);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("stream");
  void* shard = nullptr;
  if (cudaMalloc(&shard, kRows * kCols * 2) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  cudaMemset(shard, 0, kRows * kCols * 2);
  std::vector<WeightId> ids;
  for (int i = 0; i < kCallsPerStep * per_call; ++i) {
    WeightDesc desc;
    desc.name = "w" + std::to_string(i);
    desc.shard = shard;
    desc.rows = kRows;
    desc.cols = kCols;
    ids.push_back(runtime.register_weight(desc));
  }
  runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
  const auto step = [&] {
    for (int c = 0; c < kCallsPerStep; ++c) {
      const WeightId* ws = ids.data() + static_cast<std::size_t>(c) * per_call;
      benchmark::DoNotOptimize(runtime.materialize(ws, per_call, Phase::kForward, 0, Layout::kBF16, stream));
      runtime.release(ws, per_call, stream);
    }
  };
  for (int s = 0; s < kWarmupSteps; ++s) {
    step();
    runtime.drain(stream);
  }
  cudaStreamSynchronize(stream);
  const std::int64_t allocations = backend.memory().allocations;
  const auto warm = runtime.stats();
  for (auto _ : state) {
    step();
    state.PauseTiming();  // the drain, and keeping the device from falling far behind, are not timed
    runtime.drain(stream);
    cudaStreamSynchronize(stream);
    state.ResumeTiming();
  }
  const auto end = runtime.stats();
  state.counters["us_per_weight"] = benchmark::Counter(
      static_cast<double>(kCallsPerStep) * per_call * 1e-6,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["hit_fraction"] = static_cast<double>(end.prefetch_hits - warm.prefetch_hits) /
                                   static_cast<double>(end.materializations - warm.materializations);
  state.counters["allocations_after_warmup"] = static_cast<double>(backend.memory().allocations - allocations);
  state.counters["materialized_bytes"] = static_cast<double>(runtime.cache_stats().slot_bytes);
  state.counters["materialized_bound"] = static_cast<double>((depth + 1) * group_bytes(per_call, 1));
  cudaFree(shard);
  cudaStreamDestroy(stream);
}

// What the runtime's per-weight cost is made of: the host time of each CUDA / NCCL call one prefetch-hit
// materialize + release makes, alone (a size-1 group, tiny buffers; the stream is synchronized every
// kSyncEvery calls, untimed, so the device queue never fills).
constexpr int kSyncEvery = 512;

struct CallFixture {
  std::vector<std::unique_ptr<comm::ThreadBootstrap>> bootstrap = comm::ThreadBootstrap::create_group(1, milliseconds(30000));
  comm::NcclComm nccl = comm::NcclComm::create_world(*bootstrap[0], milliseconds(30000));
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  void* src = nullptr;
  void* dst = nullptr;
  CallFixture() {
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess || cudaMalloc(&src, 1 << 16) != cudaSuccess ||
        cudaMalloc(&dst, 1 << 16) != cudaSuccess) {
      throw std::runtime_error("CallFixture: CUDA setup failed");
    }
    cudaEventRecord(event, stream);
  }
  ~CallFixture() {
    cudaStreamSynchronize(stream);
    cudaFree(src);
    cudaFree(dst);
    cudaEventDestroy(event);
    cudaStreamDestroy(stream);
  }
};

template <typename Call>
void time_calls(benchmark::State& state, CallFixture& f, Call&& call) {
  int n = 0;
  for (auto _ : state) {
    call();
    if (++n % kSyncEvery == 0) {
      state.PauseTiming();
      cudaStreamSynchronize(f.stream);
      state.ResumeTiming();
    }
  }
  cudaStreamSynchronize(f.stream);
}

void BM_Call(benchmark::State& state) {
  CallFixture f;
  const std::size_t bytes = static_cast<std::size_t>(kRows * kCols * 2);
  switch (state.range(0)) {
    case 0:
      state.SetLabel("ncclAllGather, size-1 group (a cudaMemcpyAsync inside NCCL)");
      time_calls(state, f, [&] { ncclAllGather(f.src, f.dst, bytes, ncclUint8, f.nccl.get(), f.stream); });
      break;
    case 1:
      state.SetLabel("ncclGroupStart + 8 ncclAllGather + ncclGroupEnd, per all-gather");
      time_calls(state, f, [&] {
        ncclGroupStart();
        for (int i = 0; i < 8; ++i) {
          ncclAllGather(f.src, static_cast<char*>(f.dst) + i * bytes, bytes, ncclUint8, f.nccl.get(), f.stream);
        }
        ncclGroupEnd();
      });
      state.SetItemsProcessed(state.iterations() * 8);
      break;
    case 2:
      state.SetLabel("cudaMemcpyAsync device to device");
      time_calls(state, f, [&] { cudaMemcpyAsync(f.dst, f.src, bytes, cudaMemcpyDeviceToDevice, f.stream); });
      break;
    case 3:
      state.SetLabel("cudaEventRecord");
      time_calls(state, f, [&] { cudaEventRecord(f.event, f.stream); });
      break;
    case 4:
      state.SetLabel("cudaStreamWaitEvent");
      time_calls(state, f, [&] { cudaStreamWaitEvent(f.stream, f.event, 0); });
      break;
    case 5: {
      state.SetLabel("cudaStreamGetCaptureInfo");
      cudaStreamCaptureStatus status;
      unsigned long long id = 0;
      time_calls(state, f, [&] { cudaStreamGetCaptureInfo(f.stream, &status, &id); });
      break;
    }
    case 6: {
      state.SetLabel("unpack_cuda FP8 -> BF16 (one kernel launch)");
      const kernels::WireSpec spec{kernels::WireFormat::kFP8};
      const auto geometry = kernels::weight_geometry(spec.format, kRows, kCols, 1);
      const auto layout = kernels::chunk_layout(spec, geometry.shard_rows, kCols);
      const kernels::GatheredChunks chunks{f.src, layout.chunk_bytes, geometry};
      time_calls(state, f, [&] { kernels::unpack_cuda(spec, chunks, f.dst, kRows * kCols * 2, f.stream); });
      break;
    }
    case 7:
    case 8: {  // what a fill of a key of 8 / 64 FP8 weights enqueues for its unpacks; time per weight
      const int jobs_per_call = state.range(0) == 7 ? 8 : 64;
      state.SetLabel("unpack_many_cuda FP8 -> BF16, " + std::to_string(jobs_per_call) + " weights, per weight");
      const kernels::WireSpec spec{kernels::WireFormat::kFP8};
      const auto geometry = kernels::weight_geometry(spec.format, kRows, kCols, 1);
      const auto layout = kernels::chunk_layout(spec, geometry.shard_rows, kCols);
      std::vector<kernels::UnpackJob> jobs;
      for (int j = 0; j < jobs_per_call; ++j) {  // one source chunk, 64 distinct outputs in the 64 KiB dst
        jobs.push_back({{f.src, layout.chunk_bytes, geometry}, static_cast<char*>(f.dst) + j * kRows * kCols * 2,
                        kRows * kCols * 2});
      }
      time_calls(state, f, [&] { kernels::unpack_many_cuda(spec, jobs.data(), jobs_per_call, f.stream); });
      state.SetItemsProcessed(state.iterations() * jobs_per_call);
      break;
    }
    case 9:
    case 10: {  // what a batch of 1 / 8 size-1 all-gathers enqueues on the CUDA backend; time per copy
      const int copies = state.range(0) == 9 ? 1 : 8;
      state.SetLabel("cudaMemcpyBatchAsync of " + std::to_string(copies) + " device-to-device copies, per copy");
      std::vector<void*> dsts;
      std::vector<const void*> srcs(copies, f.src);
      std::vector<std::size_t> sizes(copies, bytes);
      for (int i = 0; i < copies; ++i) dsts.push_back(static_cast<char*>(f.dst) + i * bytes);
      cudaMemcpyAttributes attributes{};
      attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      std::size_t first_copy = 0;
      time_calls(state, f, [&] {
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), copies, &attributes, &first_copy, 1, f.stream);
      });
      state.SetItemsProcessed(state.iterations() * copies);
      break;
    }
    case 11:
    case 12: {  // one FP8 weight's fill (size-1 all-gather + unpack launch): eagerly, or as a graph
      const bool graph = state.range(0) == 12;
      state.SetLabel(graph ? "cudaGraphLaunch of a captured fill: ncclAllGather (size 1) + unpack_cuda FP8"
                           : "a fill, eagerly: ncclAllGather (size 1) + unpack_cuda FP8");
      const kernels::WireSpec spec{kernels::WireFormat::kFP8};
      const auto geometry = kernels::weight_geometry(spec.format, kRows, kCols, 1);
      const auto layout = kernels::chunk_layout(spec, geometry.shard_rows, kCols);
      char* gathered = static_cast<char*>(f.dst) + (1 << 15);  // the chunk's copy, then the output below it
      const kernels::GatheredChunks chunks{gathered, layout.chunk_bytes, geometry};
      const auto fill = [&] {
        ncclAllGather(f.src, gathered, static_cast<std::size_t>(layout.chunk_bytes), ncclUint8, f.nccl.get(), f.stream);
        kernels::unpack_cuda(spec, chunks, f.dst, kRows * kCols * 2, f.stream);
      };
      if (!graph) {
        time_calls(state, f, fill);
        break;
      }
      cudaGraph_t captured = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        state.SkipWithError("cudaStreamBeginCapture failed");
        break;
      }
      fill();
      if (cudaStreamEndCapture(f.stream, &captured) != cudaSuccess ||
          cudaGraphInstantiate(&exec, captured, 0) != cudaSuccess) {
        state.SkipWithError("capturing the fill failed");
        break;
      }
      time_calls(state, f, [&] { cudaGraphLaunch(exec, f.stream); });
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(captured);
      break;
    }
  }
}

}  // namespace
}  // namespace gtp::bench::remat

int main(int argc, char** argv) {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) {
    std::printf("no CUDA device: %s; nothing to run\n", why.c_str());
    return 0;
  }
  auto* b = benchmark::RegisterBenchmark("BM_CudaMaterializeRelease", gtp::bench::remat::BM_CudaMaterializeRelease);
  gtp::bench::remat::overhead_args(b);
  b->ArgNames({"weights", "depth"});
  benchmark::RegisterBenchmark("BM_Call", gtp::bench::remat::BM_Call)->DenseRange(0, 12)->ArgName("call");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
