#include "testing/remat/runtime_scenario.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "kernels/wire_format.h"
#include "remat/runtime.h"

namespace gtp::remat::testing {

const std::vector<ScenarioShape>& scenario_shapes() {
  static const std::vector<ScenarioShape> s = {{40, 64}, {5, 64}, {72, 128}};
  return s;
}

namespace {

std::vector<float> normal_values(std::int64_t n, unsigned seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}
std::vector<float> full_weight(int layer, int step) {
  return normal_values(scenario_shapes()[layer].rows * scenario_shapes()[layer].cols, 1000 * layer + step + 1, 1.0f + layer);
}
// The wgrad this rank's consumer writes or adds for (step, microbatch, layer).
std::vector<float> contribution(int step, int rank, int mb, int layer) {
  return normal_values(scenario_shapes()[layer].rows * scenario_shapes()[layer].cols, 7919 * step + 104729 * rank + 31 * mb + layer, 0.5f);
}

bool gemm_layout(const ScenarioCase& c) { return c.gemm_backward && c.wire.format != kernels::WireFormat::kBF16; }

}  // namespace

Seen run_scenario_rank(Backend& backend, const ScenarioDevice* dev, int rank, const ScenarioCase& c) {
  const bool device = dev != nullptr;
  const cudaStream_t stream = device ? dev->stream : nullptr;
  // Host to device through `dev`; device to device on `stream`.
  const auto upload = [&](void* dst, const void* src, std::int64_t bytes) {
    if (device) {
      dev->upload(dst, src, bytes);
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
      dev->download(dst, src, bytes);
    } else {
      std::memcpy(dst, src, bytes);
    }
  };
  // Waits for this rank's stream only (and lands the downloads).
  const auto sync = [&] {
    if (device) dev->sync();
  };
  RuntimeConfig config;
  config.depth = c.depth;
  config.keep_gathered = c.keep_gathered;
  config.fill_graphs = c.fill_graphs;
  config.grads.accumulate_microbatches = c.accumulate;
  Runtime runtime(backend, config);
  const int layers = static_cast<int>(scenario_shapes().size());
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
    const ScenarioShape s = scenario_shapes()[l];
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
      const std::int64_t bf16 = scenario_shapes()[l].rows * scenario_shapes()[l].cols * 2;
      if (phase == 0 || !gemm_layout(c)) {
        copy_bytes.push_back(bf16);
        continue;
      }
      const auto geometry = kernels::weight_geometry(c.wire.format, scenario_shapes()[l].rows, scenario_shapes()[l].cols, c.ranks);
      const kernels::GemmLayoutSizes g = kernels::gemm_layout_sizes(c.wire, geometry);
      copy_bytes.push_back(g.data_bytes + g.scales_bytes + g.transposed_data_bytes + g.transposed_scales_bytes +
                           g.decode_scale_count * 4);
    }
  }
  std::vector<void*> wgrads, copies;
  for (int mb = 0; mb < c.microbatches; ++mb) {
    for (int l = 0; l < layers; ++l) wgrads.push_back(buffer(scenario_shapes()[l].rows * scenario_shapes()[l].cols * 4));
    for (int phase = 0; phase < 2; ++phase)
      for (int l = 0; l < layers; ++l) copies.push_back(buffer(copy_bytes[phase * layers + l]));
  }

  // The optimizer's side, eager: new shards and wgrads, zeroed main grads, the re-pack (lazy: the
  // pack runs at each weight's next gather), in an order that changes with the step.
  const auto prepare = [&](int step) {
    for (int l = 0; l < layers; ++l) {
      const auto full = full_weight(l, step);
      upload(shards[l], full.data() + first[l] * scenario_shapes()[l].cols, valid[l] * scenario_shapes()[l].cols * 4);
      const std::vector<float> zeros(std::max<std::int64_t>(valid[l], 1) * scenario_shapes()[l].cols, 0.0f);
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
        copy(copies[(mb * 2) * layers + l], w[0], scenario_shapes()[l].rows * scenario_shapes()[l].cols * 2);
        runtime.release(&ids[l], 1, stream);
      }
      for (int l = layers - 1; l >= 0; --l) {
        const std::int64_t n = scenario_shapes()[l].rows * scenario_shapes()[l].cols;
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
      seen.main_grads.emplace_back(valid[l] * scenario_shapes()[l].cols);
      download(seen.main_grads.back().data(), main_grads[l], valid[l] * scenario_shapes()[l].cols * 4);
    }
    sync();
  };

  Seen seen;
  cudaGraphExec_t exec = nullptr;
  for (int step = 0; step < c.steps; ++step) {
    prepare(step);
    // Before the capture and each replay: the stream joins the re-pack's side-stream work (and the
    // head it prefetches), so syncing it alone covers everything from before the capture.
    if (c.capture && step >= kCapturedStep) runtime.drain(stream);
    if (!c.capture || step < kCapturedStep) {
      body();
    } else if (step == kCapturedStep) {
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
      EXPECT_EQ(cudaGraphInstantiateWithParams(&exec, graph, &params), cudaSuccess);
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

std::string describe(const ScenarioCase& c) {
  return "G=" + std::to_string(c.ranks) + " " + kernels::to_string(c.wire) + " depth " + std::to_string(c.depth) +
         (c.keep_gathered ? " keep_gathered" : "") + (c.fill_graphs ? " fill_graphs" : "") +
         (c.grad_init == GradInit::kUndefined ? " undefined grads" : " zeroed grads") +
         (c.accumulate ? " accumulated" : " per microbatch") + (c.capture ? " captured" : "") +
         (c.gemm_backward ? " GEMM-ready backward" : "") + (c.two_groups ? " two groups" : "");
}

std::vector<ScenarioCase> every_wire_cases(int ranks) {
  using kernels::WireFormat;
  std::vector<ScenarioCase> cases;
  for (const kernels::WireSpec& wire :
       {kernels::WireSpec{WireFormat::kBF16}, kernels::WireSpec{WireFormat::kFP8},
        kernels::WireSpec{WireFormat::kMXFP8, kernels::ScaleRounding::kFloor},
        kernels::WireSpec{WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k2D}}) {
    ScenarioCase c;
    c.ranks = ranks;
    c.wire = wire;
    c.gemm_backward = true;
    cases.push_back(c);
  }
  return cases;
}

std::vector<ScenarioCase> undefined_grad_cases(int ranks) {
  std::vector<ScenarioCase> cases;
  for (bool two_groups : {false, true}) {
    ScenarioCase c;
    c.ranks = ranks;
    c.wire = {kernels::WireFormat::kFP8};
    c.grad_init = GradInit::kUndefined;
    c.accumulate = false;
    c.depth = 2;
    c.two_groups = two_groups;
    cases.push_back(c);
  }
  return cases;
}

std::vector<ScenarioCase> keep_gathered_cases(int ranks) {
  ScenarioCase c;
  c.ranks = ranks;
  c.wire = {kernels::WireFormat::kNVFP4, kernels::ScaleRounding::kRceil, kernels::Nvfp4Blocks::k1D};
  c.keep_gathered = true;
  return {c};
}

std::vector<ScenarioCase> fill_graph_cases(int ranks) {
  std::vector<ScenarioCase> cases;
  for (kernels::WireFormat format : {kernels::WireFormat::kBF16, kernels::WireFormat::kMXFP8}) {
    ScenarioCase c;
    c.ranks = ranks;
    c.wire = {format};
    c.fill_graphs = 64;
    cases.push_back(c);
  }
  return cases;
}

std::vector<ScenarioCase> captured_step_cases(int ranks) {
  std::vector<ScenarioCase> cases;
  for (bool fill_graphs : {false, true}) {
    ScenarioCase c;
    c.ranks = ranks;
    c.wire = {fill_graphs ? kernels::WireFormat::kBF16 : kernels::WireFormat::kFP8};
    c.capture = true;
    c.fill_graphs = fill_graphs ? 64 : 0;
    c.grad_init = fill_graphs ? GradInit::kUndefined : GradInit::kZero;
    c.steps = 6;
    cases.push_back(c);
  }
  return cases;
}

void expect_same_as_host(const ScenarioCase& c, int rank, const Seen& device, const Seen& host, const std::string& what) {
  ASSERT_EQ(device.weights.size(), host.weights.size());
  for (std::size_t i = 0; i < host.weights.size(); ++i) {
    ASSERT_TRUE(device.weights[i] == host.weights[i])
        << what << " rank " << rank << " materialize " << i << " (step "
        << i / (scenario_shapes().size() * 2 * c.microbatches) << ") differs from the host backend's";
  }
  ASSERT_EQ(device.main_grads.size(), host.main_grads.size());
  bool nonzero = false;
  for (std::size_t i = 0; i < host.main_grads.size(); ++i) {
    const auto& a = device.main_grads[i];
    const auto& b = host.main_grads[i];
    ASSERT_EQ(a.size(), b.size());
    ASSERT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0)
        << what << " rank " << rank << " main grad " << i % scenario_shapes().size() << " after step "
        << i / scenario_shapes().size() << " differs from the host backend's";
    nonzero = nonzero || std::any_of(b.begin(), b.end(), [](float x) { return x != 0.0f; });
  }
  // Rank 0 holds rows of every layer at every G (later ranks may hold only padding).
  if (rank == 0) {
    EXPECT_TRUE(nonzero) << "the reference main grads are all zero: the comparison would be vacuous";
  }
}

}  // namespace gtp::remat::testing
