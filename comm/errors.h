// Error types of the comm layer. Bad input is std::invalid_argument; everything the environment or a
// peer caused (unreachable root, a rank that died, a timeout) is CommError, whose timed_out() flag lets
// the future C ABI map it to GTP_ERROR_TIMEOUT instead of a generic system error.
#pragma once

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace gtp::comm {

class CommError : public std::runtime_error {
 public:
  CommError(const std::string& message, bool timed_out) : std::runtime_error(message), timed_out_(timed_out) {}
  bool timed_out() const { return timed_out_; }

 private:
  bool timed_out_;
};

// now + timeout on the steady clock, saturating: a timeout up to INT64_MAX ms means "very long"
// (capped at 100 years, well inside the clock's 292-year range), never an overflow into the past
// that would time out at once.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24 * 365 * 100);
  return std::chrono::steady_clock::now() + std::clamp(timeout, std::chrono::milliseconds(0), kLongest);
}

}  // namespace gtp::comm
