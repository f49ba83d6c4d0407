// gtp-topo: see gtp_topo_cli.h and docs/topology.md.
#include <string>
#include <vector>

#include "topology/gtp_topo_cli.h"

int main(int argc, char** argv) {
  return gtp::topology::gtp_topo_main(std::vector<std::string>(argv + 1, argv + argc));
}
