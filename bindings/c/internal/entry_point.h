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

// How std::invalid_argument from the runtime is reported: release and finalize raise it only for
// call-order misuse once their handles and arguments have been checked here.
enum class InvalidArgumentIs { kArgument, kState };

// Runs an entry point's body: every exception is caught and mapped to a gtp_status_t (docs/c-abi.md).
template <typename Body>
gtp_status_t guarded(gtp_context_t* ctx, const char* call, Body&& body,
                     InvalidArgumentIs invalid = InvalidArgumentIs::kArgument) {
  std::string* error = ctx != nullptr ? &ctx->last_error : &context_free_error();
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

remat::WeightId id_of(const gtp_context_t& ctx, gtp_weight_t w);

// The ids of ws[0..n), each listed once.
std::vector<remat::WeightId> ids_of(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n);

// Calls that allocate, free or re-pack cannot become part of a CUDA graph: refused, with nothing done,
// while `stream` is captured or a capture has joined the context's side streams.
void refuse_under_capture(gtp_context& ctx, const char* call, cudaStream_t stream = nullptr);

}  // namespace gtp::cabi
