// The C ABI of include/gtp/gtp.h over remat::Runtime on the host backend (HostComm per grid group)
// or the CUDA backend (NCCL communicators split per grid group). Every entry point catches everything
// and maps it to a gtp_status_t; see docs/c-abi.md.
#include "gtp/gtp.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/context.h"
#include "comm/errors.h"
#include "remat/cuda_backend.h"
#include "remat/runtime.h"

namespace {

using gtp::cabi::as_int;
using gtp::cabi::check_struct_size;
using gtp::cabi::require;
using gtp::cabi::StateError;
using gtp::cabi::StatusError;
using gtp::remat::WeightId;

thread_local std::string context_free_error;  // failures with no context: create, a null ctx

// How std::invalid_argument from the runtime is reported: release and finalize raise it only for
// call-order misuse once their handles and arguments have been checked here.
enum class InvalidArgumentIs { kArgument, kState };

template <typename Body>
gtp_status_t guarded(gtp_context_t* ctx, const char* call, Body&& body,
                     InvalidArgumentIs invalid = InvalidArgumentIs::kArgument) {
  std::string* error = ctx != nullptr ? &ctx->last_error : &context_free_error;
  gtp_status_t status = GTP_SUCCESS;
  std::string message;
  try {
    if (ctx != nullptr && ctx->aborted) throw StateError("the context was aborted; destroy it");
    body();
  } catch (const StatusError& e) {
    status = e.status;
    message = e.what();
  } catch (const gtp::remat::CudaError& e) {
    status = GTP_ERROR_CUDA;
    message = e.what();
  } catch (const StateError& e) {
    status = GTP_ERROR_INVALID_STATE;
    message = e.what();
  } catch (const std::invalid_argument& e) {
    status = invalid == InvalidArgumentIs::kState ? GTP_ERROR_INVALID_STATE : GTP_ERROR_INVALID_ARGUMENT;
    message = e.what();
  } catch (const nlohmann::json::exception& e) {
    status = GTP_ERROR_INVALID_ARGUMENT;
    message = e.what();
  } catch (const gtp::comm::CommError& e) {
    status = e.timed_out() ? GTP_ERROR_TIMEOUT : GTP_ERROR_SYSTEM;
    message = e.what();
  } catch (const std::runtime_error& e) {
    status = GTP_ERROR_SYSTEM;
    message = e.what();
  } catch (const std::bad_alloc& e) {
    status = GTP_ERROR_SYSTEM;
    message = std::string("out of host memory: ") + e.what();
  } catch (const std::exception& e) {
    status = GTP_ERROR_INTERNAL;
    message = e.what();
  } catch (...) {
    status = GTP_ERROR_INTERNAL;
    message = "unknown exception";
  }
  if (status != GTP_SUCCESS) {
    try {
      *error = std::string(call) + ": " + message;
    } catch (...) {
      error->clear();
    }
  } else {
    error->clear();
  }
  return status;
}

// A context's entry point: a null ctx is INVALID_ARGUMENT with the message kept per thread.
template <typename Body>
gtp_status_t on_context(gtp_context_t* ctx, const char* call, Body&& body,
                        InvalidArgumentIs invalid = InvalidArgumentIs::kArgument) {
  if (ctx == nullptr) {
    return guarded(nullptr, call, [] { throw std::invalid_argument("ctx is NULL; pass a context from gtp_context_create"); });
  }
  return guarded(ctx, call, body, invalid);
}

WeightId id_of(const gtp_context_t& ctx, gtp_weight_t w) {
  if (w.generation != ctx.generation) {
    throw StateError("weight handle (id " + std::to_string(w.id) + ", generation " + std::to_string(w.generation) +
                     ") was issued by another context, one since destroyed, or never (this context's generation is " +
                     std::to_string(ctx.generation) + ")");
  }
  if (!ctx.runtime->registry().contains(w.id)) {
    throw StateError("weight id " + std::to_string(w.id) + " is not registered (unregistered already?)");
  }
  return w.id;
}

// The ids of ws[0..n), each listed once. This runs on every materialize and release, so messages are
// built only on failure and duplicates are found by sorting a copy rather than with a node-based set.
std::vector<WeightId> ids_of(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n) {
  if (ws == nullptr && n != 0) require(false, "ws is NULL but n is " + std::to_string(n));
  std::vector<WeightId> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = id_of(ctx, ws[i]);
  if (n > 1) {
    std::vector<WeightId> sorted(ids);
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end()) {
      require(false, "weight id " + std::to_string(*twice) + " is listed twice; list each weight once");
    }
  }
  return ids;
}

// The weights of a materialize call, checked: at least one, and room in the output for every weight
// once expert leaders are expanded.
std::vector<WeightId> materialize_ids(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n, size_t out_capacity) {
  if (n == 0) require(false, "n is 0; materialize at least one weight");
  std::vector<WeightId> ids = ids_of(ctx, ws, n);
  const size_t expanded = ctx.runtime->registry().expand(ids.data(), static_cast<std::int64_t>(ids.size())).size();
  if (out_capacity < expanded) {
    require(false, "out_capacity is " + std::to_string(out_capacity) + " but the weights expand to " +
                       std::to_string(expanded) + " (experts follow their leader)");
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

gtp_status_t copy_text(gtp_context_t* ctx, const char* call, char* buf, size_t cap, size_t* len,
                       std::string (*text)(const gtp_context&)) {
  return on_context(ctx, call, [&] {
    require(len != nullptr, "len is NULL");
    require(buf != nullptr || cap == 0, "buf is NULL but cap is " + std::to_string(cap));
    const std::string s = text(*ctx);
    if (cap <= s.size()) {
      *len = s.size();
      throw std::invalid_argument("the buffer holds " + std::to_string(cap) + " bytes but the text needs " +
                                  std::to_string(s.size() + 1) + " with its NUL; *len has the length");
    }
    std::memcpy(buf, s.c_str(), s.size() + 1);
    *len = s.size();
  });
}

}  // namespace

extern "C" {

const char* gtp_status_string(gtp_status_t status) {
  switch (as_int(status)) {
    case GTP_SUCCESS: return "GTP_SUCCESS";
    case GTP_ERROR_INVALID_ARGUMENT: return "GTP_ERROR_INVALID_ARGUMENT";
    case GTP_ERROR_INVALID_STATE: return "GTP_ERROR_INVALID_STATE";
    case GTP_ERROR_TIMEOUT: return "GTP_ERROR_TIMEOUT";
    case GTP_ERROR_SYSTEM: return "GTP_ERROR_SYSTEM";
    case GTP_ERROR_CUDA: return "GTP_ERROR_CUDA";
    case GTP_ERROR_VERSION: return "GTP_ERROR_VERSION";
    case GTP_ERROR_INTERNAL: return "GTP_ERROR_INTERNAL";
  }
  return "unknown gtp_status_t";
}

const char* gtp_last_error(const gtp_context_t* ctx) {
  return ctx != nullptr ? ctx->last_error.c_str() : context_free_error.c_str();
}

gtp_status_t gtp_context_create(const gtp_context_config_t* config, gtp_context_t** out) {
  return guarded(nullptr, "gtp_context_create", [&] { gtp::cabi::create_context(config, out); });
}

// Calls that allocate, free or re-pack cannot become part of a CUDA graph: refused, with nothing done,
// while `stream` is captured or a capture has joined the context's side streams.
void refuse_under_capture(gtp_context& ctx, const char* call, cudaStream_t stream = nullptr) {
  if (ctx.runtime->capture_in_progress(stream)) {
    throw StateError(std::string(call) +
                     " is not capture-safe and a CUDA graph capture is in progress on this context's streams; "
                     "call it before cudaStreamBeginCapture or after cudaStreamEndCapture");
  }
}

gtp_status_t gtp_context_destroy(gtp_context_t* ctx) {
  if (ctx == nullptr) return GTP_SUCCESS;
  const gtp_status_t status = guarded(nullptr, "gtp_context_destroy", [&] {
    ctx->runtime.reset();
    ctx->backend.reset();
    ctx->nccl_reduce_scatter.clear();
    ctx->nccl_groups.clear();
    ctx->nccl_world.reset();
    ctx->host_comms.clear();
    ctx->group_bootstraps.clear();
  });
  delete ctx;
  return status;
}

gtp_status_t gtp_context_abort(gtp_context_t* ctx) {
  return on_context(ctx, "gtp_context_abort", [&] {
    ctx->aborted = true;
    // Cancels pending NCCL work so that a peer stuck in a collective cannot hang destroy.
    for (auto& comm : ctx->nccl_reduce_scatter) comm->abort();
    for (auto& comm : ctx->nccl_groups) comm->abort();
    if (ctx->nccl_world != nullptr) ctx->nccl_world->abort();
  });
}

gtp_status_t gtp_context_sizes(gtp_context_t* ctx, gtp_sizes_t* out) {
  return on_context(ctx, "gtp_context_sizes", [&] {
    require(out != nullptr, "out is NULL");
    check_struct_size(out->struct_size, sizeof(gtp_sizes_t), "gtp_sizes_t");
    const gtp::topology::ParallelSizes& s = ctx->sizes;
    const gtp::topology::DataParallelRank data = gtp::topology::data_parallel_rank(s, ctx->rank);
    *out = gtp_sizes_t{sizeof(gtp_sizes_t), ctx->rank, s.world_size, s.tp, s.gtp_remat, s.expt_gtp_remat, s.dp,
                       data.index, data.count};
  });
}

gtp_status_t gtp_weight_register(gtp_context_t* ctx, const gtp_weight_desc_t* desc, gtp_weight_t* out) {
  return on_context(ctx, "gtp_weight_register", [&] {
    refuse_under_capture(*ctx, "gtp_weight_register");
    require(desc != nullptr, "desc is NULL");
    require(out != nullptr, "out is NULL");
    check_struct_size(desc->struct_size, sizeof(gtp_weight_desc_t), "gtp_weight_desc_t");
    gtp::remat::WeightDesc d;
    d.name = desc->name != nullptr ? desc->name : "";
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
    *out = gtp_weight_t{id, ctx->generation};
  });
}

gtp_status_t gtp_weight_unregister(gtp_context_t* ctx, gtp_weight_t w) {
  return on_context(ctx, "gtp_weight_unregister", [&] {
    refuse_under_capture(*ctx, "gtp_weight_unregister");
    ctx->runtime->unregister_weight(id_of(*ctx, w));
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_weights_shard_updated(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream) {
  return on_context(ctx, "gtp_weights_shard_updated", [&] {
    refuse_under_capture(*ctx, "gtp_weights_shard_updated", stream);
    const std::vector<WeightId> ids = ids_of(*ctx, ws, n);
    ctx->runtime->shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
  });
}

gtp_status_t gtp_materialize(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                             int32_t model_chunk, gtp_layout_t layout, void** out_ptrs, size_t out_capacity,
                             size_t* out_count, cudaStream_t stream) {
  return on_context(ctx, "gtp_materialize", [&] {
    require(out_ptrs != nullptr, "out_ptrs is NULL");
    require(out_count != nullptr, "out_count is NULL");
    const std::vector<WeightId> ids = materialize_ids(*ctx, ws, n, out_capacity);
    const std::int64_t count = static_cast<std::int64_t>(ids.size());
    require(as_int(layout) != GTP_LAYOUT_GEMM,
            "layout GTP_LAYOUT_GEMM needs several pointers per weight; call gtp_materialize_views");
    const std::vector<void*> ptrs = ctx->runtime->materialize(ids.data(), count, static_cast<gtp::remat::Phase>(as_int(phase)),
                                                              model_chunk, static_cast<gtp::remat::Layout>(as_int(layout)), stream);
    std::copy(ptrs.begin(), ptrs.end(), out_ptrs);
    *out_count = ptrs.size();
  });
}

gtp_status_t gtp_release(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_release", [&] { ids = ids_of(*ctx, ws, n); });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_release", [&] {
    ctx->runtime->release(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_materialize_views(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                                   int32_t model_chunk, gtp_layout_t layout, gtp_materialized_t* out,
                                   size_t out_capacity, size_t* out_count, cudaStream_t stream) {
  return on_context(ctx, "gtp_materialize_views", [&] {
    require(out != nullptr, "out is NULL");
    require(out_count != nullptr, "out_count is NULL");
    const std::vector<WeightId> ids = materialize_ids(*ctx, ws, n, out_capacity);
    const std::int64_t count = static_cast<std::int64_t>(ids.size());
    const size_t expanded = ctx->runtime->registry().expand(ids.data(), count).size();
    for (size_t i = 0; i < expanded; ++i) {
      check_struct_size(out[i].struct_size, sizeof(gtp_materialized_t),
                        ("gtp_materialized_t (out[" + std::to_string(i) + "])").c_str());
    }
    const std::vector<gtp::remat::Materialized> views = ctx->runtime->materialize_views(
        ids.data(), count, static_cast<gtp::remat::Phase>(as_int(phase)), model_chunk,
        static_cast<gtp::remat::Layout>(as_int(layout)), stream);
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
    ctx->runtime->release(ids.data(), static_cast<std::int64_t>(ids.size()), stream,
                          static_cast<gtp::remat::Layout>(as_int(layout)));
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_grad_buffer(gtp_context_t* ctx, gtp_weight_t w, float** out, cudaStream_t stream) {
  return on_context(ctx, "gtp_grad_buffer", [&] {
    require(out != nullptr, "out is NULL");
    *out = ctx->runtime->grad_buffer(id_of(*ctx, w), stream).data;
  });
}

gtp_status_t gtp_grad_buffer_ex(gtp_context_t* ctx, gtp_weight_t w, uint32_t flags, gtp_grad_buffer_t* out,
                                cudaStream_t stream) {
  return on_context(ctx, "gtp_grad_buffer_ex", [&] {
    constexpr uint32_t kKnown = GTP_GRAD_BUFFER_UNINITIALIZED | GTP_GRAD_BUFFER_SEPARATE;
    if ((flags & ~kKnown) != 0) {
      require(false, "flags " + std::to_string(flags) + " has unknown bits " + std::to_string(flags & ~kKnown) +
                         "; use 0 or GTP_GRAD_BUFFER_UNINITIALIZED, optionally | GTP_GRAD_BUFFER_SEPARATE");
    }
    // A zero-filled buffer is never the main grad: SEPARATE alone would ask for nothing.
    require((flags & GTP_GRAD_BUFFER_SEPARATE) == 0 || (flags & GTP_GRAD_BUFFER_UNINITIALIZED) != 0,
            "flags " + std::to_string(flags) +
                " has GTP_GRAD_BUFFER_SEPARATE without GTP_GRAD_BUFFER_UNINITIALIZED; zero-filled buffers are "
                "always separate: pass GTP_GRAD_BUFFER_UNINITIALIZED | GTP_GRAD_BUFFER_SEPARATE, or 0");
    require(out != nullptr, "out is NULL; pass a gtp_grad_buffer_t from GTP_GRAD_BUFFER_INITIALIZER");
    check_struct_size(out->struct_size, sizeof(gtp_grad_buffer_t), "gtp_grad_buffer_t");
    using gtp::remat::GradInit;
    const GradInit init = (flags & GTP_GRAD_BUFFER_UNINITIALIZED) == 0 ? GradInit::kZero
                          : (flags & GTP_GRAD_BUFFER_SEPARATE) != 0  ? GradInit::kUndefinedSeparate
                                                                     : GradInit::kUndefined;
    const gtp::remat::GradBuffer buffer = ctx->runtime->grad_buffer(id_of(*ctx, w), stream, init);
    out->data = buffer.data;
    out->overwrite = buffer.overwrite ? 1 : 0;
  });
}

gtp_status_t gtp_finalize(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, int32_t last_microbatch,
                          cudaStream_t stream) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_finalize", [&] { ids = ids_of(*ctx, ws, n); });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_finalize", [&] {
    ctx->runtime->finalize(ids.data(), static_cast<std::int64_t>(ids.size()), last_microbatch != 0, stream);
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_drain(gtp_context_t* ctx, cudaStream_t stream) {
  return on_context(ctx, "gtp_drain", [&] { ctx->runtime->drain(stream); });
}

gtp_status_t gtp_drain_ex(gtp_context_t* ctx, uint32_t flags, cudaStream_t stream) {
  return on_context(ctx, "gtp_drain_ex", [&] {
    if ((flags & ~GTP_DRAIN_DEFER_HEAD) != 0) {
      require(false, "flags " + std::to_string(flags) + " has unknown bits; use 0 or GTP_DRAIN_DEFER_HEAD");
    }
    ctx->runtime->drain(stream, (flags & GTP_DRAIN_DEFER_HEAD) != 0 ? gtp::remat::Runtime::Head::kAfterShardUpdate
                                                                    : gtp::remat::Runtime::Head::kAtDrain);
  });
}

gtp_status_t gtp_reset_chains(gtp_context_t* ctx) {
  return on_context(ctx, "gtp_reset_chains", [&] {
    refuse_under_capture(*ctx, "gtp_reset_chains");
    ctx->runtime->reset_chains();
  });
}

gtp_status_t gtp_stats_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len) {
  return copy_text(ctx, "gtp_stats_json", buf, cap, len, [](const gtp_context& c) { return c.runtime->stats_json(); });
}

gtp_status_t gtp_trace_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len) {
  return copy_text(ctx, "gtp_trace_json", buf, cap, len,
                   [](const gtp_context& c) { return c.runtime->chrome_trace(c.rank); });
}

}  // extern "C"
