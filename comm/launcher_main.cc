// gtp-launch -n N [--timeout S] -- COMMAND [ARGS...]: see launcher.h and docs/comm.md.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/launcher.h"

int main(int argc, char** argv) {
  try {
    return gtp::comm::launch(gtp::comm::parse_launch_args(std::vector<std::string>(argv + 1, argv + argc)));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-launch: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
