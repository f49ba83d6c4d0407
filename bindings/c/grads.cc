// The C ABI's gradient calls: grad buffers, finalize and drain.
#include <string>
#include <vector>

#include "bindings/c/internal/entry_point.h"

using namespace gtp::cabi;
using gtp::remat::WeightId;

extern "C" {

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
    issuing(*ctx, "gtp_finalize", stream, [&] {
      ctx->runtime->finalize(ids.data(), static_cast<std::int64_t>(ids.size()), last_microbatch != 0, stream);
    });
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_main_grads_zeroed(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_main_grads_zeroed", [&] {
    ids = ids_of(*ctx, ws, n);
    for (WeightId id : ids) {
      const gtp::remat::Weight& weight = ctx->runtime->registry().get(id);
      require(weight.desc.main_grad != nullptr || weight.valid_rows == 0,
              "weight '" + weight.desc.name + "' was registered without a main grad; list only weights that have one");
    }
  });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_main_grads_zeroed", [&] {
    refuse_under_capture(*ctx, "gtp_main_grads_zeroed");
    ctx->runtime->main_grads_zeroed(ids.data(), static_cast<std::int64_t>(ids.size()));
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_drain(gtp_context_t* ctx, cudaStream_t stream) {
  return on_context(ctx, "gtp_drain",
                    [&] { issuing(*ctx, "gtp_drain", stream, [&] { ctx->runtime->drain(stream); }); });
}

gtp_status_t gtp_drain_ex(gtp_context_t* ctx, uint32_t flags, cudaStream_t stream) {
  return on_context(ctx, "gtp_drain_ex", [&] {
    if ((flags & ~(GTP_DRAIN_DEFER_HEAD | GTP_DRAIN_MIDSTEP)) != 0) {
      require(false, "flags " + std::to_string(flags) +
                         " has unknown bits; use 0, GTP_DRAIN_DEFER_HEAD, GTP_DRAIN_MIDSTEP or both");
    }
    const auto head = (flags & GTP_DRAIN_DEFER_HEAD) != 0 ? gtp::remat::Runtime::Head::kAfterShardUpdate
                                                          : gtp::remat::Runtime::Head::kAtDrain;
    const bool step_ends = (flags & GTP_DRAIN_MIDSTEP) == 0;
    issuing(*ctx, "gtp_drain_ex", stream, [&] { ctx->runtime->drain(stream, head, step_ends); });
  });
}

}  // extern "C"
