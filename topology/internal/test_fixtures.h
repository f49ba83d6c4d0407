// Locates ../shared/fixtures/hwloc (hwloc exports of real machines) beside the repository from inside
// a Bazel test. The runfile topology/BUILD is a symlink into the source tree, so its real path reveals
// the repository root. The repository does not carry those exports: a clone without shared/ beside it
// skips the tests that replay them, and says why.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace gtp::topology::internal {

// Absolute path of the hwloc fixture folder, or nullopt with *why_absent naming the paths tried.
std::optional<std::string> find_hwloc_fixture_dir(std::string* why_absent);

// Absolute path of the hwloc fixture folder; throws std::runtime_error naming the paths tried when it
// is missing. Tests call GTP_SKIP_WITHOUT_HWLOC_FIXTURES() first, so this throws only on a bug.
std::string hwloc_fixture_dir();

}  // namespace gtp::topology::internal

// First statement of a test that replays the fixtures: skips it, printing why, when they are absent.
#define GTP_SKIP_WITHOUT_HWLOC_FIXTURES()                                                \
  do {                                                                                   \
    std::string gtp_fixtures_absent_;                                                    \
    if (!::gtp::topology::internal::find_hwloc_fixture_dir(&gtp_fixtures_absent_)) {     \
      GTEST_SKIP() << gtp_fixtures_absent_;                                              \
    }                                                                                    \
  } while (0)
