#include "topology/internal/child_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace gtp::topology::internal {
namespace {

constexpr char kYes = 'y', kNo = 'n';

// Waits for the child's one byte; returns it, or 0 when the child closed the pipe without writing
// (it died) or -1 when the deadline passed.
int read_verdict(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return -1;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return ready < 0 ? 0 : -1;
    char byte = 0;
    const ssize_t n = ::read(fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    return n == 1 ? byte : 0;
  }
}

std::string how_it_ended(pid_t pid) {
  int status = 0;
  pid_t got;
  do got = ::waitpid(pid, &status, 0);
  while (got < 0 && errno == EINTR);
  // ECHILD: the application set SIGCHLD to SIG_IGN, so the child was reaped without a status.
  if (got != pid) return "an unknown way (its exit status could not be read)";
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

}  // namespace

ChildOutcome run_in_child(const std::function<bool()>& work, std::chrono::milliseconds timeout) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe failed: ") + std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
    // The parent's crash handlers (Python's faulthandler, UCX's backtrace) would print a "fatal
    // error" here that is not the parent's; the parent reports the signal itself.
    for (const int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, SIG_DFL);
    bool result = false;
    try {
      result = work();
    } catch (...) {
    }
    const char byte = result ? kYes : kNo;
    ssize_t n;
    do n = ::write(fds[1], &byte, 1);
    while (n < 0 && errno == EINTR);
    ::_exit(0);  // no atexit handlers, no flush of stdio buffers copied from the parent
  }
  ::close(fds[1]);
  const int verdict = read_verdict(fds[0], deadline);
  ::close(fds[0]);
  if (verdict < 0) ::kill(pid, SIGKILL);
  const std::string how = how_it_ended(pid);
  if (verdict == kYes) return {ChildOutcome::kTrue, ""};
  if (verdict == kNo) return {ChildOutcome::kFalse, ""};
  if (verdict < 0) return {ChildOutcome::kTimedOut, ""};
  return {ChildOutcome::kDied, how};
}

}  // namespace gtp::topology::internal
