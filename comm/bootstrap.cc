#include "comm/bootstrap.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace gtp::comm {

std::vector<std::string> Bootstrap::allgather_records(const std::string& record) {
  const int n = world_size();
  std::vector<std::uint64_t> sizes(n);
  const std::uint64_t own_size = record.size();
  allgather(&own_size, sizes.data(), sizeof(own_size));
  const std::size_t slot = *std::max_element(sizes.begin(), sizes.end());

  // Records are padded to the largest one so the fixed-size allgather can carry them.
  std::string padded = record;
  padded.resize(slot);
  std::string gathered(slot * n, '\0');
  allgather(padded.data(), gathered.data(), slot);

  std::vector<std::string> records(n);
  for (int r = 0; r < n; ++r) records[r] = gathered.substr(r * slot, sizes[r]);
  return records;
}

void Bootstrap::check_root(int root) const {
  if (root < 0 || root >= world_size()) {
    throw std::invalid_argument("broadcast root " + std::to_string(root) + " is not a rank of this job: pass a root in [0, " +
                                std::to_string(world_size()) + ")");
  }
}

std::chrono::milliseconds timeout_from_env(const char* name, std::chrono::milliseconds fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || seconds > 1e6) {
    throw std::invalid_argument(std::string(name) + "=\"" + text +
                                "\" is not a timeout: set it to a positive number of seconds, for example 30");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

}  // namespace gtp::comm
