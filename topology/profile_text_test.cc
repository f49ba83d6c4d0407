// Untrusted profile text and files: every refusal is std::invalid_argument naming the limit or the
// JSON pointer, never a crash (deep nesting), a hang (a FIFO) or an unbounded read (/dev/zero).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "topology/internal/crashing_hwloc_xml.h"
#include "topology/profile.h"

namespace gtp::topology {
namespace {

std::string error_of_text(const std::string& text) {
  try {
    parse_profile_text(text, ".");
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

std::string error_of_file(const std::string& path) {
  try {
    load_profile(path);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

std::string temp_path(const std::string& name) { return std::string(std::getenv("TEST_TMPDIR")) + "/" + name; }

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(ProfileText, NestingIsBoundedBeforeParsing) {
  EXPECT_HAS(error_of_text(std::string(100000, '[')), "nesting deeper than 64 levels at byte 64");
  EXPECT_HAS(error_of_text("{\"a\":" + std::string(100000, '{')), "nesting deeper than 64");
  // Brackets inside strings are not nesting: this reaches the profile reader.
  EXPECT_HAS(error_of_text("{\"name\": \"" + std::string(1000, '[') + "\\\"[\"}"), "/schema_version: missing");
}

TEST(ProfileText, NulBytesAndDuplicateKeysAreRefused) {
  EXPECT_HAS(error_of_text(std::string("{\"schema_version\": 1}\0{}", 24)), "byte 21 is a NUL");
  EXPECT_HAS(error_of_text(R"({"schema_version": 1, "schema_version": 2})"), "/schema_version: duplicate key");
  EXPECT_HAS(error_of_text(R"({"parallel": {"world_size": 2, "world_size": 4}})"), "/parallel/world_size: duplicate key");
  EXPECT_HAS(error_of_text(R"({"x": [{"k": 1}, 5, {"k": 1, "k": 2}]})"), "/x/2/k: duplicate key");
  EXPECT_HAS(error_of_text(R"({"a": {"k": 1}, "b": {"k": 1}})"), "/a: unknown key");  // same key, two objects
}

TEST(ProfileText, NumbersPastDoubleRangeNameTheirPath) {
  EXPECT_HAS(error_of_text(R"({"parallel": {"world_size": 1)" + std::string(400, '0') + "}}"),
             "/parallel/world_size: ");
  EXPECT_HAS(error_of_text(R"({"list": [1, 2, -1e999]})"), "/list/2: ");
}

// A 16M-GPU template died with std::bad_alloc, a 2M-GPU one planned for 83 s in 16 GB.
TEST(ProfileText, ClustersAreBoundedTo2To18Gpus) {
  const auto with_hosts = [](int hosts, int gpus_per_host) {
    std::string gpus;
    for (int i = 0; i < gpus_per_host; ++i) gpus += (i ? "," : "") + std::string("{\"index\": ") + std::to_string(i) + "}";
    return R"({"schema_version": 1, "cluster": {"template": {"host_count": )" + std::to_string(hosts) +
           R"(, "host": {"gpus": [)" + gpus + R"(]}}}, "parallel": {"world_size": 8}})";
  };
  EXPECT_HAS(error_of_text(with_hosts(262144, 64)),
             "/cluster/template/host_count: host_count 262144 x 64 GPUs per host = 16777216 GPUs, over the 262144");
  EXPECT_HAS(error_of_text(with_hosts(32769, 8)), "= 262152 GPUs, over the 262144");
  EXPECT_EQ(error_of_text(with_hosts(32768, 8)), "");
}

TEST(ProfileFile, OnlyRegularFilesOfBoundedSizeAreRead) {
  const std::string fifo = temp_path("profile.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_HAS(error_of_file(fifo), "is not a regular file");  // would block for a writer
  EXPECT_HAS(error_of_file("/dev/zero"), "is not a regular file");
  EXPECT_HAS(error_of_file(std::getenv("TEST_TMPDIR")), "is not a regular file");
  const std::string big = temp_path("big.json");
  std::ofstream(big).close();
  ASSERT_EQ(truncate(big.c_str(), (int64_t{64} << 20) + 1), 0);
  EXPECT_HAS(error_of_file(big), "over the 64 MiB limit");
  EXPECT_HAS(error_of_file(temp_path("missing.json")), "cannot open profile");
  const std::string nul = temp_path("nul.json");
  std::ofstream(nul) << std::string("{}\0garbage", 10);
  EXPECT_HAS(error_of_file(nul), "byte 2 is a NUL");
}

// A profile's cluster.hwloc_xml that crashes hwloc 2.9: before the child-process trial, SIGSEGV.
TEST(ProfileFile, HwlocXmlThatCrashesHwlocIsAnErrorNamingItsPath) {
  std::ofstream(temp_path("crash.xml")) << internal::kPuWithoutCompleteCpuset;
  const std::string profile = temp_path("crash-profile.json");
  std::ofstream(profile) << R"({"schema_version": 1, "cluster": {"hwloc_xml": ["crash.xml"]},)"
                         << R"( "parallel": {"world_size": 1}})";
  const std::string error = error_of_file(profile);
  EXPECT_HAS(error, "/cluster/hwloc_xml/0");
  EXPECT_HAS(error, "hwloc crashed with signal");
  EXPECT_HAS(error, "crash.xml");
}

}  // namespace
}  // namespace gtp::topology
