#include "comm/internal/ucx_peers.h"

#include <poll.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "comm/errors.h"

namespace gtp::comm::internal {
namespace {

constexpr std::uint64_t kFullMask = ~std::uint64_t{0};
constexpr std::uint64_t kKindMask = std::uint64_t{0xF} << 40;
// Aborts and goodbyes are best effort: never wait longer than this for them.
constexpr std::chrono::milliseconds kBestEffortWait{1000};
// How long a rank that saw a peer vanish waits for an ABORT explaining why.
constexpr std::chrono::milliseconds kAbortGrace{300};

std::uint64_t make_tag(int src, MessageKind kind, std::uint64_t sequence) {
  return (static_cast<std::uint64_t>(src) << 44) | (static_cast<std::uint64_t>(kind) << 40) | (sequence & kSequenceMask);
}

int tag_sender(std::uint64_t tag) { return static_cast<int>(tag >> 44); }

struct MessageHeader {
  std::uint64_t payload_bytes;
  char operation[24];
};

std::string seconds_text(std::chrono::milliseconds ms) {
  std::string text = std::to_string(ms.count() / 1000.0);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text + " s";
}

void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<Endpoint*>(arg)->failure = status; }

[[noreturn]] void throw_for(AbortKind kind, const std::string& message) {
  if (kind == AbortKind::kInvalidArgument) throw std::invalid_argument(message);
  throw CommError(message, kind == AbortKind::kTimeout);
}

}  // namespace

std::string status_text(ucs_status_t status) { return ucs_status_string(status); }

UcxWorker::UcxWorker() {
  // A root listening again on the port of an earlier job of this process (gtp-overlap-bench bootstraps
  // every configuration on GTP_ROOT_ADDR) fails while that job's connections sit in TIME_WAIT, unless
  // the listener sets SO_REUSEADDR. UCX 1.13 reads that from the environment only (ucp_config_modify
  // does not reach its connection manager), so it is set once, before the first UCX context; a value
  // the user set wins.
  static std::once_flag reuse_address;
  std::call_once(reuse_address, [] { setenv("UCX_TCP_CM_REUSEADDR", "y", 0); });
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) throw CommError("UCX: cannot read its configuration: " + status_text(status), false);
  if (std::getenv("UCX_TLS") == nullptr) ucp_config_modify(config, "TLS", "tcp");

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) {
    throw CommError("UCX: ucp_init failed: " + status_text(status) + " (check the UCX_TLS / UCX_NET_DEVICES settings)",
                    false);
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status == UCS_OK) status = ucp_worker_get_efd(worker_, &event_fd_);
  if (status != UCS_OK) {
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    throw CommError("UCX: cannot create a worker: " + status_text(status), false);
  }
}

UcxWorker::~UcxWorker() {
  if (abandoned_) {
    // Kept reachable until exit, a deliberate keep. (LeakSanitizer still reports its endpoints'
    // records, which only UCX's mmap'd chunks point to: bindings/c/gtp_failure_test_lsan.supp.)
    static std::mutex mutex;
    static auto* kept = new std::vector<std::pair<ucp_context_h, ucp_worker_h>>();
    const std::lock_guard<std::mutex> lock(mutex);
    kept->emplace_back(context_, worker_);
    return;
  }
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

std::string UcxWorker::address() const {
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  const ucs_status_t status = ucp_worker_get_address(worker_, &address, &length);
  if (status != UCS_OK) throw CommError("UCX: cannot get the worker address: " + status_text(status), false);
  std::string packed(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker_, address);
  return packed;
}

void UcxWorker::progress_or_wait(std::chrono::milliseconds max_wait) {
  bool progressed = false;
  while (ucp_worker_progress(worker_) != 0) progressed = true;
  if (progressed || ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
  pollfd fd{event_fd_, POLLIN, 0};
  poll(&fd, 1, static_cast<int>(std::max<std::int64_t>(1, max_wait.count())));
}

std::unique_ptr<Endpoint> create_endpoint(ucp_worker_h worker, ucp_ep_params_t params) {
  auto endpoint = std::make_unique<Endpoint>();
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_endpoint_error;
  params.err_handler.arg = endpoint.get();
  const ucs_status_t status = ucp_ep_create(worker, &params, &endpoint->handle);
  if (status != UCS_OK) throw CommError("UCX: cannot create an endpoint: " + status_text(status), false);
  return endpoint;
}

void close_endpoint(UcxWorker& worker, Endpoint& endpoint, bool force, Clock::time_point deadline) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* request = ucp_ep_close_nbx(endpoint.handle, &param);
  if (UCS_PTR_IS_PTR(request)) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline) {
      worker.progress_or_wait(std::chrono::milliseconds(10));
    }
    // A flush that never finished (a transfer this rank gave up on, a peer that stopped progressing)
    // leaves the endpoint with requests: ucp_worker_destroy would abort the process on it.
    if (ucp_request_check_status(request) == UCS_INPROGRESS) worker.abandon();
    ucp_request_free(request);
  }
  endpoint.handle = nullptr;
}

struct UcxPeers::PendingSend {
  std::unique_ptr<std::string> message;  // header and payload
  void* request;
  int dst;
  MessageKind kind;
};

struct UcxPeers::Probed {
  ucp_tag_message_h message;
  ucp_tag_recv_info_t info;
};

UcxPeers::UcxPeers(UcxWorker& worker, int self_rank, std::string label, std::chrono::milliseconds timeout)
    : worker_(worker), self_rank_(self_rank), label_(std::move(label)), timeout_(timeout) {}

UcxPeers::~UcxPeers() {
  if (failure_.empty()) say_goodbye();
  // Messages nobody waited for are taken while their endpoints are open (a rendezvous one needs its
  // endpoint), then those that came during the close.
  discard_unexpected_messages();
  // Even after a failure, live endpoints are flushed rather than forced, sends still queued to a silent
  // peer included (a flush that cannot finish in time abandons the worker: close_endpoint). UCX 1.13's
  // tcp transport trips a fatal assertion (tcp_iface.c:307) in a peer that is progressing, as one
  // saying goodbye does, while its connection is force-closed mid-traffic. A transfer this rank gave
  // up on is the exception: only a forced close purges its request.
  const auto deadline = Clock::now() + kBestEffortWait;
  for (auto& [rank, endpoint] : endpoints_) {
    close_endpoint(worker_, *endpoint, endpoint->failure != UCS_OK || !given_up_.empty(), deadline);
  }
  discard_unexpected_messages();
  // A flush can finish with a rendezvous send still waiting for a peer that stopped (SIGSTOP) or gave
  // up on it: the request stays on its endpoint, and ucp_worker_destroy would abort the process on it
  // (ucp_ep.c:437, 3 of 16 runs of stall-mid-flight). Any request of this rank still in flight now
  // leaves the worker to the process's exit.
  bool in_flight = false;
  const auto release = [&in_flight](void* request) {
    if (request == nullptr) return;
    in_flight = in_flight || ucp_request_check_status(request) == UCS_INPROGRESS;
    ucp_request_free(request);
  };
  for (PendingSend& pending : pending_sends_) release(pending.request);
  for (GivenUp& given_up : given_up_) release(given_up.request);
  if (in_flight) worker_.abandon();
}

void UcxPeers::add(int rank, std::unique_ptr<Endpoint> endpoint) { endpoints_[rank] = std::move(endpoint); }

void UcxPeers::remove(int rank) {
  auto found = endpoints_.find(rank);
  if (found == endpoints_.end()) return;
  close_endpoint(worker_, *found->second, /*force=*/true, Clock::now() + kBestEffortWait);
  endpoints_.erase(found);
}

bool UcxPeers::rename(int from, int to) {
  auto node = endpoints_.extract(from);
  if (node.empty()) return false;
  node.key() = to;
  endpoints_.insert(std::move(node));
  return true;
}

const Endpoint& UcxPeers::endpoint(int rank) const { return *endpoints_.at(rank); }

bool UcxPeers::try_send(int dst, MessageKind kind, std::uint64_t sequence, const char* operation, const void* payload,
                        std::size_t bytes) {
  ucs_status_t ignored = UCS_OK;
  return post(dst, kind, sequence, operation, payload, bytes, &ignored);
}

bool UcxPeers::try_recv_from_anyone(MessageKind kind, int* sender, std::string* payload) {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h message = ucp_tag_probe_nb(worker_.handle(), make_tag(0, kind, 0), kKindMask, 1, &info);
  if (message == nullptr) return false;
  *sender = tag_sender(info.sender_tag);
  const std::string received = receive(message, info.length, deadline_from_now(), *sender);
  *payload = received.substr(std::min(received.size(), sizeof(MessageHeader)));
  return true;
}

void UcxPeers::check_usable() const {
  if (!failure_.empty()) {
    throw CommError(label_ + " on rank " + std::to_string(self_rank_) +
                        " is unusable after an earlier error: " + failure_ + "; create a new one",
                    false);
  }
}

bool UcxPeers::post(int dst, MessageKind kind, std::uint64_t sequence, const char* operation, const void* payload,
                    std::size_t bytes, ucs_status_t* error) {
  Endpoint& endpoint = *endpoints_.at(dst);
  MessageHeader header{};
  header.payload_bytes = bytes;
  std::strncpy(header.operation, operation, sizeof(header.operation) - 1);
  PendingSend& pending = pending_sends_.emplace_back();
  pending.message = std::make_unique<std::string>(sizeof(MessageHeader) + bytes, '\0');
  std::memcpy(pending.message->data(), &header, sizeof(MessageHeader));
  if (bytes > 0) std::memcpy(pending.message->data() + sizeof(MessageHeader), payload, bytes);
  pending.dst = dst;
  pending.kind = kind;

  ucp_request_param_t param{};
  void* request = ucp_tag_send_nbx(endpoint.handle, pending.message->data(), pending.message->size(),
                                   make_tag(self_rank_, kind, sequence), &param);
  if (UCS_PTR_IS_PTR(request)) {
    pending.request = request;
    return true;
  }
  pending_sends_.pop_back();
  *error = UCS_PTR_STATUS(request);
  return *error == UCS_OK;
}

void UcxPeers::send(int dst, MessageKind kind, std::uint64_t sequence, const char* operation, const void* payload,
                    std::size_t bytes) {
  ucs_status_t error = UCS_OK;
  if (!post(dst, kind, sequence, operation, payload, bytes, &error)) {
    fail(AbortKind::kPeerFailure, label_ + ": rank " + std::to_string(self_rank_) + " cannot send " + operation +
                                      " to rank " + std::to_string(dst) + ": " + status_text(error) +
                                      " (the peer exited or crashed)");
  }
}

bool UcxPeers::worth_waiting_for(std::optional<MessageKind> only) const {
  if (!only) return !pending_sends_.empty();
  // UCX keeps an endpoint's sends in order: one queued behind a data send the peer never takes (the
  // peer is silent: that is why this rank fails) completes only when that peer comes back.
  std::vector<int> blocked;
  for (const PendingSend& pending : pending_sends_) {
    const bool behind = std::find(blocked.begin(), blocked.end(), pending.dst) != blocked.end();
    if (pending.kind == MessageKind::kData) blocked.push_back(pending.dst);
    if (pending.kind == *only && !behind) return true;
  }
  return false;
}

void UcxPeers::drain_best_effort(std::optional<MessageKind> only) {
  const auto deadline = Clock::now() + std::min(timeout_, kBestEffortWait);
  while (Clock::now() < deadline) {
    pending_sends_.remove_if([](const PendingSend& pending) {
      if (pending.request == nullptr) return true;
      if (ucp_request_check_status(pending.request) == UCS_INPROGRESS) return false;
      ucp_request_free(pending.request);
      return true;
    });
    if (!worth_waiting_for(only)) return;
    worker_.progress_or_wait(std::chrono::milliseconds(10));
  }
}

void UcxPeers::complete(void* request, Clock::time_point deadline, int peer, std::unique_ptr<std::string>* buffer) {
  if (request == nullptr) return;
  ucs_status_t status = UCS_PTR_IS_ERR(request) ? UCS_PTR_STATUS(request) : UCS_INPROGRESS;
  while (status == UCS_INPROGRESS) {
    status = ucp_request_check_status(request);
    if (status != UCS_INPROGRESS) {
      ucp_request_free(request);
      break;
    }
    if (Clock::now() >= deadline) {
      ucp_request_cancel(worker_.handle(), request);
      give_up(request, std::move(*buffer));
      fail(AbortKind::kTimeout, label_ + ": rank " + std::to_string(self_rank_) + " timed out after " +
                                    seconds_text(timeout_) + " moving data with rank " + std::to_string(peer));
    }
    worker_.progress_or_wait(std::chrono::milliseconds(100));
  }
  if (status != UCS_OK) {
    fail(AbortKind::kPeerFailure, label_ + ": transfer between rank " + std::to_string(self_rank_) + " and rank " +
                                      std::to_string(peer) + " failed: " + status_text(status) +
                                      " (the peer exited or crashed; see its output)");
  }
}

void UcxPeers::give_up(void* request, std::unique_ptr<std::string> buffer) {
  given_up_.push_back({request, std::move(buffer)});
}

void UcxPeers::wait_sends(Clock::time_point deadline) {
  while (!pending_sends_.empty()) {
    PendingSend& pending = pending_sends_.front();
    void* request = std::exchange(pending.request, nullptr);
    complete(request, deadline, pending.dst, &pending.message);
    pending_sends_.pop_front();
  }
}

UcxPeers::Probed UcxPeers::wait_for_message(std::uint64_t tag, std::uint64_t mask, int src,
                                            Clock::time_point deadline) {
  for (;;) {
    // An ABORT goes first even when the data is there: a peer that failed after sending its part must
    // not let this rank return success from a collective the job has given up on.
    rethrow_pending_abort();
    Probed probed{};
    probed.message = ucp_tag_probe_nb(worker_.handle(), tag, mask, 1, &probed.info);
    if (probed.message != nullptr) return probed;

    if (src >= 0) {
      const Endpoint& endpoint = *endpoints_.at(src);
      if (endpoint.failure != UCS_OK) {
        fail(AbortKind::kPeerFailure, label_ + ": rank " + std::to_string(src) + " disconnected (" +
                                          status_text(endpoint.failure) + ") while rank " +
                                          std::to_string(self_rank_) +
                                          " waited for it: it exited or crashed; see its output");
      }
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      fail(AbortKind::kTimeout, label_ + ": rank " + std::to_string(self_rank_) + " timed out after " +
                                    seconds_text(timeout_) + " waiting for " +
                                    (src >= 0 ? "rank " + std::to_string(src) : std::string("any rank")) +
                                    ": a rank is missing, stuck, or calling a different collective");
    }
    const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    worker_.progress_or_wait(std::min(remaining + std::chrono::milliseconds(1), std::chrono::milliseconds(100)));
  }
}

void UcxPeers::recv(int src, MessageKind kind, std::uint64_t sequence, const char* operation, void* dest,
                    std::size_t bytes, Clock::time_point deadline) {
  Probed probed = wait_for_message(make_tag(src, kind, sequence), kFullMask, src, deadline);
  const std::string message = receive(probed.message, probed.info.length, deadline, src);
  MessageHeader header{};
  std::memcpy(&header, message.data(), std::min(sizeof(header), message.size()));
  header.operation[sizeof(header.operation) - 1] = '\0';
  const bool sized = message.size() == sizeof(MessageHeader) + bytes;
  if (!sized || std::strncmp(header.operation, operation, sizeof(header.operation) - 1) != 0) {
    fail(AbortKind::kInvalidArgument,
         label_ + ": rank " + std::to_string(src) + " sent " + std::to_string(header.payload_bytes) + " bytes for " +
             header.operation + " but rank " + std::to_string(self_rank_) + " expected " + std::to_string(bytes) +
             " bytes for " + operation +
             ": every rank must call the same collectives, in the same order, with the same counts and types");
  }
  if (bytes > 0) std::memcpy(dest, message.data() + sizeof(MessageHeader), bytes);
}

std::string UcxPeers::recv_any_size(int src, MessageKind kind, std::uint64_t sequence, Clock::time_point deadline) {
  Probed probed = wait_for_message(make_tag(src, kind, sequence), kFullMask, src, deadline);
  const std::string message = receive(probed.message, probed.info.length, deadline, src);
  return message.substr(std::min(message.size(), sizeof(MessageHeader)));
}

std::string UcxPeers::receive(ucp_tag_message_h message, std::size_t length, Clock::time_point deadline, int peer) {
  auto buffer = std::make_unique<std::string>(length, '\0');
  ucp_request_param_t param{};
  void* request = ucp_tag_msg_recv_nbx(worker_.handle(), buffer->data(), buffer->size(), message, &param);
  complete(request, deadline, peer, &buffer);
  return std::move(*buffer);
}

void UcxPeers::abort_peers(const std::string& payload, int except) {
  for (auto& [rank, endpoint] : endpoints_) {
    ucs_status_t ignored = UCS_OK;
    if (rank != except && endpoint->failure == UCS_OK) {
      post(rank, MessageKind::kAbort, 0, "abort", payload.data(), payload.size(), &ignored);
    }
  }
  // Only the ABORTs that can go out: waiting for a data send to the silent peer, or an ABORT queued
  // behind it, held the error another min(timeout, 1 s), so a call's TIMEOUT came at up to twice the
  // timeout it names.
  drain_best_effort(MessageKind::kAbort);
}

std::string UcxPeers::take_best_effort(ucp_tag_message_h message, std::size_t length,
                                       std::optional<Clock::time_point> until) {
  auto buffer = std::make_unique<std::string>(length, '\0');
  ucp_request_param_t param{};
  void* request = ucp_tag_msg_recv_nbx(worker_.handle(), buffer->data(), buffer->size(), message, &param);
  const auto deadline = until.value_or(Clock::now() + kBestEffortWait);
  while (UCS_PTR_IS_PTR(request) && ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline) {
    worker_.progress_or_wait(std::chrono::milliseconds(10));
  }
  std::string received = buffer->substr(std::min(buffer->size(), sizeof(MessageHeader)));
  if (UCS_PTR_IS_PTR(request)) {
    if (ucp_request_check_status(request) == UCS_INPROGRESS) {
      give_up(request, std::move(buffer));
    } else {
      ucp_request_free(request);
    }
  }
  return received;
}

void UcxPeers::rethrow_pending_abort() {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h message =
      ucp_tag_probe_nb(worker_.handle(), make_tag(0, MessageKind::kAbort, 0), kKindMask, 1, &info);
  if (message == nullptr) return;
  rethrow_abort(tag_sender(info.sender_tag), take_best_effort(message, info.length));
}

void UcxPeers::wait_briefly_for_abort() {
  const auto deadline = Clock::now() + std::min(timeout_, kAbortGrace);
  for (;;) {
    rethrow_pending_abort();
    if (Clock::now() >= deadline) return;
    worker_.progress_or_wait(std::chrono::milliseconds(10));
  }
}

void UcxPeers::fail(AbortKind kind, const std::string& message) {
  // An ABORT from a peer explains a timeout or a vanished peer better than the symptom does.
  if (failure_.empty() && kind == AbortKind::kPeerFailure) wait_briefly_for_abort();
  if (failure_.empty() && kind == AbortKind::kTimeout) rethrow_pending_abort();
  if (failure_.empty()) {
    failure_ = message;
    abort_peers(std::string(1, static_cast<char>(kind)) + message, -1);
  }
  throw_for(kind, message);
}

void UcxPeers::abort_job(const std::string& message) noexcept {
  if (!failure_.empty()) return;
  try {
    failure_ = message;
    abort_peers(std::string(1, static_cast<char>(AbortKind::kPeerFailure)) + message, -1);
  } catch (...) {  // best effort: out of memory, or UCX refusing a send, leaves the peers to their timeout
  }
}

void UcxPeers::rethrow_abort(int sender, const std::string& payload) {
  const AbortKind kind = payload.empty() ? AbortKind::kPeerFailure : static_cast<AbortKind>(payload[0]);
  const std::string message = payload.empty() ? label_ + ": rank " + std::to_string(sender) + " aborted"
                                              : payload.substr(1);
  if (failure_.empty()) {
    failure_ = message;
    abort_peers(payload, sender);
  }
  throw_for(kind, message);
}

void UcxPeers::discard_unexpected_messages() {
  // Aborts, goodbyes and data nobody waited for; receiving them keeps UCX from warning at worker
  // teardown. Bounded as a whole: a stopped peer's rendezvous messages would each take the full wait.
  const auto deadline = Clock::now() + kBestEffortWait;
  ucp_tag_recv_info_t info{};
  while (Clock::now() < deadline) {
    ucp_tag_message_h message = ucp_tag_probe_nb(worker_.handle(), 0, 0, 1, &info);
    if (message == nullptr) return;
    take_best_effort(message, info.length, deadline);
  }
}

void UcxPeers::say_goodbye() {
  // Never throws: a peer that is gone or silent only shortens or bounds the wait.
  for (auto& [rank, endpoint] : endpoints_) {
    ucs_status_t ignored = UCS_OK;
    if (endpoint->failure == UCS_OK) post(rank, MessageKind::kBye, 0, "bye", nullptr, 0, &ignored);
  }
  const auto deadline = deadline_after(timeout_);
  for (auto& [rank, endpoint] : endpoints_) {
    for (;;) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h message =
          ucp_tag_probe_nb(worker_.handle(), make_tag(rank, MessageKind::kBye, 0), kFullMask, 1, &info);
      if (message != nullptr) {
        take_best_effort(message, info.length);
        break;
      }
      if (endpoint->failure != UCS_OK || Clock::now() >= deadline) break;
      worker_.progress_or_wait(std::chrono::milliseconds(10));
    }
  }
  drain_best_effort();
}

}  // namespace gtp::comm::internal
