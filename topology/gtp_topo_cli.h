// The gtp-topo command line (its verbs, options and exit codes), apart from main() so that
// //fuzz:gtp_topo_args_fuzz can drive it.
#pragma once

#include <string>
#include <vector>

namespace gtp::topology {

// Runs gtp-topo with `args` (argv without the program name), printing to stdout / stderr. Returns the
// exit code: 0 ok, 1 violations or invalid input, 2 usage error.
int gtp_topo_main(const std::vector<std::string>& args);

}  // namespace gtp::topology
