// JSON and table renderings of a Plan (what `gtp-topo plan` prints).
#include <algorithm>
#include <cstdio>

#include "topology/planner.h"

namespace gtp::topology {

using nlohmann::json;

json plan_to_json(const Plan& plan, const Cluster& cluster) {
  const ParallelSizes& s = plan.sizes;
  json out;
  out["sizes"] = {{"world_size", s.world_size},
                  {"tp", s.tp},
                  {"gtp_remat", s.gtp_remat},
                  {"cp", s.cp},
                  {"dp", s.dp},
                  {"pp", s.pp},
                  {"expt_tp", s.expt_tp},
                  {"ep", s.ep},
                  {"expt_gtp_remat", s.expt_gtp_remat},
                  {"expt_dp", s.expt_dp},
                  {"data_ranks", s.data_ranks()}};
  out["policy"] = to_string(plan.policy);
  out["permuted"] = plan.permuted;
  out["ok"] = plan.ok();
  json placement = json::array();
  for (size_t rank = 0; rank < plan.placement.size(); ++rank) {
    const RankPlacement& p = plan.placement[rank];
    const HostTopology& host = cluster.hosts()[p.host];
    const Gpu& gpu = host.gpus[p.gpu];
    placement.push_back({{"rank", rank},
                         {"host", host.hostname},
                         {"gpu", gpu.index},
                         {"bus_id", gpu.bus_id},
                         {"numa_node", p.numa_node},
                         {"cpuset", gpu.cpuset}});
  }
  out["placement"] = std::move(placement);
  json groups = json::array();
  for (const GroupPlan& family : plan.groups) {
    json lists = json::array();
    for (int g = 0; g < family.groups.num_groups(); ++g) {
      lists.push_back({{"ranks", family.groups.group(g)},
                       {"link", to_string(family.link[g])},
                       {"gbytes_per_s", family.gbytes_per_s[g]},
                       {"bandwidth_source", family.bandwidth_source[g]}});
    }
    groups.push_back({{"name", family.spec.name},
                      {"view", family.spec.view.empty() ? "dense" : family.spec.view},
                      {"dims", family.spec.dims},
                      {"key", family.key},
                      {"group_size", family.groups.group_size},
                      {"worst_link", to_string(family.worst_link)},
                      {"min_gbytes_per_s", family.min_gbytes_per_s},
                      {"groups", std::move(lists)}});
  }
  out["groups"] = std::move(groups);
  json violations = json::array();
  for (const Violation& v : plan.violations) {
    violations.push_back({{"rule", v.rule}, {"group", v.group}, {"group_index", v.group_index},
                          {"reason", v.reason}, {"resolved", v.resolved}});
  }
  out["violations"] = std::move(violations);
  out["notes"] = plan.notes;
  return out;
}

std::string format_plan(const Plan& plan, const Cluster& cluster, int max_ranks, int max_violations) {
  const ParallelSizes& s = plan.sizes;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "plan: world %d = tp %d x gtp_remat %d x cp %d x dp %d x pp %d; expert: expt_tp %d x ep %d x "
                "expt_gtp_remat %d x expt_dp %d x pp %d\n",
                s.world_size, s.tp, s.gtp_remat, s.cp, s.dp, s.pp, s.expt_tp, s.ep, s.expt_gtp_remat, s.expt_dp, s.pp);
  out += line;
  std::snprintf(line, sizeof line, "hosts %zu, GPUs %d, policy %s%s, data ranks (dp x gtp_remat) %d\n\n",
                cluster.hosts().size(), cluster.gpu_count(), to_string(plan.policy),
                plan.permuted ? " (ranks permuted)" : "", s.data_ranks());
  out += line;
  out += "group               key                        size  groups  worst link  min GB/s  source of group 0\n";
  for (const GroupPlan& family : plan.groups) {
    std::snprintf(line, sizeof line, "%-18s  %-25s  %5d  %6d  %-10s  %8.1f  %s\n", family.spec.name.c_str(),
                  family.key.c_str(), family.groups.group_size, family.groups.num_groups(),
                  to_string(family.worst_link), family.min_gbytes_per_s,
                  family.bandwidth_source.empty() ? "-" : family.bandwidth_source[0].c_str());
    out += line;
  }
  out += "\nrank  host                  GPU  bus id        NUMA  cpuset\n";
  const int listed = std::min<int>(max_ranks, static_cast<int>(plan.placement.size()));
  for (int rank = 0; rank < listed; ++rank) {
    const RankPlacement& p = plan.placement[rank];
    const HostTopology& host = cluster.hosts()[p.host];
    const Gpu& gpu = host.gpus[p.gpu];
    std::snprintf(line, sizeof line, "%4d  %-20s  %3d  %-12s  %4d  %s\n", rank, host.hostname.c_str(), gpu.index,
                  gpu.bus_id.c_str(), p.numa_node, gpu.cpuset.c_str());
    out += line;
  }
  if (listed < static_cast<int>(plan.placement.size())) {
    out += "... " + std::to_string(plan.placement.size() - listed) + " more ranks (use --json for all)\n";
  }
  std::snprintf(line, sizeof line, "\nviolations: %zu (%d unresolved)\n", plan.violations.size(),
                plan.unresolved_violations());
  out += line;
  for (int i = 0; i < std::min<int>(max_violations, static_cast<int>(plan.violations.size())); ++i) {
    const Violation& v = plan.violations[i];
    out += std::string(v.resolved ? "  fixed: " : "  ") + "[" + v.rule + "] " + v.reason + "\n";
  }
  if (static_cast<int>(plan.violations.size()) > max_violations) {
    out += "  ... " + std::to_string(plan.violations.size() - max_violations) + " more (use --json for all)\n";
  }
  for (const std::string& note : plan.notes) out += "note: " + note + "\n";
  return out;
}

}  // namespace gtp::topology
