// setup_cluster and bind_rank: ranks as threads (ThreadBootstrap) and as real processes started by
// gtp-launch (argv[1], running argv[2] = cluster_setup_worker). Host records come from the hwloc
// fixtures (real hwloc replays of real machines), so the planner has GPUs to place ranks on without a
// GPU here; the live-discovery case checks whatever this machine really has.
#include "comm/cluster_setup.h"

#include <gtest/gtest.h>
#include <cuda_runtime_api.h>
#include <hwloc.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include "comm/internal/process.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "topology/discovery.h"
#include "topology/internal/test_fixtures.h"

namespace gtp::comm {
namespace {

using internal::rethrow_first;
using internal::run_ranks;
using topology::HostTopology;

constexpr std::chrono::seconds kTimeout{20};
std::string g_launcher, g_worker;

std::string fixture(const std::string& name) { return topology::internal::hwloc_fixture_dir() + "/" + name; }

topology::Profile profile_for(int world, int tp, int shards, topology::ViolationPolicy policy) {
  topology::ParallelConfig config;
  config.world_size = world;
  config.tensor_model_parallel_size = tp;
  config.tensor_parallel_num_weight_shards = shards;
  topology::Profile profile;
  profile.sizes = topology::derive_sizes(config);
  profile.on_violation = policy;
  return profile;
}

// Groups of the single-process plan, translated to process ranks as setup_cluster documents.
std::map<std::string, std::vector<std::vector<int>>> expected_groups(const topology::Plan& plan) {
  std::map<std::string, std::vector<std::vector<int>>> groups;
  for (const topology::GroupPlan& family : plan.groups) {
    for (std::vector<int> group : family.groups.to_lists()) {
      for (int& rank : group) rank = plan.placement[rank].slot;
      groups[family.spec.name].push_back(group);
    }
  }
  return groups;
}

// True when the OS binding `bound` lies inside `wanted` (both hwloc bitmap strings).
bool binding_within(const std::string& bound, const std::string& wanted) {
  hwloc_bitmap_t a = hwloc_bitmap_alloc(), b = hwloc_bitmap_alloc();
  const bool ok = hwloc_bitmap_sscanf(a, bound.c_str()) == 0 && hwloc_bitmap_sscanf(b, wanted.c_str()) == 0 &&
                  !hwloc_bitmap_iszero(a) && hwloc_bitmap_isincluded(a, b);
  hwloc_bitmap_free(a);
  hwloc_bitmap_free(b);
  return ok;
}

std::string thread_binding() {
  hwloc_topology_t topology;
  hwloc_topology_init(&topology);
  hwloc_topology_load(topology);
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  char* text = nullptr;
  hwloc_get_cpubind(topology, set, HWLOC_CPUBIND_THREAD);
  hwloc_bitmap_asprintf(&text, set);
  std::string result = text != nullptr ? text : "";
  std::free(text);
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(topology);
  return result;
}

std::vector<ClusterView> setup_threads(int n, const topology::Profile& profile,
                                       const std::function<HostTopology(int rank)>& record) {
  auto group = ThreadBootstrap::create_group(n, kTimeout);
  std::vector<ClusterView> views(n);
  rethrow_first(run_ranks(n, [&](int rank) {
    ClusterSetupOptions options;
    options.discover = [&] { return record(rank); };
    views[rank] = setup_cluster(*group[rank], profile, options);
  }));
  return views;
}

TEST(ClusterSetup, EveryThreadRankGetsTheSamePlanAndItsOwnSlot) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  const HostTopology power8 = topology::load_hwloc_xml(fixture("power8gpudistances.xml"));
  const topology::Profile profile = profile_for(4, 1, 2, topology::ViolationPolicy::kFail);
  const std::vector<ClusterView> views = setup_threads(4, profile, [&](int) { return power8; });
  const topology::Cluster cluster({power8});
  const topology::Plan reference = topology::make_plan(cluster, profile.sizes, profile.on_violation);
  const nlohmann::json reference_json = topology::plan_to_json(reference, cluster);
  for (int rank = 0; rank < 4; ++rank) {
    const ClusterView& view = views[rank];
    EXPECT_EQ(topology::plan_to_json(view.plan, view.cluster), reference_json) << "rank " << rank;
    EXPECT_EQ(view.groups, expected_groups(reference));
    EXPECT_EQ(view.self.process_rank, rank);
    EXPECT_EQ(view.self.slot, rank);
    EXPECT_EQ(view.self.grid_rank, rank);
    EXPECT_EQ(view.self.hostname, power8.hostname);
    EXPECT_EQ(view.self.gpu, power8.gpus[rank].index);
    EXPECT_EQ(view.self.gpu_bus_id, power8.gpus[rank].bus_id);
    EXPECT_EQ(view.self.numa_node, power8.gpus[rank].numa_node);
    EXPECT_EQ(view.self.cpuset, power8.gpus[rank].cpuset);
    // TP = 1, G = 2, DP = 2: gtp_remat pairs {0,1}, {2,3} (one per NVLink pair); dp pairs {0,2}, {1,3}.
    EXPECT_EQ(view.my_group("tp"), (std::vector<int>{rank}));
    EXPECT_EQ(view.my_group("gtp_remat"), (std::vector<int>{rank & ~1, (rank & ~1) + 1}));
    EXPECT_EQ(view.my_group("dp"), (std::vector<int>{rank & 1, (rank & 1) + 2}));
    EXPECT_THROW(view.my_group("tensor"), std::invalid_argument);
  }
}

TEST(ClusterSetup, IdenticalRecordsOfOneHostCollapseAndHostsStayInLaunchOrder) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  const HostTopology a = topology::load_hwloc_xml(fixture("power8gpudistances.xml"));
  HostTopology b = topology::load_hwloc_xml(fixture("32em64t-2n8c2t-pci-normalio.xml"));
  b.hostname = "second-host";
  // 4 GPUs on host a (ranks 0-3), 3 on host b (ranks 4-6): host-major, as launchers order ranks.
  const std::vector<ClusterView> views =
      setup_threads(7, profile_for(7, 1, 1, topology::ViolationPolicy::kWarn), [&](int rank) { return rank < 4 ? a : b; });
  for (int rank = 0; rank < 7; ++rank) {
    ASSERT_EQ(views[rank].cluster.hosts().size(), 2u);
    EXPECT_EQ(views[rank].self.host, rank < 4 ? 0 : 1);
    EXPECT_EQ(views[rank].self.hostname, rank < 4 ? a.hostname : "second-host");
    EXPECT_EQ(views[rank].self.gpu, rank < 4 ? a.gpus[rank].index : b.gpus[rank - 4].index);
  }
}

void expect_invalid(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning: " << needle;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ClusterSetup, RefusesWhatCannotBePlacedWithTheSameErrorOnEveryRank) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  const HostTopology a = topology::load_hwloc_xml(fixture("power8gpudistances.xml"));
  HostTopology b = topology::load_hwloc_xml(fixture("32em64t-2n8c2t-pci-normalio.xml"));
  b.hostname = "second-host";
  expect_invalid([&] { setup_threads(2, profile_for(3, 1, 1, topology::ViolationPolicy::kWarn), [&](int) { return a; }); },
                 "parallel.world_size is 3 but the job has 2 ranks");
  // Rank 1 runs on host b, but slot 1 is host a's second GPU.
  expect_invalid([&] { setup_threads(3, profile_for(3, 1, 1, topology::ViolationPolicy::kWarn),
                                     [&](int rank) { return rank == 1 ? b : a; }); },
                 "rank 1 runs on host 'second-host' but slot 1 is a GPU of host");
  HostTopology a_changed = a;
  a_changed.gpus.pop_back();
  expect_invalid([&] { setup_threads(2, profile_for(2, 1, 1, topology::ViolationPolicy::kWarn),
                                     [&](int rank) { return rank == 0 ? a : a_changed; }); },
                 a.hostname);
  HostTopology no_gpu = a;
  no_gpu.gpus.clear();
  expect_invalid([&] { setup_threads(2, profile_for(2, 1, 1, topology::ViolationPolicy::kWarn), [&](int) { return no_gpu; }); },
                 "2 ranks need one GPU each but their hosts have 0");
  // TP = 4 spans power8's two NVLink pairs: policy fail refuses it.
  expect_invalid([&] { setup_threads(4, profile_for(4, 4, 4, topology::ViolationPolicy::kFail), [&](int) { return a; }); },
                 "placement.on_violation is fail");
}

TEST(ClusterSetup, LiveDiscoveryOfThisMachine) {
  const HostTopology live = topology::discover_local();
  auto group = ThreadBootstrap::create_group(1, kTimeout);
  const topology::Profile profile = profile_for(1, 1, 1, topology::ViolationPolicy::kWarn);
  if (live.gpus.empty()) {
    expect_invalid([&] { setup_cluster(*group[0], profile); }, "1 ranks need one GPU each but their hosts have 0");
    return;
  }
  const ClusterView view = setup_cluster(*group[0], profile);
  EXPECT_EQ(view.self.hostname, live.hostname);
  EXPECT_EQ(view.self.gpu, live.gpus[0].index);
}

TEST(ClusterSetup, BindReportsWhatItDidAndPinsOnlyTheCallingThread) {
  const std::string before = thread_binding();
  RankSlot slot;
  slot.gpu = 0;
  slot.cpuset = before;  // the CPUs this process may use: binding must succeed
  BindResult bound;
  std::string inside;
  std::thread([&] {
    bound = bind_rank(slot);
    inside = thread_binding();
  }).join();
  EXPECT_TRUE(bound.cpu_bound) << bound.cpu;
  EXPECT_TRUE(binding_within(inside, before)) << inside << " vs " << before;
  EXPECT_EQ(thread_binding(), before);  // the test's own thread is untouched
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    EXPECT_FALSE(bound.gpu_bound);
    EXPECT_EQ(bound.gpu.rfind("no CUDA device: ", 0), 0u) << bound.gpu;
  } else {
    EXPECT_TRUE(bound.gpu_bound) << bound.gpu;
  }

  slot.cpuset = "";
  EXPECT_FALSE(bind_rank(slot).cpu_bound);
  slot.cpuset = "0x1,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,0x0";  // CPU 1024: no machine here has it
  const BindResult outside = bind_rank(slot);
  EXPECT_FALSE(outside.cpu_bound);
  EXPECT_NE(outside.cpu.find("has no CPU this process may use"), std::string::npos) << outside.cpu;
  slot.cpuset = "cpus 0-3";
  EXPECT_NE(bind_rank(slot).cpu.find("is not an hwloc bitmap"), std::string::npos);
}

// N real processes on loopback, each replaying power8 (4 GPUs, two NVLink pairs).
void expect_processes_agree(int n, int tp, int shards) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/cluster_setup_" + std::to_string(n);
  ASSERT_EQ(internal::run_shell("rm -rf " + dir + " && mkdir -p " + dir).status, 0);
  const std::string xml = fixture("power8gpudistances.xml");
  const auto result = internal::run_shell("env -u XML_OUTPUT_FILE -u GTEST_OUTPUT -u TEST_PREMATURE_EXIT_FILE " +
                                          g_launcher + " -n " + std::to_string(n) + " --timeout 120 -- " + g_worker +
                                          " " + xml + " " + std::to_string(tp) + " " + std::to_string(shards) + " " + dir);
  ASSERT_EQ(result.status, 0) << result.output;

  const HostTopology power8 = topology::load_hwloc_xml(xml);
  const topology::Cluster cluster({power8});
  const topology::Profile profile = profile_for(n, tp, shards, topology::ViolationPolicy::kWarn);
  const topology::Plan plan = topology::make_plan(cluster, profile.sizes, profile.on_violation);
  const nlohmann::json expected_plan = topology::plan_to_json(plan, cluster);
  const nlohmann::json groups = expected_groups(plan);
  std::set<int> slots;
  for (int rank = 0; rank < n; ++rank) {
    const nlohmann::json got = nlohmann::json::parse(std::ifstream(dir + "/rank" + std::to_string(rank) + ".json"));
    EXPECT_EQ(got["plan"], expected_plan) << "rank " << rank;
    EXPECT_EQ(got["groups"], groups) << "rank " << rank;
    EXPECT_EQ(got["process_rank"], rank);
    EXPECT_EQ(got["slot"], rank);
    EXPECT_EQ(got["gpu"], power8.gpus[rank].index);
    EXPECT_EQ(got["cpuset"], power8.gpus[rank].cpuset);
    slots.insert(got["slot"].get<int>());
    const std::string note = got["cpu_note"];
    if (got["cpu_bound"].get<bool>()) {
      EXPECT_TRUE(binding_within(got["thread_binding"], power8.gpus[rank].cpuset)) << got.dump();
    } else {
      EXPECT_FALSE(note.empty());
    }
    EXPECT_NE(result.output.find("[" + std::to_string(rank) + "] rank " + std::to_string(rank) + ": slot " +
                                 std::to_string(rank)), std::string::npos) << result.output;
  }
  EXPECT_EQ(slots.size(), static_cast<std::size_t>(n));
}

TEST(ClusterSetupMultiProcess, TwoProcesses) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  expect_processes_agree(2, 1, 2);
}
TEST(ClusterSetupMultiProcess, ThreeProcesses) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  expect_processes_agree(3, 1, 1);
}
TEST(ClusterSetupMultiProcess, FourProcesses) {
  GTP_SKIP_WITHOUT_HWLOC_FIXTURES();
  expect_processes_agree(4, 1, 2);
}

}  // namespace
}  // namespace gtp::comm

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: cluster_setup_test GTP_LAUNCH CLUSTER_SETUP_WORKER\n");
    return 2;
  }
  gtp::comm::g_launcher = argv[1];
  gtp::comm::g_worker = argv[2];
  return RUN_ALL_TESTS();
}
