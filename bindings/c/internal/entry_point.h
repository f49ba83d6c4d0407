// Internal to the C ABI: what every entry point shares (status mapping, handle checks, capture refusal).
#pragma once

#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bindings/c/internal/context.h"
#include "comm/errors.h"
#include "gtp/gtp.h"
#include "remat/cuda_backend.h"
#include "remat/runtime.h"

namespace gtp::cabi {

// The calling thread's last error of failures with no context (create, a null ctx). A function: an
// extern thread_local variable was exported by libgtp.so despite libgtp.lds (exports_test).
std::string& context_free_error();

// The message gtp_last_error(ctx) shows to the calling thread (ctx NULL: the context-free one).
void set_last_error(gtp_context_t* ctx, std::string text);

// How std::invalid_argument from the runtime is reported: release and finalize raise it only for
// call-order misuse once their handles and arguments have been checked here.
enum class InvalidArgumentIs { kArgument, kState };

// "the context was aborted (...why...); destroy it".
std::string aborted_message(gtp_context& ctx);

// Failing ranks (docs/reliability.md): marks the context failed with a message naming `call`, this
// rank and the groups, and aborts its communicators, so peers waiting in a collective this rank will
// not make fail too (host: they throw this message; NCCL: their deadline fires). A context whose
// groups all have one rank has no peers and stays usable. Never throws.
void fail_context(gtp_context& ctx, const char* call, const std::string& what) noexcept;

// Runs an entry point's body: every exception is caught and mapped to a gtp_status_t (docs/c-abi.md).
template <typename Body>
gtp_status_t guarded(gtp_context_t* ctx, const char* call, Body&& body,
                     InvalidArgumentIs invalid = InvalidArgumentIs::kArgument) {
  gtp_status_t status = GTP_SUCCESS;
  std::string message;
  try {
    if (ctx != nullptr && ctx->aborted) throw StateError(aborted_message(*ctx));
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
  } catch (const gtp::remat::DivergenceError& e) {  // the context is spent
    status = GTP_ERROR_DIVERGED;
    message = e.what();
    // Every rank of the group raises it, but not at the same call where the device found it (the CUDA
    // backend's verdict surfaces at each rank's next call): a peer may already have issued a collective
    // this rank will never join, or this rank one a peer will not. Aborting the communicators lets both
    // destroy instead of waiting for it.
    if (ctx != nullptr) {
      fail_context(*ctx, call, e.what());
      ctx->aborted = true;  // also where no group has peers (fail_context leaves such a context usable)
    }
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
  try {
    set_last_error(ctx, status != GTP_SUCCESS ? std::string(call) + ": " + message : std::string());
  } catch (...) {  // out of memory for the message: the status still says what happened
  }
  return status;
}

// How an entry point may overlap a call in progress on the same context.
enum class Access {
  kExclusive,  // refused while another call runs
  kRead,       // from another thread: waits for the running call, and calls wait for it (stats, trace)
  kAny,        // touches only what is set at create or atomic (sizes, abort)
};

// Makes `call` the context's call in progress, waiting where Access allows; otherwise returns why it
// is refused (naming the call in progress) and changes nothing.
std::string enter_call(gtp_context& ctx, const char* call, Access access);
void leave_call(gtp_context& ctx);

// Leaves the call at the end of the scope.
class CallScope {
 public:
  explicit CallScope(gtp_context& ctx) : ctx_(ctx) {}
  ~CallScope() { leave_call(ctx_); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  gtp_context& ctx_;
};

// A context's entry point: a null ctx is INVALID_ARGUMENT with the message kept per thread; a call
// while another holds the context is INVALID_STATE naming that call, or waits for it (Access::kRead).
template <typename Body>
gtp_status_t on_context(gtp_context_t* ctx, const char* call, Body&& body,
                        InvalidArgumentIs invalid = InvalidArgumentIs::kArgument, Access access = Access::kExclusive) {
  if (ctx == nullptr) {
    return guarded(nullptr, call, [] { throw std::invalid_argument("ctx is NULL; pass a context from gtp_context_create"); });
  }
  if (access == Access::kAny) return guarded(ctx, call, body, invalid);
  const std::string refusal = enter_call(*ctx, call, access);
  if (!refusal.empty()) return guarded(ctx, call, [&] { throw StateError(refusal); });
  CallScope scope(*ctx);
  return guarded(ctx, call, body, invalid);
}

// Watchdog (gtp_context_check): on the CUDA backend with call_timeout_ms set, records an event on
// each side stream the call may have enqueued on (not while a capture is in progress).
void mark_collectives(gtp_context& ctx, const char* call, cudaStream_t stream);
// gtp_context_check's body: the first collective past call_timeout fails the context (TIMEOUT), as
// does a communicator's asynchronous error; an aborted context is INVALID_STATE with the reason.
void check_context(gtp_context& ctx);

// Runs the part of a collective-issuing entry point that reaches the runtime: a failure there fails
// the context, except misuse refused before anything was enqueued (the C ABI's and the runtime's
// argument and call-order checks: std::logic_error other than remat::WorkError), which leaves it
// usable. Success marks its collectives for the watchdog.
template <typename Body>
void issuing(gtp_context& ctx, const char* call, cudaStream_t stream, Body&& body) {
  try {
    body();
    mark_collectives(ctx, call, stream);
  } catch (const remat::WorkError& e) {
    fail_context(ctx, call, e.what());
    throw;
  } catch (const std::logic_error&) {
    throw;
  } catch (const std::exception& e) {
    fail_context(ctx, call, e.what());
    throw;
  } catch (...) {
    fail_context(ctx, call, "unknown exception");
    throw;
  }
}

remat::WeightId id_of(const gtp_context_t& ctx, gtp_weight_t w);

// The ids of ws[0..n), each listed once.
std::vector<remat::WeightId> ids_of(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n);

// Calls that allocate, free or re-pack cannot become part of a CUDA graph: refused, with nothing done,
// while `stream` is captured or a capture has joined the context's side streams.
void refuse_under_capture(gtp_context& ctx, const char* call, cudaStream_t stream = nullptr);

}  // namespace gtp::cabi
