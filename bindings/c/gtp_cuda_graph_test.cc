// A whole training step made only of C ABI calls, captured into a CUDA graph and replayed, as a
// framework that uses CUDA graphs drives libgtp: a GTP_BACKEND_CUDA context on a size-1 NCCL group
// (G = 1), four weights of different shapes on the BF16, FP8, MXFP8 and NVFP4 wires, prefetch depth 1
// and 2, and per-group depths from a profile (MXFP8 and NVFP4 in the expert group; expert depth 0
// gathers those on demand inside the graph). Two eager warm-up steps record the chains; then the step (forward materialize -> "GEMM" ->
// release per layer, backward materialize (GEMM-ready views for FP8 and MXFP8) -> grad_buffer ->
// "wgrad" -> release -> finalize, drain) is captured on a non-default stream and replayed, with new
// shards re-packed eagerly between replays. The "GEMM" copies the materialized bytes into check
// buffers and the "wgrad" copies a known FP32 pattern into the grad buffer, both inside the graph.
// Asserts after every step: the bytes the GEMM read equal the CPU reference's unpack of the shards
// bit for bit, main grads equal the host's sum of the patterns, grad-ready fires per replay; and that
// capture and replay allocate nothing (the stats JSON's memory.allocations) and return the warm-up's
// addresses, the stats count the capture once with every steady-state materialize a prefetch hit,
// and calls that are not capture-safe fail with their documented status without breaking the
// capture. Skips without a GPU.
#include <cuda_runtime_api.h>

#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"
#include "kernels/cuda_kernels.h"
#include "kernels/reference.h"
#include "kernels/wire_format.h"

namespace {

namespace kernels = gtp::kernels;
using gtp::cabi_test::stats_of;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
#define GTP_OK(call, ctx) ASSERT_EQ((call), GTP_SUCCESS) << #call << ": " << gtp_last_error(ctx)

struct Layer {
  const char* name;
  int64_t rows, cols;
  gtp_dtype_t dtype;
  gtp_wire_t wire;
  kernels::WireSpec spec;
  bool backward_gemm;  // backward takes the GEMM-ready views (codes, scales, transpose, decode scales)
};
// Different shapes; MXFP8's 40 rows are padded to its 32-row alignment (gemm_rows 64).
const std::vector<Layer>& layers() {
  static const std::vector<Layer> specs = {
      {"bf16", 64, 128, GTP_DTYPE_BF16, GTP_WIRE_BF16, {kernels::WireFormat::kBF16}, false},
      {"fp8", 96, 64, GTP_DTYPE_FP32, GTP_WIRE_FP8, {kernels::WireFormat::kFP8}, true},
      {"mxfp8", 40, 96, GTP_DTYPE_BF16, GTP_WIRE_MXFP8, {kernels::WireFormat::kMXFP8}, true},
      {"nvfp4", 128, 48, GTP_DTYPE_BF16, GTP_WIRE_NVFP4, {kernels::WireFormat::kNVFP4}, false},
  };
  return specs;
}
constexpr int kWarmup = 2;   // eager steps before capture: recording, then the first prefetching step
constexpr int kReplays = 4;  // steps kWarmup .. kWarmup + kReplays - 1 are replays

int64_t elements(const Layer& l) { return l.rows * l.cols; }
int64_t source_bytes(const Layer& l) { return elements(l) * (l.dtype == GTP_DTYPE_FP32 ? 4 : 2); }
kernels::SourceDtype source_dtype(const Layer& l) {
  return l.dtype == GTP_DTYPE_FP32 ? kernels::SourceDtype::kFP32 : kernels::SourceDtype::kBF16;
}
kernels::WeightGeometry geometry(const Layer& l) { return kernels::weight_geometry(l.spec.format, l.rows, l.cols, 1); }

// The shard of `layer` at `step` (G = 1: the whole weight) as raw bytes of its source dtype.
std::vector<unsigned char> shard_bytes(int layer, int step) {
  const Layer& l = layers()[layer];
  std::mt19937 rng(131 * step + layer);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<unsigned char> out(source_bytes(l));
  for (int64_t i = 0; i < elements(l); ++i) {
    const float v = normal(rng);
    if (l.dtype == GTP_DTYPE_FP32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      std::uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const auto bf16 = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(out.data() + 2 * i, &bf16, 2);
    }
  }
  return out;
}

// The "wgrad" of `layer` at `step`: multiples of 1/8 below 2 in magnitude, so main-grad sums over
// the test's steps are exact in FP32 whatever the order.
std::vector<float> wgrad(int layer, int step) {
  std::vector<float> g(elements(layers()[layer]));
  for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
    g[i] = static_cast<float>((i * 7 + layer * 5 + step * 3) % 31 - 15) * 0.125f;
  }
  return g;
}

// The sections of a GEMM-ready view, in a fixed order (absent ones have no bytes).
constexpr int kSections = 5;  // data, scales, data_t, scales_t, decode_scales
const char* const kSectionNames[kSections] = {"data", "scales", "data_t", "scales_t", "decode_scales"};
std::vector<int64_t> section_bytes(const Layer& l) {
  const kernels::GemmLayoutSizes s = kernels::gemm_layout_sizes(l.spec, geometry(l));
  return {s.data_bytes, s.scales_bytes, s.transpose_supported ? s.transposed_data_bytes : 0,
          s.transpose_supported ? s.transposed_scales_bytes : 0, s.decode_scale_count * 4};
}
const void* section_ptr(const gtp_materialized_t& v, int section) {
  const gtp_section_t* all[kSections] = {&v.data, &v.scales, &v.data_t, &v.scales_t, &v.decode_scales};
  return all[section]->ptr;
}

// What the CPU reference makes of a layer's shard: the BF16 weight and the GEMM-ready sections.
struct Reference {
  std::vector<unsigned char> bf16;
  std::vector<std::vector<unsigned char>> sections;
};
Reference reference(const Layer& l, const std::vector<unsigned char>& shard) {
  const kernels::WeightGeometry g = geometry(l);
  const kernels::ChunkLayout chunk = kernels::chunk_layout(l.spec, g.shard_rows, l.cols);
  const float amax = kernels::amax_reference(shard.data(), source_dtype(l), l.rows, l.cols);
  std::vector<unsigned char> chunks(chunk.chunk_bytes);
  kernels::PackArgs args;
  args.shard = shard.data();
  args.src_dtype = source_dtype(l);
  args.shard_rows = g.shard_rows;
  args.valid_rows = g.valid_rows(0);
  args.cols = l.cols;
  args.amax = &amax;
  args.chunk = chunks.data();
  args.chunk_capacity = chunk.chunk_bytes;
  kernels::pack_reference(l.spec, args);
  const kernels::GatheredChunks in{chunks.data(), static_cast<int64_t>(chunks.size()), g};
  Reference r;
  r.bf16.resize(elements(l) * 2);
  kernels::unpack_reference(l.spec, in, r.bf16.data(), static_cast<int64_t>(r.bf16.size()));
  if (!l.backward_gemm) return r;
  const std::vector<int64_t> bytes = section_bytes(l);
  for (int64_t b : bytes) r.sections.emplace_back(b);
  kernels::GemmOutputs out;
  out.data = r.sections[0].data();
  out.data_capacity = bytes[0];
  if (bytes[1] > 0) {
    out.scales = r.sections[1].data();
    out.scales_capacity = bytes[1];
  }
  if (bytes[2] > 0) {
    out.transposed_data = r.sections[2].data();
    out.transposed_data_capacity = bytes[2];
  }
  if (bytes[3] > 0) {
    out.transposed_scales = r.sections[3].data();
    out.transposed_scales_capacity = bytes[3];
  }
  if (bytes[4] > 0) {
    out.decode_scales = reinterpret_cast<float*>(r.sections[4].data());
    out.decode_scales_capacity = bytes[4] / 4;
  }
  kernels::unpack_gemm_reference(l.spec, in, out);
  return r;
}

void count_grad_ready(void* user, gtp_weight_t w) {  // a CUDA host thread under replay: no CUDA, no libgtp
  static_cast<std::atomic<int>*>(user)[w.id].fetch_add(1);
}
constexpr int kMaxWeightId = 64;

// The context's prefetch depths: one for both groups from the config, or (different values) each
// group its own from the profile, with the MXFP8 and NVFP4 layers registered in the expert group.
struct Depths {
  int dense, expert;
  bool per_group() const { return dense != expert; }
  int group_of(int layer) const { return per_group() && layer >= 2 ? GTP_GROUP_EXPERT_GTP_REMAT : GTP_GROUP_GTP_REMAT; }
  // Materializations per step gathered on demand: each layer twice, in a group of depth 0.
  int64_t on_demand_per_step() const {
    int64_t n = 0;
    for (int i = 0; i < static_cast<int>(layers().size()); ++i) n += (group_of(i) == GTP_GROUP_GTP_REMAT ? dense : expert) == 0 ? 2 : 0;
    return n;
  }
};

// One rank's model through the C ABI on the CUDA backend.
class Model {
 public:
  explicit Model(const Depths& depths) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    group_ = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
    callbacks_ = gtp::cabi_test::callbacks_for(*group_[0]);
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks_;
    config.backend = GTP_BACKEND_CUDA;
    if (depths.per_group()) {
      profile_ = gtp::cabi_test::profile_with(1, {{"tensor_parallel_num_weight_shards", 1}},
                                              {{"gtp_remat", {{"prefetch_depth", depths.dense}}},
                                               {"expt_gtp_remat", {{"prefetch_depth", depths.expert}}}});
      config.profile_json = profile_.c_str();
      config.prefetch_depth = GTP_FROM_PROFILE;
    } else {
      config.prefetch_depth = depths.dense;
    }
    config.memory_budget_bytes = 0;
    config.grad_ready = count_grad_ready;
    config.grad_ready_user_data = grads_ready_;
    EXPECT_EQ(gtp_context_create(&config, &ctx_), GTP_SUCCESS) << gtp_last_error(nullptr);
    if (ctx_ == nullptr) return;
    for (const Layer& l : layers()) {
      const int layer = static_cast<int>(shards_.size());
      shards_.push_back(device(source_bytes(l)));
      main_grads_.push_back(static_cast<float*>(device(elements(l) * 4)));
      EXPECT_EQ(cudaMemset(main_grads_.back(), 0, elements(l) * 4), cudaSuccess);
      wgrads_.push_back(static_cast<float*>(device(elements(l) * 4)));
      forward_check_.push_back(device(elements(l) * 2));
      std::vector<void*> backward;
      if (l.backward_gemm) {
        for (int64_t b : section_bytes(l)) backward.push_back(b > 0 ? device(b) : nullptr);
      } else {
        backward.push_back(device(elements(l) * 2));
      }
      backward_check_.push_back(backward);
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      desc.name = l.name;
      desc.shard = shards_.back();
      desc.dtype = l.dtype;
      desc.rows = l.rows;
      desc.cols = l.cols;
      desc.wire = l.wire;
      desc.group = static_cast<gtp_group_t>(depths.group_of(layer));
      desc.main_grad = main_grads_.back();
      gtp_weight_t w{};
      EXPECT_EQ(gtp_weight_register(ctx_, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx_);
      EXPECT_LT(w.id, kMaxWeightId);
      handles_.push_back(w);
    }
    expected_main_.resize(layers().size());
    for (std::size_t i = 0; i < layers().size(); ++i) expected_main_[i].assign(elements(layers()[i]), 0.0f);
  }
  ~Model() {
    cudaStreamSynchronize(stream_);
    EXPECT_EQ(gtp_context_destroy(ctx_), GTP_SUCCESS);
    cudaStreamDestroy(stream_);
    for (void* p : owned_) cudaFree(p);
  }

  gtp_context_t* ctx() const { return ctx_; }
  cudaStream_t stream() const { return stream_; }
  int grads_ready(int layer) const { return grads_ready_[handles_[layer].id].load(); }

  // Eager, between steps and between replays (after the previous one finished): the optimizer's new
  // shards, re-packed on the launch stream; this step's wgrad patterns; check buffers poisoned, so a
  // replay that skipped a copy cannot pass on the previous step's bytes.
  void prepare(int step) {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    sources_.clear();
    for (std::size_t i = 0; i < layers().size(); ++i) {
      const Layer& l = layers()[i];
      sources_.push_back(shard_bytes(static_cast<int>(i), step));
      const std::vector<float> g = wgrad(static_cast<int>(i), step);
      CUDA_OK(cudaMemcpy(shards_[i], sources_.back().data(), source_bytes(l), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(wgrads_[i], g.data(), g.size() * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(forward_check_[i], 0xFF, elements(l) * 2));
      const std::vector<int64_t> bytes = l.backward_gemm ? section_bytes(l) : std::vector<int64_t>{elements(l) * 2};
      for (std::size_t s = 0; s < bytes.size(); ++s) {
        if (bytes[s] > 0) {
          CUDA_OK(cudaMemset(backward_check_[i][s], 0xFF, bytes[s]));
        }
      }
      for (int64_t e = 0; e < elements(l); ++e) expected_main_[i][e] += g[e];  // G = 1: the mean is g
    }
    CUDA_OK(cudaDeviceSynchronize());  // the legacy-stream copies above, before the re-pack reads them
    GTP_OK(gtp_weights_shard_updated(ctx_, handles_.data(), handles_.size(), stream_), ctx_);
  }

  // The step: only C ABI calls plus the consumer's copies, all on stream(). Under capture it also
  // makes the calls that must fail there. Returns every address the step was handed, in call order.
  std::vector<const void*> step(bool capturing) {
    std::vector<const void*> addresses;
    const int n = static_cast<int>(layers().size());
    for (int i = 0; i < n; ++i) {
      const Layer& l = layers()[i];
      void* w = nullptr;
      size_t count = 0;
      EXPECT_EQ(gtp_materialize(ctx_, &handles_[i], 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &w, 1, &count, stream_),
                GTP_SUCCESS) << gtp_last_error(ctx_);
      EXPECT_EQ(count, 1u);
      EXPECT_EQ(cudaMemcpyAsync(forward_check_[i], w, elements(l) * 2, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
      EXPECT_EQ(gtp_release(ctx_, &handles_[i], 1, stream_), GTP_SUCCESS) << gtp_last_error(ctx_);
      addresses.push_back(w);
      if (capturing && i == 0) refused_under_capture(w);
    }
    for (int i = n - 1; i >= 0; --i) {
      const Layer& l = layers()[i];
      size_t count = 0;
      if (l.backward_gemm) {
        gtp_materialized_t view = GTP_MATERIALIZED_INITIALIZER;
        EXPECT_EQ(gtp_materialize_views(ctx_, &handles_[i], 1, GTP_PHASE_BACKWARD, 0, GTP_LAYOUT_GEMM, &view, 1, &count,
                                        stream_), GTP_SUCCESS) << gtp_last_error(ctx_);
        EXPECT_EQ(view.layout, GTP_LAYOUT_GEMM) << l.name;
        const std::vector<int64_t> bytes = section_bytes(l);
        for (int s = 0; s < kSections; ++s) {
          const void* p = section_ptr(view, s);
          EXPECT_EQ(p != nullptr, bytes[s] > 0) << l.name << " " << kSectionNames[s];
          if (p != nullptr && bytes[s] > 0) {
            EXPECT_EQ(cudaMemcpyAsync(backward_check_[i][s], p, bytes[s], cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
          }
          addresses.push_back(p);
        }
      } else {
        void* w = nullptr;
        EXPECT_EQ(gtp_materialize(ctx_, &handles_[i], 1, GTP_PHASE_BACKWARD, 0, GTP_LAYOUT_BF16, &w, 1, &count, stream_),
                  GTP_SUCCESS) << gtp_last_error(ctx_);
        EXPECT_EQ(cudaMemcpyAsync(backward_check_[i][0], w, elements(l) * 2, cudaMemcpyDeviceToDevice, stream_),
                  cudaSuccess);
        addresses.push_back(w);
      }
      float* grad = nullptr;
      EXPECT_EQ(gtp_grad_buffer(ctx_, handles_[i], &grad, stream_), GTP_SUCCESS) << gtp_last_error(ctx_);
      EXPECT_EQ(cudaMemcpyAsync(grad, wgrads_[i], elements(l) * 4, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
      EXPECT_EQ(gtp_release_layout(ctx_, &handles_[i], 1, l.backward_gemm ? GTP_LAYOUT_GEMM : GTP_LAYOUT_BF16, stream_),
                GTP_SUCCESS) << gtp_last_error(ctx_);
      EXPECT_EQ(gtp_finalize(ctx_, &handles_[i], 1, /*last_microbatch=*/1, stream_), GTP_SUCCESS) << gtp_last_error(ctx_);
      addresses.push_back(grad);
    }
    if (capturing) {
      // The head cannot be deferred to shard_updated inside a graph (shard_updated is not captured).
      EXPECT_GTP_ERROR(gtp_drain_ex(ctx_, GTP_DRAIN_DEFER_HEAD, stream_), GTP_ERROR_INVALID_ARGUMENT, ctx_,
                       "capture");
      EXPECT_GTP_ERROR(gtp_drain_ex(ctx_, 4u, stream_), GTP_ERROR_INVALID_ARGUMENT, ctx_, "unknown bits");
      expect_still_capturing("after the refused drain_ex calls");
    }
    EXPECT_EQ(gtp_drain(ctx_, stream_), GTP_SUCCESS) << gtp_last_error(ctx_);
    return addresses;
  }

  // After a step or replay has run: what the GEMMs read, and the main grads.
  void verify(int step) {
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    for (std::size_t i = 0; i < layers().size(); ++i) {
      const Layer& l = layers()[i];
      const Reference want = reference(l, sources_[i]);
      std::vector<unsigned char> got(elements(l) * 2);
      CUDA_OK(cudaMemcpy(got.data(), forward_check_[i], got.size(), cudaMemcpyDeviceToHost));
      EXPECT_TRUE(got == want.bf16) << l.name << " forward weight, step " << step;
      if (l.backward_gemm) {
        for (int s = 0; s < kSections; ++s) {
          if (want.sections[s].empty()) continue;
          got.resize(want.sections[s].size());
          CUDA_OK(cudaMemcpy(got.data(), backward_check_[i][s], got.size(), cudaMemcpyDeviceToHost));
          EXPECT_TRUE(got == want.sections[s]) << l.name << " backward GEMM " << kSectionNames[s] << ", step " << step;
        }
      } else {
        CUDA_OK(cudaMemcpy(got.data(), backward_check_[i][0], got.size(), cudaMemcpyDeviceToHost));
        EXPECT_TRUE(got == want.bf16) << l.name << " backward weight, step " << step;
      }
      std::vector<float> main(elements(l));
      CUDA_OK(cudaMemcpy(main.data(), main_grads_[i], main.size() * 4, cudaMemcpyDeviceToHost));
      for (int64_t e = 0; e < elements(l); ++e) {
        ASSERT_EQ(main[e], expected_main_[i][e]) << l.name << " main grad element " << e << ", step " << step;
      }
    }
  }

 private:
  // Calls made while stream() is being captured that must fail with their documented status, enqueue
  // nothing and leave the capture intact; host-only calls that must work there. `w0` is layer 0's
  // forward weight, just released.
  void refused_under_capture(const void* w0) {
    EXPECT_GTP_ERROR(gtp_release(ctx_, &handles_[0], 1, stream_), GTP_ERROR_INVALID_STATE, ctx_, "not materialized");
    void* none = nullptr;
    size_t count = 7;
    EXPECT_GTP_ERROR(gtp_materialize(ctx_, &handles_[1], 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &none, 0, &count,
                                     stream_), GTP_ERROR_INVALID_ARGUMENT, ctx_, "out_capacity is 0");
    EXPECT_EQ(count, 7u) << "an output was written on failure";
    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    EXPECT_EQ(gtp_context_sizes(ctx_, &sizes), GTP_SUCCESS) << gtp_last_error(ctx_);
    EXPECT_EQ(sizes.gtp_remat, 1);
    const nlohmann::json stats = stats_of(ctx_);
    EXPECT_EQ(stats.at("backend"), "cuda");
    size_t len = 0;
    EXPECT_EQ(gtp_trace_json(ctx_, nullptr, 0, &len), GTP_ERROR_INVALID_ARGUMENT);  // sizes the text
    std::vector<char> trace(len + 1);
    EXPECT_EQ(gtp_trace_json(ctx_, trace.data(), trace.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx_);
    EXPECT_NE(w0, nullptr);
    // Not capture-safe (they allocate, free or re-pack): refused with nothing done.
    EXPECT_GTP_ERROR(gtp_weights_shard_updated(ctx_, handles_.data(), handles_.size(), stream_),
                     GTP_ERROR_INVALID_STATE, ctx_, "capture");
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "late";
    desc.shard = w0;
    desc.rows = 16;
    desc.cols = 16;
    desc.wire = GTP_WIRE_BF16;
    gtp_weight_t late{};
    EXPECT_GTP_ERROR(gtp_weight_register(ctx_, &desc, &late), GTP_ERROR_INVALID_STATE, ctx_, "capture");
    EXPECT_GTP_ERROR(gtp_weight_unregister(ctx_, handles_[0]), GTP_ERROR_INVALID_STATE, ctx_, "capture");
    EXPECT_GTP_ERROR(gtp_reset_chains(ctx_), GTP_ERROR_INVALID_STATE, ctx_, "capture");
    expect_still_capturing("after the refused release and materialize and the host-only calls");
  }

  void expect_still_capturing(const char* when) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    EXPECT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusActive) << "the capture was invalidated " << when;
  }

  void* device(int64_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    owned_.push_back(p);
    return p;
  }

  std::vector<std::unique_ptr<gtp::comm::ThreadBootstrap>> group_;
  gtp_bootstrap_callbacks_t callbacks_{};
  gtp_context_t* ctx_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::string profile_;
  std::atomic<int> grads_ready_[kMaxWeightId] = {};
  std::vector<void*> owned_;
  std::vector<void*> shards_, forward_check_;
  std::vector<std::vector<void*>> backward_check_;  // per layer: the BF16 weight, or the GEMM sections
  std::vector<float*> main_grads_, wgrads_;
  std::vector<gtp_weight_t> handles_;
  std::vector<std::vector<unsigned char>> sources_;  // this step's shards, for the reference
  std::vector<std::vector<float>> expected_main_;    // host sums of every executed step's wgrad
};

// The stats JSON's materialize counters and per-weight sums, checked for consistency.
struct Counts {
  int64_t calls, hits, exposed, reduce_scatters, grads_ready, allocations;
};
Counts counts_of(gtp_context_t* ctx) {
  const nlohmann::json s = stats_of(ctx);
  const nlohmann::json& m = s.at("materialize");
  Counts c{m.at("calls").get<int64_t>(), m.at("prefetch_hits").get<int64_t>(), m.at("exposed_gathers").get<int64_t>(),
           s.at("grads").at("reduce_scatters").get<int64_t>(), s.at("grads").at("grads_ready").get<int64_t>(),
           s.at("memory").at("allocations").get<int64_t>()};
  EXPECT_EQ(c.calls, c.hits + c.exposed) << s;
  int64_t calls = 0, hits = 0;
  for (const nlohmann::json& w : s.at("weights")) {
    EXPECT_EQ(w.at("materializations").get<int64_t>(),
              w.at("prefetch_hits").get<int64_t>() + w.at("exposed_gathers").get<int64_t>()) << w;
    calls += w.at("materializations").get<int64_t>();
    hits += w.at("prefetch_hits").get<int64_t>();
  }
  EXPECT_EQ(calls, c.calls) << "one weight per call: the per-weight materializations add up to the calls; " << s;
  EXPECT_EQ(hits, c.hits) << s;
  EXPECT_EQ(s.at("chains").at("mismatches").get<int64_t>(), 0) << s;
  EXPECT_EQ(s.at("chains").at("schedule_mismatches").get<int64_t>(), 0) << s;
  return c;
}

// The captured graph and its executable, destroyed before the context (docs/c-abi.md: destroy the
// graph before destroying what it refers to).
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

class CAbiCudaGraph : public ::testing::TestWithParam<Depths> {};

TEST_P(CAbiCudaGraph, CapturedStepOfCAbiCallsReplaysBitExact) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  CUDA_OK(cudaSetDevice(0));
  const Depths depths = GetParam();
  Model model(depths);
  ASSERT_NE(model.ctx(), nullptr);
  gtp_context_t* ctx = model.ctx();
  const int64_t per_step = 2 * static_cast<int64_t>(layers().size());  // materializations per step
  const int64_t on_demand = depths.on_demand_per_step(), prefetched = per_step - on_demand;
  const int n = static_cast<int>(layers().size());

  std::vector<const void*> warm_addresses;
  for (int step = 0; step < kWarmup; ++step) {
    ASSERT_NO_FATAL_FAILURE(model.prepare(step));
    warm_addresses = model.step(/*capturing=*/false);
    ASSERT_NO_FATAL_FAILURE(model.verify(step));
  }
  for (int i = 0; i < n; ++i) EXPECT_EQ(model.grads_ready(i), kWarmup) << layers()[i].name;
  // Recording step: every gather exposed; the next step: every materialize a prefetch hit (except
  // those of a group of depth 0).
  const Counts warm = counts_of(ctx);
  EXPECT_EQ(warm.calls, kWarmup * per_step);
  EXPECT_EQ(warm.exposed, per_step + (kWarmup - 1) * on_demand) << "only the recording step gathers on demand";
  EXPECT_EQ(warm.hits, (kWarmup - 1) * prefetched);
  const nlohmann::json groups = stats_of(ctx).at("groups");
  EXPECT_EQ(groups.at(GTP_GROUP_GTP_REMAT).at("depth").get<int>(), depths.dense) << groups;
  EXPECT_EQ(groups.at(GTP_GROUP_EXPERT_GTP_REMAT).at("depth").get<int>(), depths.expert) << groups;

  // Capture, after the previous work completed (waits on it are dropped inside the capture).
  ASSERT_NO_FATAL_FAILURE(model.prepare(kWarmup));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaStreamBeginCapture(model.stream(), cudaStreamCaptureModeThreadLocal));
  const std::vector<const void*> captured_addresses = model.step(/*capturing=*/true);
  Graph g;
  const cudaError_t ended = cudaStreamEndCapture(model.stream(), &g.graph);
  ASSERT_EQ(ended, cudaSuccess) << "cudaStreamEndCapture: " << cudaGetErrorString(ended);
  ASSERT_FALSE(HasFailure()) << "a call of the captured step failed; not replaying";
  CUDA_OK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  EXPECT_EQ(captured_addresses, warm_addresses) << "a materialized, view or grad-buffer address moved at capture";
  const Counts captured = counts_of(ctx);
  EXPECT_EQ(captured.allocations, warm.allocations) << "allocated during capture";
  EXPECT_EQ(captured.calls - warm.calls, per_step) << "the capture counts one step";
  EXPECT_EQ(captured.hits - warm.hits, prefetched) << "the captured step is all prefetch hits (but depth 0's)";
  EXPECT_EQ(captured.exposed - warm.exposed, on_demand);
  EXPECT_EQ(captured.reduce_scatters, (kWarmup + 1) * n);
  EXPECT_EQ(captured.grads_ready, (kWarmup + 1) * n);

  for (int r = 0; r < kReplays; ++r) {
    const int step = kWarmup + r;
    if (r > 0) {  // the first replay runs the shards prepared before capture
      ASSERT_NO_FATAL_FAILURE(model.prepare(step));
      GTP_OK(gtp_drain(ctx, model.stream()), ctx);  // orders the launch after the eager re-pack
    }
    CUDA_OK(cudaGraphLaunch(g.exec, model.stream()));
    ASSERT_NO_FATAL_FAILURE(model.verify(step)) << "replay " << r;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(model.grads_ready(i), step + 1) << layers()[i].name << ": grad-ready did not fire on replay " << r;
    }
  }
  // Host-side bookkeeping ran at capture only: replays change no counter and allocate nothing.
  const Counts replayed = counts_of(ctx);
  EXPECT_EQ(replayed.allocations, warm.allocations) << "allocated during replay or the re-packs between replays";
  EXPECT_EQ(replayed.calls, captured.calls);
  EXPECT_EQ(replayed.hits, captured.hits);
  EXPECT_EQ(replayed.exposed, captured.exposed);
  EXPECT_EQ(replayed.reduce_scatters, captured.reduce_scatters);
  EXPECT_EQ(replayed.grads_ready, captured.grads_ready);

  // Back to eager after the last replay finished: the step continues from the graph's end state.
  ASSERT_NO_FATAL_FAILURE(model.prepare(kWarmup + kReplays));
  EXPECT_EQ(model.step(/*capturing=*/false), warm_addresses);
  ASSERT_NO_FATAL_FAILURE(model.verify(kWarmup + kReplays));
  const Counts after = counts_of(ctx);
  EXPECT_EQ(after.hits - replayed.hits, prefetched);
  EXPECT_EQ(after.exposed - replayed.exposed, on_demand);
  EXPECT_EQ(after.allocations, warm.allocations);
  for (int i = 0; i < n; ++i) EXPECT_EQ(model.grads_ready(i), kWarmup + kReplays + 1) << layers()[i].name;
}

INSTANTIATE_TEST_SUITE_P(Depths, CAbiCudaGraph, ::testing::Values(Depths{1, 1}, Depths{2, 2}, Depths{2, 1}, Depths{2, 0}),
                         [](const ::testing::TestParamInfo<Depths>& info) {
                           const Depths d = info.param;
                           return d.per_group() ? "dense" + std::to_string(d.dense) + "_expert" + std::to_string(d.expert)
                                                : "depth" + std::to_string(d.dense);
                         });

}  // namespace
