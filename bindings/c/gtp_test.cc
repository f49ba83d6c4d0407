// The C ABI driven by thread ranks (ThreadBootstrap behind the callbacks vtable) on the host backend:
// a training step bit-exact against the unsharded weight and the reference gradient, stats and trace
// JSON, and every misuse returning its status and a message that names the problem.
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"
#include "kernels/reference.h"

namespace {

using gtp::cabi_test::callbacks_for;
using gtp::cabi_test::kTimeout;
using gtp::cabi_test::on_ranks;

constexpr int64_t kRows = 40, kCols = 32;  // BF16 shards are 16-row aligned: G=2 -> 32 rows, G=4 -> 16 rows

gtp_context_t* create(const gtp_bootstrap_callbacks_t& callbacks, const char* profile = nullptr, size_t trace = 0,
                      gtp_grad_ready_fn ready = nullptr, void* ready_user = nullptr) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.profile_json = profile;
  config.trace_spans = trace;
  config.grad_ready = ready;
  config.grad_ready_user_data = ready_user;
  gtp_context_t* ctx = nullptr;
  const gtp_status_t status = gtp_context_create(&config, &ctx);
  EXPECT_EQ(status, GTP_SUCCESS) << gtp_last_error(nullptr);
  return ctx;
}

uint16_t full_weight(int64_t row, int64_t col) {  // BF16 bits, distinct per element
  return static_cast<uint16_t>(0x3F80 + ((row * kCols + col) % 97));
}

std::string profile_json(int world, int shards) {
  return gtp::cabi_test::profile_with(world, {{"tensor_parallel_num_weight_shards", shards}});
}

struct Ready {
  std::vector<gtp_weight_t> weights;
};

void train_step(int world) {
  std::vector<Ready> ready(world);
  on_ranks(world, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    const std::string profile = profile_json(world, world);
    gtp_context_t* ctx = create(callbacks, profile.c_str(), 64,
                                [](void* user, gtp_weight_t w) { static_cast<Ready*>(user)->weights.push_back(w); },
                                &ready[rank]);
    ASSERT_NE(ctx, nullptr);
    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(sizes.rank, rank);
    EXPECT_EQ(sizes.world_size, world);
    EXPECT_EQ(sizes.tp, 1);
    EXPECT_EQ(sizes.gtp_remat, world);
    EXPECT_EQ(sizes.dp, 1);
    EXPECT_EQ(sizes.data_parallel_count, world);
    EXPECT_EQ(sizes.data_parallel_index, rank);

    const int64_t shard_rows = world == 2 ? 32 : 16;
    const int64_t first = rank * shard_rows;
    const int64_t valid = std::max<int64_t>(0, std::min(shard_rows, kRows - first));
    std::vector<uint16_t> shard(std::max<int64_t>(valid, 1) * kCols);
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) shard[r * kCols + c] = full_weight(first + r, c);
    std::vector<float> main_grad(std::max<int64_t>(valid, 1) * kCols, 1.0f);

    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "fc1";
    desc.shard = valid > 0 ? shard.data() : nullptr;
    desc.rows = kRows;
    desc.cols = kCols;
    desc.main_grad = main_grad.data();
    gtp_weight_t w{};
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

    for (gtp_phase_t phase : {GTP_PHASE_FORWARD, GTP_PHASE_BACKWARD}) {
      void* ptr = nullptr;
      size_t count = 0;
      ASSERT_EQ(gtp_materialize(ctx, &w, 1, phase, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr), GTP_SUCCESS)
          << gtp_last_error(ctx);
      ASSERT_EQ(count, 1u);
      const auto* full = static_cast<const uint16_t*>(ptr);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(full[r * kCols + c], full_weight(r, c)) << r << "," << c;
      if (phase == GTP_PHASE_BACKWARD) {
        float* g = nullptr;
        ASSERT_EQ(gtp_grad_buffer(ctx, w, &g, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t c = 0; c < kCols; ++c) g[r * kCols + c] = static_cast<float>((rank + 1) * (r + 1));
      }
      ASSERT_EQ(gtp_release(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    ASSERT_EQ(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    const float mean = (world + 1) / 2.0f;  // mean over ranks of (rank + 1)
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(main_grad[r * kCols + c], 1.0f + mean * (first + r + 1)) << r;
    ASSERT_EQ(ready[rank].weights.size(), 1u);
    EXPECT_EQ(ready[rank].weights[0].id, w.id);
    EXPECT_EQ(ready[rank].weights[0].generation, w.generation);

    size_t len = 0;
    ASSERT_EQ(gtp_stats_json(ctx, nullptr, 0, &len), GTP_ERROR_INVALID_ARGUMENT);
    std::vector<char> text(len + 1);
    ASSERT_EQ(gtp_stats_json(ctx, text.data(), text.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx);
    const nlohmann::json stats = nlohmann::json::parse(text.data());
    EXPECT_EQ(stats.at("materialize").at("calls").get<int>(), 2) << text.data();
    ASSERT_EQ(gtp_trace_json(ctx, nullptr, 0, &len), GTP_ERROR_INVALID_ARGUMENT);
    text.assign(len + 1, 0);
    ASSERT_EQ(gtp_trace_json(ctx, text.data(), text.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_NO_THROW(nlohmann::json::parse(text.data()));
    EXPECT_EQ(gtp_weight_unregister(ctx, w), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(CAbi, TrainingStepWith2Ranks) { train_step(2); }
TEST(CAbi, TrainingStepWith4Ranks) { train_step(4); }

TEST(CAbi, ExpertGroupMaterializesEveryExpertAfterItsLeader) {
  on_ranks(2, [](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks);  // no profile: G = EG = 2
    ASSERT_NE(ctx, nullptr);
    std::vector<std::vector<uint16_t>> shards(2, std::vector<uint16_t>(32 * kCols));
    gtp_weight_t experts[2];
    for (int e = 0; e < 2; ++e) {
      for (int64_t r = 0; r < 32 && rank * 32 + r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) shards[e][r * kCols + c] = static_cast<uint16_t>(full_weight(rank * 32 + r, c) + e);
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      desc.name = e == 0 ? "expert0" : "expert1";
      desc.shard = shards[e].data();
      desc.rows = kRows;
      desc.cols = kCols;
      desc.group = GTP_GROUP_EXPERT_GTP_REMAT;
      desc.expert_leader = e == 0 ? nullptr : &experts[0];
      ASSERT_EQ(gtp_weight_register(ctx, &desc, &experts[e]), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    ASSERT_EQ(gtp_weights_shard_updated(ctx, experts, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptrs[2] = {nullptr, nullptr};
    size_t count = 0;
    EXPECT_GTP_ERROR(gtp_materialize(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "expand to 2");
    ASSERT_EQ(gtp_materialize(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 2, &count, nullptr),
              GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(count, 2u);
    for (int e = 0; e < 2; ++e) {
      const auto* full = static_cast<const uint16_t*>(ptrs[e]);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kCols; ++c) ASSERT_EQ(full[r * kCols + c], full_weight(r, c) + e) << e << ":" << r;
    }
    ASSERT_EQ(gtp_release(ctx, experts, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

// The GEMM layout through gtp_materialize_views: an expert group (2 experts) on each quantized wire,
// both layouts held at once; every section, dtype, shape and decode scale equals the CPU reference's
// GEMM-ready unpack of the chunks a single process packs; then the misuse of the new calls.
float gemm_source(int expert, int64_t row, int64_t col) {  // exact in BF16, so BF16 and FP32 shards agree
  return static_cast<float>(((row * 7 + col * 3 + expert * 5) % 23) - 11) * 0.125f;
}

TEST(CAbi, GemmLayoutViewsMatchTheReferenceAndMisuseIsRefused) {
  using gtp::kernels::WireFormat;
  using gtp::kernels::Nvfp4Blocks;
  using gtp::kernels::ScaleRounding;
  struct Wire {
    gtp_wire_t wire;
    gtp::kernels::WireSpec spec;
    int32_t nvfp4_2d = 0;
    int32_t mx_rounding = GTP_MX_ROUNDING_RCEIL;
  };
  const std::vector<Wire> wires = {
      {GTP_WIRE_FP8, {WireFormat::kFP8}},
      {GTP_WIRE_MXFP8, {WireFormat::kMXFP8}},
      {GTP_WIRE_MXFP8, {WireFormat::kMXFP8, ScaleRounding::kFloor}, 0, GTP_MX_ROUNDING_FLOOR},
      {GTP_WIRE_NVFP4, {WireFormat::kNVFP4}},
      {GTP_WIRE_NVFP4, {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k2D}, 1},
      {GTP_WIRE_BF16, {WireFormat::kBF16}}};
  constexpr int kWorld = 2, kExperts = 2;
  constexpr int64_t rows = 40, cols = 64;
  on_ranks(kWorld, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks);  // G = EG = 2
    ASSERT_NE(ctx, nullptr);
    for (const Wire& wire : wires) {
      const auto geometry = gtp::kernels::weight_geometry(wire.spec.format, rows, cols, kWorld);
      const auto layout = gtp::kernels::chunk_layout(wire.spec, geometry.shard_rows, cols);
      std::vector<std::vector<float>> shards(kExperts, std::vector<float>(geometry.shard_rows * cols));
      gtp_weight_t experts[kExperts];
      for (int e = 0; e < kExperts; ++e) {
        for (int64_t r = 0; r < geometry.valid_rows(rank); ++r)
          for (int64_t c = 0; c < cols; ++c) shards[e][r * cols + c] = gemm_source(e, rank * geometry.shard_rows + r, c);
        gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
        desc.name = "gemm_expert";
        desc.shard = shards[e].data();
        desc.dtype = GTP_DTYPE_FP32;
        desc.rows = rows;
        desc.cols = cols;
        desc.wire = wire.wire;
        desc.nvfp4_2d = wire.nvfp4_2d;
        desc.mx_rounding = wire.mx_rounding;
        desc.group = GTP_GROUP_EXPERT_GTP_REMAT;
        desc.expert_leader = e == 0 ? nullptr : &experts[0];
        ASSERT_EQ(gtp_weight_register(ctx, &desc, &experts[e]), GTP_SUCCESS) << gtp_last_error(ctx);
      }
      ASSERT_EQ(gtp_weights_shard_updated(ctx, experts, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

      gtp_materialized_t views[kExperts] = {GTP_MATERIALIZED_INITIALIZER, GTP_MATERIALIZED_INITIALIZER};
      size_t count = 99;
      // Misuse first: nothing is written on failure.
      EXPECT_GTP_ERROR(gtp_materialize_views(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, nullptr, 2, &count,
                                             nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
      EXPECT_GTP_ERROR(gtp_materialize_views(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, views, 2, nullptr,
                                             nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out_count is NULL");
      EXPECT_GTP_ERROR(gtp_materialize_views(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, views, 1, &count,
                                             nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "expand to 2");
      views[1].struct_size = sizeof(gtp_materialized_t) - 8;
      EXPECT_GTP_ERROR(gtp_materialize_views(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, views, 2, &count,
                                             nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out[1]).struct_size");
      views[1].struct_size = sizeof(gtp_materialized_t);
      EXPECT_GTP_ERROR(gtp_materialize_views(ctx, experts, 1, GTP_PHASE_FORWARD, 0, static_cast<gtp_layout_t>(7), views,
                                             2, &count, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "layout 7");
      void* ptrs[kExperts] = {nullptr, nullptr};
      EXPECT_GTP_ERROR(gtp_materialize(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, ptrs, 2, &count, nullptr),
                       GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_materialize_views");
      EXPECT_EQ(count, 99u);
      EXPECT_EQ(views[0].data.ptr, nullptr);
      EXPECT_EQ(ptrs[0], nullptr);

      ASSERT_EQ(gtp_materialize_views(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, views, 2, &count, nullptr),
                GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_EQ(count, 2u);
      // A BF16 consumer of the same weights in the same step: another key, another buffer.
      ASSERT_EQ(gtp_materialize(ctx, experts, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 2, &count, nullptr),
                GTP_SUCCESS) << gtp_last_error(ctx);
      const std::string name = gtp::kernels::to_string(wire.spec);
      for (int e = 0; e < kExperts; ++e) {
        std::vector<float> full(rows * cols);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) full[r * cols + c] = gemm_source(e, r, c);
        const float amax = gtp::kernels::amax_reference(full.data(), gtp::kernels::SourceDtype::kFP32, rows, cols);
        std::vector<unsigned char> chunks(kWorld * layout.chunk_bytes);
        for (int r = 0; r < kWorld; ++r) {
          gtp::kernels::PackArgs args;
          args.shard = full.data() + r * geometry.shard_rows * cols;
          args.src_dtype = gtp::kernels::SourceDtype::kFP32;
          args.shard_rows = geometry.shard_rows;
          args.valid_rows = geometry.valid_rows(r);
          args.cols = cols;
          args.amax = &amax;
          args.chunk = chunks.data() + r * layout.chunk_bytes;
          args.chunk_capacity = layout.chunk_bytes;
          gtp::kernels::pack_reference(wire.spec, args);
        }
        const gtp::kernels::GatheredChunks in{chunks.data(), static_cast<int64_t>(chunks.size()), geometry};
        std::vector<uint16_t> bf16(rows * cols);
        gtp::kernels::unpack_reference(wire.spec, in, bf16.data(), rows * cols * 2);
        EXPECT_EQ(std::memcmp(ptrs[e], bf16.data(), bf16.size() * 2), 0) << name << " bf16 expert " << e;
        const gtp_materialized_t& v = views[e];
        EXPECT_EQ(v.struct_size, sizeof(gtp_materialized_t));
        EXPECT_EQ(v.wire, wire.wire);
        EXPECT_EQ(v.rows, rows);
        EXPECT_EQ(v.cols, cols);
        EXPECT_NE(v.data.ptr, ptrs[e]) << name;
        if (wire.wire == GTP_WIRE_BF16) {  // GEMM of the BF16 wire is the BF16 weight
          EXPECT_EQ(v.layout, GTP_LAYOUT_BF16);
          EXPECT_EQ(v.data.dtype, GTP_ELEM_BF16);
          EXPECT_EQ(v.scales.ptr, nullptr);
          EXPECT_EQ(v.decode_scales.ptr, nullptr);
          EXPECT_EQ(std::memcmp(v.data.ptr, bf16.data(), bf16.size() * 2), 0) << name;
          continue;
        }
        const auto sizes = gtp::kernels::gemm_layout_sizes(wire.spec, geometry);
        std::vector<unsigned char> data(sizes.data_bytes), scales(sizes.scales_bytes),
            data_t(sizes.transposed_data_bytes), scales_t(sizes.transposed_scales_bytes);
        std::vector<float> decode(sizes.decode_scale_count);
        gtp::kernels::GemmOutputs out;
        out.data = data.data();
        out.data_capacity = sizes.data_bytes;
        out.scales = sizes.scales_bytes > 0 ? scales.data() : nullptr;
        out.scales_capacity = sizes.scales_bytes;
        out.transposed_data = sizes.transpose_supported ? data_t.data() : nullptr;
        out.transposed_data_capacity = sizes.transpose_supported ? sizes.transposed_data_bytes : 0;
        out.transposed_scales = sizes.transposed_scales_bytes > 0 ? scales_t.data() : nullptr;
        out.transposed_scales_capacity = sizes.transposed_scales_bytes;
        out.decode_scales = sizes.decode_scale_count > 0 ? decode.data() : nullptr;
        out.decode_scales_capacity = sizes.decode_scale_count;
        gtp::kernels::unpack_gemm_reference(wire.spec, in, out);
        EXPECT_EQ(v.layout, GTP_LAYOUT_GEMM) << name;
        EXPECT_EQ(v.nvfp4_2d, wire.nvfp4_2d) << name;
        EXPECT_EQ(v.gemm_rows, sizes.gemm_rows) << name;
        const gtp_elem_t code = wire.wire == GTP_WIRE_NVFP4 ? GTP_ELEM_E2M1 : GTP_ELEM_E4M3;
        EXPECT_EQ(v.data.dtype, code);
        EXPECT_EQ(v.data.rows, sizes.gemm_rows);
        EXPECT_EQ(v.data.cols, cols);
        EXPECT_EQ(v.data.ld, cols);
        EXPECT_EQ(std::memcmp(v.data.ptr, data.data(), data.size()), 0) << name << " data expert " << e;
        if (wire.wire == GTP_WIRE_FP8) {
          EXPECT_EQ(v.scales.dtype, GTP_ELEM_NONE);
          EXPECT_EQ(v.scales.ptr, nullptr);
          EXPECT_EQ(v.data_t.dtype, GTP_ELEM_E4M3);
          EXPECT_EQ(v.data_t.rows, cols);
          EXPECT_EQ(v.data_t.cols, sizes.gemm_rows);
          EXPECT_EQ(std::memcmp(v.data_t.ptr, data_t.data(), data_t.size()), 0) << name << " transpose";
        } else if (wire.nvfp4_2d != 0) {  // 16x16 tiles: scales per tile, and the exact transpose
          EXPECT_EQ(v.scale_block_rows, 16);
          EXPECT_EQ(v.scale_block_cols, 16);
          EXPECT_EQ(v.scales.dtype, GTP_ELEM_E4M3);
          EXPECT_EQ(v.scales.rows, sizes.gemm_rows / 16);
          EXPECT_EQ(v.scales.cols, cols / 16);
          EXPECT_EQ(std::memcmp(v.scales.ptr, scales.data(), scales.size()), 0) << name << " scales expert " << e;
          ASSERT_TRUE(sizes.transpose_supported) << name;
          EXPECT_EQ(v.data_t.dtype, GTP_ELEM_E2M1);
          EXPECT_EQ(v.data_t.rows, cols);
          EXPECT_EQ(v.data_t.cols, sizes.gemm_rows);
          ASSERT_NE(v.data_t.ptr, nullptr) << name;
          EXPECT_EQ(std::memcmp(v.data_t.ptr, data_t.data(), data_t.size()), 0) << name << " transpose expert " << e;
          EXPECT_EQ(v.scales_t.dtype, GTP_ELEM_E4M3);
          EXPECT_EQ(v.scales_t.rows, cols / 16);
          EXPECT_EQ(v.scales_t.cols, sizes.gemm_rows / 16);
          ASSERT_NE(v.scales_t.ptr, nullptr) << name;
          EXPECT_EQ(std::memcmp(v.scales_t.ptr, scales_t.data(), scales_t.size()), 0)
              << name << " transposed scales expert " << e;
        } else {
          EXPECT_EQ(v.data_t.ptr, nullptr) << name << ": its scale blocks run along rows, no exact transpose";
          EXPECT_EQ(v.scales_t.ptr, nullptr) << name;
          EXPECT_EQ(v.scales.dtype, wire.wire == GTP_WIRE_MXFP8 ? GTP_ELEM_E8M0 : GTP_ELEM_E4M3);
          EXPECT_EQ(v.scales.rows, sizes.gemm_rows);
          EXPECT_EQ(v.scales.cols * v.scale_block_cols, cols);
          EXPECT_EQ(v.scale_block_rows, 1);
          EXPECT_EQ(std::memcmp(v.scales.ptr, scales.data(), scales.size()), 0) << name << " scales expert " << e;
        }
        if (wire.wire == GTP_WIRE_MXFP8) {
          EXPECT_EQ(v.decode_scales.ptr, nullptr);
        } else {
          EXPECT_EQ(v.decode_scales.dtype, GTP_ELEM_FP32);
          EXPECT_EQ(v.decode_scales.rows, kWorld);
          EXPECT_EQ(v.decode_scale_rows, geometry.shard_rows);
          EXPECT_EQ(std::memcmp(v.decode_scales.ptr, decode.data(), decode.size() * sizeof(float)), 0) << name;
        }
      }
      // Both layouts held: a plain release is ambiguous; naming the layout ends the right one.
      EXPECT_GTP_ERROR(gtp_release(ctx, experts, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "both the BF16 and the GEMM");
      EXPECT_GTP_ERROR(gtp_release_layout(ctx, experts, 1, static_cast<gtp_layout_t>(3), nullptr),
                       GTP_ERROR_INVALID_ARGUMENT, ctx, "layout 3");
      ASSERT_EQ(gtp_release_layout(ctx, experts, 1, GTP_LAYOUT_GEMM, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      EXPECT_GTP_ERROR(gtp_release_layout(ctx, experts, 1, GTP_LAYOUT_GEMM, nullptr), GTP_ERROR_INVALID_STATE, ctx,
                       "in the gemm layout");
      ASSERT_EQ(gtp_release(ctx, experts, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_EQ(gtp_weight_unregister(ctx, experts[1]), GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_EQ(gtp_weight_unregister(ctx, experts[0]), GTP_SUCCESS) << gtp_last_error(ctx);
      ASSERT_EQ(gtp_reset_chains(ctx), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

// Every 32-element block holds +-1.875 = 2^0.907: RCEIL takes e = ceil(log2(1.875 / 448)) = -7 (1.875
// encodes exactly as 240), FLOOR takes floor(log2 1.875) - 8 = -8 (1.875 * 256 = 480 saturates to 448,
// decoding to 1.75). The other elements are small multiples of 1/8, exact in BF16.
float mx_source(int64_t row, int64_t col) {
  if (col % 32 == 0) return row % 2 == 0 ? 1.875f : -1.875f;
  return static_cast<float>(((row * 5 + col * 3) % 15) - 7) * 0.125f;
}

TEST(CAbi, MxFp8FloorRoundingMatchesTheReferenceAndDiffersFromRceil) {
  using gtp::kernels::ScaleRounding;
  using gtp::kernels::WireFormat;
  constexpr int kWorld = 2;
  constexpr int64_t rows = 64, cols = 64;
  const gtp::kernels::WireSpec specs[2] = {{WireFormat::kMXFP8, ScaleRounding::kRceil},
                                           {WireFormat::kMXFP8, ScaleRounding::kFloor}};
  const int32_t roundings[2] = {GTP_MX_ROUNDING_RCEIL, GTP_MX_ROUNDING_FLOOR};
  std::vector<float> full(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) full[r * cols + c] = mx_source(r, c);
  const auto geometry = gtp::kernels::weight_geometry(WireFormat::kMXFP8, rows, cols, kWorld);
  const auto sizes = gtp::kernels::gemm_layout_sizes(specs[0], geometry);
  // The reference's BF16 weight, GEMM codes and E8M0 scales for each rounding.
  std::vector<uint16_t> ref_bf16[2];
  std::vector<unsigned char> ref_data[2], ref_scales[2];
  for (int k = 0; k < 2; ++k) {
    const auto layout = gtp::kernels::chunk_layout(specs[k], geometry.shard_rows, cols);
    const float amax = gtp::kernels::amax_reference(full.data(), gtp::kernels::SourceDtype::kFP32, rows, cols);
    std::vector<unsigned char> chunks(kWorld * layout.chunk_bytes);
    for (int r = 0; r < kWorld; ++r) {
      gtp::kernels::PackArgs args;
      args.shard = full.data() + r * geometry.shard_rows * cols;
      args.src_dtype = gtp::kernels::SourceDtype::kFP32;
      args.shard_rows = geometry.shard_rows;
      args.valid_rows = geometry.valid_rows(r);
      args.cols = cols;
      args.amax = &amax;
      args.chunk = chunks.data() + r * layout.chunk_bytes;
      args.chunk_capacity = layout.chunk_bytes;
      gtp::kernels::pack_reference(specs[k], args);
    }
    const gtp::kernels::GatheredChunks in{chunks.data(), static_cast<int64_t>(chunks.size()), geometry};
    ref_bf16[k].resize(rows * cols);
    gtp::kernels::unpack_reference(specs[k], in, ref_bf16[k].data(), rows * cols * 2);
    ref_data[k].resize(sizes.data_bytes);
    ref_scales[k].resize(sizes.scales_bytes);
    gtp::kernels::GemmOutputs out;
    out.data = ref_data[k].data();
    out.data_capacity = sizes.data_bytes;
    out.scales = ref_scales[k].data();
    out.scales_capacity = sizes.scales_bytes;
    gtp::kernels::unpack_gemm_reference(specs[k], in, out);
  }
  // The rules differ on this data, so equality below tells the roundings apart.
  ASSERT_NE(ref_scales[0], ref_scales[1]);
  ASSERT_NE(ref_bf16[0], ref_bf16[1]);
  EXPECT_EQ(ref_bf16[0][0], 0x3FF0) << "RCEIL keeps 1.875";
  EXPECT_EQ(ref_bf16[1][0], 0x3FE0) << "FLOOR saturates 1.875 to 1.75";

  on_ranks(kWorld, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks);
    ASSERT_NE(ctx, nullptr);
    gtp_weight_t ws[2];
    for (int k = 0; k < 2; ++k) {
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      desc.name = k == 0 ? "mx_rceil" : "mx_floor";
      desc.shard = full.data() + rank * geometry.shard_rows * cols;
      desc.dtype = GTP_DTYPE_FP32;
      desc.rows = rows;
      desc.cols = cols;
      desc.wire = GTP_WIRE_MXFP8;
      desc.mx_rounding = roundings[k];
      ASSERT_EQ(gtp_weight_register(ctx, &desc, &ws[k]), GTP_SUCCESS) << gtp_last_error(ctx);
    }
    ASSERT_EQ(gtp_weights_shard_updated(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    void* ptrs[2] = {nullptr, nullptr};
    size_t count = 0;
    ASSERT_EQ(gtp_materialize(ctx, ws, 2, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 2, &count, nullptr), GTP_SUCCESS)
        << gtp_last_error(ctx);
    ASSERT_EQ(count, 2u);
    gtp_materialized_t views[2] = {GTP_MATERIALIZED_INITIALIZER, GTP_MATERIALIZED_INITIALIZER};
    ASSERT_EQ(gtp_materialize_views(ctx, ws, 2, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, views, 2, &count, nullptr),
              GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(count, 2u);
    for (int k = 0; k < 2; ++k) {
      const std::string name = gtp::kernels::to_string(specs[k]);
      EXPECT_EQ(std::memcmp(ptrs[k], ref_bf16[k].data(), ref_bf16[k].size() * 2), 0) << name << " bf16";
      EXPECT_EQ(views[k].scales.dtype, GTP_ELEM_E8M0) << name;
      EXPECT_EQ(std::memcmp(views[k].data.ptr, ref_data[k].data(), ref_data[k].size()), 0) << name << " data";
      EXPECT_EQ(std::memcmp(views[k].scales.ptr, ref_scales[k].data(), ref_scales[k].size()), 0) << name << " scales";
    }
    ASSERT_EQ(gtp_release_layout(ctx, ws, 2, GTP_LAYOUT_GEMM, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_release(ctx, ws, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(CAbi, CreateRefusesBadConfigurationsAndLeavesTheOutputUntouched) {
  auto group = gtp::comm::ThreadBootstrap::create_group(2, kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[0]);
  gtp_context_t* const sentinel = reinterpret_cast<gtp_context_t*>(0x1);
  gtp_context_t* out = sentinel;
  auto attempt = [&](const std::function<void(gtp_context_config_t&)>& edit) {
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    edit(config);
    return gtp_context_create(&config, &out);
  };
  EXPECT_GTP_ERROR(gtp_context_create(nullptr, &out), GTP_ERROR_INVALID_ARGUMENT, nullptr, "config is NULL");
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  EXPECT_GTP_ERROR(gtp_context_create(&config, nullptr), GTP_ERROR_INVALID_ARGUMENT, nullptr, "out is NULL");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.struct_size -= 8; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "gtp_context_config_t.struct_size");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.header_version += 100; }), GTP_ERROR_VERSION, nullptr,
                   "compiled against gtp.h 0.4 but this libgtp is 0.3");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.header_version -= 100; }), GTP_ERROR_VERSION, nullptr,
                   "compiled against gtp.h 0.2 but this libgtp is 0.3");  // gtp_weight_desc_t grew in 0.3
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.header_version += 10000; }), GTP_ERROR_VERSION, nullptr,
                   "compiled against gtp.h 1.3");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.timeout_ms = 0; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "timeout_ms");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.backend = static_cast<gtp_backend_t>(9); }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "backend 9 is unknown");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.callbacks = nullptr; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "callbacks is NULL");
  gtp_bootstrap_callbacks_t broken = callbacks;
  broken.allgather = nullptr;
  EXPECT_GTP_ERROR(attempt([&](gtp_context_config_t& c) { c.callbacks = &broken; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "allgather");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.bootstrap = static_cast<gtp_bootstrap_kind_t>(5); }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "bootstrap 5 is unknown");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.profile_json = "{not json"; }), GTP_ERROR_INVALID_ARGUMENT,
                   nullptr, "parse error");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.profile_json = "{}", c.profile_path = "p.json"; }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "give at most one");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.profile_path = "/nonexistent/profile.json"; }),
                   GTP_ERROR_INVALID_ARGUMENT, nullptr, "profile.json");
  const std::string four = profile_json(4, 4);
  EXPECT_GTP_ERROR(attempt([&](gtp_context_config_t& c) { c.profile_json = four.c_str(); }), GTP_ERROR_INVALID_ARGUMENT,
                   nullptr, "world_size is 4 but the bootstrap has 2");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.prefetch_depth = 65; }), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "prefetch_depth is 65; give 0..64 or GTP_FROM_PROFILE");
  EXPECT_GTP_ERROR(attempt([](gtp_context_config_t& c) { c.memory_budget_bytes = -2; }), GTP_ERROR_INVALID_ARGUMENT,
                   nullptr, "memory_budget_bytes is -2");
  EXPECT_EQ(out, sentinel);
  EXPECT_EQ(gtp_context_destroy(nullptr), GTP_SUCCESS);
  EXPECT_STREQ(gtp_status_string(GTP_ERROR_TIMEOUT), "GTP_ERROR_TIMEOUT");
  EXPECT_STREQ(gtp_status_string(static_cast<gtp_status_t>(42)), "unknown gtp_status_t");
}

TEST(CAbi, BootstrapFailuresMapToTimeoutAndSystem) {
  for (gtp_bootstrap_result_t result : {GTP_BOOTSTRAP_TIMEOUT, GTP_BOOTSTRAP_ERROR}) {
    gtp_bootstrap_callbacks_t callbacks{};
    callbacks.struct_size = sizeof(callbacks);
    callbacks.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
    callbacks.world_size = 2;
    callbacks.user_data = &result;
    callbacks.allgather = [](void* u, const void*, void*, size_t, int64_t) { return *static_cast<gtp_bootstrap_result_t*>(u); };
    callbacks.broadcast = [](void* u, void*, size_t, int32_t, int64_t) { return *static_cast<gtp_bootstrap_result_t*>(u); };
    callbacks.barrier = [](void* u, int64_t) { return *static_cast<gtp_bootstrap_result_t*>(u); };
    callbacks.last_error = [](void*) { return "the store is gone"; };
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    gtp_context_t* out = nullptr;
    EXPECT_GTP_ERROR(gtp_context_create(&config, &out),
                     result == GTP_BOOTSTRAP_TIMEOUT ? GTP_ERROR_TIMEOUT : GTP_ERROR_SYSTEM, nullptr, "the store is gone");
    EXPECT_EQ(out, nullptr);
  }
}

TEST(CAbi, NullContextIsAnInvalidArgumentForEveryCall) {
  gtp_weight_t w{};
  void* ptr = nullptr;
  float* grad = nullptr;
  size_t n = 0;
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  const std::vector<std::function<gtp_status_t()>> calls = {
      [&] { return gtp_context_abort(nullptr); },
      [&] { return gtp_context_sizes(nullptr, &sizes); },
      [&] { return gtp_weight_register(nullptr, &desc, &w); },
      [&] { return gtp_weight_unregister(nullptr, w); },
      [&] { return gtp_weights_shard_updated(nullptr, &w, 1, nullptr); },
      [&] { return gtp_materialize(nullptr, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &n, nullptr); },
      [&] { return gtp_release(nullptr, &w, 1, nullptr); },
      [&] { return gtp_grad_buffer(nullptr, w, &grad, nullptr); },
      [&] { return gtp_finalize(nullptr, &w, 1, 1, nullptr); },
      [&] { return gtp_drain(nullptr, nullptr); },
      [&] { return gtp_reset_chains(nullptr); },
      [&] { return gtp_stats_json(nullptr, nullptr, 0, &n); },
      [&] { return gtp_trace_json(nullptr, nullptr, 0, &n); },
  };
  for (const auto& call : calls) EXPECT_GTP_ERROR(call(), GTP_ERROR_INVALID_ARGUMENT, nullptr, "ctx is NULL");
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(grad, nullptr);
  EXPECT_EQ(n, 0u);
}

TEST(CAbi, MisuseReturnsItsStatusAndNamesTheProblem) {
  on_ranks(2, [](int, const gtp_bootstrap_callbacks_t& callbacks) {
    const std::string profile = profile_json(2, 2);  // G = 2
    gtp_context_t* ctx = create(callbacks, profile.c_str());
    ASSERT_NE(ctx, nullptr);
    std::vector<uint16_t> shard(32 * kCols, 0x3F80);
    std::vector<float> main_grad(32 * kCols, 0.0f);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "w";
    desc.shard = shard.data();  // 40 rows: rank 0 holds 32, rank 1 holds 8
    desc.rows = kRows;
    desc.cols = kCols;
    desc.main_grad = main_grad.data();
    const gtp_weight_t untouched{-7, 7};
    gtp_weight_t w = untouched;

    // Registration: null and malformed inputs, unknown enums.
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, nullptr, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "desc is NULL");
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &desc, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
    gtp_weight_desc_t bad = desc;
    bad.struct_size = 8;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_weight_desc_t.struct_size");
    bad = desc;
    bad.group = static_cast<gtp_group_t>(3);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "group 3 is unknown");
    bad = desc;
    bad.wire = static_cast<gtp_wire_t>(9);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "wire 9 is unknown");
    bad = desc;
    bad.dtype = static_cast<gtp_dtype_t>(4);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "dtype 4 is unknown");
    bad = desc;
    bad.rows = 0;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_weight_register: ");
    // The 0.3 fields: a block shape the wire lacks (also through FROM_GROUP: bf16 here), unknown roundings.
    bad = desc;
    bad.wire = GTP_WIRE_FP8;
    bad.nvfp4_2d = 1;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "nvfp4_2d is 1 but the wire is fp8");
    bad.wire = GTP_WIRE_FROM_GROUP;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "nvfp4_2d is 1 but the wire is bf16");
    bad = desc;
    bad.wire = GTP_WIRE_MXFP8;
    bad.mx_rounding = 2;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "mx_rounding 2 is unknown; use GTP_MX_ROUNDING_RCEIL");
    bad.wire = GTP_WIRE_BF16;
    bad.mx_rounding = -1;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "mx_rounding -1 is unknown");
    // An expert's block shape (or rounding) differs from its leader's: the batch is unpacked with one spec.
    gtp_weight_desc_t leader_desc = desc;
    leader_desc.name = "expert0";
    leader_desc.wire = GTP_WIRE_NVFP4;
    leader_desc.group = GTP_GROUP_EXPERT_GTP_REMAT;
    leader_desc.main_grad = nullptr;
    gtp_weight_t leader{};
    ASSERT_EQ(gtp_weight_register(ctx, &leader_desc, &leader), GTP_SUCCESS) << gtp_last_error(ctx);
    bad = leader_desc;
    bad.name = "expert1";
    bad.nvfp4_2d = 1;
    bad.expert_leader = &leader;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "this expert's wire is nvfp4 (2d), the leader's nvfp4 (1d)");
    ASSERT_EQ(gtp_weight_unregister(ctx, leader), GTP_SUCCESS) << gtp_last_error(ctx);
    leader_desc.wire = GTP_WIRE_MXFP8;
    leader_desc.rows = 64;  // MXFP8 shards are 32-row aligned: G = 2 -> two full 32-row shards
    leader_desc.cols = kCols;
    std::vector<uint16_t> mx_shard(32 * kCols, 0x3F80);
    leader_desc.shard = mx_shard.data();
    ASSERT_EQ(gtp_weight_register(ctx, &leader_desc, &leader), GTP_SUCCESS) << gtp_last_error(ctx);
    bad = leader_desc;
    bad.name = "expert1";
    bad.mx_rounding = GTP_MX_ROUNDING_FLOOR;
    bad.expert_leader = &leader;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "this expert's wire is mxfp8 (floor), the leader's mxfp8 (rceil)");
    ASSERT_EQ(gtp_weight_unregister(ctx, leader), GTP_SUCCESS) << gtp_last_error(ctx);
    // A 0.2 caller's struct is two int32 shorter.
    bad = desc;
    bad.struct_size = offsetof(gtp_weight_desc_t, nvfp4_2d);
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &bad, &w), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_weight_desc_t.struct_size");
    EXPECT_EQ(w.id, untouched.id);
    EXPECT_EQ(w.generation, untouched.generation);
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

    gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
    EXPECT_GTP_ERROR(gtp_context_sizes(ctx, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
    sizes.struct_size = 3;
    EXPECT_GTP_ERROR(gtp_context_sizes(ctx, &sizes), GTP_ERROR_INVALID_ARGUMENT, ctx, "gtp_sizes_t.struct_size");
    EXPECT_EQ(sizes.world_size, 0);

    // Materialize and release.
    void* ptrs[2] = {nullptr, nullptr};
    size_t count = 99;
    const gtp_weight_t twice[2] = {w, w};
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, nullptr, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "out_ptrs is NULL");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, nullptr, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "out_count is NULL");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 0, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "out_capacity is 0");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, twice, 2, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 2, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "listed twice");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, static_cast<gtp_phase_t>(5), 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "phase 5");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, -1, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "model chunk -1");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, static_cast<gtp_layout_t>(2), ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_ARGUMENT, ctx, "layout 2");
    EXPECT_EQ(ptrs[0], nullptr);
    EXPECT_EQ(count, 99u);
    EXPECT_GTP_ERROR(gtp_release(ctx, &w, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "release");
    ASSERT_EQ(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr), GTP_SUCCESS)
        << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_weight_unregister(ctx, w), GTP_ERROR_INVALID_STATE, ctx, "is materialized");
    ASSERT_EQ(gtp_release(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_release(ctx, &w, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "release");
    EXPECT_GTP_ERROR(gtp_release(ctx, nullptr, 1, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "ws is NULL");

    // Gradients.
    float* grad = nullptr;
    EXPECT_GTP_ERROR(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "has no grad buffer");
    EXPECT_GTP_ERROR(gtp_grad_buffer(ctx, w, nullptr, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
    ASSERT_EQ(gtp_grad_buffer(ctx, w, &grad, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_finalize(ctx, twice, 2, 1, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "listed twice");
    ASSERT_EQ(gtp_finalize(ctx, &w, 1, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    ASSERT_EQ(gtp_drain(ctx, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

    // Stats into a short buffer: nothing written, *len is the length needed.
    char small[4] = {'x', 'x', 'x', 'x'};
    size_t len = 0;
    EXPECT_GTP_ERROR(gtp_stats_json(ctx, small, sizeof(small), &len), GTP_ERROR_INVALID_ARGUMENT, ctx, "needs");
    EXPECT_GT(len, sizeof(small));
    EXPECT_EQ(small[0], 'x');
    EXPECT_GTP_ERROR(gtp_stats_json(ctx, nullptr, 5, &len), GTP_ERROR_INVALID_ARGUMENT, ctx, "buf is NULL");
    EXPECT_GTP_ERROR(gtp_stats_json(ctx, small, sizeof(small), nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "len is NULL");

    // Unregister: later uses of the handle are stale.
    ASSERT_EQ(gtp_weight_unregister(ctx, w), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_weight_unregister(ctx, w), GTP_ERROR_INVALID_STATE, ctx, "not registered");
    EXPECT_GTP_ERROR(gtp_grad_buffer(ctx, w, &grad, nullptr), GTP_ERROR_INVALID_STATE, ctx, "not registered");
    EXPECT_GTP_ERROR(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, ptrs, 1, &count, nullptr),
                     GTP_ERROR_INVALID_STATE, ctx, "not registered");
    EXPECT_GTP_ERROR(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "not registered");
    ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
    const gtp_weight_t from_old_context = w;
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);

    // A handle of a destroyed context, used on a new one.
    ctx = create(callbacks, profile.c_str());
    ASSERT_NE(ctx, nullptr);
    EXPECT_GTP_ERROR(gtp_weight_unregister(ctx, from_old_context), GTP_ERROR_INVALID_STATE, ctx,
                     "another context, one since destroyed");
    EXPECT_GTP_ERROR(gtp_grad_buffer(ctx, from_old_context, &grad, nullptr), GTP_ERROR_INVALID_STATE, ctx,
                     "one since destroyed");
    desc.expert_leader = &from_old_context;
    EXPECT_GTP_ERROR(gtp_weight_register(ctx, &desc, &w), GTP_ERROR_INVALID_STATE, ctx, "one since destroyed");
    EXPECT_EQ(gtp_weight_unregister(ctx, gtp_weight_t{}), GTP_ERROR_INVALID_STATE);

    // Abort: every later call but destroy fails.
    EXPECT_EQ(gtp_context_abort(ctx), GTP_SUCCESS);
    EXPECT_GTP_ERROR(gtp_drain(ctx, nullptr), GTP_ERROR_INVALID_STATE, ctx, "aborted");
    EXPECT_GTP_ERROR(gtp_context_sizes(ctx, &sizes), GTP_ERROR_INVALID_STATE, ctx, "aborted");
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

}  // namespace
