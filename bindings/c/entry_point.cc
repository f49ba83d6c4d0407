// The entry points' shared handle and capture checks, the context-free error, and the status strings.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings/c/internal/entry_point.h"

namespace gtp::cabi {

using remat::WeightId;

std::string& context_free_error() {
  thread_local std::string error;
  return error;
}

void set_last_error(gtp_context_t* ctx, std::string text) {
  if (ctx == nullptr) {
    context_free_error() = std::move(text);
    return;
  }
  std::lock_guard<std::mutex> lock(ctx->errors_mutex);
  ctx->last_errors[std::this_thread::get_id()] = std::move(text);
}

std::string enter_call(gtp_context& ctx, const char* call, Access access) {
  std::unique_lock<std::mutex> lock(ctx.call_mutex);
  const auto deadline = std::chrono::steady_clock::now() + ctx.call_wait;
  while (ctx.call_in_progress != nullptr) {
    const std::string other = ctx.call_in_progress;
    if (ctx.call_thread == std::this_thread::get_id()) {
      return std::string(call) + " was called from inside " + other +
             " on the same thread (from the grad_ready callback?); calls on a context are not re-entrant: "
             "make it after " + other + " returns";
    }
    // A read is short and must not make the training thread's calls fail: wait for it (or let it wait).
    if (access != Access::kRead && !ctx.call_is_read) {
      return other + " is in progress on this context on another thread; a context takes one call at a time "
                     "(stats, trace and sizes reads excepted): serialize the calls, e.g. with a lock";
    }
    if (ctx.call_done.wait_until(lock, deadline) == std::cv_status::timeout && ctx.call_in_progress != nullptr) {
      return std::string(call) + " waited timeout_ms=" + std::to_string(ctx.call_wait.count()) + " for " + other +
             " to return; is it waiting for this call (a CUDA host-function callback reading its own context)?";
    }
  }
  ctx.call_in_progress = call;
  ctx.call_thread = std::this_thread::get_id();
  ctx.call_is_read = access == Access::kRead;
  return "";
}

void leave_call(gtp_context& ctx) {
  {
    std::lock_guard<std::mutex> lock(ctx.call_mutex);
    ctx.call_in_progress = nullptr;
    ctx.call_thread = std::thread::id();
    ctx.call_is_read = false;
  }
  ctx.call_done.notify_all();
}

namespace {
const char* group_name(int group) { return group == GTP_GROUP_GTP_REMAT ? "gtp_remat" : "expt_gtp_remat"; }
}  // namespace

std::string aborted_message(gtp_context& ctx) {
  std::lock_guard<std::mutex> lock(ctx.errors_mutex);
  if (ctx.failure.empty()) return "the context was aborted; destroy it";
  return "the context was aborted after a failure: " + ctx.failure;
}

void fail_context(gtp_context& ctx, const char* call, const std::string& what) noexcept {
  try {
    if (ctx.backend == nullptr) return;
    std::string groups;
    bool peers = false;
    for (int g = 0; g < ctx.backend->group_count(); ++g) {
      peers = peers || ctx.backend->group_size(g) > 1;
      groups += std::string(g == 0 ? "" : ", ") + group_name(g) + " of " + std::to_string(ctx.backend->group_size(g)) +
                " ranks";
    }
    if (!peers) return;  // nobody can be waiting for this rank
    const std::string message = std::string(call) + " failed on rank " + std::to_string(ctx.rank) + " (groups " +
                                groups + "): " + what +
                                "; libgtp aborted its communicators so that no rank waits for it: destroy the "
                                "context on every rank (and create a new one)";
    {
      std::lock_guard<std::mutex> lock(ctx.errors_mutex);
      if (!ctx.failure.empty()) return;  // the first failure already aborted everything
      ctx.failure = message;
    }
    ctx.aborted = true;
    ctx.backend->abort_communicators(message);
    for (auto& comm : ctx.nccl_reduce_scatter) comm->abort();
    for (auto& comm : ctx.nccl_groups) comm->abort();
    if (ctx.nccl_world != nullptr) ctx.nccl_world->abort();
  } catch (...) {  // out of memory building the message: the call's own error is still reported
  }
}

void mark_collectives(gtp_context& ctx, const char* call, cudaStream_t stream) {
  // Armed by call_timeout_ms; only where collectives outlive the call (CUDA), never into a capture.
  if (!ctx.watch_collectives || ctx.runtime->capture_in_progress(stream)) return;
  // The side streams the call can have enqueued on: gathers for materialize / release (their
  // prefetches), reduce-scatters for finalize, both for drain and shard_updated.
  const bool gathers = std::strncmp(call, "gtp_finalize", 12) != 0;
  const bool reduce_scatters =
      std::strncmp(call, "gtp_materialize", 15) != 0 && std::strncmp(call, "gtp_release", 11) != 0;
  const gtp::remat::Backend::CallScope scope(*ctx.backend);  // the backend's device current
  ctx.marks.resize(static_cast<std::size_t>(2 * ctx.backend->group_count()));
  for (int g = 0; g < ctx.backend->group_count(); ++g) {
    for (gtp::remat::Role role : {gtp::remat::Role::kGather, gtp::remat::Role::kReduceScatter}) {
      if (!(role == gtp::remat::Role::kGather ? gathers : reduce_scatters)) continue;
      std::vector<gtp_context::Mark>& marks = ctx.marks[2 * g + static_cast<int>(role)];
      // Finished marks go first, so the list holds only what may still be running.
      std::size_t done = 0;
      while (done < marks.size() && ctx.backend->complete(marks[done].event)) ctx.backend->forget(marks[done++].event);
      marks.erase(marks.begin(), marks.begin() + static_cast<std::ptrdiff_t>(done));
      const gtp::remat::Event event = ctx.backend->record(ctx.backend->side_stream(g, role));
      marks.push_back({event, std::chrono::steady_clock::now(), call, g});
    }
  }
}

void check_context(gtp_context& ctx) {
  if (ctx.aborted) throw StateError(aborted_message(ctx));
  // First the backend's poll of the device's fill-tag verdict (the scope throws DivergenceError): what this
  // rank's device found is the cause to report, before the error a peer's abort on its own verdict left in
  // a communicator here.
  const gtp::remat::Backend::CallScope scope(*ctx.backend);
  for (auto* list : {&ctx.nccl_groups, &ctx.nccl_reduce_scatter}) {
    for (auto& comm : *list) {
      try {
        comm->check_async_error();
      } catch (const std::exception& e) {
        fail_context(ctx, "gtp_context_check", e.what());
        throw;
      }
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < ctx.marks.size(); ++s) {
    std::vector<gtp_context::Mark>& marks = ctx.marks[s];
    std::size_t done = 0;
    while (done < marks.size() && ctx.backend->complete(marks[done].event)) ctx.backend->forget(marks[done++].event);
    marks.erase(marks.begin(), marks.begin() + static_cast<std::ptrdiff_t>(done));
    if (marks.empty() || now - marks.front().issued <= ctx.call_timeout) continue;
    const gtp_context::Mark& late = marks.front();
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - late.issued);
    const std::string message =
        std::string("a collective that ") + late.call + " issued on group " + group_name(late.group) + " (its " +
        gtp::remat::to_string(static_cast<gtp::remat::Role>(s % 2)) + " stream) has not completed " +
        std::to_string(waited.count()) + " ms after the call, past call_timeout_ms=" +
        std::to_string(ctx.call_timeout.count()) + ": a peer is missing, stuck or made different calls";
    fail_context(ctx, "gtp_context_check", message);
    throw gtp::comm::CommError(message, true);
  }
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

// Runs on every materialize and release, so messages are built only on failure and duplicates are
// found by sorting a copy rather than with a node-based set.
std::vector<WeightId> ids_of(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n) {
  if (ws == nullptr && n != 0) require(false, "ws is NULL but n is " + std::to_string(n));
  // More handles than registered weights means one is listed twice among the first registered + 1:
  // reading stops there, so a huge n neither sizes a vector nor walks past what ws can hold.
  const size_t most = static_cast<size_t>(ctx.registered) + 1;
  std::vector<WeightId> ids;
  ids.reserve(std::min(n, most));
  for (size_t i = 0; i < n && ids.size() < most; ++i) ids.push_back(id_of(ctx, ws[i]));
  if (ids.size() > 1) {
    std::vector<WeightId> sorted(ids);
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end()) {
      require(false, "weight id " + std::to_string(*twice) + " is listed twice" +
                         (ids.size() < n ? " (n is " + std::to_string(n) + " but " + std::to_string(ctx.registered) +
                                               " weights are registered)"
                                         : std::string()) +
                         "; list each weight once");
    }
  }
  return ids;
}

void refuse_under_capture(gtp_context& ctx, const char* call, cudaStream_t stream) {
  if (ctx.runtime->capture_in_progress(stream)) {
    throw StateError(std::string(call) +
                     " is not capture-safe and a CUDA graph capture is in progress on this context's streams; "
                     "call it before cudaStreamBeginCapture or after cudaStreamEndCapture");
  }
}

}  // namespace gtp::cabi

using namespace gtp::cabi;

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
    case GTP_ERROR_DIVERGED: return "GTP_ERROR_DIVERGED";
  }
  return "unknown gtp_status_t";
}

const char* gtp_last_error(const gtp_context_t* ctx) {
  if (ctx == nullptr) return context_free_error().c_str();
  auto* c = const_cast<gtp_context_t*>(ctx);
  std::lock_guard<std::mutex> lock(c->errors_mutex);
  return c->last_errors[std::this_thread::get_id()].c_str();
}

}  // extern "C"
