// The C ABI's consumer calls: materialize (pointers or views), release, and the chains' reset.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings/c/internal/entry_point.h"

using namespace gtp::cabi;
using gtp::remat::WeightId;

namespace {

// The weights of a materialize call, checked: at least one, and room in the output for every weight
// once expert leaders are expanded.
std::vector<WeightId> materialize_ids(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n, size_t out_capacity,
                                      int32_t model_chunk) {
  if (n == 0) require(false, "n is 0; materialize at least one weight");
  // Each chunk has its chains: a huge index would allocate them all.
  if (model_chunk < 0 || model_chunk >= kMaxModelChunks) {
    require(false, "model_chunk is " + std::to_string(model_chunk) + "; give 0.." + std::to_string(kMaxModelChunks - 1) +
                       " (the virtual pipeline chunk of the layer)");
  }
  std::vector<WeightId> ids = ids_of(ctx, ws, n);
  const size_t expanded = ctx.runtime->registry().expand(ids.data(), static_cast<std::int64_t>(ids.size())).size();
  if (out_capacity < expanded) {
    require(false, "out_capacity is " + std::to_string(out_capacity) + " but the weights expand to " +
                       std::to_string(expanded) + " (experts follow their leader)");
  }
  // Call order, not a bad value: INVALID_STATE like a release without materialize (found by c_abi_fuzz).
  for (WeightId id : ids) {
    const gtp::remat::Weight& w = ctx.runtime->registry().get(id);
    if (w.version == 0) {
      throw StateError("weight '" + w.desc.name +
                       "' was never packed; call gtp_weights_shard_updated on it (collectively) after register");
    }
  }
  return ids;
}

gtp_section_t section(void* ptr, gtp_elem_t dtype, std::int64_t rows, std::int64_t cols) {
  if (ptr == nullptr) return gtp_section_t{nullptr, GTP_ELEM_NONE, 0, 0, 0};
  return gtp_section_t{ptr, dtype, rows, cols, cols};
}

// A runtime view as the C struct (docs/c-abi.md, gtp_materialized_t).
gtp_materialized_t to_c(const gtp::remat::Materialized& m) {
  using gtp::kernels::WireFormat;
  gtp_materialized_t c = GTP_MATERIALIZED_INITIALIZER;
  c.wire = static_cast<gtp_wire_t>(static_cast<int>(m.wire.format));
  c.nvfp4_2d = m.wire.format == WireFormat::kNVFP4 && m.wire.nvfp4_blocks == gtp::kernels::Nvfp4Blocks::k2D;
  c.rows = m.rows;
  c.cols = m.cols;
  if (m.layout == gtp::remat::Layout::kBF16) {
    c.layout = GTP_LAYOUT_BF16;
    c.data = section(m.data, GTP_ELEM_BF16, m.rows, m.cols);
    return c;
  }
  c.layout = GTP_LAYOUT_GEMM;
  const std::int64_t r = m.gemm.gemm_rows;
  const bool nvfp4 = m.wire.format == WireFormat::kNVFP4;
  const gtp_elem_t code = nvfp4 ? GTP_ELEM_E2M1 : GTP_ELEM_E4M3;
  c.gemm_rows = r;
  c.data = section(m.data, code, r, m.cols);
  c.data_t = section(m.transposed_data, code, m.cols, r);
  // Blocked scale sections span whole 128 x 4 tiles.
  const bool blocked = m.gemm.scale_layout == gtp::kernels::ScaleLayout::kBlocked128x4;
  c.scale_layout = blocked ? GTP_SCALE_LAYOUT_BLOCKED_128X4 : GTP_SCALE_LAYOUT_ROW_MAJOR;
  const auto scale_section = [&](void* ptr, gtp_elem_t dtype, std::int64_t rows, std::int64_t cols) {
    using gtp::kernels::round_up;
    return blocked ? section(ptr, dtype, round_up(rows, 128), round_up(cols, 4)) : section(ptr, dtype, rows, cols);
  };
  if (m.wire.format == WireFormat::kMXFP8 || nvfp4) {
    c.scales = scale_section(m.scales, nvfp4 ? GTP_ELEM_E4M3 : GTP_ELEM_E8M0, m.gemm.scale_rows, m.gemm.scale_cols);
    c.scales_t = scale_section(m.transposed_scales, GTP_ELEM_E4M3, m.gemm.transposed_scale_rows,
                               m.gemm.transposed_scale_cols);
    c.scale_block_rows = c.nvfp4_2d && !blocked ? 16 : 1;
    c.scale_block_cols = nvfp4 ? 16 : 32;
  }
  c.decode_scales = section(const_cast<float*>(m.decode_scales), GTP_ELEM_FP32, m.gemm.decode_scale_count, 1);
  if (m.gemm.decode_scale_count > 0) c.decode_scale_rows = m.shard_rows;
  return c;
}

}  // namespace

extern "C" {

gtp_status_t gtp_materialize(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                             int32_t model_chunk, gtp_layout_t layout, void** out_ptrs, size_t out_capacity,
                             size_t* out_count, cudaStream_t stream) {
  return on_context(ctx, "gtp_materialize", [&] {
    require(out_ptrs != nullptr, "out_ptrs is NULL");
    require(out_count != nullptr, "out_count is NULL");
    const std::vector<WeightId> ids = materialize_ids(*ctx, ws, n, out_capacity, model_chunk);
    const std::int64_t count = static_cast<std::int64_t>(ids.size());
    require(as_int(layout) != GTP_LAYOUT_GEMM,
            "layout GTP_LAYOUT_GEMM needs several pointers per weight; call gtp_materialize_views");
    std::vector<void*> ptrs;
    issuing(*ctx, "gtp_materialize", stream, [&] {
      ptrs = ctx->runtime->materialize(ids.data(), count, static_cast<gtp::remat::Phase>(as_int(phase)), model_chunk,
                                       static_cast<gtp::remat::Layout>(as_int(layout)), stream);
    });
    std::copy(ptrs.begin(), ptrs.end(), out_ptrs);
    *out_count = ptrs.size();
  });
}

gtp_status_t gtp_release(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_release", [&] { ids = ids_of(*ctx, ws, n); });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_release", [&] {
    issuing(*ctx, "gtp_release", stream,
            [&] { ctx->runtime->release(ids.data(), static_cast<std::int64_t>(ids.size()), stream); });
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_materialize_views(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                                   int32_t model_chunk, gtp_layout_t layout, gtp_materialized_t* out,
                                   size_t out_capacity, size_t* out_count, cudaStream_t stream) {
  return on_context(ctx, "gtp_materialize_views", [&] {
    require(out != nullptr, "out is NULL");
    require(out_count != nullptr, "out_count is NULL");
    const std::vector<WeightId> ids = materialize_ids(*ctx, ws, n, out_capacity, model_chunk);
    const std::int64_t count = static_cast<std::int64_t>(ids.size());
    const size_t expanded = ctx->runtime->registry().expand(ids.data(), count).size();
    for (size_t i = 0; i < expanded; ++i) {
      check_struct_size(out[i].struct_size, sizeof(gtp_materialized_t),
                        ("gtp_materialized_t (out[" + std::to_string(i) + "])").c_str());
    }
    std::vector<gtp::remat::Materialized> views;
    issuing(*ctx, "gtp_materialize_views", stream, [&] {
      views = ctx->runtime->materialize_views(ids.data(), count, static_cast<gtp::remat::Phase>(as_int(phase)),
                                              model_chunk, static_cast<gtp::remat::Layout>(as_int(layout)), stream);
    });
    for (size_t i = 0; i < views.size(); ++i) out[i] = to_c(views[i]);
    *out_count = views.size();
  });
}

gtp_status_t gtp_release_layout(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_layout_t layout,
                                cudaStream_t stream) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_release_layout", [&] {
    ids = ids_of(*ctx, ws, n);
    const int l = as_int(layout);
    require(l == GTP_LAYOUT_BF16 || l == GTP_LAYOUT_GEMM,
            "layout " + std::to_string(l) + " is unknown; use GTP_LAYOUT_BF16 or GTP_LAYOUT_GEMM");
  });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_release_layout", [&] {
    issuing(*ctx, "gtp_release_layout", stream, [&] {
      ctx->runtime->release(ids.data(), static_cast<std::int64_t>(ids.size()), stream,
                            static_cast<gtp::remat::Layout>(as_int(layout)));
    });
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_reset_chains(gtp_context_t* ctx) {
  return on_context(ctx, "gtp_reset_chains", [&] {
    refuse_under_capture(*ctx, "gtp_reset_chains");
    ctx->runtime->reset_chains();
  });
}

}  // extern "C"
