// Bootstrap: the out-of-band exchange of small byte buffers among the ranks of a job (NCCL unique id,
// topology records, worker addresses). Three implementations share this interface: UcxBootstrap
// (client-server rendezvous, ucx_bootstrap.h), CallbackBootstrap (framework-supplied C callbacks,
// callback_bootstrap.h) and ThreadBootstrap (in-process threads, thread_bootstrap.h).
//
// Contract for every implementation: all ranks call the same collectives in the same order; each call
// either completes, or throws within the bootstrap's timeout (CommError for peer or environment failures,
// std::invalid_argument when ranks pass inconsistent arguments). One thread at a time per object.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace gtp::comm {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Every rank contributes `bytes_per_rank` bytes from `send`; `recv` receives world_size() * bytes_per_rank
  // bytes, rank r's contribution at offset r * bytes_per_rank. `send` may alias rank()'s slot in `recv`.
  virtual void allgather(const void* send, void* recv, std::size_t bytes_per_rank) = 0;

  // Copies `bytes` bytes of `root`'s `buffer` into every other rank's `buffer`.
  virtual void broadcast(void* buffer, std::size_t bytes, int root) = 0;

  virtual void barrier() = 0;

  // Gathers one record of any size per rank (for example a topology JSON record), in rank order.
  std::vector<std::string> allgather_records(const std::string& record);

 protected:
  // Throws std::invalid_argument naming `root` and the valid range.
  void check_root(int root) const;
};

// Reads a timeout in seconds (for example "30" or "2.5") from environment variable `name`;
// returns `fallback` when it is unset.
std::chrono::milliseconds timeout_from_env(const char* name, std::chrono::milliseconds fallback);

}  // namespace gtp::comm
