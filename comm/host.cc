#include "comm/host.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/internal/bf16.h"
#include "comm/internal/ucx_peers.h"

namespace gtp::comm {

using internal::MessageKind;

namespace {

// Tag sequence = collective number (24 bits, wraps harmlessly) then step within it (16 bits); the
// longest collective (all_reduce_max) takes 2 * (ranks - 1) steps.
constexpr int kMaxHostRanks = 1 << 15;

int mod(int value, int n) { return ((value % n) + n) % n; }

float nan_max(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return a > b ? a : b;
}

// Chunk i of `count` elements split over n ranks as evenly as possible.
std::size_t chunk_begin(std::size_t count, int n, int i) {
  return (count / n) * i + std::min<std::size_t>(i, count % n);
}

}  // namespace

HostComm::HostComm(Bootstrap& bootstrap, std::chrono::milliseconds timeout, const std::string& label)
    : rank_(bootstrap.rank()), size_(bootstrap.world_size()) {
  if (size_ > kMaxHostRanks) {
    throw std::invalid_argument("host comm supports at most " + std::to_string(kMaxHostRanks) + " ranks, not " +
                                std::to_string(size_) + ": use NCCL for jobs this large");
  }
  if (timeout.count() <= 0) {
    throw std::invalid_argument("host comm timeout " + std::to_string(timeout.count()) +
                                " ms: pass a positive timeout");
  }
  worker_ = std::make_unique<internal::UcxWorker>();
  peers_ = std::make_unique<internal::UcxPeers>(*worker_, rank_, label, timeout);
  const std::vector<std::string> addresses = bootstrap.allgather_records(worker_->address());
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(addresses[r].data());
    try {
      peers_->add(r, internal::create_endpoint(worker_->handle(), params));
    } catch (const CommError& e) {
      // Rank r published its address and left: the ranks connected so far must not wait for this one.
      const std::string message = label + ": rank " + std::to_string(rank_) + " cannot connect to rank " +
                                  std::to_string(r) + " (" + e.what() +
                                  "): it exited or crashed after the address exchange; see its output";
      peers_->abort_job(message);
      throw CommError(message, false);
    }
  }
}

HostComm::~HostComm() {
  peers_.reset();  // closes the endpoints before the worker goes
}

void HostComm::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    throw std::invalid_argument("host comm timeout " + std::to_string(timeout.count()) +
                                " ms: pass a positive timeout");
  }
  peers_->set_timeout(timeout);
}

void HostComm::abort(const std::string& reason) noexcept { peers_->abort_job(reason); }

std::uint64_t HostComm::next_sequence() {
  peers_->check_usable();
  return (++collectives_ & 0xFFFFFF) << 16;
}

void HostComm::all_gather(const void* send, void* recv, std::size_t bytes_per_rank) {
  const std::uint64_t sequence = next_sequence();
  const auto deadline = peers_->deadline_from_now();
  auto* out = static_cast<unsigned char*>(recv);
  if (bytes_per_rank > 0) std::memmove(out + rank_ * bytes_per_rank, send, bytes_per_rank);
  const int left = mod(rank_ - 1, size_);
  const int right = mod(rank_ + 1, size_);
  // Step s forwards the chunk received at step s-1: after size-1 steps every rank has every chunk.
  for (int step = 0; step < size_ - 1; ++step) {
    const int send_chunk = mod(rank_ - step, size_);
    const int recv_chunk = mod(rank_ - step - 1, size_);
    peers_->send(right, MessageKind::kData, sequence + step, "all_gather", out + send_chunk * bytes_per_rank,
                 bytes_per_rank);
    peers_->recv(left, MessageKind::kData, sequence + step, "all_gather", out + recv_chunk * bytes_per_rank,
                 bytes_per_rank, deadline);
    peers_->wait_sends(deadline);
  }
}

void HostComm::reduce_scatter(const void* send, void* recv, std::size_t recv_count, HostDataType type,
                              HostReduceOp op) {
  const std::uint64_t sequence = next_sequence();
  const auto deadline = peers_->deadline_from_now();
  const bool bf16 = type == HostDataType::kBFloat16;
  // Type and op are part of the name, so ranks that disagree on them fail instead of mixing data.
  const std::string operation = std::string("reduce_scatter(") + (bf16 ? "bf16" : "fp32") +
                                (op == HostReduceOp::kMean ? ",mean)" : ",sum)");
  auto input = [&](int chunk, std::size_t i) {
    const std::size_t index = chunk * recv_count + i;
    return bf16 ? internal::bf16_to_float(static_cast<const std::uint16_t*>(send)[index])
                : static_cast<const float*>(send)[index];
  };
  const int left = mod(rank_ - 1, size_);
  const int right = mod(rank_ + 1, size_);
  // Ring: at step s this rank sends its partial sum of chunk rank-1-s and adds its own contribution
  // to the partial of chunk rank-2-s from the left; after size-1 steps it holds the sum of chunk rank.
  std::vector<float> partial(recv_count), incoming(recv_count);
  for (std::size_t i = 0; i < recv_count; ++i) partial[i] = input(mod(rank_ - 1, size_), i);
  for (int step = 0; step < size_ - 1; ++step) {
    const int chunk = mod(rank_ - step - 2, size_);
    peers_->send(right, MessageKind::kData, sequence + step, operation.c_str(), partial.data(),
                 recv_count * sizeof(float));
    peers_->recv(left, MessageKind::kData, sequence + step, operation.c_str(), incoming.data(),
                 recv_count * sizeof(float), deadline);
    peers_->wait_sends(deadline);
    for (std::size_t i = 0; i < recv_count; ++i) incoming[i] += input(chunk, i);
    partial.swap(incoming);
  }
  const float ranks = static_cast<float>(size_);
  for (std::size_t i = 0; i < recv_count; ++i) {
    const float value = op == HostReduceOp::kMean ? partial[i] / ranks : partial[i];
    if (bf16) {
      static_cast<std::uint16_t*>(recv)[i] = internal::float_to_bf16(value);
    } else {
      static_cast<float*>(recv)[i] = value;
    }
  }
}

void HostComm::all_reduce_max(float* data, std::size_t count) {
  const std::uint64_t sequence = next_sequence();
  const auto deadline = peers_->deadline_from_now();
  const int left = mod(rank_ - 1, size_);
  const int right = mod(rank_ + 1, size_);
  auto begin = [&](int chunk) { return chunk_begin(count, size_, chunk); };
  auto length = [&](int chunk) { return begin(chunk + 1) - begin(chunk); };
  // The count is part of the name because uneven chunks may coincide in size across different counts.
  const std::string operation = "all_reduce_max(" + std::to_string(count) + ")";
  std::vector<float> incoming(count / size_ + 1);
  // Reduce-scatter of maxima (as in reduce_scatter), then a ring all-gather of the reduced chunks.
  for (int step = 0; step < size_ - 1; ++step) {
    const int send_chunk = mod(rank_ - step - 1, size_);
    const int recv_chunk = mod(rank_ - step - 2, size_);
    peers_->send(right, MessageKind::kData, sequence + step, operation.c_str(), data + begin(send_chunk),
                 length(send_chunk) * sizeof(float));
    peers_->recv(left, MessageKind::kData, sequence + step, operation.c_str(), incoming.data(),
                 length(recv_chunk) * sizeof(float), deadline);
    peers_->wait_sends(deadline);
    float* target = data + begin(recv_chunk);
    for (std::size_t i = 0; i < length(recv_chunk); ++i) target[i] = nan_max(target[i], incoming[i]);
  }
  for (int step = 0; step < size_ - 1; ++step) {
    const int send_chunk = mod(rank_ - step, size_);
    const int recv_chunk = mod(rank_ - step - 1, size_);
    const std::uint64_t tag = sequence + size_ - 1 + step;
    peers_->send(right, MessageKind::kData, tag, operation.c_str(), data + begin(send_chunk),
                 length(send_chunk) * sizeof(float));
    peers_->recv(left, MessageKind::kData, tag, operation.c_str(), data + begin(recv_chunk),
                 length(recv_chunk) * sizeof(float), deadline);
    peers_->wait_sends(deadline);
  }
}

void HostComm::barrier() {
  const std::uint64_t sequence = next_sequence();
  const auto deadline = peers_->deadline_from_now();
  // Dissemination barrier: after round k every rank has heard, directly or not, from 2^(k+1) ranks.
  int round = 0;
  for (int distance = 1; distance < size_; distance *= 2, ++round) {
    peers_->send(mod(rank_ + distance, size_), MessageKind::kData, sequence + round, "barrier", nullptr, 0);
    peers_->recv(mod(rank_ - distance, size_), MessageKind::kData, sequence + round, "barrier", nullptr, 0,
                 deadline);
    peers_->wait_sends(deadline);
  }
}

}  // namespace gtp::comm
