// gtp-overlap-bench's flags, shapes, sizing arithmetic and profile, on the CPU.
#include "bench/overlap/overlap_options.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "topology/profile.h"

namespace gtp::bench::overlap {
namespace {

Options parse(std::vector<const char*> args) {
  args.insert(args.begin(), "gtp-overlap-bench");
  return parse_options(static_cast<int>(args.size()), args.data());
}

// The message of the std::invalid_argument that parsing `args` throws ("" if none).
std::string parse_error(std::vector<const char*> args) {
  try {
    parse(std::move(args));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(OverlapOptions, DefaultsAutoSizeEveryWireTwoDepthsBothPriorities) {
  const Options o = parse({});
  EXPECT_EQ(o.m, 0);
  EXPECT_EQ(o.n, 8192);
  EXPECT_EQ(o.k, 8192);
  EXPECT_EQ(o.layers, 8);
  EXPECT_EQ(o.microbatches, 1);
  EXPECT_EQ(o.wires.size(), 4u);
  EXPECT_EQ(o.depths, (std::vector<int>{1, 2}));
  EXPECT_EQ(o.priorities, (std::vector<std::string>{"high", "normal"}));
  EXPECT_EQ(o.bootstrap, Bootstrap::kCallbacks);
  EXPECT_FALSE(o.switches.keep_gathered);
  EXPECT_TRUE(o.switches.grads_into_main_grad);
  EXPECT_FALSE(o.repack);
  EXPECT_FALSE(o.help);
}

TEST(OverlapOptions, ParsesEveryFlag) {
  const Options o = parse({"--m",
                           "512",
                           "--n",
                           "4096",
                           "--k",
                           "1024",
                           "--layers",
                           "6",
                           "--microbatches",
                           "4",
                           "--iters",
                           "7",
                           "--warmup",
                           "0",
                           "--wires",
                           "nvfp4,bf16",
                           "--depths",
                           "0,3",
                           "--priorities",
                           "low",
                           "--keep-gathered",
                           "on",
                           "--grads-into-main-grad",
                           "off",
                           "--repack",
                           "on",
                           "--bootstrap",
                           "ucx",
                           "--gather-gbps",
                           "350.5",
                           "--timeout-ms",
                           "5000",
                           "--json",
                           "out.json"});
  EXPECT_EQ(o.m, 512);
  EXPECT_EQ(o.n, 4096);
  EXPECT_EQ(o.k, 1024);
  EXPECT_EQ(o.layers, 6);
  EXPECT_EQ(o.microbatches, 4);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.warmup, 0);
  EXPECT_EQ(o.wires, (std::vector<kernels::WireFormat>{kernels::WireFormat::kNVFP4, kernels::WireFormat::kBF16}));
  EXPECT_EQ(o.depths, (std::vector<int>{0, 3}));
  EXPECT_EQ(o.priorities, (std::vector<std::string>{"low"}));
  EXPECT_TRUE(o.switches.keep_gathered);
  EXPECT_FALSE(o.switches.grads_into_main_grad);
  EXPECT_TRUE(o.repack);
  EXPECT_FALSE(parse({"--keep-gathered", "off"}).switches.keep_gathered);
  EXPECT_EQ(o.bootstrap, Bootstrap::kUcxFromEnv);
  EXPECT_DOUBLE_EQ(o.gather_gbps, 350.5);
  EXPECT_EQ(o.timeout_ms, 5000);
  EXPECT_EQ(o.json_path, "out.json");
  EXPECT_EQ(parse({"--m", "auto"}).m, 0);
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(OverlapOptions, BadFlagsNameTheValueAndTheFix) {
  EXPECT_NE(parse_error({"--n", "1000"}).find("--n 1000 is not a multiple of 32"), std::string::npos);
  EXPECT_NE(parse_error({"--n", "1000"}).find("use 1024"), std::string::npos);
  EXPECT_NE(parse_error({"--k", "12x"}).find("--k '12x' is not an integer"), std::string::npos);
  EXPECT_NE(parse_error({"--m", "0"}).find("--m 0 is out of range"), std::string::npos);
  EXPECT_NE(parse_error({"--layers", "0"}).find("--layers 0 is out of range; give a value in [1, 1024]"),
            std::string::npos);
  EXPECT_NE(parse_error({"--microbatches", "65"}).find("--microbatches 65 is out of range"), std::string::npos);
  EXPECT_NE(parse_error({"--depths", "1,65"}).find("--depths 65 is out of range"), std::string::npos);
  EXPECT_NE(parse_error({"--depths", "1,1"}).find("lists '1' twice"), std::string::npos);
  EXPECT_NE(parse_error({"--depths", "1,,2"}).find("empty item"), std::string::npos);
  EXPECT_NE(parse_error({"--wires", "fp16"}).find("unknown wire format \"fp16\""), std::string::npos);
  EXPECT_NE(parse_error({"--priorities", "highest"}).find("'highest' is not a stream priority"), std::string::npos);
  EXPECT_NE(parse_error({"--bootstrap", "mpi"}).find("--bootstrap 'mpi' is unknown"), std::string::npos);
  EXPECT_NE(parse_error({"--keep-gathered", "yes"}).find("--keep-gathered 'yes' is not on or off"), std::string::npos);
  EXPECT_NE(parse_error({"--grads-into-main-grad", "1"}).find("--grads-into-main-grad '1' is not on or off"),
            std::string::npos);
  EXPECT_NE(parse_error({"--repack", "1"}).find("--repack '1' is not on or off"), std::string::npos);
  EXPECT_NE(parse_error({"--gather-gbps", "-3"}).find("not a positive number"), std::string::npos);
  EXPECT_NE(parse_error({"--iters"}).find("--iters needs a value"), std::string::npos);
  EXPECT_NE(parse_error({"--size", "3"}).find("unknown flag '--size'"), std::string::npos);
  EXPECT_NE(parse_error({"8192"}).find("unexpected argument '8192'"), std::string::npos);
}

TEST(OverlapOptions, LayersAlternateSoTheChainComposes) {
  Options o;
  o.n = 4096;
  o.k = 1024;
  for (int i = 0; i + 1 < 6; ++i) {
    // Layer i's output feeds layer i+1's input, and every weight has N x K elements.
    EXPECT_EQ(layer_shape(o, i).out_features, layer_shape(o, i + 1).in_features);
    EXPECT_EQ(layer_shape(o, i).out_features * layer_shape(o, i).in_features, 4096 * 1024);
  }
  EXPECT_EQ(layer_shape(o, 0).out_features, 4096);
  EXPECT_EQ(layer_shape(o, 0).in_features, 1024);
}

TEST(OverlapSizing, GatherOnOneRankIsTwoCopiesElseTheAllGatherPlusTheUnpack) {
  const std::int64_t elements = 1 << 20;  // 2 MiB of BF16
  // One rank: the size-1 all-gather copies the chunk, the unpack copies it again.
  EXPECT_DOUBLE_EQ(gather_seconds(elements, 1, 2e12, 0), 2 * 2.0 * elements / 2e12);
  // G = 8 at 350 GB/s busbw: 7/8 of the gathered bytes cross the wire, then the unpack.
  EXPECT_DOUBLE_EQ(gather_seconds(elements, 8, 2e12, 350e9), 2.0 * elements * 7 / 8 / 350e9 + 2.0 * elements / 2e12);
  EXPECT_THROW(gather_seconds(elements, 2, 2e12, 0), std::invalid_argument);
  EXPECT_THROW(gather_seconds(0, 1, 2e12, 0), std::invalid_argument);
}

TEST(OverlapSizing, ConstantRateSolvesInOneStep) {
  const std::int64_t n = 8192, k = 8192;
  const double rate = 600e12;
  const double gather_s = 2.0 * n * k * 700 / rate;  // a GEMM of M = 700 lasts exactly this long
  const Sizing s = choose_m(n, k, gather_s, 65536, [&](std::int64_t) { return rate; });
  EXPECT_EQ(s.m, 704);            // 700 rounded up to the multiple of 64
  ASSERT_EQ(s.steps.size(), 2u);  // 1024, then 704, whose next M is 704 again: stop
  EXPECT_EQ(s.steps[0].m, 1024);
  EXPECT_EQ(s.steps[1].m, 704);
  EXPECT_GE(s.steps[1].gemm_seconds, gather_s);
  EXPECT_NE(s.why.find("M 704"), std::string::npos);
}

TEST(OverlapSizing, RateGrowingWithMConvergesToAGemmAtLeastAsLongAsTheGather) {
  const std::int64_t n = 4096, k = 4096;
  // Small GEMMs run below peak: rate(M) = peak * M / (M + 512).
  auto rate = [](std::int64_t m) { return 800e12 * static_cast<double>(m) / (m + 512.0); };
  const double gather_s = 40e-6;
  const Sizing s = choose_m(n, k, gather_s, 65536, rate);
  EXPECT_EQ(s.m % 64, 0);
  const double gemm_s = 2.0 * n * k * s.m / rate(s.m);
  EXPECT_GE(gemm_s, gather_s);
  // and the next smaller multiple of 64 would be shorter than the gather, or was not needed.
  const double smaller = 2.0 * n * k * (s.m - 64) / rate(s.m - 64);
  EXPECT_LT(smaller, gather_s * 1.1);
}

TEST(OverlapSizing, CapsMAndSaysSo) {
  const Sizing s = choose_m(1024, 1024, 1.0, 2048, [](std::int64_t) { return 1e15; });
  EXPECT_EQ(s.m, 2048);
  EXPECT_NE(s.why.find("capped"), std::string::npos);
  EXPECT_THROW(choose_m(1024, 1024, 1.0, 32, [](std::int64_t) { return 1e15; }), std::invalid_argument);
  EXPECT_THROW(choose_m(1024, 1024, 1e-3, 4096, [](std::int64_t) { return 0.0; }), std::invalid_argument);
}

TEST(OverlapProfile, ParsesWithTheGroupsPriorityDepthAndWire) {
  for (const char* priority : {"high", "normal", "low"}) {
    const std::string text = profile_json(4, priority, 2, kernels::WireFormat::kMXFP8);
    const topology::Profile p = topology::parse_profile(nlohmann::json::parse(text), ".");
    EXPECT_EQ(p.sizes.world_size, 4);
    EXPECT_EQ(p.sizes.tp, 1);
    EXPECT_EQ(p.sizes.gtp_remat, 4);
    EXPECT_EQ(p.group("gtp_remat").stream_priority, priority);
    EXPECT_EQ(p.group("gtp_remat").prefetch_depth, 2);
    EXPECT_EQ(p.group("gtp_remat").wire_format, topology::WireFormat::kMxfp8);
    EXPECT_FALSE(p.group("gtp_remat").keep_gathered);
    EXPECT_TRUE(p.group("gtp_remat").grads_into_main_grad);
  }
  const std::string switched_profile = profile_json(2, "high", 1, kernels::WireFormat::kBF16, {true, false});
  const topology::GroupSettings switched =
      topology::parse_profile(nlohmann::json::parse(switched_profile), ".").group("gtp_remat");
  EXPECT_TRUE(switched.keep_gathered);
  EXPECT_FALSE(switched.grads_into_main_grad);
  EXPECT_EQ(topology::parse_profile(nlohmann::json::parse(profile_json(1, "high", 0, kernels::WireFormat::kBF16)), ".")
                .sizes.gtp_remat,
            1);
  EXPECT_THROW(profile_json(1, "highest", 1, kernels::WireFormat::kBF16), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::bench::overlap
