// Internal to the C ABI (bindings/c): the context object, the error types the entry points map to
// gtp_status_t, argument-check helpers, and context creation (context_create.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/group_bootstrap.h"
#include "comm/host.h"
#include "comm/nccl.h"
#include "gtp/gtp.h"
#include "kernels/wire_format.h"
#include "remat/backend.h"
#include "remat/runtime.h"
#include "topology/arithmetic.h"

namespace gtp::cabi {

// Misuse of call order or handle lifetime: GTP_ERROR_INVALID_STATE.
class StateError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A failure with an explicit status (version mismatch, CUDA unavailable).
class StatusError : public std::runtime_error {
 public:
  StatusError(gtp_status_t status, const std::string& message) : std::runtime_error(message), status(status) {}
  gtp_status_t status;
};

// A C enum's value as an int, read without an enum-typed load: C callers may pass any int, which
// would be undefined behaviour to load as a C++ enum whose values do not cover it.
template <typename Enum>
int as_int(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized");
  int result;
  std::memcpy(&result, &value, sizeof(result));
  return result;
}

inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

inline void check_struct_size(size_t given, size_t expected, const char* type) {
  require(given == expected, std::string(type) + ".struct_size is " + std::to_string(given) + " but this library expects " +
                                 std::to_string(expected) + "; initialize it with the header's *_INITIALIZER");
}

// Bounds that keep hostile values from becoming huge allocations (docs/reliability.md).
inline constexpr std::size_t kMaxTraceSpans = std::size_t{1} << 24;
inline constexpr std::int32_t kMaxModelChunks = 1024;

// gtp_context_create: checks the config, bootstraps, builds the grid's groups on the chosen backend
// and the runtime; *out only on success.
void create_context(const gtp_context_config_t* config, gtp_context_t** out);

}  // namespace gtp::cabi

struct gtp_context {
  std::uint64_t generation = 0;
  // The call in progress (docs/c-abi.md, Thread safety): another is refused while it runs, except
  // that reads (stats, trace) wait for a call and calls wait for a read; nothing below is touched
  // by two threads at once. Guarded by call_mutex.
  std::mutex call_mutex;
  std::condition_variable call_done;
  const char* call_in_progress = nullptr;
  std::thread::id call_thread;
  bool call_is_read = false;
  // How long a call waits for another (the config's timeout_ms): a read from a CUDA host-function
  // callback waiting for a drain that waits for that callback fails instead of deadlocking.
  std::chrono::milliseconds call_wait{0};
  // gtp_last_error(ctx), per calling thread: a refused call cannot overwrite the running call's
  // message, and std::map's nodes stay put while other threads add theirs.
  std::mutex errors_mutex;
  std::map<std::thread::id, std::string> last_errors;
  std::atomic<bool> aborted{false};  // set by gtp_context_abort from any thread, or by a failure
  std::string failure;  // why the context failed (fail_context); guarded by errors_mutex
  std::chrono::milliseconds call_timeout{0};  // the deadline of each collective (gtp_context_check)
  // Whether calls record watchdog marks: CUDA with call_timeout_ms set (each mark is an event record).
  bool watch_collectives = false;
  // Watchdog marks (gtp_context_check): per side stream, events recorded at the end of calls that
  // issued collectives, oldest first, with when and by which call; CUDA only (host work is done).
  struct Mark {
    gtp::remat::Event event;
    std::chrono::steady_clock::time_point issued;
    const char* call;
    int group;
  };
  std::vector<std::vector<Mark>> marks;  // [2 * group + role]
  int rank = 0;
  gtp::topology::ParallelSizes sizes;
  gtp::kernels::WireSpec group_wire[2] = {};  // GTP_WIRE_FROM_GROUP, by gtp_group_t
  std::int64_t registered = 0;  // weights registered now: no call can list more
  gtp_grad_ready_fn grad_ready = nullptr;
  void* grad_ready_user_data = nullptr;
  // Destroyed bottom-up: the runtime before its backend, the backend before its communicators and
  // streams, the communicators before the bootstraps they were built over.
  std::unique_ptr<gtp::comm::Bootstrap> bootstrap;
  std::vector<std::unique_ptr<gtp::comm::GroupBootstrap>> group_bootstraps;  // host: one per grid group
  std::vector<std::unique_ptr<gtp::comm::HostComm>> host_comms;               // host: one per distinct group
  std::unique_ptr<gtp::comm::NcclComm> nccl_world;                            // cuda
  std::vector<std::unique_ptr<gtp::comm::NcclComm>> nccl_groups;              // cuda: one per distinct group
  std::vector<std::unique_ptr<gtp::comm::NcclComm>> nccl_reduce_scatter;      // cuda: a copy of each, split from it
  std::unique_ptr<gtp::remat::Backend> backend;
  std::unique_ptr<gtp::remat::Runtime> runtime;
};
