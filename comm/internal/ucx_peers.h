// UCX plumbing shared by the UCX bootstrap and the host transport: a UCP worker with libgtp's
// defaults, endpoints with peer-failure tracking, and UcxPeers, which exchanges typed messages with
// other ranks over one worker and turns every failure (peer gone, inconsistent sizes, timeout) into an
// exception on this rank and an ABORT message to the others, so no rank is left waiting.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "comm/errors.h"

namespace gtp::comm::internal {

using Clock = std::chrono::steady_clock;

// What a message is; carried in the UCX tag next to the sender's rank and a sequence number.
enum class MessageKind : std::uint8_t { kData = 1, kAbort = 2, kBye = 3, kWelcome = 4, kHello = 5, kAccept = 6 };

// The exception a rank that aborts the job asks its peers to throw.
enum class AbortKind : std::uint8_t { kPeerFailure = 0, kInvalidArgument = 1, kTimeout = 2 };

// Ranks and sequence numbers must fit the tag layout: 20 bits of rank, 4 of kind, 40 of sequence.
constexpr int kMaxRanks = 1 << 20;
constexpr std::uint64_t kSequenceMask = (std::uint64_t{1} << 40) - 1;

// A UCP context and worker. Unless the user set UCX_TLS, transports are limited to tcp: it detects a
// peer that died at once (socket closed), while shared-memory transports only notice through keepalive.
class UcxWorker {
 public:
  UcxWorker();
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h handle() const { return worker_; }
  std::string address() const;  // the packed worker address other ranks connect to
  // Progresses until idle; when nothing happened, sleeps until an event arrives or `max_wait` elapses.
  void progress_or_wait(std::chrono::milliseconds max_wait);
  // An endpoint could not be closed (its requests still in flight): destroying the worker would trip
  // UCX's assertion that no endpoint has requests left, aborting the process. The worker and its
  // context are then left to the process's exit instead (a bounded leak, once per failed job).
  void abandon() { abandoned_ = true; }

 private:
  bool abandoned_ = false;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
};

// An endpoint whose error callback records the failure instead of aborting the process.
struct Endpoint {
  ucp_ep_h handle = nullptr;
  ucs_status_t failure = UCS_OK;
};

// `params` carries the address fields (remote worker address, socket address or connection request).
std::unique_ptr<Endpoint> create_endpoint(ucp_worker_h worker, ucp_ep_params_t params);
// Closes the endpoint, progressing until `deadline`; a close still running then abandons the worker.
void close_endpoint(UcxWorker& worker, Endpoint& endpoint, bool force, Clock::time_point deadline);

class UcxPeers {
 public:
  // `label` names the communicator in messages ("bootstrap", "host comm"). An ABORT received from one
  // peer is forwarded to every other peer before this rank gives up: in a star it reaches the leaves,
  // and in a mesh it reaches a peer before that peer can see this rank's endpoints close.
  UcxPeers(UcxWorker& worker, int self_rank, std::string label, std::chrono::milliseconds timeout);
  // Unless the job failed: tells every peer goodbye and waits (bounded by the timeout) for theirs, so
  // no rank leaves while its last messages are still in flight. Then closes every endpoint.
  ~UcxPeers();
  UcxPeers(const UcxPeers&) = delete;
  UcxPeers& operator=(const UcxPeers&) = delete;

  void add(int rank, std::unique_ptr<Endpoint> endpoint);
  void remove(int rank);          // closes the endpoint of `rank`, if there is one
  // Re-keys an endpoint once a handshake told whose it is; false when `from` is unknown.
  bool rename(int from, int to);
  const Endpoint& endpoint(int rank) const;
  Clock::time_point deadline_from_now() const { return deadline_after(timeout_); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Throws if an earlier call failed: a communicator is unusable after any error.
  void check_usable() const;

  // Posts a message. The payload is copied (UCX may read a rendezvous send's data whenever the worker
  // progresses, after a failed call's caller freed its buffer); `operation` names the collective (at
  // most 23 characters) so a receiver can report a mismatch precisely.
  void send(int dst, MessageKind kind, std::uint64_t sequence, const char* operation, const void* payload,
            std::size_t bytes);
  void wait_sends(Clock::time_point deadline);

  // Receives the message (src, kind, sequence) whose payload must be exactly `bytes` long.
  void recv(int src, MessageKind kind, std::uint64_t sequence, const char* operation, void* dest, std::size_t bytes,
            Clock::time_point deadline);
  // Receives the message (src, kind, sequence) whatever its length.
  std::string recv_any_size(int src, MessageKind kind, std::uint64_t sequence, Clock::time_point deadline);
  // Handshake helpers that never fail the communicator: a send that may hit a stale endpoint, and a
  // receive that returns false at once when no message of `kind` (sequence 0, any sender) is there.
  bool try_send(int dst, MessageKind kind, std::uint64_t sequence, const char* operation, const void* payload,
                std::size_t bytes);
  bool try_recv_from_anyone(MessageKind kind, int* sender, std::string* payload);

  // Sends ABORT with `message` to every peer (best effort, bounded) and throws the matching exception.
  [[noreturn]] void fail(AbortKind kind, const std::string& message);
  // fail() without the throw, for a rank whose own call failed elsewhere: its peers, perhaps waiting
  // in a collective this rank will never make, throw `message` (a peer failure) instead of waiting.
  // Does nothing once the communicator has failed. Never throws.
  void abort_job(const std::string& message) noexcept;
  // The timeout of later calls (construction may use a longer one).
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  struct PendingSend;
  struct Probed;
  struct GivenUp {
    void* request;
    std::unique_ptr<std::string> buffer;
  };
  Probed wait_for_message(std::uint64_t tag, std::uint64_t mask, int src, Clock::time_point deadline);
  // Posts without throwing; false (with `error` set) when the endpoint refused the send.
  bool post(int dst, MessageKind kind, std::uint64_t sequence, const char* operation, const void* payload,
            std::size_t bytes, ucs_status_t* error);
  // Waits for `request`, which reads or writes `buffer`; past `deadline` gives both up and fails with
  // a timeout.
  void complete(void* request, Clock::time_point deadline, int peer, std::unique_ptr<std::string>* buffer);
  // Keeps a request this rank stopped waiting for, and the buffer UCX may still read or write, until
  // the destructor has closed the endpoints and can tell whether it is still in flight.
  void give_up(void* request, std::unique_ptr<std::string> buffer);
  // Receives a probed message, header included, into a buffer of its own: a receive given up after UCX
  // matched it cannot be cancelled, and UCX goes on writing it (rendezvous data) while the worker
  // progresses, after the caller's buffer may be gone. Costs one copy into the caller's buffer.
  std::string receive(ucp_tag_message_h message, std::size_t length, Clock::time_point deadline, int peer);
  // Waits (at most min(timeout, 1 s)) for the pending sends, or only those of kind `only`, to complete.
  void drain_best_effort(std::optional<MessageKind> only = std::nullopt);
  // Whether a pending send (of kind `only`: one that is not queued behind a data send) can still go out.
  bool worth_waiting_for(std::optional<MessageKind> only) const;
  void abort_peers(const std::string& payload, int except);
  void rethrow_pending_abort();  // throws what a peer's ABORT asks for, if one is waiting
  // A peer that vanished may have been told to abort by another rank: wait briefly for that ABORT so
  // this rank reports the root cause rather than the disconnection it caused.
  void wait_briefly_for_abort();
  // Receives a probed message without ever throwing, waiting until `until` (default: the best-effort
  // bound from now); returns its payload.
  std::string take_best_effort(ucp_tag_message_h message, std::size_t length,
                               std::optional<Clock::time_point> until = std::nullopt);
  void discard_unexpected_messages();
  [[noreturn]] void rethrow_abort(int sender, const std::string& payload);
  void say_goodbye();

  UcxWorker& worker_;
  int self_rank_;
  std::string label_;
  std::chrono::milliseconds timeout_;
  std::map<int, std::unique_ptr<Endpoint>> endpoints_;
  std::list<PendingSend> pending_sends_;
  std::string failure_;  // the first error; non-empty once the communicator failed
  // Transfers given up in flight (timeout, best-effort bound), with their buffers; they live as long as
  // anything can progress the worker. Such a request stays on its endpoint until a forced close purges
  // it; destroying the worker before that aborts the process.
  std::list<GivenUp> given_up_;
};

std::string status_text(ucs_status_t status);

}  // namespace gtp::comm::internal
