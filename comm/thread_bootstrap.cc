#include "comm/thread_bootstrap.h"

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "comm/errors.h"

namespace gtp::comm {
namespace {

enum class Operation { kAllgather, kBroadcast, kBarrier };

const char* operation_name(Operation op) {
  switch (op) {
    case Operation::kAllgather: return "allgather";
    case Operation::kBroadcast: return "broadcast";
    case Operation::kBarrier: return "barrier";
  }
  return "?";
}

// One collective: the first rank to arrive fixes its signature, later ranks must match it.
struct Round {
  Operation op;
  std::size_t bytes;
  int root;
  std::vector<unsigned char> data;  // allgather: all contributions; broadcast: the root's buffer
  std::vector<bool> arrived_ranks;
  int arrived = 0;
  int departed = 0;
  std::string error;  // set once the round failed; every waiting rank then throws it
  bool error_is_invalid_argument = false;
};

}  // namespace

struct ThreadBootstrap::Shared {
  int world_size;
  std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::uint64_t, Round> rounds;
  std::vector<bool> left;  // ranks whose object was destroyed
};

std::vector<std::unique_ptr<ThreadBootstrap>> ThreadBootstrap::create_group(int world_size,
                                                                            std::chrono::milliseconds timeout) {
  if (world_size < 1) {
    throw std::invalid_argument("thread bootstrap world size " + std::to_string(world_size) + ": pass at least 1");
  }
  if (timeout.count() <= 0) {
    throw std::invalid_argument("thread bootstrap timeout " + std::to_string(timeout.count()) +
                                " ms: pass a positive timeout");
  }
  auto shared = std::make_shared<Shared>();
  shared->world_size = world_size;
  shared->timeout = timeout;
  shared->left.assign(world_size, false);
  std::vector<std::unique_ptr<ThreadBootstrap>> group;
  for (int r = 0; r < world_size; ++r) group.emplace_back(new ThreadBootstrap(shared, r));
  return group;
}

ThreadBootstrap::ThreadBootstrap(std::shared_ptr<Shared> shared, int rank) : shared_(std::move(shared)), rank_(rank) {}

ThreadBootstrap::~ThreadBootstrap() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->left[rank_] = true;
  shared_->changed.notify_all();
}

int ThreadBootstrap::world_size() const { return shared_->world_size; }

namespace {

// Runs one collective for `rank`: deposits its part, waits for every rank, copies the result out.
void run_round(ThreadBootstrap::Shared& shared, std::uint64_t sequence, int rank, Operation op, const void* send,
               void* recv, std::size_t bytes, int root) {
  const int n = shared.world_size;
  const auto deadline = deadline_after(shared.timeout);
  std::unique_lock<std::mutex> lock(shared.mutex);
  auto [it, created] = shared.rounds.try_emplace(sequence);
  Round& round = it->second;
  if (created) {
    round.op = op;
    round.bytes = bytes;
    round.root = root;
    round.data.resize(op == Operation::kAllgather ? bytes * n : bytes);
    round.arrived_ranks.assign(n, false);
  }
  const std::string where = std::string(operation_name(op)) + " #" + std::to_string(sequence) + " on rank " +
                            std::to_string(rank);
  if (round.error.empty() && (round.op != op || round.bytes != bytes || round.root != root)) {
    round.error = where + " does not match what another rank called (" + operation_name(round.op) + " of " +
                  std::to_string(round.bytes) + " bytes, root " + std::to_string(round.root) + " vs " +
                  std::to_string(bytes) + " bytes, root " + std::to_string(root) +
                  "): every rank must call the same collectives with the same sizes in the same order";
    round.error_is_invalid_argument = true;
  }
  if (round.error.empty()) {
    // bytes == 0 allows null buffers, which memcpy must not see.
    if (op == Operation::kAllgather && bytes > 0) std::memcpy(round.data.data() + rank * bytes, send, bytes);
    if (op == Operation::kBroadcast && rank == root && bytes > 0) std::memcpy(round.data.data(), send, bytes);
    round.arrived_ranks[rank] = true;
    ++round.arrived;
  }
  shared.changed.notify_all();

  auto missing_ranks = [&] {
    std::string missing;
    for (int r = 0; r < n; ++r) {
      if (!round.arrived_ranks[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    return missing;
  };
  while (round.error.empty() && round.arrived < n) {
    for (int r = 0; r < n; ++r) {
      if (shared.left[r] && !round.arrived_ranks[r]) {
        round.error = where + " failed: rank " + std::to_string(r) + " left the job before taking part";
      }
    }
    if (!round.error.empty()) break;
    if (shared.changed.wait_until(lock, deadline) == std::cv_status::timeout && round.arrived < n) {
      throw CommError(where + " timed out after " + std::to_string(shared.timeout.count()) +
                          " ms waiting for rank(s) " + missing_ranks(),
                      true);
    }
  }
  if (!round.error.empty()) {
    shared.changed.notify_all();
    if (round.error_is_invalid_argument) throw std::invalid_argument(round.error);
    throw CommError(round.error, false);
  }
  if (op != Operation::kBarrier && !(op == Operation::kBroadcast && rank == root) && !round.data.empty()) {
    std::memcpy(recv, round.data.data(), round.data.size());
  }
  if (++round.departed == n) shared.rounds.erase(it);
}

}  // namespace

void ThreadBootstrap::allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  run_round(*shared_, sequence_++, rank_, Operation::kAllgather, send, recv, bytes_per_rank, 0);
}

void ThreadBootstrap::broadcast(void* buffer, std::size_t bytes, int root) {
  check_root(root);
  run_round(*shared_, sequence_++, rank_, Operation::kBroadcast, buffer, buffer, bytes, root);
}

void ThreadBootstrap::barrier() { run_round(*shared_, sequence_++, rank_, Operation::kBarrier, nullptr, nullptr, 0, 0); }

}  // namespace gtp::comm
