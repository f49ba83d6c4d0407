// gtp-topo's command line: any arguments end with exit code 0, 1 or 2 (docs/topology.md), never a
// crash. Its output goes to /dev/null.
#include <cstdio>
#include <cstdlib>

#include "fuzz/cli_args.h"
#include "topology/gtp_topo_cli.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (!std::freopen("/dev/null", "w", stdout)) std::abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int code = gtp::topology::gtp_topo_main(gtp::fuzz::split_args(data, size));
  if (code < 0 || code > 2) {
    std::fprintf(stderr, "FINDING: gtp-topo exited %d\n", code);
    std::abort();
  }
  return 0;
}
