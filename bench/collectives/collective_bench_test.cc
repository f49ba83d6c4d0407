// Argument parsing, and a real run: gtp-launch starts 3 gtp-bench ranks (paths in argv[1], argv[2]).
#include "bench/collectives/collective_bench.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "comm/internal/process.h"

namespace gtp::bench {
namespace {

std::string g_launcher, g_bench;

TEST(CollectiveBench, ParsesNcclTestsFlags) {
  const BenchOptions options = parse_bench_args(
      {"reduce_scatter", "-b", "1K", "-e", "64M", "-f", "4", "-n", "7", "-w", "3", "-c", "0", "-d", "bfloat16", "-o",
       "mean", "--json", "out.json"});
  EXPECT_EQ(options.collective, Collective::kReduceScatter);
  EXPECT_EQ(options.min_bytes, 1024u);
  EXPECT_EQ(options.max_bytes, 64u << 20);
  EXPECT_EQ(options.factor, 4u);
  EXPECT_EQ(options.iters, 7);
  EXPECT_EQ(options.warmup, 3);
  EXPECT_FALSE(options.check);
  EXPECT_EQ(options.type, comm::HostDataType::kBFloat16);
  EXPECT_EQ(options.op, comm::HostReduceOp::kMean);
  EXPECT_EQ(options.json_path, "out.json");
  EXPECT_EQ(parse_size("3G"), std::size_t{3} << 30);
  EXPECT_THROW(parse_size("12Q"), std::invalid_argument);
  EXPECT_THROW(parse_bench_args({"all_reduce"}), std::invalid_argument);
  EXPECT_THROW(parse_bench_args({"all_gather", "-b", "2M", "-e", "1M"}), std::invalid_argument);
  EXPECT_THROW(parse_bench_args({"all_gather", "-f", "1"}), std::invalid_argument);
  EXPECT_THROW(parse_bench_args({"all_gather", "-d", "int8"}), std::invalid_argument);
}

TEST(CollectiveBench, BusBandwidthFactorIsNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(8), 7.0 / 8.0);
}

TEST(CollectiveBench, ThreeRanksSweepWithCheckAndJson) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string json_path = std::string(tmp != nullptr ? tmp : "/tmp") + "/gtp_bench_test.json";
  for (const std::string collective : {"all_gather", "reduce_scatter"}) {
    const auto result = comm::internal::run_shell(g_launcher + " -n 3 --timeout 120 -- " + g_bench + " " +
                                                  collective + " -b 1K -e 64K -f 8 -n 3 -w 1 --json " + json_path);
    ASSERT_EQ(result.status, 0) << result.output;
    EXPECT_NE(result.output.find("[0] #    size(B)        count      type  redop     time(us) algbw(GB/s) busbw(GB/s)   #wrong  path"), std::string::npos)
        << result.output;
    const nlohmann::json json = nlohmann::json::parse(std::ifstream(json_path));
    EXPECT_EQ(json["collective"], collective);
    EXPECT_EQ(json["ranks"], 3);
    EXPECT_EQ(json["path"], "host");
    ASSERT_EQ(json["results"].size(), 3u);  // 1K, 8K, 64K
    for (const auto& row : json["results"]) {
      EXPECT_EQ(row["wrong"], 0);
      EXPECT_EQ(row["size"].get<std::size_t>() % (3 * 4), 0u);  // whole float elements per rank
      EXPECT_NEAR(row["busbw_gbps"].get<double>(), row["algbw_gbps"].get<double>() * 2 / 3, 1e-12);
      EXPECT_NEAR(row["algbw_gbps"].get<double>(), row["size"].get<double>() / 1e3 / row["time_us"].get<double>(),
                  1e-9);
    }
  }
}

}  // namespace
}  // namespace gtp::bench

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: collective_bench_test GTP_LAUNCH GTP_BENCH\n");
    return 2;
  }
  gtp::bench::g_launcher = argv[1];
  gtp::bench::g_bench = argv[2];
  return RUN_ALL_TESTS();
}
