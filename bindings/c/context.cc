// The C ABI's context: create, destroy, abort, its sizes, and its stats and trace texts.
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/c/internal/entry_point.h"

using namespace gtp::cabi;

namespace {

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
  }, InvalidArgumentIs::kArgument, Access::kRead);
}

}  // namespace

extern "C" {

gtp_status_t gtp_context_create(const gtp_context_config_t* config, gtp_context_t** out) {
  return guarded(nullptr, "gtp_context_create", [&] { gtp::cabi::create_context(config, out); });
}

gtp_status_t gtp_context_destroy(gtp_context_t* ctx) {
  if (ctx == nullptr) return GTP_SUCCESS;
  // Refused while a call runs (another thread's, or the one whose grad_ready callback this is):
  // freeing the context under it would corrupt the heap. The context stays usable.
  const std::string refusal = enter_call(*ctx, "gtp_context_destroy", Access::kExclusive);
  if (!refusal.empty()) return guarded(nullptr, "gtp_context_destroy", [&] { throw StateError(refusal); });
  // INVALID_STATE is kept for that refusal, so a caller can tell a context still there from a freed one.
  gtp_status_t status = guarded(nullptr, "gtp_context_destroy", [&] {
    ctx->runtime.reset();
    ctx->backend.reset();
    ctx->nccl_reduce_scatter.clear();
    ctx->nccl_groups.clear();
    ctx->nccl_world.reset();
    ctx->host_comms.clear();
    ctx->group_bootstraps.clear();
  });
  if (status == GTP_ERROR_INVALID_STATE) status = GTP_ERROR_SYSTEM;
  leave_call(*ctx);  // a thread still calling into the context after this uses a freed handle
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
  }, InvalidArgumentIs::kArgument, Access::kAny);  // ncclCommAbort is how another thread stops a stuck call
}

gtp_status_t gtp_context_check(gtp_context_t* ctx) {
  return on_context(ctx, "gtp_context_check", [&] { check_context(*ctx); }, InvalidArgumentIs::kArgument,
                    Access::kRead);
}

gtp_status_t gtp_context_sizes(gtp_context_t* ctx, gtp_sizes_t* out) {
  return on_context(ctx, "gtp_context_sizes", [&] {
    require(out != nullptr, "out is NULL");
    check_struct_size(out->struct_size, sizeof(gtp_sizes_t), "gtp_sizes_t");
    const gtp::topology::ParallelSizes& s = ctx->sizes;
    const gtp::topology::DataParallelRank data = gtp::topology::data_parallel_rank(s, ctx->rank);
    // A single-dimension group lists its ranks along that dimension, so the rank's coordinate there is
    // its position in the group (dense: tp, gtp_remat, cp, dp, pp; expert: expt_tp, ep, expt_gtp_remat, ...).
    const gtp::topology::HyperCommGrid grid = gtp::topology::make_gtp_grid(s);
    const std::vector<int> dense = grid.coords(ctx->rank);
    const std::vector<int> expert = grid.coords(ctx->rank, gtp::topology::kExpertView);
    *out = gtp_sizes_t{sizeof(gtp_sizes_t), ctx->rank, s.world_size, s.tp, s.gtp_remat, s.expt_gtp_remat, s.dp,
                       data.index, data.count, dense[0], dense[1], expert[2], dense[3]};
  }, InvalidArgumentIs::kArgument, Access::kAny);  // the sizes are fixed at create
}

gtp_status_t gtp_stats_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len) {
  return copy_text(ctx, "gtp_stats_json", buf, cap, len, [](const gtp_context& c) { return c.runtime->stats_json(); });
}

gtp_status_t gtp_trace_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len) {
  return copy_text(ctx, "gtp_trace_json", buf, cap, len,
                   [](const gtp_context& c) { return c.runtime->chrome_trace(c.rank); });
}

}  // extern "C"
