// Bootstrap over a UCX client-server rendezvous: rank 0 listens on host:port through a UCX listener,
// every other rank connects to it; collectives run through rank 0 (a star), which is plenty for the
// few small buffers a bootstrap carries. See docs/comm.md for the environment and the UCX defaults.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/bootstrap.h"

namespace gtp::comm {

struct UcxBootstrapConfig {
  int rank = -1;
  int world_size = -1;
  std::string root_host;  // a name or address every rank can reach
  int root_port = -1;     // 0 on rank 0 listens on a free port; root_port() reports which
  std::chrono::milliseconds timeout{60000};

  // GTP_RANK, GTP_WORLD_SIZE, GTP_ROOT_ADDR=host:port, each falling back to torchrun's RANK, WORLD_SIZE,
  // MASTER_ADDR + MASTER_PORT; GTP_BOOTSTRAP_TIMEOUT in seconds (default 60). Throws
  // std::invalid_argument naming the variable that is missing or malformed.
  static UcxBootstrapConfig from_env();
};

class UcxBootstrap : public Bootstrap {
 public:
  // Returns once every rank has joined (rank 0) or been accepted (other ranks). Throws CommError when
  // the root cannot be reached or a rank does not join within the timeout, std::invalid_argument when
  // the ranks disagree on the world size or two ranks claim the same rank.
  explicit UcxBootstrap(const UcxBootstrapConfig& config);
  // Collective unless the job failed: waits (at most the timeout) for every peer's goodbye.
  ~UcxBootstrap() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int root_port() const { return root_port_; }

  void allgather(const void* send, void* recv, std::size_t bytes_per_rank) override;
  void broadcast(void* buffer, std::size_t bytes, int root) override;
  void barrier() override;

 private:
  struct Ucx;
  void join_as_root(const std::string& where);
  void join_as_client(const std::string& where);
  void gather_and_release(const char* operation, const void* send, void* recv, std::size_t bytes_per_rank);

  int rank_;
  int world_size_;
  int root_port_;
  std::uint64_t sequence_ = 0;
  std::unique_ptr<Ucx> ucx_;
};

}  // namespace gtp::comm
