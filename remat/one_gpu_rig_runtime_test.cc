// Every multi-rank device path of the runtime on ONE GPU, through the one-GPU rig (a test double for
// NCCL, remat/one_gpu_rig.h): G = 2, 4, 8 ranks as threads, each with its own CudaBackend, run the
// same calls on the same inputs as G host-backend ranks (HostBackend over HostComm, the reference),
// and every rank's materialized weights (every materialize of every step) and main grads must equal
// the host's bit for bit. Cases: the four wires (BF16, FP8, MXFP8, NVFP4); a weight of 5 rows, so
// ranks hold only padding rows; the pooled grad path (zero-filled buffers, reduce-scatter mean) and
// undefined buffers written by the consumer; wgrads accumulated over microbatches or reduced each;
// keep_gathered; lazy packs (every step re-packs, in varying orders); fill graphs; a step captured
// into a CUDA graph and replayed. Skips without a GPU, printing why.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/host.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/host_backend.h"
#include "remat/internal/rig_ranks.h"
#include "remat/one_gpu_rig.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

struct Shape {
  std::int64_t rows, cols;
};
// Shards are at least 16 rows on every wire: layer 1 (5 rows) leaves rank 0 a partial shard (the
// BF16 wire packs it, where full BF16 shards are sent as they are) and every other rank only padding;
// layer 0 (40 rows) is partial on some rank at every G.
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {{40, 64}, {5, 64}, {72, 128}};
  return s;
}

struct Case {
  int ranks = 2;
  kernels::WireSpec wire{kernels::WireFormat::kBF16};
  int depth = 1;
  bool keep_gathered = false;
  std::int64_t fill_graphs = 0;
  GradInit grad_init = GradInit::kZero;
  bool accumulate = true;
  bool capture = false;  // rig only: step kCaptured is captured, later ones replay it
  bool gemm_backward = false;  // the backward materializes the GEMM-ready layout (quantized wires)
  bool two_groups = false;     // layer 2 in a second backend group over the same ranks (an expert group)
  int microbatches = 2;
  int steps = 5;
};
constexpr int kCaptured = 2;

std::vector<float> normal_values(std::int64_t n, unsigned seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}
std::vector<float> full_weight(int layer, int step) {
  return normal_values(shapes()[layer].rows * shapes()[layer].cols, 1000 * layer + step + 1, 1.0f + layer);
}
// The wgrad this rank's consumer writes or adds for (step, microbatch, layer).
std::vector<float> contribution(int step, int rank, int mb, int layer) {
  return normal_values(shapes()[layer].rows * shapes()[layer].cols, 7919 * step + 104729 * rank + 31 * mb + layer, 0.5f);
}

// What one rank saw: every materialized weight (BF16 bytes, in call order) and its main grads after
// every step (its valid rows).
struct Seen {
  std::vector<std::vector<unsigned char>> weights;
  std::vector<std::vector<float>> main_grads;
};

bool gemm_layout(const Case& c) { return c.gemm_backward && c.wire.format != kernels::WireFormat::kBF16; }

// One rank's run on either backend. With a `rig` and a `stage`: buffers are device memory, the consumer
// is `stream`, and every copy is ordered on it, host data through the pinned stage; without: host
// memory, copies at once. Returns what the rank saw.
Seen run_rank(Backend& backend, OneGpuRig* rig, testing::PinnedStage* stage, cudaStream_t stream, int rank,
              const Case& c) {
  const bool device = stage != nullptr;
  // Host to device (and device to device, inside a step): through the pinned stage on `stream`.
  const auto upload = [&](void* dst, const void* src, std::int64_t bytes) {
    if (device) {
      stage->upload(dst, src, bytes, stream);
    } else {
      std::memcpy(dst, src, bytes);
    }
  };
  const auto copy = [&](void* dst, const void* src, std::int64_t bytes) {
    if (device) {
      EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    } else {
      std::memcpy(dst, src, bytes);
    }
  };
  const auto download = [&](void* dst, const void* src, std::int64_t bytes) {
    if (device) {
      stage->download(dst, src, bytes, stream);
    } else {
      std::memcpy(dst, src, bytes);
    }
  };
  // Waits for this rank's stream only (and lands the downloads).
  const auto sync = [&] {
    if (device) stage->finish(stream);
  };
  RuntimeConfig config;
  config.depth = c.depth;
  config.keep_gathered = c.keep_gathered;
  config.fill_graphs = c.fill_graphs;
  config.grads.accumulate_microbatches = c.accumulate;
  Runtime runtime(backend, config);
  const int layers = static_cast<int>(shapes().size());
  std::vector<WeightId> ids;
  std::vector<void*> shards, main_grads;
  std::vector<std::int64_t> valid(layers), first(layers);
  // Buffers of the test (not the runtime's) from the backend: device or host memory alike.
  std::vector<std::pair<void*, std::int64_t>> owned;
  const auto buffer = [&](std::int64_t bytes) {
    owned.emplace_back(backend.allocate(bytes), bytes);
    return owned.back().first;
  };
  for (int l = 0; l < layers; ++l) {
    const Shape s = shapes()[l];
    const auto geometry = kernels::weight_geometry(c.wire.format, s.rows, s.cols, c.ranks);
    valid[l] = geometry.valid_rows(rank);
    first[l] = rank * geometry.shard_rows;
    shards.push_back(buffer(std::max<std::int64_t>(valid[l], 1) * s.cols * 4));
    main_grads.push_back(buffer(std::max<std::int64_t>(valid[l], 1) * s.cols * 4));
    WeightDesc desc;
    desc.name = "layer" + std::to_string(l);
    desc.shard = shards.back();
    desc.dtype = kernels::SourceDtype::kFP32;
    desc.rows = s.rows;
    desc.cols = s.cols;
    desc.wire = c.wire;
    desc.main_grad = static_cast<float*>(main_grads.back());
    desc.group = c.two_groups && l == 2 ? 1 : 0;
    ids.push_back(runtime.register_weight(desc));
  }
  // Per (microbatch, layer): the consumer's wgrad input, and per (microbatch, phase, layer) a copy of
  // what materialize returned, written on the consumer stream (so a captured step copies too).
  // The backward's copy holds every section of the GEMM-ready layout, one after another.
  std::vector<std::int64_t> copy_bytes;  // [phase * layers + layer]
  for (int phase = 0; phase < 2; ++phase) {
    for (int l = 0; l < layers; ++l) {
      const std::int64_t bf16 = shapes()[l].rows * shapes()[l].cols * 2;
      if (phase == 0 || !gemm_layout(c)) {
        copy_bytes.push_back(bf16);
        continue;
      }
      const auto geometry = kernels::weight_geometry(c.wire.format, shapes()[l].rows, shapes()[l].cols, c.ranks);
      const kernels::GemmLayoutSizes g = kernels::gemm_layout_sizes(c.wire, geometry);
      copy_bytes.push_back(g.data_bytes + g.scales_bytes + g.transposed_data_bytes + g.transposed_scales_bytes +
                           g.decode_scale_count * 4);
    }
  }
  std::vector<void*> wgrads, copies;
  for (int mb = 0; mb < c.microbatches; ++mb) {
    for (int l = 0; l < layers; ++l) wgrads.push_back(buffer(shapes()[l].rows * shapes()[l].cols * 4));
    for (int phase = 0; phase < 2; ++phase)
      for (int l = 0; l < layers; ++l) copies.push_back(buffer(copy_bytes[phase * layers + l]));
  }

  // The optimizer's side, eager: new shards and wgrads, zeroed main grads, the re-pack (lazy: the
  // pack runs at each weight's next gather), in an order that changes with the step.
  const auto prepare = [&](int step) {
    for (int l = 0; l < layers; ++l) {
      const auto full = full_weight(l, step);
      upload(shards[l], full.data() + first[l] * shapes()[l].cols, valid[l] * shapes()[l].cols * 4);
      const std::vector<float> zeros(std::max<std::int64_t>(valid[l], 1) * shapes()[l].cols, 0.0f);
      upload(main_grads[l], zeros.data(), zeros.size() * 4);
      for (int mb = 0; mb < c.microbatches; ++mb) {
        const auto g = contribution(step, rank, mb, l);
        upload(wgrads[mb * layers + l], g.data(), g.size() * 4);
      }
    }
    sync();
    std::vector<WeightId> order = ids;
    if (step % 3 == 1) std::reverse(order.begin(), order.end());
    if (step % 3 == 2) {
      for (WeightId id : order) runtime.shard_updated(&id, 1, stream);
    } else {
      runtime.shard_updated(order.data(), layers, stream);
    }
  };
  // The step's runtime calls and consumer work, all on `stream`.
  const auto body = [&] {
    for (int mb = 0; mb < c.microbatches; ++mb) {
      for (int l = 0; l < layers; ++l) {
        const auto w = runtime.materialize(&ids[l], 1, Phase::kForward, 0, Layout::kBF16, stream);
        copy(copies[(mb * 2) * layers + l], w[0], shapes()[l].rows * shapes()[l].cols * 2);
        runtime.release(&ids[l], 1, stream);
      }
      for (int l = layers - 1; l >= 0; --l) {
        const std::int64_t n = shapes()[l].rows * shapes()[l].cols;
        const Layout layout = gemm_layout(c) ? Layout::kGemm : Layout::kBF16;
        const Materialized w = runtime.materialize_views(&ids[l], 1, Phase::kBackward, 0, layout, stream)[0];
        auto* into = static_cast<unsigned char*>(copies[(mb * 2 + 1) * layers + l]);
        if (layout == Layout::kBF16) {
          copy(into, w.data, n * 2);
        } else {  // every section, as the consumer's GEMM would read it
          const kernels::GemmLayoutSizes& g = w.gemm;
          const std::pair<const void*, std::int64_t> sections[] = {
              {w.data, g.data_bytes}, {w.scales, g.scales_bytes}, {w.transposed_data, g.transposed_data_bytes},
              {w.transposed_scales, g.transposed_scales_bytes}, {w.decode_scales, g.decode_scale_count * 4}};
          for (const auto& [ptr, bytes] : sections) {
            if (bytes == 0) continue;
            copy(into, ptr, bytes);
            into += bytes;
          }
        }
        const GradBuffer g = runtime.grad_buffer(ids[l], stream, c.grad_init);
        const auto* src = static_cast<const float*>(wgrads[mb * layers + l]);
        if (g.overwrite) {
          copy(g.data, src, n * 4);
        } else {
          backend.add(stream, src, g.data, n);
        }
        runtime.release(&ids[l], 1, stream);
        runtime.finalize(&ids[l], 1, !c.accumulate || mb == c.microbatches - 1, stream);
      }
    }
    runtime.drain(stream);
  };
  // Copies on the rank's own stream only: the legacy default stream or a device-wide synchronization
  // could wait for a peer that waits for this rank.
  const auto collect = [&](Seen& seen) {
    for (std::size_t i = 0; i < copies.size(); ++i) {
      const std::int64_t bytes = copy_bytes[i % (2 * layers)];
      seen.weights.emplace_back(bytes);
      download(seen.weights.back().data(), copies[i], bytes);
    }
    for (int l = 0; l < layers; ++l) {
      seen.main_grads.emplace_back(valid[l] * shapes()[l].cols);
      download(seen.main_grads.back().data(), main_grads[l], valid[l] * shapes()[l].cols * 4);
    }
    sync();
  };

  Seen seen;
  cudaGraphExec_t exec = nullptr;
  for (int step = 0; step < c.steps; ++step) {
    prepare(step);
    // Before the capture and each replay: the stream joins the re-pack's side-stream work (and the
    // head it prefetches), so syncing it alone covers everything from before the capture.
    if (c.capture && step >= kCaptured) runtime.drain(stream);
    if (!c.capture || step < kCaptured) {
      body();
    } else if (step == kCaptured) {
      // The capture rule (docs/remat.md): the last eager drain's stream is synchronized first (never the
      // whole device: a peer may be waiting for this rank).
      sync();
      EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      try {
        body();
      } catch (...) {
        cudaGraph_t broken = nullptr;
        cudaStreamEndCapture(stream, &broken);
        if (broken != nullptr) cudaGraphDestroy(broken);
        throw;
      }
      cudaGraph_t graph = nullptr;
      EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      // Uploaded at instantiation on the rank's (idle) stream, as CudaBackend does its fill graphs: a
      // first launch that uploads does so behind its stream's queued work (docs/remat.md, Fill graphs).
      cudaGraphInstantiateParams params{};
      params.flags = cudaGraphInstantiateFlagUpload;
      params.uploadStream = stream;
      rig->graph_barrier(rank);  // instantiation may wait for the device holding the context's lock
      EXPECT_EQ(cudaGraphInstantiateWithParams(&exec, graph, &params), cudaSuccess);
      rig->graph_barrier(rank);
      cudaGraphDestroy(graph);
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    } else {
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    }
    collect(seen);
  }
  sync();
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  const RuntimeStats stats = runtime.stats();
  EXPECT_EQ(stats.chain_mismatches, 0) << stats.last_mismatch;
  EXPECT_GT(runtime.grads_stats().reduce_scatters, 0);
  if (c.keep_gathered) {
    EXPECT_GT(stats.kept_hits, 0) << runtime.stats_json();
  }
  if (c.fill_graphs > 0) {
    EXPECT_GT(runtime.group_stats(0).graph_fills, 0) << runtime.stats_json();
  }
  if (c.two_groups) {
    EXPECT_GT(runtime.group_stats(1).materializations, 0) << runtime.stats_json();
  }
  for (auto& [ptr, bytes] : owned) backend.deallocate(ptr, bytes);
  return seen;
}

std::string describe(const Case& c) {
  return "G=" + std::to_string(c.ranks) + " " + kernels::to_string(c.wire) + " depth " + std::to_string(c.depth) +
         (c.keep_gathered ? " keep_gathered" : "") + (c.fill_graphs ? " fill_graphs" : "") +
         (c.grad_init == GradInit::kUndefined ? " undefined grads" : " zeroed grads") +
         (c.accumulate ? " accumulated" : " per microbatch") + (c.capture ? " captured" : "") +
         (c.gemm_backward ? " GEMM-ready backward" : "") + (c.two_groups ? " two groups" : "");
}

// Runs the case on G host ranks and on G rig ranks and compares every rank's view.
void compare(const Case& c) {
  SCOPED_TRACE(describe(c));
  std::vector<Seen> host(c.ranks), rig_seen(c.ranks);
  {
    const auto timeout = std::chrono::milliseconds(60000);
    auto group = comm::ThreadBootstrap::create_group(c.ranks, timeout);
    comm::internal::rethrow_first(comm::internal::run_ranks(c.ranks, [&](int rank) {
      comm::HostComm comm(*group[rank], timeout);
      // Both groups over the same ranks: one communicator serves both on the host.
      HostBackend backend(c.two_groups ? std::vector<comm::HostComm*>{&comm, &comm}
                                       : std::vector<comm::HostComm*>{&comm});
      Case eager = c;
      eager.capture = false;  // the reference runs every step eagerly
      host[rank] = run_rank(backend, nullptr, nullptr, nullptr, rank, eager);
    }));
  }
  std::vector<int> all(c.ranks);
  for (int r = 0; r < c.ranks; ++r) all[r] = r;
  std::vector<std::vector<std::vector<int>>> groups = {{all}};
  if (c.two_groups) groups.push_back({all});
  OneGpuRig rig(0, c.ranks, groups, testing::rig_flags_from_env());
  auto stages = testing::pinned_stages(c.ranks, std::int64_t{8} << 20);  // before any rank runs
  testing::on_rig_ranks(rig, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    {
      CudaBackend backend(0, rig.transport(rank));
      rig_seen[rank] = run_rank(backend, &rig, stages[rank].get(), stream, rank, c);
    }
    cudaStreamDestroy(stream);
  });
  bool nonzero = false;
  for (int rank = 0; rank < c.ranks; ++rank) {
    ASSERT_EQ(rig_seen[rank].weights.size(), host[rank].weights.size());
    for (std::size_t i = 0; i < host[rank].weights.size(); ++i) {
      ASSERT_TRUE(rig_seen[rank].weights[i] == host[rank].weights[i])
          << "rank " << rank << " materialize " << i << " (step " << i / (shapes().size() * 2 * c.microbatches)
          << ") differs from the host backend's";
    }
    ASSERT_EQ(rig_seen[rank].main_grads.size(), host[rank].main_grads.size());
    for (std::size_t i = 0; i < host[rank].main_grads.size(); ++i) {
      const auto& a = rig_seen[rank].main_grads[i];
      const auto& b = host[rank].main_grads[i];
      ASSERT_EQ(a.size(), b.size());
      ASSERT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0)
          << "rank " << rank << " main grad " << i % shapes().size() << " after step " << i / shapes().size()
          << " differs from the host backend's";
      nonzero = nonzero || std::any_of(b.begin(), b.end(), [](float x) { return x != 0.0f; });
    }
  }
  EXPECT_TRUE(nonzero) << "the reference main grads are all zero: the comparison would be vacuous";
}

bool skip(std::string* why) { return !kernels::cuda_device_available(why); }

class RigRuntime : public ::testing::TestWithParam<int> {};

// Every wire at G ranks, zeroed (pooled) grads accumulated over microbatches; padding-only ranks; the
// backward in the GEMM-ready layout (every section, decode scales of G chunks included).
TEST_P(RigRuntime, EveryWireMatchesTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  using kernels::WireFormat;
  for (const kernels::WireSpec& wire :
       {kernels::WireSpec{WireFormat::kBF16}, kernels::WireSpec{WireFormat::kFP8},
        kernels::WireSpec{WireFormat::kMXFP8, kernels::ScaleRounding::kFloor},
        kernels::WireSpec{WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k2D}}) {
    Case c;
    c.ranks = GetParam();
    c.wire = wire;
    c.gemm_backward = true;
    // Layer 1 (5 rows, shards of at least 16 rows): rank 0 holds a partial shard, the others only padding.
    const auto geometry = kernels::weight_geometry(wire.format, shapes()[1].rows, shapes()[1].cols, c.ranks);
    ASSERT_EQ(geometry.valid_rows(0), 5);
    ASSERT_EQ(geometry.valid_rows(c.ranks - 1), 0) << "the last rank must hold only padding rows of layer 1";
    compare(c);
  }
}

// Undefined grad buffers written by the consumer, reduced every microbatch; depth 2; the last layer
// in a second group (its own side streams and communicators).
TEST_P(RigRuntime, UndefinedGradsPerMicrobatchMatchTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (bool two_groups : {false, true}) {
    // Five streams a rank with two groups: past G = 4 they would outnumber the 32 hardware queues
    // (remat/one_gpu_rig.h), and two ranks' streams could share one.
    if (two_groups && GetParam() > 4) continue;
    Case c;
    c.ranks = GetParam();
    c.wire = {kernels::WireFormat::kFP8};
    c.grad_init = GradInit::kUndefined;
    c.accumulate = false;
    c.depth = 2;
    c.two_groups = two_groups;
    compare(c);
  }
}

TEST_P(RigRuntime, KeepGatheredMatchesTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  Case c;
  c.ranks = GetParam();
  c.wire = {kernels::WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k1D};
  c.keep_gathered = true;
  compare(c);
}

TEST_P(RigRuntime, FillGraphsMatchTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (kernels::WireFormat format : {kernels::WireFormat::kBF16, kernels::WireFormat::kMXFP8}) {
    Case c;
    c.ranks = GetParam();
    c.wire = {format};
    c.fill_graphs = 64;
    compare(c);
  }
}

// A step captured into a CUDA graph with real peers (collectives, reduce-scatters and all), replayed
// for the later steps; with and without fill graphs, zeroed and undefined grads.
TEST_P(RigRuntime, CapturedStepReplaysMatchTheHostBackend) {
  std::string why;
  if (skip(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (bool fill_graphs : {false, true}) {
    Case c;
    c.ranks = GetParam();
    c.wire = {fill_graphs ? kernels::WireFormat::kBF16 : kernels::WireFormat::kFP8};
    c.capture = true;
    c.fill_graphs = fill_graphs ? 64 : 0;
    c.grad_init = fill_graphs ? GradInit::kUndefined : GradInit::kZero;
    c.steps = 6;
    compare(c);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, RigRuntime, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "G" + std::to_string(info.param); });

}  // namespace
}  // namespace gtp::remat
