#include "topology/internal/test_fixtures.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <stdexcept>

namespace gtp::topology::internal {

std::string hwloc_fixture_dir() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (!srcdir || !workspace) throw std::runtime_error("TEST_SRCDIR/TEST_WORKSPACE unset: run this under bazel test");
  const std::string marker = std::string(srcdir) + "/" + workspace + "/topology/BUILD";
  char resolved[PATH_MAX];
  if (!realpath(marker.c_str(), resolved)) {
    throw std::runtime_error("cannot resolve " + marker + ": list topology/BUILD in the test's data");
  }
  std::string root(resolved);
  root = root.substr(0, root.rfind("/topology/BUILD"));
  const std::string fixtures = root + "/../shared/fixtures/hwloc";
  struct stat info;
  if (stat((fixtures + "/power8gpudistances.xml").c_str(), &info) != 0) {
    throw std::runtime_error("hwloc fixtures not found at " + fixtures +
                             " (repository root " + root + "): check out shared/ beside the repository as ../shared");
  }
  return fixtures;
}

}  // namespace gtp::topology::internal
