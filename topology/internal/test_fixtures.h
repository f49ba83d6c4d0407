// Locates ../shared/fixtures/hwloc beside the repository from inside a Bazel test. The runfile
// topology/BUILD is a symlink into the source tree, so its real path reveals the repository root.
#pragma once

#include <string>

namespace gtp::topology::internal {

// Absolute path of the hwloc fixture folder; throws std::runtime_error with the paths it tried
// when the fixtures are missing (CI always has them, so a missing folder is a failure).
std::string hwloc_fixture_dir();

}  // namespace gtp::topology::internal
