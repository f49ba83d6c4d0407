// gtp-launch's arguments (-n N [--timeout S] -- CMD ARGS...): refusals are std::invalid_argument; what
// is accepted must be within docs/reliability.md's ranges (a bad value silently accepted is a finding).
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "comm/launcher.h"
#include "fuzz/cli_args.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gtp::comm::LaunchOptions options;
  try {
    options = gtp::comm::parse_launch_args(gtp::fuzz::split_args(data, size));
  } catch (const std::invalid_argument&) {
    return 0;
  }
  const long long ms = options.timeout.count();
  if (options.world_size < 1 || options.world_size > 4096 || options.command.empty() ||
      (ms != 0 && (ms < 1 || ms > 31536000LL * 1000))) {
    std::fprintf(stderr, "FINDING: gtp-launch accepted -n %d, timeout %lld ms, %zu command words\n",
                 options.world_size, ms, options.command.size());
    std::abort();
  }
  return 0;
}
