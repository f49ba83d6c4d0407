// A tiny three-layer linear model trained through the remat runtime, and a check of every wire format,
// shared by the thread-rank tests and the multi-process worker. Weights are in {-0.5, 0, 0.5} and inputs in {-1, 0, 1}, so every
// product and sum below is exact in FP32 in any order: main grads must equal the single-process
// reference bit for bit, whatever order the reduce-scatter sums in.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "comm/host.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "kernels/reference.h"
#include "remat/host_backend.h"
#include "remat/runtime.h"

namespace gtp::remat::testing {

// Runs body on n host ranks as threads of this process (ThreadBootstrap), rethrowing the first failure.
inline void on_ranks(int n, const std::function<void(comm::HostComm&)>& body) {
  constexpr std::chrono::milliseconds kTimeout{60000};
  auto group = comm::ThreadBootstrap::create_group(n, kTimeout);
  comm::internal::rethrow_first(comm::internal::run_ranks(n, [&](int rank) {
    comm::HostComm comm(*group[rank], kTimeout);
    body(comm);
  }));
}

inline float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

struct LayerShape {
  std::int64_t rows, cols;  // out_features, in_features
};
inline const std::vector<LayerShape>& layer_shapes() {
  static const std::vector<LayerShape> shapes = {{48, 32}, {32, 48}, {24, 32}};
  return shapes;
}
inline constexpr std::int64_t kBatchRows = 4;

// The unsharded BF16 weight of `layer` during `step`: values in {-0.5, 0, 0.5}.
inline std::vector<std::uint16_t> full_weight(int layer, int step) {
  const LayerShape shape = layer_shapes()[layer];
  std::mt19937 rng(1000 * layer + step + 17);
  std::vector<std::uint16_t> w(shape.rows * shape.cols);
  for (std::uint16_t& v : w) {
    const unsigned pick = rng() % 3;
    v = pick == 0 ? 0 : pick == 1 ? 0x3F00 : 0xBF00;
  }
  return w;
}

// The input of data rank `rank` for (step, microbatch): kBatchRows x cols of layer 0, in {-1, 0, 1}.
inline std::vector<float> input(int step, int rank, int microbatch) {
  std::mt19937 rng(7919 * step + 104729 * rank + 31 * microbatch + 5);
  std::vector<float> x(kBatchRows * layer_shapes()[0].cols);
  for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 3) - 1);
  return x;
}

// y = x W^T for x [B, cols], W [rows, cols] given as BF16 bits.
inline std::vector<float> forward(const std::vector<float>& x, const std::uint16_t* w, LayerShape s) {
  std::vector<float> y(kBatchRows * s.rows, 0.0f);
  for (std::int64_t b = 0; b < kBatchRows; ++b)
    for (std::int64_t r = 0; r < s.rows; ++r)
      for (std::int64_t c = 0; c < s.cols; ++c) y[b * s.rows + r] += x[b * s.cols + c] * bf16_to_float(w[r * s.cols + c]);
  return y;
}

// dx = dy W and g += dy^T x (g = dy^T x with `overwrite`, as a GEMM with beta = 0 writes every output).
inline std::vector<float> backward(const std::vector<float>& dy, const std::vector<float>& x, const std::uint16_t* w,
                                   LayerShape s, float* g, bool overwrite = false) {
  if (overwrite) std::fill(g, g + s.rows * s.cols, 0.0f);
  std::vector<float> dx(kBatchRows * s.cols, 0.0f);
  for (std::int64_t b = 0; b < kBatchRows; ++b)
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const float d = dy[b * s.rows + r];
      for (std::int64_t c = 0; c < s.cols; ++c) {
        dx[b * s.cols + c] += d * bf16_to_float(w[r * s.cols + c]);
        g[r * s.cols + c] += d * x[b * s.cols + c];
      }
    }
  return dx;
}

// The weight gradient of every layer, summed over data ranks and microbatches, divided by G: what
// each rank's main grad must hold (its rows) after one step.
inline std::vector<std::vector<float>> reference_grads(int step, int group_size, int microbatches) {
  const auto& shapes = layer_shapes();
  std::vector<std::vector<std::uint16_t>> w;
  std::vector<std::vector<float>> g;
  for (int l = 0; l < static_cast<int>(shapes.size()); ++l) {
    w.push_back(full_weight(l, step));
    g.emplace_back(shapes[l].rows * shapes[l].cols, 0.0f);
  }
  for (int rank = 0; rank < group_size; ++rank)
    for (int mb = 0; mb < microbatches; ++mb) {
      std::vector<std::vector<float>> xs = {input(step, rank, mb)};
      for (std::size_t l = 0; l < shapes.size(); ++l) xs.push_back(forward(xs[l], w[l].data(), shapes[l]));
      std::vector<float> dy(kBatchRows * shapes.back().rows, 1.0f);
      for (int l = static_cast<int>(shapes.size()) - 1; l >= 0; --l) dy = backward(dy, xs[l], w[l].data(), shapes[l], g[l].data());
    }
  for (auto& layer : g)
    for (float& v : layer) v /= static_cast<float>(group_size);
  return g;
}

struct TrainReport {
  RuntimeStats runtime;
  CacheStats cache;
  std::int64_t largest_group_bytes = 0;  // the largest single materialize call's slot bytes
  GroupStats group;                      // of group 0, the only one
  std::vector<std::vector<float>> main_grads;  // this rank's, after the last step
  GradsStats grads;
};

struct TrainOptions {
  int steps = 4;
  int microbatches = 2;
  RuntimeConfig config;
  GradInit grad_init = GradInit::kZero;
  bool poison_memory = false;  // PoisoningHostBackend: what the runtime did not write reads as NaN
  bool declare_zeroed = false;  // main_grads_zeroed (every weight) after zeroing them each step
};

// A HostBackend whose fresh allocations and reduced (hence released) gradient buffers are refilled
// with NaN bytes, so a gradient buffer handed out again holds NaN wherever the runtime does not fill it.
class PoisoningHostBackend : public HostBackend {
 public:
  using HostBackend::HostBackend;
  static constexpr unsigned char kPoison = 0xFF;  // 0xFFFFFFFF is a NaN

  // The reduction is in place: everything but this rank's result is dead once it ran, and the result
  // once the main-grad add read it.
  void reduce_scatter_mean(Stream stream, int group, const float* send, float* recv, std::int64_t recv_count) override {
    HostBackend::reduce_scatter_mean(stream, group, send, recv, recv_count);
    const std::int64_t before = recv - send, after = group_size(group) * recv_count - before - recv_count;
    fill(stream, const_cast<float*>(send), kPoison, before * static_cast<std::int64_t>(sizeof(float)));
    fill(stream, recv + recv_count, kPoison, after * static_cast<std::int64_t>(sizeof(float)));
  }
  void add(Stream stream, const float* src, float* dst, std::int64_t count) override {
    HostBackend::add(stream, src, dst, count);
    fill(stream, const_cast<float*>(src), kPoison, count * static_cast<std::int64_t>(sizeof(float)));
  }
  void copy(Stream stream, const float* src, float* dst, std::int64_t count) override {
    HostBackend::copy(stream, src, dst, count);
    fill(stream, const_cast<float*>(src), kPoison, count * static_cast<std::int64_t>(sizeof(float)));
  }

 protected:
  void* do_allocate(std::int64_t bytes) override {
    void* ptr = HostBackend::do_allocate(bytes);
    std::memset(ptr, kPoison, static_cast<std::size_t>(bytes));
    return ptr;
  }
};

// Trains on this rank (data rank = group rank) and checks, every step: every materialized weight is
// bit-identical to the unsharded weight; main grads equal the reference; after the first two steps
// (recording, then the first prefetching step) nothing is allocated; the cache never holds more than
// (depth + 1) x the largest weight group.
inline void train_and_check(comm::HostComm& comm, const TrainOptions& options, TrainReport* report = nullptr) {
  const auto& shapes = layer_shapes();
  const int layers = static_cast<int>(shapes.size());
  std::unique_ptr<HostBackend> backend_owner =
      options.poison_memory ? std::make_unique<PoisoningHostBackend>(std::vector<comm::HostComm*>{&comm})
                            : std::make_unique<HostBackend>(std::vector<comm::HostComm*>{&comm});
  HostBackend& backend = *backend_owner;
  Runtime runtime(backend, options.config);
  std::vector<std::vector<std::uint16_t>> shards(layers);
  std::vector<std::vector<float>> main_grads(layers);
  std::vector<WeightId> ids;
  std::int64_t largest = 0;
  for (int l = 0; l < layers; ++l) {
    const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, shapes[l].rows, shapes[l].cols, comm.size());
    const std::int64_t valid = geometry.valid_rows(comm.rank());
    shards[l].resize(std::max<std::int64_t>(valid, 1) * shapes[l].cols);
    main_grads[l].assign(std::max<std::int64_t>(valid, 1) * shapes[l].cols, 0.0f);
    WeightDesc desc;
    desc.name = "layer" + std::to_string(l);
    desc.shard = shards[l].data();
    desc.rows = shapes[l].rows;
    desc.cols = shapes[l].cols;
    desc.main_grad = main_grads[l].data();
    ids.push_back(runtime.register_weight(desc));
    const Weight& w = runtime.registry().get(ids.back());
    largest = std::max(largest, w.geometry.group_size * w.layout.chunk_bytes + w.output_bytes);
  }
  std::int64_t warm_allocations = 0;
  for (int step = 0; step < options.steps; ++step) {
    for (int l = 0; l < layers; ++l) {
      const auto full = full_weight(l, step);
      const auto geometry = runtime.registry().get(ids[l]).geometry;
      const std::int64_t first = comm.rank() * geometry.shard_rows * shapes[l].cols;
      const std::int64_t valid = geometry.valid_rows(comm.rank()) * shapes[l].cols;
      std::copy(full.begin() + first, full.begin() + first + valid, shards[l].begin());
      std::fill(main_grads[l].begin(), main_grads[l].end(), 0.0f);
    }
    if (options.declare_zeroed) runtime.main_grads_zeroed(nullptr, 0);
    runtime.shard_updated(ids.data(), layers, nullptr);
    for (int mb = 0; mb < options.microbatches; ++mb) {
      std::vector<std::vector<float>> xs = {input(step, comm.rank(), mb)};
      for (int l = 0; l < layers; ++l) {
        const auto out = runtime.materialize(&ids[l], 1, Phase::kForward, 0, Layout::kBF16, nullptr);
        const auto full = full_weight(l, step);
        ASSERT_EQ(std::memcmp(out[0], full.data(), full.size() * 2), 0) << "forward layer " << l << " step " << step;
        xs.push_back(forward(xs[l], static_cast<const std::uint16_t*>(out[0]), shapes[l]));
        runtime.release(&ids[l], 1, nullptr);
      }
      std::vector<float> dy(kBatchRows * shapes.back().rows, 1.0f);
      for (int l = layers - 1; l >= 0; --l) {
        const auto out = runtime.materialize(&ids[l], 1, Phase::kBackward, 0, Layout::kBF16, nullptr);
        const auto full = full_weight(l, step);
        ASSERT_EQ(std::memcmp(out[0], full.data(), full.size() * 2), 0) << "backward layer " << l << " step " << step;
        const GradBuffer g = runtime.grad_buffer(ids[l], nullptr, options.grad_init);
        // Overwrite exactly when a kUndefined kind hands out a buffer (not one held across microbatches),
        // unless it is the main grad holding earlier microbatches (kUndefined on one rank). A main grad
        // declared zero is the first buffer itself on one rank (written, or added into for kZero).
        const bool fresh = mb == 0 || !options.config.grads.accumulate_microbatches;
        const bool one_rank = comm.size() == 1 && options.config.grads_into_main_grad;
        const bool declared_first = options.declare_zeroed && mb == 0 && one_rank;
        const bool adds_into_main = one_rank && options.grad_init == GradInit::kUndefined && !declared_first;
        ASSERT_EQ(g.overwrite, options.grad_init != GradInit::kZero && fresh && !adds_into_main)
            << "layer " << l << " mb " << mb;
        if (declared_first) {
          ASSERT_EQ(g.data, main_grads[l].data()) << "layer " << l;
        }
        // The main grad has no padding rows (the buffer is the main grad on one rank, whatever the padding).
        const std::int64_t padded_rows =
            g.data == main_grads[l].data() ? shapes[l].rows : runtime.registry().get(ids[l]).geometry.padded_rows;
        for (std::int64_t i = shapes[l].rows * shapes[l].cols; i < padded_rows * shapes[l].cols; ++i) {
          ASSERT_EQ(g.data[i], 0.0f) << "padding element " << i << " of layer " << l << " mb " << mb;
        }
        dy = backward(dy, xs[l], static_cast<const std::uint16_t*>(out[0]), shapes[l], g.data, g.overwrite);
        runtime.release(&ids[l], 1, nullptr);
        runtime.finalize(&ids[l], 1, mb == options.microbatches - 1, nullptr);
      }
    }
    runtime.drain(nullptr);
    const auto reference = reference_grads(step, comm.size(), options.microbatches);
    for (int l = 0; l < layers; ++l) {
      const auto geometry = runtime.registry().get(ids[l]).geometry;
      const std::int64_t first = comm.rank() * geometry.shard_rows * shapes[l].cols;
      const std::int64_t valid = geometry.valid_rows(comm.rank()) * shapes[l].cols;
      for (std::int64_t i = 0; i < valid; ++i) {
        ASSERT_EQ(main_grads[l][i], reference[l][first + i]) << "layer " << l << " element " << i << " step " << step;
      }
    }
    EXPECT_LE(runtime.cache_stats().slot_bytes, (options.config.depth + 1) * largest) << "step " << step;
    if (step == 1) warm_allocations = backend.memory().allocations;
    if (step > 1) {
      EXPECT_EQ(backend.memory().allocations, warm_allocations) << "allocated in steady state, step " << step;
    }
  }
  const RuntimeStats stats = runtime.stats();
  if (options.config.depth > 0) {
    EXPECT_GT(stats.prefetch_hits, 0) << runtime.stats_json();
    EXPECT_GT(stats.stale_prefetches, 0) << "the head prefetched across the step boundary was not re-gathered";
  } else {
    EXPECT_EQ(stats.prefetches, 0) << runtime.stats_json();
    EXPECT_EQ(stats.exposed_gathers, stats.materializations);
  }
  EXPECT_EQ(stats.chain_mismatches, 0) << stats.last_mismatch;
  EXPECT_EQ(runtime.grads_stats().grads_ready, options.steps * layers * (options.config.grads.accumulate_microbatches ? 1 : options.microbatches));
  if (report != nullptr) *report = TrainReport{stats, runtime.cache_stats(), largest, runtime.group_stats(0), main_grads,
                                  runtime.grads_stats()};
}

// The G chunks a single process packs from the full FP32 weight with the weight-wide amax: what the
// runtime's gather must yield.
inline std::vector<unsigned char> reference_chunks(const kernels::WireSpec& spec, const std::vector<float>& full,
                                                   const kernels::WeightGeometry& geometry,
                                                   const kernels::ChunkLayout& layout) {
  const int g = static_cast<int>(geometry.group_size);
  const float amax = kernels::amax_reference(full.data(), kernels::SourceDtype::kFP32, geometry.rows, geometry.cols);
  std::vector<unsigned char> chunks(g * layout.chunk_bytes);
  for (int r = 0; r < g; ++r) {
    kernels::PackArgs args;
    args.shard = full.data() + r * geometry.shard_rows * geometry.cols;
    args.src_dtype = kernels::SourceDtype::kFP32;
    args.shard_rows = geometry.shard_rows;
    args.valid_rows = geometry.valid_rows(r);
    args.cols = geometry.cols;
    args.amax = &amax;
    args.chunk = chunks.data() + r * layout.chunk_bytes;
    args.chunk_capacity = layout.chunk_bytes;
    kernels::pack_reference(spec, args);
  }
  return chunks;
}

// The GEMM-ready layout of gathered chunks by the CPU reference, every section the format has
// (the exact transpose included where it exists), as host byte vectors.
struct GemmReference {
  kernels::GemmLayoutSizes sizes;
  std::vector<unsigned char> data, scales, transposed_data, transposed_scales;
  std::vector<float> decode_scales;
};
inline GemmReference reference_gemm(const kernels::WireSpec& spec, const std::vector<unsigned char>& chunks,
                                    const kernels::WeightGeometry& geometry) {
  GemmReference ref;
  ref.sizes = kernels::gemm_layout_sizes(spec, geometry);
  ref.data.resize(ref.sizes.data_bytes);
  ref.scales.resize(ref.sizes.scales_bytes);
  ref.decode_scales.resize(ref.sizes.decode_scale_count);
  kernels::GemmOutputs out;
  out.data = ref.data.data();
  out.data_capacity = ref.sizes.data_bytes;
  if (ref.sizes.scales_bytes > 0) {
    out.scales = ref.scales.data();
    out.scales_capacity = ref.sizes.scales_bytes;
  }
  if (ref.sizes.transpose_supported) {
    ref.transposed_data.resize(ref.sizes.transposed_data_bytes);
    ref.transposed_scales.resize(ref.sizes.transposed_scales_bytes);
    out.transposed_data = ref.transposed_data.data();
    out.transposed_data_capacity = ref.sizes.transposed_data_bytes;
    if (ref.sizes.transposed_scales_bytes > 0) {
      out.transposed_scales = ref.transposed_scales.data();
      out.transposed_scales_capacity = ref.sizes.transposed_scales_bytes;
    }
  }
  if (ref.sizes.decode_scale_count > 0) {
    out.decode_scales = ref.decode_scales.data();
    out.decode_scales_capacity = ref.sizes.decode_scale_count;
  }
  kernels::unpack_gemm_reference(spec, kernels::GatheredChunks{chunks.data(), static_cast<std::int64_t>(chunks.size()), geometry}, out);
  return ref;
}

// `got` (host memory) equals the reference in every section, and has no section the format lacks.
inline void expect_gemm_equal(const Materialized& got, const GemmReference& ref, const std::string& what) {
  const auto same = [&](const void* ptr, const void* expected, std::size_t bytes, const char* section) {
    if (bytes == 0) {
      EXPECT_EQ(ptr, nullptr) << what << ": " << section << " must be absent";
      return;
    }
    ASSERT_NE(ptr, nullptr) << what << ": " << section;
    EXPECT_EQ(std::memcmp(ptr, expected, bytes), 0) << what << ": " << section << " differs from the reference";
  };
  EXPECT_EQ(got.layout, Layout::kGemm) << what;
  EXPECT_EQ(got.gemm.gemm_rows, ref.sizes.gemm_rows) << what;
  same(got.data, ref.data.data(), ref.data.size(), "data");
  same(got.scales, ref.scales.data(), ref.scales.size(), "scales");
  same(got.transposed_data, ref.transposed_data.data(), ref.transposed_data.size(), "transposed_data");
  same(got.transposed_scales, ref.transposed_scales.data(), ref.transposed_scales.size(), "transposed_scales");
  same(got.decode_scales, ref.decode_scales.data(), ref.decode_scales.size() * sizeof(float), "decode_scales");
}

// Every wire format, with an expert group: the materialized weights equal the reference decode of the
// chunks a single process packs from the full weight with the group-wide amax.
inline void check_wire_format(comm::HostComm& comm, const kernels::WireSpec& spec) {
  const int g = comm.size();
  const std::int64_t rows = 40, cols = 64;
  const int experts = 3;
  auto full_weight = [&](int expert, int step) {
    std::mt19937 rng(100 * expert + step);
    std::normal_distribution<float> normal(0.0f, 1.0f + expert + step);
    std::vector<float> w(rows * cols);
    for (float& v : w) v = normal(rng);
    return w;
  };
  {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.depth = 2;
    Runtime runtime(backend, config);
    const auto geometry = kernels::weight_geometry(spec.format, rows, cols, g);
    const std::int64_t valid = geometry.valid_rows(comm.rank());
    std::vector<std::vector<float>> shards(experts, std::vector<float>(std::max<std::int64_t>(valid, 1) * cols));
    std::vector<WeightId> ids;
    for (int e = 0; e < experts; ++e) {
      WeightDesc desc;
      desc.name = "expert" + std::to_string(e);
      desc.shard = shards[e].data();
      desc.dtype = kernels::SourceDtype::kFP32;
      desc.rows = rows;
      desc.cols = cols;
      desc.wire = spec;
      desc.expert_leader = e == 0 ? kNoWeight : ids[0];
      ids.push_back(runtime.register_weight(desc));
    }
    const kernels::ChunkLayout layout = runtime.registry().get(ids[0]).layout;
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<std::uint16_t>> expected;
      for (int e = 0; e < experts; ++e) {
        const auto full = full_weight(e, step);
        std::copy(full.begin() + comm.rank() * geometry.shard_rows * cols,
                  full.begin() + (comm.rank() * geometry.shard_rows + valid) * cols, shards[e].begin());
        const std::vector<unsigned char> chunks = reference_chunks(spec, full, geometry, layout);
        expected.emplace_back(rows * cols);
        kernels::unpack_reference(spec, kernels::GatheredChunks{chunks.data(), g * layout.chunk_bytes, geometry},
                                  expected.back().data(), rows * cols * 2);
      }
      runtime.shard_updated(ids.data(), 1, nullptr);  // the leader brings its experts
      for (int pass = 0; pass < 2; ++pass) {
        const auto out = runtime.materialize(ids.data(), 1, Phase::kForward, 0, Layout::kBF16, nullptr);
        ASSERT_EQ(out.size(), static_cast<std::size_t>(experts));
        for (int e = 0; e < experts; ++e) {
          ASSERT_EQ(std::memcmp(out[e], expected[e].data(), rows * cols * 2), 0)
              << kernels::to_string(spec.format) << " expert " << e << " step " << step << " pass " << pass;
        }
        runtime.release(ids.data(), 1, nullptr);
      }
      runtime.drain(nullptr);
    }
    EXPECT_GT(runtime.stats().prefetch_hits, 0);
  }
}

// The GEMM-ready layout of every wire format with an expert group (3 experts) and a lone weight, BF16
// and GEMM consumers mixed in one step (both layouts of the experts held at once): every section equals
// the CPU reference's GEMM-ready unpack of the single-process chunks (the BF16 wire: the BF16 weight);
// each layout is its own chain entry (no mismatches, prefetch hits); after warm-up nothing is
// allocated; the cache stays within (depth + 2) x the largest weight group, sized with the larger
// layout (two groups are held at once here); released slots are poisoned, so a layout served from
// a recycled slot would show.
inline void check_gemm_layout(comm::HostComm& comm, const kernels::WireSpec& spec) {
  const int g = comm.size();
  const std::int64_t cols = 64;
  const std::vector<std::int64_t> rows = {40, 40, 40, 24};  // experts 0..2, then the lone weight
  const int experts = 3;
  auto full_weight = [&](int w, int step) {
    std::mt19937 rng(31 * w + step + 5);
    std::normal_distribution<float> normal(0.0f, 1.0f + w);
    std::vector<float> v(rows[w] * cols);
    for (float& x : v) x = normal(rng);
    return v;
  };
  HostBackend backend({&comm});
  RuntimeConfig config;
  config.depth = 2;
  config.cache.poison_released = true;
  Runtime runtime(backend, config);
  std::vector<std::vector<float>> shards;
  std::vector<WeightId> ids;
  std::int64_t largest = 0;
  for (std::size_t w = 0; w < rows.size(); ++w) {
    const auto geometry = kernels::weight_geometry(spec.format, rows[w], cols, g);
    shards.emplace_back(std::max<std::int64_t>(geometry.valid_rows(comm.rank()), 1) * cols);
    WeightDesc desc;
    desc.name = "w" + std::to_string(w);
    desc.shard = shards.back().data();
    desc.dtype = kernels::SourceDtype::kFP32;
    desc.rows = rows[w];
    desc.cols = cols;
    desc.wire = spec;
    desc.expert_leader = (w == 0 || static_cast<int>(w) >= experts) ? kNoWeight : ids[0];
    ids.push_back(runtime.register_weight(desc));
    const Weight& weight = runtime.registry().get(ids.back());
    EXPECT_EQ(weight.gathers_in_place, spec.format == kernels::WireFormat::kBF16);
    if (weight.gathers_in_place) {  // the gathered chunks hold the weight; no output region
      EXPECT_EQ(weight.output_bytes, 0);
      EXPECT_GE(weight.geometry.group_size * weight.layout.chunk_bytes, rows[w] * cols * 2);
    } else {
      EXPECT_GE(weight.output_bytes, weight.gemm.bytes);
      EXPECT_GE(weight.output_bytes, rows[w] * cols * 2);
    }
  }
  for (WeightId leader : {ids[0], ids[3]}) {
    std::int64_t bytes = 0;
    for (WeightId id : runtime.registry().expand(&leader, 1)) {
      const Weight& w = runtime.registry().get(id);
      bytes += w.geometry.group_size * w.layout.chunk_bytes + w.output_bytes;
    }
    largest = std::max(largest, bytes);
  }
  const std::string name = kernels::to_string(spec.format) + " G=" + std::to_string(g);
  const bool bf16_wire = spec.format == kernels::WireFormat::kBF16;
  std::int64_t warm_allocations = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<std::uint16_t>> bf16;
    std::vector<GemmReference> gemm;
    for (std::size_t w = 0; w < rows.size(); ++w) {
      const Weight& weight = runtime.registry().get(ids[w]);
      const auto full = full_weight(static_cast<int>(w), step);
      std::copy(full.begin() + comm.rank() * weight.geometry.shard_rows * cols,
                full.begin() + (comm.rank() * weight.geometry.shard_rows + weight.valid_rows) * cols,
                shards[w].begin());
      const auto chunks = reference_chunks(spec, full, weight.geometry, weight.layout);
      bf16.emplace_back(rows[w] * cols);
      kernels::unpack_reference(spec, kernels::GatheredChunks{chunks.data(), static_cast<std::int64_t>(chunks.size()), weight.geometry},
                                bf16.back().data(), rows[w] * cols * 2);
      if (!bf16_wire) gemm.push_back(reference_gemm(spec, chunks, weight.geometry));
    }
    const WeightId updated[] = {ids[0], ids[3]};
    runtime.shard_updated(updated, 2, nullptr);
    const auto check = [&](const std::vector<Materialized>& got, WeightId first, Layout layout, const char* where) {
      for (std::size_t i = 0; i < got.size(); ++i) {
        const std::size_t w = static_cast<std::size_t>(first) + i;
        const std::string what = name + " " + where + " weight " + std::to_string(w) + " step " + std::to_string(step);
        if (layout == Layout::kBF16 || bf16_wire) {
          EXPECT_EQ(got[i].layout, Layout::kBF16) << what;
          EXPECT_EQ(got[i].scales, nullptr) << what;
          ASSERT_EQ(std::memcmp(got[i].data, bf16[w].data(), bf16[w].size() * 2), 0) << what;
        } else {
          expect_gemm_equal(got[i], gemm[w], what);
        }
      }
    };
    for (int mb = 0; mb < 2; ++mb) {
      // Forward: one consumer wants the experts GEMM-ready, another (same step, both held) in BF16.
      const auto experts_gemm = runtime.materialize_views(&ids[0], 1, Phase::kForward, 0, Layout::kGemm, nullptr);
      const auto experts_bf16 = runtime.materialize_views(&ids[0], 1, Phase::kForward, 0, Layout::kBF16, nullptr);
      ASSERT_EQ(experts_gemm.size(), static_cast<std::size_t>(experts));
      ASSERT_EQ(experts_bf16.size(), static_cast<std::size_t>(experts));
      EXPECT_NE(experts_gemm[0].data, experts_bf16[0].data) << "two layouts are two keys, two slots";
      check(experts_gemm, 0, Layout::kGemm, "forward gemm");
      check(experts_bf16, 0, Layout::kBF16, "forward bf16");
      EXPECT_THROW(runtime.release(&ids[0], 1, nullptr), std::invalid_argument) << "ambiguous layout";
      runtime.release(&ids[0], 1, nullptr, Layout::kBF16);
      check(experts_gemm, 0, Layout::kGemm, "forward gemm after the bf16 release");  // not poisoned
      runtime.release(&ids[0], 1, nullptr, Layout::kGemm);
      check(runtime.materialize_views(&ids[3], 1, Phase::kForward, 0, Layout::kGemm, nullptr), 3, Layout::kGemm,
            "forward lone");
      runtime.release(&ids[3], 1, nullptr);  // one layout held: unambiguous
      // Backward: the other way round.
      check(runtime.materialize_views(&ids[3], 1, Phase::kBackward, 0, Layout::kBF16, nullptr), 3, Layout::kBF16,
            "backward lone");
      runtime.release(&ids[3], 1, nullptr);
      check(runtime.materialize_views(&ids[0], 1, Phase::kBackward, 0, Layout::kGemm, nullptr), 0, Layout::kGemm,
            "backward experts");
      EXPECT_THROW(runtime.release(&ids[0], 1, nullptr, Layout::kBF16), std::invalid_argument) << "held in GEMM only";
      runtime.release(&ids[0], 1, nullptr);
    }
    runtime.drain(nullptr);
    EXPECT_LE(runtime.cache_stats().slot_bytes, (config.depth + 2) * largest) << name << " step " << step;
    if (step == 1) warm_allocations = backend.memory().allocations;
    if (step > 1) {
      EXPECT_EQ(backend.memory().allocations, warm_allocations) << name << " allocated, step " << step;
    }
  }
  const RuntimeStats stats = runtime.stats();
  EXPECT_EQ(stats.chain_mismatches, 0) << stats.last_mismatch;
  EXPECT_GT(stats.prefetch_hits, 0) << runtime.stats_json();
}

inline std::vector<kernels::WireSpec> all_wire_specs() {
  using kernels::WireFormat;
  using kernels::ScaleRounding;
  using kernels::Nvfp4Blocks;
  return {{WireFormat::kBF16},
          {WireFormat::kFP8},
          {WireFormat::kMXFP8, ScaleRounding::kRceil},
          {WireFormat::kMXFP8, ScaleRounding::kFloor},
          {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k1D},
          {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k2D}};
}

}  // namespace gtp::remat::testing
