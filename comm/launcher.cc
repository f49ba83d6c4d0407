#include "comm/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm/internal/loopback_port.h"

namespace gtp::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kUsage = "usage: gtp-launch -n N [--timeout SECONDS] [--share-gpu] -- COMMAND [ARGS...]";
constexpr double kMinTimeoutSeconds = 0.001, kMaxTimeoutSeconds = 365.0 * 24 * 3600;
// How long ranks get between SIGTERM and SIGKILL, and how long the launcher keeps reading output
// that a rank's leftover children still write after every rank exited.
constexpr std::chrono::milliseconds kGracePeriod{3000};

volatile sig_atomic_t g_stop_signal = 0;

void on_stop_signal(int signal) { g_stop_signal = signal; }

// One output stream of one rank, split into prefixed lines.
struct Stream {
  int fd;
  int rank;
  FILE* sink;
  std::string partial;

  void write_lines(bool flush_partial) {
    std::size_t start = 0;
    for (std::size_t end; (end = partial.find('\n', start)) != std::string::npos; start = end + 1) {
      std::fprintf(sink, "[%d] %.*s\n", rank, static_cast<int>(end - start), partial.data() + start);
    }
    partial.erase(0, start);
    if (flush_partial && !partial.empty()) {
      std::fprintf(sink, "[%d] %s\n", rank, partial.c_str());
      partial.clear();
    }
    std::fflush(sink);
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // the launcher-style exit status once it ended
};

int exit_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

[[noreturn]] void exec_rank(const LaunchOptions& options, int rank, int port, const std::string& launch_id, int out_fd,
                            int err_fd) {
  setpgid(0, 0);  // its own process group, so stopping it also stops what it started
  signal(SIGPIPE, SIG_DFL);  // the launcher ignores SIGPIPE; an ignored signal would survive exec
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  setenv("GTP_RANK", std::to_string(rank).c_str(), 1);
  setenv("GTP_WORLD_SIZE", std::to_string(options.world_size).c_str(), 1);
  setenv("GTP_ROOT_ADDR", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  if (options.share_gpu) {
    for (const auto& [name, value] : shared_gpu_environment(rank, launch_id)) setenv(name.c_str(), value.c_str(), 1);
  }
  std::vector<char*> argv;
  for (const std::string& arg : options.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "gtp-launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
  _exit(127);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> shared_gpu_environment(int rank, const std::string& launch_id) {
  return {{"NCCL_HOSTID", "gtp-shared-gpu-" + launch_id + "-rank" + std::to_string(rank)},
          {"NCCL_SOCKET_IFNAME", "lo"},
          {"NCCL_IB_DISABLE", "1"},
          {"NCCL_NVLS_ENABLE", "0"},
          {"LOCAL_RANK", "0"},
          {"GTP_LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", "1"},
          {"GTP_SHARED_GPU", "1"}};
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions options;
  std::size_t i = 0;
  auto value_of = [&](const std::string& flag) {
    if (i + 1 >= args.size()) throw std::invalid_argument(flag + " needs a value\n" + kUsage);
    return args[++i];
  };
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& arg = args[i];
    char* end = nullptr;
    if (arg == "-n" || arg == "--np") {
      const std::string text = value_of(arg);
      const long n = std::strtol(text.c_str(), &end, 10);
      if (*end != '\0' || n < 1 || n > 4096) {
        throw std::invalid_argument("-n " + text + ": pass a process count in [1, 4096]\n" + kUsage);
      }
      options.world_size = static_cast<int>(n);
    } else if (arg == "--timeout") {
      const std::string text = value_of(arg);
      // Decimal only: strtod would also take blanks, hex ("0x10") and "inf".
      const bool decimal = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.') &&
                           text.find_first_not_of("0123456789.eE+-") == std::string::npos;
      const double seconds = decimal ? std::strtod(text.c_str(), &end) : NAN;
      // Whole string, finite, and at least 1 ms: smaller values used to round to 0, "no timeout".
      const bool whole = end != nullptr && *end == '\0';
      if (!whole || !(seconds >= kMinTimeoutSeconds && seconds <= kMaxTimeoutSeconds)) {
        throw std::invalid_argument("--timeout " + text + ": pass seconds in [0.001, 31536000] (1 ms to a year), "
                                    "or leave --timeout out for no limit\n" + kUsage);
      }
      options.timeout = std::chrono::milliseconds(static_cast<long long>(std::llround(seconds * 1000)));
    } else if (arg == "--share-gpu") {
      options.share_gpu = true;
    } else {
      throw std::invalid_argument("unknown argument \"" + arg + "\" (put the command after --)\n" + kUsage);
    }
  }
  if (options.world_size == 0) throw std::invalid_argument(std::string("-n is required\n") + kUsage);
  if (i + 1 >= args.size()) throw std::invalid_argument(std::string("no command after --\n") + kUsage);
  options.command.assign(args.begin() + i + 1, args.end());
  return options;
}

int launch(const LaunchOptions& options) {
  int port = 0;
  try {
    port = internal::unused_loopback_port();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("gtp-launch: ") + e.what());
  }
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, on_stop_signal);
  signal(SIGTERM, on_stop_signal);

  // Distinct per launch (the launcher's pid and the port), so two jobs on one machine never share a host id.
  const std::string launch_id = std::to_string(getpid()) + "-" + std::to_string(port);
  std::vector<Rank> ranks(options.world_size);
  std::vector<Stream> streams;
  for (int r = 0; r < options.world_size; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("gtp-launch: pipe: ") + std::strerror(errno));
    }
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(std::string("gtp-launch: fork: ") + std::strerror(errno));
    if (pid == 0) exec_rank(options, r, port, launch_id, out[1], err[1]);
    setpgid(pid, pid);  // also here, so a stop signal cannot race the child's own setpgid
    close(out[1]);
    close(err[1]);
    ranks[r].pid = pid;
    ranks[r].running = true;
    streams.push_back({out[0], r, stdout, {}});
    streams.push_back({err[0], r, stderr, {}});
  }

  const auto start = Clock::now();
  int result = 0;
  bool stopping = false;
  Clock::time_point kill_at{}, all_exited_at{};
  auto stop_all = [&](const std::string& why) {
    std::fprintf(stderr, "gtp-launch: %s; stopping the other ranks\n", why.c_str());
    for (const Rank& rank : ranks) {
      if (rank.running) kill(-rank.pid, SIGTERM);
    }
    stopping = true;
    kill_at = Clock::now() + kGracePeriod;
  };

  for (;;) {
    std::vector<pollfd> fds;
    for (const Stream& stream : streams) fds.push_back({stream.fd, POLLIN, 0});
    if (!fds.empty()) {
      poll(fds.data(), fds.size(), 50);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[65536];
      const ssize_t got = read(streams[i].fd, buffer, sizeof(buffer));
      if (got > 0) {
        streams[i].partial.append(buffer, got);
        streams[i].write_lines(false);
      } else if (got == 0 || errno != EINTR) {
        streams[i].write_lines(true);
        close(streams[i].fd);
        streams[i].fd = -1;
      }
    }
    streams.erase(std::remove_if(streams.begin(), streams.end(), [](const Stream& s) { return s.fd < 0; }),
                  streams.end());

    bool any_running = false;
    for (int r = 0; r < options.world_size; ++r) {
      Rank& rank = ranks[r];
      if (!rank.running) continue;
      int wait_status = 0;
      if (waitpid(rank.pid, &wait_status, WNOHANG) == rank.pid) {
        rank.running = false;
        rank.status = exit_status(wait_status);
        if (rank.status != 0 && result == 0 && !stopping) {
          result = rank.status;
          stop_all("rank " + std::to_string(r) + " exited with status " + std::to_string(rank.status));
        }
      } else {
        any_running = true;
      }
    }
    if (!stopping && options.timeout.count() > 0 && Clock::now() - start > options.timeout) {
      result = 124;
      stop_all("timed out after " + std::to_string(options.timeout.count() / 1000.0) + " s");
    }
    if (!stopping && g_stop_signal != 0) {
      result = 128 + g_stop_signal;
      stop_all(std::string("received ") + strsignal(g_stop_signal));
    }
    if (stopping && any_running && Clock::now() > kill_at) {
      for (const Rank& rank : ranks) {
        if (rank.running) kill(-rank.pid, SIGKILL);
      }
    }
    if (!any_running) {
      if (all_exited_at == Clock::time_point{}) all_exited_at = Clock::now();
      if (streams.empty() || Clock::now() - all_exited_at > kGracePeriod) break;
    }
  }
  for (Stream& stream : streams) {
    stream.write_lines(true);
    close(stream.fd);
  }
  return result;
}

}  // namespace gtp::comm
