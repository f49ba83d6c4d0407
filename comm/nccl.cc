#include "comm/nccl.h"

#include <cuda_runtime_api.h>

#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

#include "comm/errors.h"

namespace gtp::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Finalizing flushes outstanding work; a peer that stopped participating must not hold us forever.
constexpr std::chrono::milliseconds kFinalizeTimeout{30000};

std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

// `name` (config.comm_name, kept by the communicator) must outlive it.
ncclConfig_t to_nccl(const NcclGroupConfig& config, const std::string& name) {
  ncclConfig_t nccl = NCCL_CONFIG_INITIALIZER;
  nccl.blocking = 0;
  if (config.cga_cluster_size >= 0) nccl.cgaClusterSize = config.cga_cluster_size;
  if (config.min_ctas >= 0) nccl.minCTAs = config.min_ctas;
  if (config.max_ctas >= 0) nccl.maxCTAs = config.max_ctas;
  if (!config.net_name.empty()) nccl.netName = config.net_name.c_str();
  if (!name.empty()) nccl.commName = name.c_str();
  return nccl;
}

void check_config(const NcclGroupConfig& config) {
  if (config.min_ctas > 0 && config.max_ctas > 0 && config.min_ctas > config.max_ctas) {
    throw std::invalid_argument("NCCL config of group \"" + config.comm_name + "\": min_ctas " +
                                std::to_string(config.min_ctas) + " exceeds max_ctas " +
                                std::to_string(config.max_ctas) + ": lower min_ctas or raise max_ctas");
  }
}

// Waits until a non-blocking NCCL operation on `comm` has finished; aborts `comm` and throws on
// error or timeout.
void wait_ready(ncclComm_t comm, ncclResult_t issued, Clock::time_point deadline, const std::string& what) {
  ncclResult_t state = issued;
  while (state == ncclInProgress) {
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm);
      throw CommError(what + " did not complete within the timeout; the communicator was aborted (a rank is "
                             "missing or stuck: check that every rank makes the same calls)",
                      true);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const ncclResult_t polled = ncclCommGetAsyncError(comm, &state);
    if (polled != ncclSuccess) state = polled;
  }
  if (state != ncclSuccess) {
    const std::string detail = nccl_text(state, comm);
    ncclCommAbort(comm);
    throw CommError(what + " failed: " + detail, false);
  }
}

void require_cuda_device() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    throw CommError(std::string("NCCL needs a CUDA device, and there is none: ") +
                        (error != cudaSuccess ? cudaGetErrorString(error) : "cudaGetDeviceCount returned 0"),
                    false);
  }
}

}  // namespace

SplitAssignment split_assignment(const std::vector<std::vector<int>>& groups, int rank, int parent_size) {
  SplitAssignment assignment{NCCL_SPLIT_NOCOLOR, 0};
  std::set<int> seen;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) {
      throw std::invalid_argument("split group " + std::to_string(g) + " is empty: drop it or give it ranks");
    }
    for (std::size_t position = 0; position < groups[g].size(); ++position) {
      const int member = groups[g][position];
      if (member < 0 || member >= parent_size) {
        throw std::invalid_argument("split group " + std::to_string(g) + " lists rank " + std::to_string(member) +
                                    ", outside the parent communicator's [0, " + std::to_string(parent_size) +
                                    "): list parent ranks only");
      }
      if (!seen.insert(member).second) {
        throw std::invalid_argument("rank " + std::to_string(member) + " is listed twice (again in split group " +
                                    std::to_string(g) + "): every rank may belong to at most one group of a split");
      }
      if (member == rank) assignment = {static_cast<int>(g), static_cast<int>(position)};
    }
  }
  return assignment;
}

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      owned_(std::exchange(other.owned_, false)),
      name_(std::move(other.name_)) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, nullptr);
    owned_ = std::exchange(other.owned_, false);
    name_ = std::move(other.name_);
  }
  return *this;
}

NcclComm::~NcclComm() { release(); }

void NcclComm::release() {
  if (comm_ == nullptr) return;
  if (owned_) {
    ncclResult_t state = ncclSuccess;
    const bool healthy = ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
    bool finalized = false;
    if (healthy) {
      ncclResult_t result = ncclCommFinalize(comm_);
      const auto deadline = Clock::now() + kFinalizeTimeout;
      while (result == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (ncclCommGetAsyncError(comm_, &result) != ncclSuccess) break;
      }
      finalized = result == ncclSuccess;
    }
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  comm_ = nullptr;
  owned_ = false;
  name_.reset();  // only once NCCL is done with the communicator
}

NcclComm NcclComm::create_world(Bootstrap& bootstrap, std::chrono::milliseconds timeout,
                                const NcclGroupConfig& config) {
  check_config(config);
  require_cuda_device();
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      throw CommError(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(result), false);
    }
  }
  bootstrap.broadcast(&id, sizeof(id), 0);
  auto name = std::make_unique<std::string>(config.comm_name);
  ncclConfig_t nccl = to_nccl(config, *name);
  ncclComm_t comm = nullptr;
  const auto deadline = deadline_after(timeout);
  const ncclResult_t issued = ncclCommInitRankConfig(&comm, bootstrap.world_size(), id, bootstrap.rank(), &nccl);
  if (comm == nullptr) {
    throw CommError(std::string("ncclCommInitRankConfig failed: ") + ncclGetErrorString(issued), false);
  }
  wait_ready(comm, issued == ncclSuccess ? ncclInProgress : issued, deadline,
             "NCCL world communicator init (rank " + std::to_string(bootstrap.rank()) + " of " +
                 std::to_string(bootstrap.world_size()) + ")");
  return NcclComm(comm, true, std::move(name));
}

NcclComm NcclComm::borrow(ncclComm_t comm) {
  if (comm == nullptr) throw std::invalid_argument("cannot borrow a null ncclComm_t: pass an initialized communicator");
  return NcclComm(comm, false);
}

NcclComm NcclComm::split(const std::vector<std::vector<int>>& groups, const NcclGroupConfig& config,
                         std::chrono::milliseconds timeout) const {
  if (comm_ == nullptr) throw std::invalid_argument("split called on an empty NcclComm: split a valid communicator");
  check_config(config);
  const SplitAssignment assignment = split_assignment(groups, rank(), size());
  auto name = std::make_unique<std::string>(config.comm_name);
  ncclConfig_t nccl = to_nccl(config, *name);
  ncclComm_t child = nullptr;
  const auto deadline = deadline_after(timeout);
  // Built before the split: while a non-blocking split is in flight the parent answers
  // ncclInProgress to every query, rank() included.
  const std::string what = "ncclCommSplit into group " + std::to_string(assignment.color) + " (\"" +
                           config.comm_name + "\", rank " + std::to_string(rank()) + ")";
  const ncclResult_t issued = ncclCommSplit(comm_, assignment.color, assignment.key, &child, &nccl);
  if (issued != ncclSuccess && issued != ncclInProgress) {
    throw CommError(what + " failed: " + nccl_text(issued, comm_), false);
  }
  // The parent is non-blocking as well: its own state tells when the split finished.
  ncclResult_t parent_state = ncclInProgress;
  while (parent_state == ncclInProgress && Clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm_, &parent_state) != ncclSuccess) break;
    if (parent_state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (child == nullptr) {
    if (parent_state != ncclSuccess) {
      throw CommError(what + " failed on the parent: " + nccl_text(parent_state, comm_), parent_state == ncclInProgress);
    }
    return NcclComm();
  }
  wait_ready(child, ncclInProgress, deadline, what);
  return NcclComm(child, true, std::move(name));
}

int NcclComm::rank() const {
  int rank = -1;
  if (comm_ == nullptr || ncclCommUserRank(comm_, &rank) != ncclSuccess) {
    throw std::invalid_argument("rank() of an empty or failed NcclComm: check valid() first");
  }
  return rank;
}

int NcclComm::size() const {
  int count = 0;
  if (comm_ == nullptr || ncclCommCount(comm_, &count) != ncclSuccess) {
    throw std::invalid_argument("size() of an empty or failed NcclComm: check valid() first");
  }
  return count;
}

void NcclComm::check_async_error() {
  if (comm_ == nullptr) return;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t polled = ncclCommGetAsyncError(comm_, &state);
  if (polled != ncclSuccess) state = polled;
  if (state == ncclSuccess || state == ncclInProgress) return;
  const std::string detail = nccl_text(state, comm_);
  abort();
  throw CommError("NCCL reported an asynchronous error: " + detail + "; the communicator was aborted", false);
}

void NcclComm::wait_enqueued(std::chrono::milliseconds timeout) {
  if (comm_ == nullptr) return;
  const auto deadline = deadline_after(timeout);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    const ncclResult_t polled = ncclCommGetAsyncError(comm_, &state);
    if (polled != ncclSuccess) state = polled;
    if (state != ncclInProgress) break;
    if (Clock::now() >= deadline) {
      abort();
      throw CommError("NCCL operation still not enqueued after the timeout; the communicator was aborted", true);
    }
    std::this_thread::yield();
  }
  check_async_error();
}

void NcclComm::abort() {
  if (comm_ != nullptr && owned_) ncclCommAbort(comm_);
  comm_ = nullptr;
  owned_ = false;
  name_.reset();
}

}  // namespace gtp::comm
