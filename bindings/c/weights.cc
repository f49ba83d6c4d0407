// The C ABI's weights: register (the descriptor checked and resolved), unregister, shard_updated, and
// the group-reduced amax a weight was last packed with.
#include <cstddef>
#include <string>
#include <vector>

#include "bindings/c/internal/entry_point.h"

using namespace gtp::cabi;
using gtp::remat::WeightId;

namespace {

// The offset of the first byte that is not well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or -1. Names end up in the stats JSON, which must be UTF-8.
std::ptrdiff_t invalid_utf8_offset(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) len = 1;
    else if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return static_cast<std::ptrdiff_t>(i);
    if (i + len > n) return static_cast<std::ptrdiff_t>(i);
    for (std::size_t k = 1; k < len; ++k) {
      if (p[i + k] < (k == 1 ? lo : 0x80) || p[i + k] > (k == 1 ? hi : 0xBF)) return static_cast<std::ptrdiff_t>(i);
    }
    i += len;
  }
  return -1;
}

}  // namespace

extern "C" {

gtp_status_t gtp_weight_register(gtp_context_t* ctx, const gtp_weight_desc_t* desc, gtp_weight_t* out) {
  return on_context(ctx, "gtp_weight_register", [&] {
    refuse_under_capture(*ctx, "gtp_weight_register");
    require(desc != nullptr, "desc is NULL");
    require(out != nullptr, "out is NULL");
    check_struct_size(desc->struct_size, sizeof(gtp_weight_desc_t), "gtp_weight_desc_t");
    gtp::remat::WeightDesc d;
    d.name = desc->name != nullptr ? desc->name : "";
    const std::ptrdiff_t bad = invalid_utf8_offset(d.name);
    require(bad < 0, "name is not valid UTF-8 (byte " + std::to_string(bad) + " of " + std::to_string(d.name.size()) +
                         " starts no well-formed sequence); weight names go into the stats JSON: pass UTF-8");
    d.shard = desc->shard;
    const int dtype = as_int(desc->dtype), wire = as_int(desc->wire), group = as_int(desc->group);
    require(dtype == GTP_DTYPE_BF16 || dtype == GTP_DTYPE_FP32,
            "dtype " + std::to_string(dtype) + " is unknown; use GTP_DTYPE_BF16 or GTP_DTYPE_FP32");
    d.dtype = dtype == GTP_DTYPE_BF16 ? gtp::kernels::SourceDtype::kBF16 : gtp::kernels::SourceDtype::kFP32;
    d.rows = desc->rows;
    d.cols = desc->cols;
    require(wire >= GTP_WIRE_FROM_GROUP && wire <= GTP_WIRE_NVFP4,
            "wire " + std::to_string(wire) + " is unknown; use GTP_WIRE_FROM_GROUP, _BF16, _FP8, _MXFP8 or _NVFP4");
    require(group == GTP_GROUP_GTP_REMAT || group == GTP_GROUP_EXPERT_GTP_REMAT,
            "group " + std::to_string(group) + " is unknown; use GTP_GROUP_GTP_REMAT or GTP_GROUP_EXPERT_GTP_REMAT");
    // FROM_GROUP takes the group's whole spec (format, NVFP4 block shape, MXFP8 rounding); the
    // descriptor's nvfp4_2d / FLOOR below can only add to it.
    if (wire == GTP_WIRE_FROM_GROUP) {
      d.wire = ctx->group_wire[group];
    } else {
      d.wire.format = static_cast<gtp::kernels::WireFormat>(wire);
    }
    const std::string resolved = gtp::kernels::to_string(d.wire.format);
    require(desc->mx_rounding == GTP_MX_ROUNDING_RCEIL || desc->mx_rounding == GTP_MX_ROUNDING_FLOOR,
            "mx_rounding " + std::to_string(desc->mx_rounding) +
                " is unknown; use GTP_MX_ROUNDING_RCEIL (TransformerEngine) or GTP_MX_ROUNDING_FLOOR (OCP MX v1.0)");
    require(desc->nvfp4_2d == 0 || d.wire.format == gtp::kernels::WireFormat::kNVFP4,
            "nvfp4_2d is " + std::to_string(desc->nvfp4_2d) + " but the wire is " + resolved +
                "; 16x16 blocks exist for the nvfp4 wire only: set nvfp4_2d = 0 or wire = GTP_WIRE_NVFP4");
    if (desc->nvfp4_2d != 0) d.wire.nvfp4_blocks = gtp::kernels::Nvfp4Blocks::k2D;
    // Other wires ignore the rounding; keeping their spec at the default keeps expert-leader equality
    // about what the bytes depend on.
    if (d.wire.format == gtp::kernels::WireFormat::kMXFP8 && desc->mx_rounding == GTP_MX_ROUNDING_FLOOR) {
      d.wire.mx_rounding = gtp::kernels::ScaleRounding::kFloor;
    }
    require(desc->gemm_scale_layout == GTP_SCALE_LAYOUT_ROW_MAJOR ||
                desc->gemm_scale_layout == GTP_SCALE_LAYOUT_BLOCKED_128X4,
            "gemm_scale_layout " + std::to_string(desc->gemm_scale_layout) +
                " is unknown; use GTP_SCALE_LAYOUT_ROW_MAJOR or GTP_SCALE_LAYOUT_BLOCKED_128X4 (cuBLASLt block-scaled GEMMs)");
    d.gemm_scales = desc->gemm_scale_layout == GTP_SCALE_LAYOUT_BLOCKED_128X4
                        ? gtp::kernels::ScaleLayout::kBlocked128x4
                        : gtp::kernels::ScaleLayout::kRowMajor;
    d.group = group;
    d.main_grad = desc->main_grad;
    if (desc->expert_leader != nullptr) d.expert_leader = id_of(*ctx, *desc->expert_leader);
    const WeightId id = ctx->runtime->register_weight(d);
    ++ctx->registered;
    *out = gtp_weight_t{id, ctx->generation};
  });
}

gtp_status_t gtp_weight_unregister(gtp_context_t* ctx, gtp_weight_t w) {
  return on_context(ctx, "gtp_weight_unregister", [&] {
    refuse_under_capture(*ctx, "gtp_weight_unregister");
    ctx->runtime->unregister_weight(id_of(*ctx, w));
    --ctx->registered;
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_weights_shard_updated(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream) {
  return on_context(ctx, "gtp_weights_shard_updated", [&] {
    refuse_under_capture(*ctx, "gtp_weights_shard_updated", stream);
    const std::vector<WeightId> ids = ids_of(*ctx, ws, n);
    issuing(*ctx, "gtp_weights_shard_updated", stream,
            [&] { ctx->runtime->shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream); });
  });
}

gtp_status_t gtp_weight_amax(gtp_context_t* ctx, gtp_weight_t w, const float** out) {
  return on_context(ctx, "gtp_weight_amax", [&] {
    require(out != nullptr, "out is NULL");
    const WeightId id = id_of(*ctx, w);
    const gtp::remat::Weight& weight = ctx->runtime->registry().get(id);
    const float* slot = ctx->runtime->registry().amax_of(id);
    require(slot != nullptr, "weight '" + weight.desc.name + "' travels on the " +
                                 gtp::kernels::to_string(weight.desc.wire.format) +
                                 " wire, which encodes without a tensor amax (only the fp8 and nvfp4 wires have "
                                 "one); ask for the amax of FP8 and NVFP4 weights only");
    // Before the first shard_updated the slot holds nothing this weight was packed with.
    if (weight.version == 0) {
      throw StateError("weight '" + weight.desc.name + "' has no amax yet: it was never packed; call "
                       "gtp_weights_shard_updated on it (collectively) after gtp_weight_register");
    }
    *out = slot;
  });
}

}  // extern "C"
