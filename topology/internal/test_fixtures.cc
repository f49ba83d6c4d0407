#include "topology/internal/test_fixtures.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <stdexcept>

namespace gtp::topology::internal {

std::optional<std::string> find_hwloc_fixture_dir(std::string* why_absent) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (!srcdir || !workspace) {
    *why_absent = "TEST_SRCDIR/TEST_WORKSPACE unset: run this under bazel test";
    return std::nullopt;
  }
  const std::string marker = std::string(srcdir) + "/" + workspace + "/topology/BUILD";
  char resolved[PATH_MAX];
  if (!realpath(marker.c_str(), resolved)) {
    *why_absent = "cannot resolve " + marker + ": list topology/BUILD in the test's data";
    return std::nullopt;
  }
  std::string root(resolved);
  root = root.substr(0, root.rfind("/topology/BUILD"));
  const std::string fixtures = root + "/../shared/fixtures/hwloc";
  struct stat info;
  if (stat((fixtures + "/power8gpudistances.xml").c_str(), &info) != 0) {
    *why_absent = "hwloc fixtures (exports of real machines) not found at " + fixtures + " (repository root " +
                  root + "): this test replays them; check out shared/ beside the repository as ../shared to run it";
    return std::nullopt;
  }
  return fixtures;
}

std::string hwloc_fixture_dir() {
  std::string why;
  std::optional<std::string> dir = find_hwloc_fixture_dir(&why);
  if (!dir) throw std::runtime_error(why);
  return *dir;
}

}  // namespace gtp::topology::internal
