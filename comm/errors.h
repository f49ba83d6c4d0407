// Error types of the comm layer. Bad input is std::invalid_argument; everything the environment or a
// peer caused (unreachable root, a rank that died, a timeout) is CommError, whose timed_out() flag lets
// the future C ABI map it to GTP_ERROR_TIMEOUT instead of a generic system error.
#pragma once

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

}  // namespace gtp::comm
