#include "comm/ucx_bootstrap.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "comm/errors.h"
#include "comm/internal/ucx_peers.h"

namespace gtp::comm {

using internal::AbortKind;
using internal::Clock;
using internal::MessageKind;

namespace {

const char* first_set(const char* primary, const char* fallback) {
  const char* value = std::getenv(primary);
  return value != nullptr && *value != '\0' ? value : std::getenv(fallback);
}

int parse_int(const char* text, const std::string& variables, int min, int max) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || value < min || value > max) {
    throw std::invalid_argument(variables + "=\"" + text + "\" is not an integer in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "]: fix the variable");
  }
  return static_cast<int>(value);
}

// Splits "host:port" or "[v6-address]:port".
void split_host_port(const std::string& text, std::string* host, std::string* port) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    throw std::invalid_argument("GTP_ROOT_ADDR=\"" + text +
                                "\" is not host:port: set it like 127.0.0.1:29500 or [::1]:29500");
  }
  *host = text.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  *port = text.substr(colon + 1);
}

sockaddr_storage resolve(const std::string& host, int port, socklen_t* length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (error != 0 || found == nullptr) {
    throw std::invalid_argument("bootstrap root host \"" + host + "\" cannot be resolved (" + gai_strerror(error) +
                                "): set GTP_ROOT_ADDR (or MASTER_ADDR) to a name or address every rank can reach");
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  *length = found->ai_addrlen;
  freeaddrinfo(found);
  return address;
}

// How long past its own timeout a joined rank waits for rank 0's accept or abort.
constexpr std::chrono::milliseconds kAcceptGrace{3000};

// Handshake payloads.
struct Hello {
  std::int32_t slot;  // the slot the root assigned in its welcome
  std::int32_t rank;
  std::int32_t world_size;
};

}  // namespace

UcxBootstrapConfig UcxBootstrapConfig::from_env() {
  UcxBootstrapConfig config;
  const char* rank = first_set("GTP_RANK", "RANK");
  const char* world_size = first_set("GTP_WORLD_SIZE", "WORLD_SIZE");
  if (rank == nullptr) throw std::invalid_argument("bootstrap: the rank is not set: set GTP_RANK (or torchrun's RANK)");
  if (world_size == nullptr) {
    throw std::invalid_argument("bootstrap: the world size is not set: set GTP_WORLD_SIZE (or torchrun's WORLD_SIZE)");
  }
  config.world_size = parse_int(world_size, "GTP_WORLD_SIZE/WORLD_SIZE", 1, internal::kMaxRanks - 1);
  config.rank = parse_int(rank, "GTP_RANK/RANK", 0, config.world_size - 1);

  std::string port;
  if (const char* root = std::getenv("GTP_ROOT_ADDR"); root != nullptr && *root != '\0') {
    split_host_port(root, &config.root_host, &port);
  } else {
    const char* host = std::getenv("MASTER_ADDR");
    const char* master_port = std::getenv("MASTER_PORT");
    if (host == nullptr || master_port == nullptr) {
      throw std::invalid_argument(
          "bootstrap: the root address is not set: set GTP_ROOT_ADDR=host:port (or torchrun's MASTER_ADDR and "
          "MASTER_PORT)");
    }
    config.root_host = host;
    port = master_port;
  }
  config.root_port = parse_int(port.c_str(), "the root port (GTP_ROOT_ADDR or MASTER_PORT)", 1, 65535);
  config.timeout = timeout_from_env("GTP_BOOTSTRAP_TIMEOUT", config.timeout);
  return config;
}

struct UcxBootstrap::Ucx {
  internal::UcxWorker worker;  // declared first: destroyed after the peers close their endpoints
  std::unique_ptr<internal::UcxPeers> peers;
  ucp_listener_h listener = nullptr;
  std::vector<ucp_conn_request_h> connection_requests;  // filled by the listener callback
  std::list<std::int32_t> welcome_slots;                // payloads of welcomes in flight

  ~Ucx() {
    peers.reset();
    if (listener != nullptr) ucp_listener_destroy(listener);
  }
};

UcxBootstrap::UcxBootstrap(const UcxBootstrapConfig& config)
    : rank_(config.rank), world_size_(config.world_size), root_port_(config.root_port) {
  if (config.world_size < 1 || config.world_size >= internal::kMaxRanks) {
    throw std::invalid_argument("bootstrap world size " + std::to_string(config.world_size) + ": set it in [1, " +
                                std::to_string(internal::kMaxRanks - 1) + "]");
  }
  if (config.rank < 0 || config.rank >= config.world_size) {
    throw std::invalid_argument("bootstrap rank " + std::to_string(config.rank) + " is outside [0, " +
                                std::to_string(config.world_size) + "): fix GTP_RANK or GTP_WORLD_SIZE");
  }
  if (config.root_port < (config.rank == 0 ? 0 : 1) || config.root_port > 65535) {
    throw std::invalid_argument("bootstrap root port " + std::to_string(config.root_port) +
                                ": set a port in [1, 65535] (rank 0 may use 0 to pick a free one)");
  }
  if (config.timeout.count() <= 0) {
    throw std::invalid_argument("bootstrap timeout " + std::to_string(config.timeout.count()) +
                                " ms: set GTP_BOOTSTRAP_TIMEOUT to a positive number of seconds");
  }
  ucx_ = std::make_unique<Ucx>();
  ucx_->peers = std::make_unique<internal::UcxPeers>(ucx_->worker, rank_, "bootstrap", config.timeout);
  socklen_t length = 0;
  const sockaddr_storage address = resolve(config.root_host, config.root_port, &length);
  const std::string where = config.root_host + ":" + std::to_string(config.root_port);
  if (rank_ == 0) {
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
    params.sockaddr.addrlen = length;
    params.conn_handler.cb = [](ucp_conn_request_h request, void* arg) {
      static_cast<Ucx*>(arg)->connection_requests.push_back(request);
    };
    params.conn_handler.arg = ucx_.get();
    const ucs_status_t status = ucp_listener_create(ucx_->worker.handle(), &params, &ucx_->listener);
    if (status != UCS_OK) {
      throw CommError("bootstrap: rank 0 cannot listen on " + where + ": " + internal::status_text(status) +
                          " (is the port in use? set GTP_ROOT_ADDR to a free port on this host)",
                      false);
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(ucx_->listener, &attr) == UCS_OK) {
      const auto* bound = reinterpret_cast<const sockaddr*>(&attr.sockaddr);
      root_port_ = ntohs(bound->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(bound)->sin6_port
                                                      : reinterpret_cast<const sockaddr_in*>(bound)->sin_port);
    }
    join_as_root(config.root_host + ":" + std::to_string(root_port_));
    // Everyone joined: whoever connects now belongs to another job.
    for (ucp_conn_request_h request : std::exchange(ucx_->connection_requests, {})) {
      ucp_listener_reject(ucx_->listener, request);
    }
    ucp_listener_destroy(ucx_->listener);
    ucx_->listener = nullptr;
  } else {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
    params.sockaddr.addrlen = length;
    // Rank 0 may start later than this rank: retry until it answers or the timeout expires.
    const auto deadline = ucx_->peers->deadline_from_now();
    std::string last_error = "no answer";
    std::int32_t slot = -1;
    while (slot < 0) {
      ucx_->peers->add(0, internal::create_endpoint(ucx_->worker.handle(), params));
      std::string welcome;
      int sender = 0;
      while (Clock::now() < deadline && ucx_->peers->endpoint(0).failure == UCS_OK &&
             !ucx_->peers->try_recv_from_anyone(MessageKind::kWelcome, &sender, &welcome)) {
        ucx_->worker.progress_or_wait(std::chrono::milliseconds(20));
      }
      if (welcome.size() == sizeof(slot)) {
        std::memcpy(&slot, welcome.data(), sizeof(slot));
        break;
      }
      if (ucx_->peers->endpoint(0).failure != UCS_OK) {
        last_error = internal::status_text(ucx_->peers->endpoint(0).failure);
      }
      ucx_->peers->remove(0);
      if (Clock::now() >= deadline) {
        throw CommError("bootstrap: rank " + std::to_string(rank_) + " could not reach rank 0 at " + where +
                            " within " + std::to_string(config.timeout.count()) + " ms (" + last_error +
                            "): check GTP_ROOT_ADDR / MASTER_ADDR:MASTER_PORT and that rank 0 is running",
                        true);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Rank 0 accepts once every rank joined, or names the missing ones in an ABORT when its own
    // timeout (started before this welcome) expires: wait a little past that, so this rank reports
    // rank 0's message (which ranks are missing) rather than its own "waiting for rank 0".
    const auto accept_deadline =
        deadline_after(std::min(config.timeout, std::chrono::milliseconds::max() - kAcceptGrace) + kAcceptGrace);
    const Hello hello{slot, rank_, world_size_};
    ucx_->peers->send(0, MessageKind::kHello, 0, "hello", &hello, sizeof(hello));
    ucx_->peers->wait_sends(accept_deadline);
    ucx_->peers->recv_any_size(0, MessageKind::kAccept, 0, accept_deadline);
  }
}

void UcxBootstrap::join_as_root(const std::string& where) {
  internal::UcxPeers& peers = *ucx_->peers;
  const auto deadline = peers.deadline_from_now();
  // Connections are keyed by a slot above every rank until their hello says which rank they are.
  std::int32_t next_slot = world_size_;
  std::set<int> joined;
  while (static_cast<int>(joined.size()) < world_size_ - 1) {
    for (ucp_conn_request_h request : std::exchange(ucx_->connection_requests, {})) {
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
      params.conn_request = request;
      const std::int32_t slot = next_slot++;
      peers.add(slot, internal::create_endpoint(ucx_->worker.handle(), params));
      peers.try_send(slot, MessageKind::kWelcome, 0, "welcome", &ucx_->welcome_slots.emplace_back(slot), sizeof(slot));
    }
    int sender = 0;
    std::string payload;
    while (peers.try_recv_from_anyone(MessageKind::kHello, &sender, &payload)) {
      Hello hello{};
      if (payload.size() != sizeof(hello)) continue;  // not one of our clients
      std::memcpy(&hello, payload.data(), sizeof(hello));
      if (hello.slot < world_size_ || hello.slot >= next_slot) continue;
      if (hello.world_size != world_size_) {
        peers.fail(AbortKind::kInvalidArgument,
                   "bootstrap: rank " + std::to_string(hello.rank) + " started with world size " +
                       std::to_string(hello.world_size) + " but rank 0 with " + std::to_string(world_size_) +
                       ": set the same GTP_WORLD_SIZE (or WORLD_SIZE) on every rank");
      }
      if (hello.rank <= 0 || hello.rank >= world_size_ || joined.count(hello.rank) != 0) {
        peers.fail(AbortKind::kInvalidArgument,
                   "bootstrap: two processes claim rank " + std::to_string(hello.rank) +
                       " (or it is out of range): give every process a distinct GTP_RANK in [0, " +
                       std::to_string(world_size_) + ")");
      }
      if (peers.rename(hello.slot, hello.rank)) joined.insert(hello.rank);
    }
    if (Clock::now() >= deadline) {
      std::string missing;
      for (int r = 1; r < world_size_; ++r) {
        if (joined.count(r) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      peers.fail(AbortKind::kTimeout, "bootstrap: rank 0 listening on " + where + " timed out after " +
                                          std::to_string(peers.timeout().count()) + " ms waiting for rank(s) " +
                                          missing + " to join: start them with GTP_ROOT_ADDR=" + where +
                                          " and GTP_WORLD_SIZE=" + std::to_string(world_size_));
    }
    ucx_->worker.progress_or_wait(std::chrono::milliseconds(20));
  }
  // Endpoints of clients that gave up and reconnected never said hello; drop them.
  for (int slot = world_size_; slot < next_slot; ++slot) peers.remove(slot);
  for (int r = 1; r < world_size_; ++r) peers.send(r, MessageKind::kAccept, 0, "accept", nullptr, 0);
  peers.wait_sends(deadline);
}

UcxBootstrap::~UcxBootstrap() = default;

void UcxBootstrap::gather_and_release(const char* operation, const void* send, void* recv,
                                      std::size_t bytes_per_rank) {
  internal::UcxPeers& peers = *ucx_->peers;
  peers.check_usable();
  const std::uint64_t sequence = ++sequence_;
  const auto deadline = peers.deadline_from_now();
  auto* gathered = static_cast<unsigned char*>(recv);
  const std::size_t total = bytes_per_rank * world_size_;
  if (rank_ != 0) {
    peers.send(0, MessageKind::kData, sequence, operation, send, bytes_per_rank);
    peers.wait_sends(deadline);  // `send` may alias `recv`
    peers.recv(0, MessageKind::kData, sequence, operation, gathered, total, deadline);
    return;
  }
  if (bytes_per_rank > 0) std::memmove(gathered, send, bytes_per_rank);
  for (int r = 1; r < world_size_; ++r) {
    peers.recv(r, MessageKind::kData, sequence, operation, gathered + r * bytes_per_rank, bytes_per_rank, deadline);
  }
  for (int r = 1; r < world_size_; ++r) peers.send(r, MessageKind::kData, sequence, operation, gathered, total);
  peers.wait_sends(deadline);
}

void UcxBootstrap::allgather(const void* send, void* recv, std::size_t bytes_per_rank) {
  gather_and_release("allgather", send, recv, bytes_per_rank);
}

void UcxBootstrap::barrier() { gather_and_release("barrier", nullptr, nullptr, 0); }

void UcxBootstrap::broadcast(void* buffer, std::size_t bytes, int root) {
  check_root(root);
  internal::UcxPeers& peers = *ucx_->peers;
  peers.check_usable();
  const std::uint64_t sequence = ++sequence_;
  const auto deadline = peers.deadline_from_now();
  // The root is part of the operation name so ranks that disagree on it fail instead of mixing data.
  const std::string operation = "broadcast(root=" + std::to_string(root) + ")";
  if (root != 0 && rank_ == root) {
    peers.send(0, MessageKind::kData, sequence, operation.c_str(), buffer, bytes);
    peers.wait_sends(deadline);
  }
  if (rank_ == 0) {
    if (root != 0) peers.recv(root, MessageKind::kData, sequence, operation.c_str(), buffer, bytes, deadline);
    for (int r = 1; r < world_size_; ++r) {
      if (r != root) peers.send(r, MessageKind::kData, sequence, operation.c_str(), buffer, bytes);
    }
    peers.wait_sends(deadline);
  } else if (rank_ != root) {
    peers.recv(0, MessageKind::kData, sequence, operation.c_str(), buffer, bytes, deadline);
  }
}

}  // namespace gtp::comm
