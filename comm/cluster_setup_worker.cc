// One rank of cluster_setup_test's multi-process cases, started by gtp-launch. Usage:
//   cluster_setup_worker HWLOC_XML|live TP SHARDS OUT_DIR
// Every rank "discovers" the replayed machine HWLOC_XML (or, given "live", this machine: the GPU-machine
// check in the GPU runner's comm step), runs setup_cluster over the UCX bootstrap
// with parallel sizes TP / SHARDS, binds, and writes OUT_DIR/rank<R>.json: its slot, plan, groups,
// binding and the thread's CPU binding read back from the OS. Exit 0 on success, 1 on any error.
#include <hwloc.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/cluster_setup.h"
#include "comm/ucx_bootstrap.h"
#include "topology/discovery.h"

namespace {

// The calling thread's CPU binding as the OS reports it.
std::string current_binding() {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0 || hwloc_topology_load(topology) != 0) return "?";
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  std::string text = "?";
  char* printed = nullptr;
  if (hwloc_get_cpubind(topology, set, HWLOC_CPUBIND_THREAD) == 0 && hwloc_bitmap_asprintf(&printed, set) >= 0) {
    text = printed;
    std::free(printed);
  }
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(topology);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gtp;
  if (argc != 5) {
    std::fprintf(stderr, "usage: cluster_setup_worker HWLOC_XML|live TP SHARDS OUT_DIR\n");
    return 2;
  }
  try {
    const std::string xml = argv[1];
    comm::UcxBootstrap bootstrap(comm::UcxBootstrapConfig::from_env());
    topology::Profile profile;
    topology::ParallelConfig config;
    config.world_size = bootstrap.world_size();
    config.tensor_model_parallel_size = std::atoi(argv[2]);
    config.tensor_parallel_num_weight_shards = std::atoi(argv[3]);
    profile.sizes = topology::derive_sizes(config);
    comm::ClusterSetupOptions options;
    if (xml != "live") options.discover = [&] { return topology::load_hwloc_xml(xml); };
    const comm::ClusterView view = comm::setup_cluster(bootstrap, profile, options);
    const comm::BindResult bind = comm::bind_rank(view.self);
    const comm::RankSlot& self = view.self;
    const nlohmann::json out = {
        {"process_rank", self.process_rank}, {"grid_rank", self.grid_rank}, {"slot", self.slot},
        {"host", self.host}, {"hostname", self.hostname}, {"gpu", self.gpu}, {"gpu_bus_id", self.gpu_bus_id},
        {"numa_node", self.numa_node}, {"cpuset", self.cpuset},
        {"plan", topology::plan_to_json(view.plan, view.cluster)}, {"groups", view.groups},
        {"my_gtp_remat", view.my_group("gtp_remat")}, {"gpu_bound", bind.gpu_bound}, {"gpu_note", bind.gpu},
        {"cpu_bound", bind.cpu_bound}, {"cpu_note", bind.cpu}, {"thread_binding", current_binding()}};
    std::ofstream(std::string(argv[4]) + "/rank" + std::to_string(self.process_rank) + ".json") << out.dump(1);
    std::printf("rank %d: slot %d, GPU %d, %s; %s\n", self.process_rank, self.slot, self.gpu, bind.gpu.c_str(),
                bind.cpu.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_setup_worker: %s\n", e.what());
    return 1;
  }
}
