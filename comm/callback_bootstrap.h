// A Bootstrap over callbacks a framework supplies through the C vtable of bootstrap_callbacks.h.
#pragma once

#include <chrono>

#include "comm/bootstrap.h"
#include "comm/bootstrap_callbacks.h"

namespace gtp::comm {

class CallbackBootstrap : public Bootstrap {
 public:
  // Validates the vtable (size, version, rank, world size, non-null callbacks) and keeps a copy;
  // `timeout` is passed to every callback.
  CallbackBootstrap(const gtp_bootstrap_callbacks_t& callbacks, std::chrono::milliseconds timeout);

  int rank() const override { return callbacks_.rank; }
  int world_size() const override { return callbacks_.world_size; }
  void allgather(const void* send, void* recv, std::size_t bytes_per_rank) override;
  void broadcast(void* buffer, std::size_t bytes, int root) override;
  void barrier() override;

 private:
  void check(gtp_bootstrap_result_t result, const char* operation) const;

  gtp_bootstrap_callbacks_t callbacks_;
  std::chrono::milliseconds timeout_;
};

}  // namespace gtp::comm
