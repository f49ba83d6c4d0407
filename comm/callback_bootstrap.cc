#include "comm/callback_bootstrap.h"

#include <stdexcept>
#include <string>

#include "comm/errors.h"

namespace gtp::comm {

CallbackBootstrap::CallbackBootstrap(const gtp_bootstrap_callbacks_t& callbacks, std::chrono::milliseconds timeout)
    : callbacks_(callbacks), timeout_(timeout) {
  if (callbacks.struct_size < sizeof(gtp_bootstrap_callbacks_t)) {
    throw std::invalid_argument("bootstrap callbacks struct_size " + std::to_string(callbacks.struct_size) +
                                " is smaller than this library's " + std::to_string(sizeof(gtp_bootstrap_callbacks_t)) +
                                ": set struct_size = sizeof(gtp_bootstrap_callbacks_t)");
  }
  if (callbacks.version != GTP_BOOTSTRAP_CALLBACKS_VERSION) {
    throw std::invalid_argument("bootstrap callbacks version " + std::to_string(callbacks.version) +
                                " is not supported: set version = GTP_BOOTSTRAP_CALLBACKS_VERSION (" +
                                std::to_string(GTP_BOOTSTRAP_CALLBACKS_VERSION) + ")");
  }
  if (callbacks.world_size < 1 || callbacks.rank < 0 || callbacks.rank >= callbacks.world_size) {
    throw std::invalid_argument("bootstrap callbacks rank " + std::to_string(callbacks.rank) + " / world_size " +
                                std::to_string(callbacks.world_size) +
                                " are inconsistent: world_size must be >= 1 and rank in [0, world_size)");
  }
  if (callbacks.allgather == nullptr || callbacks.broadcast == nullptr || callbacks.barrier == nullptr) {
    throw std::invalid_argument("bootstrap callbacks allgather, broadcast and barrier must all be set (non-NULL)");
  }
  if (timeout.count() <= 0) {
    throw std::invalid_argument("bootstrap timeout " + std::to_string(timeout.count()) + " ms: pass a positive timeout");
  }
}

void CallbackBootstrap::check(gtp_bootstrap_result_t result, const char* operation) const {
  if (result == GTP_BOOTSTRAP_OK) return;
  std::string message = std::string("bootstrap callback ") + operation + " on rank " + std::to_string(rank()) +
                        (result == GTP_BOOTSTRAP_TIMEOUT ? " timed out after " + std::to_string(timeout_.count()) + " ms"
                                                         : " failed (code " + std::to_string(result) + ")");
  const char* detail = callbacks_.last_error != nullptr ? callbacks_.last_error(callbacks_.user_data) : nullptr;
  if (detail != nullptr && *detail != '\0') message += std::string(": ") + detail;
  throw CommError(message, result == GTP_BOOTSTRAP_TIMEOUT);
}

void CallbackBootstrap::allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  check(callbacks_.allgather(callbacks_.user_data, send, recv, bytes_per_rank, timeout_.count()), "allgather");
}

void CallbackBootstrap::broadcast(void* buffer, std::size_t bytes, int root) {
  check_root(root);
  check(callbacks_.broadcast(callbacks_.user_data, buffer, bytes, root, timeout_.count()), "broadcast");
}

void CallbackBootstrap::barrier() { check(callbacks_.barrier(callbacks_.user_data, timeout_.count()), "barrier"); }

}  // namespace gtp::comm
