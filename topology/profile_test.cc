#include "topology/profile.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "topology/discovery.h"
#include "topology/internal/test_fixtures.h"

namespace gtp::topology {
namespace {

using nlohmann::json;

std::string docs_profile(const std::string& name) {
  return std::string(getenv("TEST_SRCDIR")) + "/" + getenv("TEST_WORKSPACE") + "/docs/profiles/" + name;
}

// A valid small profile to break one field at a time.
json base_profile() {
  return json::parse(R"({
    "schema_version": 1,
    "cluster": {"template": {"host_count": 2, "host": {
      "numa_nodes": [{"os_index": 0, "cpuset": "0xff"}],
      "gpus": [{"index": 0, "numa_node": 0, "nvlink": [{"peer_kind": "nvswitch", "peer": "sw", "gbytes_per_s": 450}],
                "nvlink_domain": "nvswitch"},
               {"index": 1, "numa_node": 0, "nvlink": [{"peer_kind": "nvswitch", "peer": "sw", "gbytes_per_s": 450}],
                "nvlink_domain": "nvswitch"}],
      "nics": [{"name": "mlx5_0", "numa_node": 0, "gbytes_per_s": 50}]}}},
    "parallel": {"tensor_model_parallel_size": 2},
    "groups": {"gtp_remat": {"stream_priority": "high"}}
  })");
}

std::string error_of(const json& document) {
  try {
    parse_profile(document, ".");
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(Profile, ExampleProfilesAreValidAndPlanCleanly) {
  const Profile dgx = load_profile(docs_profile("dgx-h100-8gpu.json"));
  EXPECT_EQ(dgx.name, "dgx-h100-8gpu");
  EXPECT_EQ(dgx.cluster.gpu_count(), 8);
  EXPECT_EQ(dgx.sizes.tp, 2);
  EXPECT_EQ(dgx.sizes.gtp_remat, 4);
  EXPECT_EQ(dgx.on_violation, ViolationPolicy::kFail);
  EXPECT_EQ(dgx.group("gtp_remat").wire_format, WireFormat::kMxfp8);
  EXPECT_EQ(dgx.group("gtp_remat").memory_budget_bytes, 8LL << 30);
  EXPECT_EQ(dgx.group("gtp_remat").nccl.max_ctas, 16);
  EXPECT_EQ(dgx.group("cp").stream_priority, "normal");  // not mentioned: defaults
  EXPECT_EQ(dgx.group("gtp_remat").reduce_scatter_stream_priority, "low");
  const Plan dgx_plan = make_plan(dgx.cluster, dgx.sizes, dgx.on_violation);
  EXPECT_TRUE(dgx_plan.ok());
  EXPECT_DOUBLE_EQ(dgx_plan.group("tp_gtp_remat").min_gbytes_per_s, 450);

  const Profile gb = load_profile(docs_profile("gb200-nvl72.json"));
  EXPECT_EQ(gb.cluster.gpu_count(), 72);
  EXPECT_EQ(gb.cluster.domain_count(), 1);
  EXPECT_EQ(gb.sizes.gtp_remat, 16);
  EXPECT_EQ(gb.sizes.ep, 64);
  const Plan gb_plan = make_plan(gb.cluster, gb.sizes, gb.on_violation);
  EXPECT_TRUE(gb_plan.violations.empty());
  EXPECT_EQ(gb_plan.group("ep").worst_link, LinkClass::kNvlink);
  EXPECT_DOUBLE_EQ(gb_plan.group("tp_gtp_remat").min_gbytes_per_s, 900);

  const Profile h200 = load_profile(docs_profile("single-h200.json"));
  EXPECT_EQ(h200.cluster.gpu_count(), 1);
  EXPECT_EQ(h200.sizes.world_size, 1);
  EXPECT_EQ(h200.cluster_source, "hosts");
  EXPECT_TRUE(make_plan(h200.cluster, h200.sizes, h200.on_violation).ok());
}

TEST(Profile, UnknownKeysSuggestTheClosest) {
  json doc = base_profile();
  doc["paralel"] = doc["parallel"];
  doc.erase("parallel");
  EXPECT_EQ(error_of(doc).rfind("/paralel: unknown key 'paralel': did you mean 'parallel'? (allowed here: ", 0), 0u)
      << error_of(doc);
  doc = base_profile();
  doc["parallel"]["tensor_model_paralel_size"] = 2;
  EXPECT_NE(error_of(doc).find("/parallel/tensor_model_paralel_size: unknown key 'tensor_model_paralel_size': did you "
                               "mean 'tensor_model_parallel_size'?"),
            std::string::npos);
  doc = base_profile();
  doc["groups"]["gtp_remta"] = json::object();
  EXPECT_NE(error_of(doc).find("/groups/gtp_remta: unknown group 'gtp_remta': did you mean 'gtp_remat'?"),
            std::string::npos);
  doc = base_profile();
  doc["groups"]["gtp_remat"]["prefetch_dept"] = 2;
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/prefetch_dept: unknown key 'prefetch_dept': did you mean "
                               "'prefetch_depth'?"),
            std::string::npos);
  doc = base_profile();
  doc["groups"]["gtp_remat"]["reduce_scatter_stream_priority"] = "lowest";
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/reduce_scatter_stream_priority: 'lowest' is not allowed"),
            std::string::npos)
      << error_of(doc);
  doc["groups"]["gtp_remat"]["reduce_scatter_stream_priority"] = "high";
  EXPECT_EQ(parse_profile(doc, "").group("gtp_remat").reduce_scatter_stream_priority, "high");
  doc["groups"]["gtp_remat"].erase("reduce_scatter_stream_priority");
  doc["groups"]["gtp_remat"]["stream_priority"] = "highest";
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/stream_priority: 'highest' is not allowed: did you mean 'high'?"),
            std::string::npos);
}

TEST(Profile, WireVariantsBelongToTheirWire) {
  json doc = base_profile();
  doc["groups"]["gtp_remat"] = {{"wire_format", "nvfp4"}, {"nvfp4_blocks", "2d"}};
  doc["groups"]["expt_gtp_remat"] = {{"wire_format", "mxfp8"}, {"mx_rounding", "floor"}};
  const Profile p = parse_profile(doc, ".");
  EXPECT_TRUE(p.group("gtp_remat").nvfp4_2d);
  EXPECT_FALSE(p.group("gtp_remat").mx_rounding_floor);
  EXPECT_TRUE(p.group("expt_gtp_remat").mx_rounding_floor);
  EXPECT_FALSE(p.group("expt_gtp_remat").nvfp4_2d);
  EXPECT_FALSE(p.group("dp").nvfp4_2d);  // defaults: 1d, rceil

  doc["groups"]["gtp_remat"] = {{"wire_format", "fp8"}, {"nvfp4_blocks", "2d"}};
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/nvfp4_blocks: applies to wire_format \"nvfp4\" only, but wire_format "
                               "is \"fp8\"; remove it or set wire_format to \"nvfp4\""),
            std::string::npos) << error_of(doc);
  doc["groups"]["gtp_remat"] = {{"nvfp4_blocks", "2d"}};  // the default wire, bf16
  EXPECT_NE(error_of(doc).find("wire_format is \"bf16\""), std::string::npos) << error_of(doc);
  doc["groups"]["gtp_remat"] = {{"wire_format", "nvfp4"}, {"nvfp4_blocks", "3d"}};
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/nvfp4_blocks: '3d' is not allowed"), std::string::npos) << error_of(doc);
  doc["groups"]["gtp_remat"] = {{"wire_format", "nvfp4"}};
  doc["groups"]["expt_gtp_remat"] = {{"wire_format", "nvfp4"}, {"mx_rounding", "floor"}};
  EXPECT_NE(error_of(doc).find("/groups/expt_gtp_remat/mx_rounding: applies to wire_format \"mxfp8\" only"),
            std::string::npos) << error_of(doc);
  doc["groups"]["expt_gtp_remat"] = {{"wire_format", "mxfp8"}, {"mx_rounding", "ceil"}};
  EXPECT_NE(error_of(doc).find("/groups/expt_gtp_remat/mx_rounding: 'ceil' is not allowed"), std::string::npos)
      << error_of(doc);
}

TEST(Profile, WrongTypesNameThePath) {
  json doc = base_profile();
  doc["parallel"]["tensor_model_parallel_size"] = "2";
  EXPECT_EQ(error_of(doc),
            "/parallel/tensor_model_parallel_size: expected an integer, got string \"2\": write the number without quotes");
  doc = base_profile();
  doc["groups"]["gtp_remat"]["nccl"] = {{"max_ctas", 2.5}};
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/nccl/max_ctas: expected an integer, got number 2.5"), std::string::npos);
  doc = base_profile();
  doc["groups"]["dp"] = {{"wire_format", "fp4"}};
  EXPECT_NE(error_of(doc).find("/groups/dp/wire_format: 'fp4' is not allowed"), std::string::npos);
  doc = base_profile();
  doc["placement"] = {{"on_violation", 1}};
  EXPECT_NE(error_of(doc).find("/placement/on_violation: expected a string, got integer 1"), std::string::npos);
  doc = base_profile();
  doc["cluster"]["template"]["host"]["gpus"][1].erase("index");
  EXPECT_NE(error_of(doc).find("/cluster/template/host/gpus/1/index: missing"), std::string::npos) << error_of(doc);
  doc = base_profile();
  doc["groups"] = json::array();
  EXPECT_NE(error_of(doc).find("/groups: expected an object, got array"), std::string::npos);
  doc = base_profile();
  doc["schema_version"] = 2;
  EXPECT_EQ(error_of(doc), "/schema_version: version 2 is not supported: this build reads version 1");
  doc.erase("schema_version");
  EXPECT_EQ(error_of(doc), "/schema_version: missing: add \"schema_version\": 1");
}

TEST(Profile, ImpossibleSizesPointAtTheKnob) {
  json doc = base_profile();
  doc["parallel"]["tensor_parallel_num_weight_shards"] = 3;
  EXPECT_EQ(error_of(doc),
            "/parallel/tensor_parallel_num_weight_shards: tensor_parallel_num_weight_shards=3 is not divisible by "
            "tensor_model_parallel_size=2: choose a multiple of 2 (e.g. 4)");
  doc = base_profile();
  doc["parallel"]["tensor_model_parallel_size"] = 3;
  EXPECT_NE(error_of(doc).find("/parallel/world_size: world_size=4 is not divisible by tp*gtp_remat*cp*pp"),
            std::string::npos);
  doc = base_profile();
  doc["parallel"]["world_size"] = 8;
  EXPECT_EQ(error_of(doc),
            "/parallel/world_size: world_size=8 needs that many GPUs but the cluster has 4: lower world_size or "
            "describe more hosts");
  doc = base_profile();
  doc["parallel"]["context_parallel_size"] = 0;
  EXPECT_NE(error_of(doc).find("/parallel/context_parallel_size: value 0 is out of range"), std::string::npos);
  doc = base_profile();
  doc["groups"]["tp"] = {{"nccl", {{"min_ctas", 8}, {"max_ctas", 4}}}};
  EXPECT_NE(error_of(doc).find("/groups/tp/nccl/min_ctas: min_ctas=8 exceeds max_ctas=4"), std::string::npos);
  doc = base_profile();
  doc["groups"]["tp"] = {{"memory_budget", "lots"}};
  EXPECT_NE(error_of(doc).find("/groups/tp/memory_budget: 'lots' is not a byte size"), std::string::npos);
  doc = base_profile();
  doc["groups"]["gtp_remat"] = {{"prefetch_depth", 2}, {"prefetch_batch", 3}};
  EXPECT_EQ(error_of(doc),
            "/groups/gtp_remat/prefetch_batch: prefetch_batch=3 exceeds prefetch_depth=2; use 1..2 (a batch is "
            "issued out of the prefetch window)");
  doc = base_profile();
  doc["groups"]["gtp_remat"] = {{"prefetch_batch", 0}};
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/prefetch_batch: value 0 is out of range: use 1..64"),
            std::string::npos);
}

TEST(Profile, PrefetchBatchDefaultsToOneAndIsReadPerGroup) {
  json doc = base_profile();
  doc["groups"]["gtp_remat"] = {{"prefetch_depth", 4}, {"prefetch_batch", 2}};
  const Profile profile = parse_profile(doc, ".");
  EXPECT_EQ(profile.group("gtp_remat").prefetch_depth, 4);
  EXPECT_EQ(profile.group("gtp_remat").prefetch_batch, 2);
  EXPECT_EQ(profile.group("expt_gtp_remat").prefetch_batch, 1);  // not mentioned: the default
  doc["groups"]["gtp_remat"] = {{"prefetch_depth", 0}, {"prefetch_batch", 1}};  // no prefetch: batch 1 only
  EXPECT_EQ(parse_profile(doc, ".").group("gtp_remat").prefetch_batch, 1);
}

TEST(Profile, KeepGatheredDefaultsToFalseAndMustBeABoolean) {
  json doc = base_profile();
  doc["groups"]["gtp_remat"] = {{"keep_gathered", true}};
  const Profile profile = parse_profile(doc, ".");
  EXPECT_TRUE(profile.group("gtp_remat").keep_gathered);
  EXPECT_FALSE(profile.group("expt_gtp_remat").keep_gathered);  // not mentioned: the default
  doc["groups"]["gtp_remat"] = {{"keep_gathered", "yes"}};
  EXPECT_EQ(error_of(doc), "/groups/gtp_remat/keep_gathered: expected true or false, got string \"yes\": write true or "
                           "false, unquoted");
}

TEST(Profile, FillGraphsIsACountThatDefaultsToZero) {
  json doc = base_profile();
  doc["groups"]["gtp_remat"] = {{"fill_graphs", 512}};
  const Profile profile = parse_profile(doc, ".");
  EXPECT_EQ(profile.group("gtp_remat").fill_graphs, 512);
  EXPECT_EQ(profile.group("expt_gtp_remat").fill_graphs, 0);  // not mentioned: the default
  doc["groups"]["gtp_remat"] = {{"fill_graphs", -1}};
  EXPECT_EQ(error_of(doc), "/groups/gtp_remat/fill_graphs: value -1 is out of range: use 0..65536");
  doc["groups"]["gtp_remat"] = {{"fill_graphs", true}};
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/fill_graphs: "), std::string::npos) << error_of(doc);
}

TEST(Profile, GradsIntoMainGradIsABooleanThatDefaultsToTrue) {
  json doc = base_profile();
  doc["groups"]["gtp_remat"] = {{"grads_into_main_grad", false}};
  const Profile profile = parse_profile(doc, ".");
  EXPECT_FALSE(profile.group("gtp_remat").grads_into_main_grad);
  EXPECT_TRUE(profile.group("expt_gtp_remat").grads_into_main_grad);  // not mentioned: the default
  doc["groups"]["gtp_remat"] = {{"grads_into_main_grad", 0}};
  EXPECT_NE(error_of(doc).find("/groups/gtp_remat/grads_into_main_grad: expected true or false"), std::string::npos)
      << error_of(doc);
}

TEST(Profile, ClusterForms) {
  json doc = base_profile();
  doc["cluster"]["hosts"] = json::array();
  EXPECT_NE(error_of(doc).find("/cluster: give exactly one of"), std::string::npos);
  doc = base_profile();
  doc["cluster"] = "discovered";
  EXPECT_NE(error_of(doc).find("/cluster: 'discovered' is not allowed"), std::string::npos);

  // "discover" probes this machine; the test machine may have no GPU, which must be reported at
  // world_size rather than crash.
  const json discover = {{"schema_version", 1}, {"cluster", "discover"}, {"parallel", {{"world_size", 1}}}};
  if (discover_local().gpus.empty()) {
    EXPECT_NE(error_of(discover).find("/parallel/world_size: world_size=1 needs that many GPUs but the cluster has 0"),
              std::string::npos)
        << error_of(discover);
  } else {
    EXPECT_EQ(parse_profile(discover, ".").cluster_source, "discover");
  }

  const std::string dir = getenv("TEST_TMPDIR");
  std::ofstream(dir + "/missing-xml.json") << R"({"schema_version": 1, "cluster": {"hwloc_xml": "nope.xml"},
      "parallel": {"world_size": 1}})";
  try {
    load_profile(dir + "/missing-xml.json");
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("/cluster/hwloc_xml: cannot open hwloc XML file"), std::string::npos);
  }
}

TEST(Profile, HwlocXmlClusterResolvesAgainstTheProfileFolder) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  // hwloc_xml resolves relative paths against the profile's folder, and a NIC rate can be supplied.
  const std::string dir = getenv("TEST_TMPDIR");
  std::ifstream source(internal::hwloc_fixture_dir() + "/32em64t-2n8c2t-pci-normalio.xml");
  std::ofstream(dir + "/conan.xml") << source.rdbuf();
  std::ofstream(dir + "/xml-profile.json") << R"({"schema_version": 1,
      "cluster": {"hwloc_xml": ["conan.xml"], "nic_gbytes_per_s": 12.5},
      "parallel": {"world_size": 3}})";
  const Profile replay = load_profile(dir + "/xml-profile.json");
  EXPECT_EQ(replay.cluster_source, "hwloc_xml");
  EXPECT_EQ(replay.cluster.gpu_count(), 3);
  EXPECT_DOUBLE_EQ(replay.cluster.hosts()[0].nics[0].gbytes_per_s, 12.5);
}

TEST(Profile, FileErrors) {
  EXPECT_THROW(load_profile("/nonexistent/profile.json"), std::invalid_argument);
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/malformed.json";
  std::ofstream(path) << "{\"schema_version\": 1,\n \"cluster\": ";
  try {
    load_profile(path);
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("is not valid JSON"), std::string::npos);
  }
}

TEST(Profile, ByteSizes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  EXPECT_EQ(parse_byte_size("2GiB"), 2LL << 30);
  EXPECT_EQ(parse_byte_size("512 MiB"), 512LL << 20);
  EXPECT_EQ(parse_byte_size("1GB"), 1000000000);
  EXPECT_THROW(parse_byte_size("GiB"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("1.5GiB"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("99999999999999TiB"), std::invalid_argument);
}

}  // namespace
}  // namespace gtp::topology
