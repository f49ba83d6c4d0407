// Planning time for a 100 000-GPU GB200 NVL72 cluster. Build with -c opt:
//   bazel run -c opt //topology:planner_benchmark
#include <benchmark/benchmark.h>

#include <utility>
#include <vector>

#include "topology/internal/test_clusters.h"
#include "topology/planner.h"

namespace gtp::topology {
namespace {

ParallelSizes hundred_thousand_sizes() {
  ParallelConfig config;
  config.world_size = 100000;
  config.tensor_model_parallel_size = 4;
  config.tensor_parallel_num_weight_shards = 8;
  config.pipeline_model_parallel_size = 4;
  config.expert_model_parallel_size = 8;
  config.expert_tensor_parallel_size = 1;
  return derive_sizes(config);
}

// Racks listed in order: the launcher order already satisfies every rule.
void BM_Plan100kGpusNvl72(benchmark::State& state) {
  const Cluster cluster = internal::nvl72_cluster(1389);
  const ParallelSizes sizes = hundred_thousand_sizes();
  for (auto _ : state) benchmark::DoNotOptimize(make_plan(cluster, sizes, ViolationPolicy::kFail));
  state.counters["gpus"] = sizes.world_size;
}
BENCHMARK(BM_Plan100kGpusNvl72)->Unit(benchmark::kMillisecond);

// Worst case: hosts of different racks interleaved, every GTP group violates, permute repacks.
void BM_Plan100kGpusNvl72InterleavedPermute(benchmark::State& state) {
  std::vector<HostTopology> hosts = internal::nvl72_cluster(1389).hosts();
  for (size_t i = 1; i + 18 < hosts.size(); i += 36) std::swap(hosts[i], hosts[i + 18]);
  const Cluster cluster(std::move(hosts));
  const ParallelSizes sizes = hundred_thousand_sizes();
  size_t violations = 0;
  for (auto _ : state) {
    const Plan plan = make_plan(cluster, sizes, ViolationPolicy::kPermute);
    violations = plan.violations.size();
    if (!plan.ok()) state.SkipWithError("permute did not fix the interleaved racks");
  }
  state.counters["violations_fixed"] = static_cast<double>(violations);
}
BENCHMARK(BM_Plan100kGpusNvl72InterleavedPermute)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gtp::topology

BENCHMARK_MAIN();
