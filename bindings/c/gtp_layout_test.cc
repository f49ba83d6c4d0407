// The C ABI's GEMM-ready layout (gtp_materialize_views) and wire variants on thread ranks over the
// host backend, against the CPU reference's pack and unpack of the same weights.
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "bindings/c/internal/test_ranks.h"
#include "kernels/reference.h"

namespace {

using gtp::cabi_test::create;
using gtp::cabi_test::on_ranks;

// The chunks G ranks pack from the full FP32 weight with its amax shared (as shard_updated does),
// back to back: what one all-gather delivers.
std::vector<unsigned char> reference_chunks(const gtp::kernels::WireSpec& spec, const std::vector<float>& full,
                                            const gtp::kernels::WeightGeometry& geometry) {
  const int64_t cols = geometry.cols;
  const auto layout = gtp::kernels::chunk_layout(spec, geometry.shard_rows, cols);
  const float amax = gtp::kernels::amax_reference(full.data(), gtp::kernels::SourceDtype::kFP32, geometry.rows, cols);
  std::vector<unsigned char> chunks(geometry.group_size * layout.chunk_bytes);
  for (int64_t r = 0; r < geometry.group_size; ++r) {
    gtp::kernels::PackArgs args;
    args.shard = full.data() + r * geometry.shard_rows * cols;
    args.src_dtype = gtp::kernels::SourceDtype::kFP32;
    args.shard_rows = geometry.shard_rows;
    args.valid_rows = geometry.valid_rows(r);
    args.cols = cols;
    args.amax = &amax;
    args.chunk = chunks.data() + r * layout.chunk_bytes;
    args.chunk_capacity = layout.chunk_bytes;
    gtp::kernels::pack_reference(spec, args);
  }
  return chunks;
}

// The GEMM layout through gtp_materialize_views: an expert group (2 experts) on each quantized wire,
// with row-major and blocked 128x4 scales, both layouts held at once; every section, dtype, shape and
// decode scale equals the CPU reference's GEMM-ready unpack of the chunks a single process packs;
// then the misuse of the new calls.
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
    int32_t gemm_scales = GTP_SCALE_LAYOUT_ROW_MAJOR;
  };
  constexpr int32_t kBlocked = GTP_SCALE_LAYOUT_BLOCKED_128X4;
  const std::vector<Wire> wires = {
      {GTP_WIRE_FP8, {WireFormat::kFP8}},
      {GTP_WIRE_MXFP8, {WireFormat::kMXFP8}},
      {GTP_WIRE_MXFP8, {WireFormat::kMXFP8, ScaleRounding::kFloor}, 0, GTP_MX_ROUNDING_FLOOR},
      {GTP_WIRE_NVFP4, {WireFormat::kNVFP4}},
      {GTP_WIRE_NVFP4, {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k2D}, 1},
      {GTP_WIRE_MXFP8, {WireFormat::kMXFP8}, 0, GTP_MX_ROUNDING_RCEIL, kBlocked},
      {GTP_WIRE_NVFP4, {WireFormat::kNVFP4}, 0, GTP_MX_ROUNDING_RCEIL, kBlocked},
      {GTP_WIRE_NVFP4, {WireFormat::kNVFP4, ScaleRounding::kRceil, Nvfp4Blocks::k2D}, 1, GTP_MX_ROUNDING_RCEIL, kBlocked},
      {GTP_WIRE_FP8, {WireFormat::kFP8}, 0, GTP_MX_ROUNDING_RCEIL, kBlocked},  // no block scales: no effect
      {GTP_WIRE_BF16, {WireFormat::kBF16}}};
  constexpr int kWorld = 2, kExperts = 2;
  constexpr int64_t rows = 40, cols = 64;
  on_ranks(kWorld, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks);  // G = EG = 2
    ASSERT_NE(ctx, nullptr);
    {
      gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
      const std::vector<float> shard(rows * cols);
      desc.name = "bad_scale_layout";
      desc.shard = shard.data();
      desc.dtype = GTP_DTYPE_FP32;
      desc.rows = rows;
      desc.cols = cols;
      desc.wire = GTP_WIRE_MXFP8;
      desc.gemm_scale_layout = 5;
      gtp_weight_t w{-1, 0};
      EXPECT_GTP_ERROR(gtp_weight_register(ctx, &desc, &w), GTP_ERROR_INVALID_ARGUMENT, ctx,
                       "gemm_scale_layout 5 is unknown; use GTP_SCALE_LAYOUT_ROW_MAJOR");
      EXPECT_EQ(w.id, -1);
    }
    for (const Wire& wire : wires) {
      const auto geometry = gtp::kernels::weight_geometry(wire.spec.format, rows, cols, kWorld);
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
        desc.gemm_scale_layout = wire.gemm_scales;
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
      const bool blocked = wire.gemm_scales == kBlocked;
      const auto scale_layout = blocked ? gtp::kernels::ScaleLayout::kBlocked128x4 : gtp::kernels::ScaleLayout::kRowMajor;
      const std::string name = gtp::kernels::to_string(wire.spec) + (blocked ? ", blocked scales" : "");
      // A scale section's shape: the matrix, or (blocked) the whole 128 x 4 tiles holding it.
      const auto tiled_rows = [&](int64_t n) { return blocked ? gtp::kernels::round_up(n, 128) : n; };
      const auto tiled_cols = [&](int64_t n) { return blocked ? gtp::kernels::round_up(n, 4) : n; };
      for (int e = 0; e < kExperts; ++e) {
        std::vector<float> full(rows * cols);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) full[r * cols + c] = gemm_source(e, r, c);
        const std::vector<unsigned char> chunks = reference_chunks(wire.spec, full, geometry);
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
        const auto sizes = gtp::kernels::gemm_layout_sizes(wire.spec, geometry, scale_layout);
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
        out.scale_layout = scale_layout;
        gtp::kernels::unpack_gemm_reference(wire.spec, in, out);
        EXPECT_EQ(v.scale_layout, wire.gemm_scales) << name;
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
        } else if (wire.nvfp4_2d != 0) {  // 16x16 tiles: scales per tile (blocked: per row), exact transpose
          EXPECT_EQ(v.scale_block_rows, blocked ? 1 : 16);
          EXPECT_EQ(v.scale_block_cols, 16);
          EXPECT_EQ(v.scales.dtype, GTP_ELEM_E4M3);
          EXPECT_EQ(v.scales.rows, tiled_rows(blocked ? sizes.gemm_rows : sizes.gemm_rows / 16));
          EXPECT_EQ(v.scales.cols, tiled_cols(cols / 16));
          EXPECT_EQ(v.scales.rows * v.scales.cols, sizes.scales_bytes);
          EXPECT_EQ(std::memcmp(v.scales.ptr, scales.data(), scales.size()), 0) << name << " scales expert " << e;
          ASSERT_TRUE(sizes.transpose_supported) << name;
          EXPECT_EQ(v.data_t.dtype, GTP_ELEM_E2M1);
          EXPECT_EQ(v.data_t.rows, cols);
          EXPECT_EQ(v.data_t.cols, sizes.gemm_rows);
          ASSERT_NE(v.data_t.ptr, nullptr) << name;
          EXPECT_EQ(std::memcmp(v.data_t.ptr, data_t.data(), data_t.size()), 0) << name << " transpose expert " << e;
          EXPECT_EQ(v.scales_t.dtype, GTP_ELEM_E4M3);
          EXPECT_EQ(v.scales_t.rows, tiled_rows(blocked ? cols : cols / 16));
          EXPECT_EQ(v.scales_t.cols, tiled_cols(sizes.gemm_rows / 16));
          ASSERT_NE(v.scales_t.ptr, nullptr) << name;
          EXPECT_EQ(std::memcmp(v.scales_t.ptr, scales_t.data(), scales_t.size()), 0)
              << name << " transposed scales expert " << e;
        } else {
          EXPECT_EQ(v.data_t.ptr, nullptr) << name << ": its scale blocks run along rows, no exact transpose";
          EXPECT_EQ(v.scales_t.ptr, nullptr) << name;
          EXPECT_EQ(v.scales.dtype, wire.wire == GTP_WIRE_MXFP8 ? GTP_ELEM_E8M0 : GTP_ELEM_E4M3);
          EXPECT_EQ(v.scales.rows, tiled_rows(sizes.gemm_rows));
          EXPECT_EQ(v.scales.cols, tiled_cols(cols / v.scale_block_cols));
          EXPECT_EQ(v.scale_block_cols, wire.wire == GTP_WIRE_MXFP8 ? 32 : 16);
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
    const std::vector<unsigned char> chunks = reference_chunks(specs[k], full, geometry);
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

}  // namespace
