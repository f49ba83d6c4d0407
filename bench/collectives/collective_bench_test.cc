// Argument parsing, and a real run: gtp-launch starts 3 gtp-bench ranks (paths in argv[1], argv[2]).
#include "bench/collectives/collective_bench.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "bench/collectives/bench_groups.h"
#include "bench/collectives/wire_bench.h"
#include "comm/internal/process.h"

namespace gtp::bench {
namespace {

std::string g_launcher, g_bench;

std::string tmp_path(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

// A profile of `world` ranks on one host of 8 GPUs, TP = tp, G = shards / tp.
std::string write_profile(const std::string& name, int world, int tp, int shards) {
  const std::string path = tmp_path(name);
  std::ofstream(path) << R"({"schema_version": 1, "cluster": {"template": {"host_count": 1, "host": {"gpus": [)"
                      << R"({"index": 0}, {"index": 1}, {"index": 2}, {"index": 3}, {"index": 4}, {"index": 5},)"
                      << R"({"index": 6}, {"index": 7}]}}}, "parallel": {"world_size": )" << world
                      << R"(, "tensor_model_parallel_size": )" << tp << R"(, "tensor_parallel_num_weight_shards": )"
                      << shards << "}}";
  return path;
}

// Throws std::invalid_argument whose message contains `needle`.
void expect_rejected(const std::vector<std::string>& args, const std::string& needle) {
  try {
    parse_bench_args(args);
    ADD_FAILURE() << "accepted; expected an error naming " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

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

// Sizes are whole bytes in [1, 1T]: a fraction, an exponent or inf used to become 0 (an endless sweep)
// or an undefined conversion ("-e 1e30" read as 0).
TEST(CollectiveBench, RefusesSizesAndCountsThatAreNotWholeNumbersInRange) {
  for (const char* text : {"0.5", "1e30", "inf", "nan", "-1", "0", "1.5K", "2T", "2048G", " 64", "+64", "64MB",
                           "99999999999999999999"}) {
    try {
      parse_size(text);
      ADD_FAILURE() << "size '" << text << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("whole number of bytes in [1, 1T]"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_size("1024G"), kMaxBytes);
  EXPECT_EQ(parse_size("1"), 1u);
  for (const char* text : {"2.5", "1e3", " 3", "+3", "99999999999"}) {
    EXPECT_THROW(parse_bench_args({"all_gather", "-n", text}), std::invalid_argument) << text;
  }
  EXPECT_THROW(parse_bench_args({"all_gather", "-e", "1e30"}), std::invalid_argument);
}

TEST(CollectiveBench, HostMemoryIsCheckedBeforeTheSweepNamingMinusE) {
  BenchOptions options = parse_bench_args({"all_gather", "-b", "1M", "-e", "64M"});
  EXPECT_EQ(host_bytes_per_rank(options, 4), std::size_t{128} << 20);  // input + output at 64 MiB
  EXPECT_NO_THROW(check_host_memory(options, 4, std::size_t{128} << 20));
  EXPECT_NO_THROW(check_host_memory(options, 4, 0));  // unknown: not checked
  try {
    check_host_memory(options, 4, std::size_t{100} << 20);
    ADD_FAILURE() << "128 MiB fit in 100";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("-e 67108864 needs about 0.1 GiB"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pass a smaller -e"), std::string::npos) << e.what();
  }
  options.format = kernels::WireFormat::kFP8;
  EXPECT_EQ(host_bytes_per_rank(options, 4), std::size_t{256} << 20);
  EXPECT_GT(available_host_bytes(), 0u);
}

TEST(CollectiveBench, ParsesGroupProfileAndFormat) {
  const BenchOptions options =
      parse_bench_args({"all_gather", "--format", "nvfp4", "--profile", "p.json", "--group", "tp,gtp_remat"});
  ASSERT_TRUE(options.format.has_value());
  EXPECT_EQ(*options.format, kernels::WireFormat::kNVFP4);
  EXPECT_EQ(options.type, comm::HostDataType::kBFloat16);  // the weight is BF16 whatever -d defaults to
  EXPECT_EQ(options.profile_path, "p.json");
  EXPECT_EQ(options.group, "tp,gtp_remat");
  EXPECT_EQ(parse_bench_args({"all_gather"}).group, "world");
  expect_rejected({"all_gather", "--format", "fp4"}, "--format fp4");
  expect_rejected({"reduce_scatter", "--format", "fp8"}, "--format");
  expect_rejected({"all_gather", "--format", "fp8", "-d", "float"}, "-d float");
  expect_rejected({"all_gather", "--group", "tp"}, "--group tp needs --profile");
  expect_rejected({"all_gather", "--format"}, "--format needs a value");
}

TEST(CollectiveBench, FormatSweepGathersWholeAlignedWeights) {
  BenchOptions options = parse_bench_args({"all_gather", "-b", "64K", "-e", "8M", "-f", "4", "--format", "mxfp8"});
  for (const SweepPoint& point : sweep(options, 3)) {
    const std::size_t block = 32 * kWireCols;  // 32 rows per rank, the MXFP8 alignment
    EXPECT_EQ(point.per_rank_count % block, 0u);
    EXPECT_GE(point.per_rank_count, block);
    EXPECT_EQ(point.count, 3 * point.per_rank_count);
    EXPECT_EQ(point.size, 2 * point.count);
    EXPECT_LE(point.size, std::max<std::size_t>(8u << 20, 3 * block * 2));
    const kernels::WeightGeometry geometry = wire_geometry(options, point, 3);
    EXPECT_EQ(geometry.padded_rows, geometry.rows);  // no padding: every format gathers the same weight
    EXPECT_EQ(static_cast<std::size_t>(geometry.rows * geometry.cols), point.count);
  }
}

TEST(CollectiveBench, ReferenceWeightIsTheWholeWeightDecoded) {
  for (const char* format : {"bf16", "fp8", "mxfp8", "nvfp4"}) {
    const BenchOptions options = parse_bench_args({"all_gather", "-b", "1", "-e", "1", "--format", format});
    const SweepPoint point = sweep(options, 2)[0];
    const std::vector<std::uint16_t> weight = reference_weight(options, point, 2);
    ASSERT_EQ(weight.size(), point.count);
    if (std::string(format) == "bf16") {  // passthrough: the shards themselves, back to back
      std::vector<std::uint16_t> shards(point.count);
      for (int rank = 0; rank < 2; ++rank) {
        const std::vector<unsigned char> shard = make_input(options, point, rank);
        std::memcpy(shards.data() + rank * point.per_rank_count, shard.data(), shard.size());
      }
      EXPECT_EQ(count_mismatches(weight, shards), 0);
    }
    std::vector<std::uint16_t> changed = weight;
    changed[7] ^= 1;
    EXPECT_EQ(count_mismatches(changed, weight), 1);
  }
}

TEST(CollectiveBench, GroupsComeFromTheProfileGrid) {
  const std::string profile = write_profile("groups.json", 8, 2, 4);  // TP 2, G 2, DP 2
  BenchOptions options = parse_bench_args({"all_gather", "--profile", profile, "--group", "gtp_remat"});
  BenchGroups groups = resolve_groups(options, 8);
  EXPECT_EQ(groups.group_size, 2);
  EXPECT_EQ(groups.groups, (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(groups.group_of(6), (std::vector<int>{4, 6}));
  options.group = "tp,gtp_remat";  // dims: the same groups as the family tp_gtp_remat
  const BenchGroups dims = resolve_groups(options, 8);
  options.group = "tp_gtp_remat";
  EXPECT_EQ(dims.groups, resolve_groups(options, 8).groups);
  EXPECT_EQ(dims.groups, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  options.group = "expt_tp,ep";
  EXPECT_EQ(resolve_groups(options, 8).group_size, 2);  // ETP follows TP, EP 1
  options.group = "world";
  EXPECT_EQ(resolve_groups(options, 8).group_size, 8);
  options.group = "tp,ep";  // dims of two different views
  EXPECT_THROW(resolve_groups(options, 8), std::invalid_argument);
  options.group = "tp";
  try {
    resolve_groups(options, 4);
    ADD_FAILURE() << "a profile of 8 ranks was accepted for 4";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.world_size is 8 but gtp-bench runs 4 ranks"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(resolve_groups(parse_bench_args({"all_gather"}), 5).groups,
            (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}}));
}

TEST(CollectiveBench, BusBandwidthFactorIsNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(8), 7.0 / 8.0);
}

TEST(CollectiveBench, ThreeRanksSweepWithCheckAndJson) {
  const std::string json_path = tmp_path("gtp_bench_test.json");
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

// Every wire format over 3 launched ranks: the unpacked weight equals the reference bit for bit.
TEST(CollectiveBench, ThreeRanksGatherEveryWireFormatExactly) {
  const std::string json_path = tmp_path("gtp_bench_wire.json");
  for (const std::string format : {"bf16", "fp8", "mxfp8", "nvfp4"}) {
    const auto result = comm::internal::run_shell(g_launcher + " -n 3 --timeout 120 -- " + g_bench +
                                                  " all_gather -b 512K -e 2M -f 4 -n 2 -w 1 -c 1 --format " +
                                                  format + " --json " + json_path);
    ASSERT_EQ(result.status, 0) << result.output;
    EXPECT_NE(result.output.find("wire format " + format), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("wire(B)   pack(us) gather(us) unpack(us)    e2e(us)  vs_bf16"), std::string::npos)
        << result.output;
    const nlohmann::json json = nlohmann::json::parse(std::ifstream(json_path));
    EXPECT_EQ(json["format"], format);
    EXPECT_EQ(json["group_size"], 3);
    const BenchOptions options = parse_bench_args({"all_gather", "--format", format});
    ASSERT_EQ(json["results"].size(), 4u);  // 512K and 2M: a BF16 row, then the wire row
    for (std::size_t i = 0; i < 4; i += 2) {
      const auto& bf16 = json["results"][i];
      const auto& wire = json["results"][i + 1];
      EXPECT_EQ(bf16["path"], "host");
      EXPECT_EQ(bf16["type"], "bfloat16");
      EXPECT_EQ(wire["path"], "host_wire");
      EXPECT_EQ(wire["type"], format);
      EXPECT_EQ(bf16["wrong"], 0);
      EXPECT_EQ(wire["wrong"], 0);
      EXPECT_EQ(wire["size"], bf16["size"]);  // the same weight
      SweepPoint point{wire["size"], wire["count"], wire["count"].get<std::size_t>() / 3};
      EXPECT_EQ(wire["wire_bytes"], wire_layout(options, point).chunk_bytes * 3);
      EXPECT_DOUBLE_EQ(wire["e2e_us"].get<double>(), wire["time_us"].get<double>());
      EXPECT_NEAR(wire["e2e_ratio_to_bf16"].get<double>(),
                  bf16["time_us"].get<double>() / wire["e2e_us"].get<double>(), 1e-9);
      for (const char* part : {"pack_us", "gather_us", "unpack_us"}) EXPECT_GT(wire[part].get<double>(), 0) << part;
    }
  }
}

// --profile and --group over 4 launched ranks: TP 2, G 2, the collective on each gtp_remat pair.
TEST(CollectiveBench, FourRanksRunOnTheirGtpRematGroups) {
  const std::string profile = write_profile("four.json", 4, 2, 4);
  const std::string json_path = tmp_path("gtp_bench_group.json");
  const auto result = comm::internal::run_shell(g_launcher + " -n 4 --timeout 120 -- " + g_bench +
                                                " all_gather -b 1M -e 1M -n 2 -w 1 --format nvfp4 --profile " +
                                                profile + " --group gtp_remat --json " + json_path);
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("group: gtp_remat groups of 2 ranks"), std::string::npos) << result.output;
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(json_path));
  EXPECT_EQ(json["ranks"], 4);
  EXPECT_EQ(json["group_size"], 2);
  EXPECT_DOUBLE_EQ(json["busbw_factor"].get<double>(), 0.5);
  ASSERT_EQ(json["results"].size(), 2u);
  for (const auto& row : json["results"]) {
    EXPECT_EQ(row["wrong"], 0);
    EXPECT_EQ(row["count"].get<std::size_t>() % (2 * 32 * kWireCols), 0u);  // two shards of whole row blocks
    EXPECT_NEAR(row["busbw_gbps"].get<double>(), row["algbw_gbps"].get<double>() / 2, 1e-12);
  }
}

// Bad flags and a profile of the wrong size: exit status 2 and a message naming the flag.
TEST(CollectiveBench, BadFlagsAndMismatchedProfilesExitWith2) {
  const std::string profile = write_profile("mismatch.json", 4, 1, 1);
  const std::string fifo = tmp_path("bench_fifo.json");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {g_bench + " all_gather --format int4", "--format int4"},
      {g_bench + " reduce_scatter --format fp8", "--format applies to all_gather only"},
      {g_bench + " all_gather --group tp", "--group tp needs --profile"},
      {g_launcher + " -n 2 --timeout 60 -- " + g_bench + " all_gather --profile " + profile,
       "parallel.world_size is 4 but gtp-bench runs 2 ranks"},
      {g_launcher + " -n 4 --timeout 60 -- " + g_bench + " all_gather --profile " + profile + " --group tp,expt_dp",
       "--group tp,expt_dp: not a group family"},
      {g_launcher + " -n 2 --timeout 60 -- " + g_bench + " all_gather --profile " + tmp_path("missing.json"),
       "missing.json"},
      {g_bench + " all_gather -b 0.5", "size \"0.5\": pass a whole number of bytes"},
      {g_bench + " all_gather -b inf", "size \"inf\""},
      {g_bench + " all_gather -e 1e30", "size \"1e30\""},
      // Checked before the run: it used to exit 0 after the sweep without writing anything.
      {g_launcher + " -n 1 --timeout 60 -- " + g_bench + " all_gather -b 1K -e 1K --json /nonexistent/dir/x.json",
       "--json /nonexistent/dir/x.json: cannot open for writing"},
      // Opening a FIFO for writing blocked until a reader came (run_shell would hang here).
      {g_launcher + " -n 1 --timeout 60 -- " + g_bench + " all_gather -b 1K -e 1K --json " + fifo, "exists and is not a regular file (a FIFO"},
      {g_launcher + " -n 1 --timeout 60 -- " + g_bench + " all_gather -b 1K -e 1K --json " + tmp_path(""), "is not a regular file"},
      // The documented maximum: std::bad_alloc, without a word on which flag, mid-sweep.
      {g_launcher + " -n 1 --timeout 60 -- " + g_bench + " all_gather -b 1024G -e 1024G", "-e 1099511627776 needs about 2048.0 GiB of host memory per rank"},
  };
  for (const auto& [command, message] : cases) {
    const auto result = comm::internal::run_shell(command);
    EXPECT_EQ(result.status, 2) << command << "\n" << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << command << "\n" << result.output;
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
