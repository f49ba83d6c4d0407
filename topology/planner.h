// The planner: places grid ranks on a cluster's GPUs, enumerates every named group, predicts each
// group's link class and bandwidth from the topology's numbers, and checks the placement rules:
//   1. tp x gtp_remat groups stay inside one NVLink domain (required);
//   2. then tp x gtp_remat x cp, and expt_tp x ep, stay inside one when they fit in the smallest domain;
//   3. dp is the outermost data axis of the grid, so it is what crosses hosts.
// What happens on a violation (warn, fail, permute) comes from the policy; every violation carries
// its reason.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "topology/arithmetic.h"
#include "topology/grid.h"
#include "topology/topology.h"

namespace gtp::topology {

// Ordered from fastest to slowest; a group's class is its slowest member pair.
enum class LinkClass { kLocal, kNvlink, kPcie, kNetwork };
const char* to_string(LinkClass link);

enum class ViolationPolicy { kWarn, kFail, kPermute };
ViolationPolicy parse_violation_policy(const std::string& name);  // "warn", "fail", "permute"
const char* to_string(ViolationPolicy policy);

// A group family under Megatron's name: which grid view and which dims it spans.
struct GroupSpec {
  std::string name;
  std::string view;  // "" dense, kExpertView expert
  std::vector<std::string> dims;
};
// tp, gtp_remat, tp_gtp_remat, cp, dp, dp_cp, gtp_remat_dp, gtp_remat_dp_cp, pp, mp, expt_tp, ep,
// tp_ep, expt_gtp_remat, expt_dp, expt_dp_gtp_remat.
const std::vector<GroupSpec>& standard_groups();
std::vector<std::string> standard_group_names();

struct RankPlacement {
  int slot = 0;       // cluster slot (host-major GPU order)
  int host = 0;       // index into Cluster::hosts()
  int gpu = 0;        // index into that host's gpus
  int numa_node = -1;
};

struct GroupPlan {
  GroupSpec spec;
  std::string key;                    // the grid's canonical key
  RankGroups groups;
  std::vector<LinkClass> link;        // per group
  std::vector<double> gbytes_per_s;   // per group, unidirectional per GPU; 0 when unknown or local
  std::vector<std::string> bandwidth_source;  // per group: where the number came from
  LinkClass worst_link = LinkClass::kLocal;
  double min_gbytes_per_s = 0;        // over groups that communicate
};

struct Violation {
  std::string rule;     // "tp_gtp_remat_in_nvlink_domain", "cp_in_nvlink_domain", "ep_in_nvlink_domain"
  std::string group;    // group family name
  int group_index = 0;
  std::string reason;
  bool resolved = false;  // fixed by the permuted placement
};

struct Plan {
  ParallelSizes sizes;
  ViolationPolicy policy = ViolationPolicy::kWarn;
  bool permuted = false;
  std::vector<RankPlacement> placement;  // indexed by rank
  std::vector<GroupPlan> groups;         // standard_groups() order
  std::vector<Violation> violations;
  std::vector<std::string> notes;

  // For the process on each cluster slot, the grid rank it plays (-1 on unused slots): what a
  // launcher-ordered world communicator needs to re-key its ranks after a permutation.
  std::vector<int> rank_by_slot(int slot_count) const;

  int unresolved_violations() const;
  // False when the policy refuses the placement: fail with any violation, or permute that could
  // not fix them all. warn is always ok.
  bool ok() const;
  const GroupPlan& group(const std::string& name) const;
};

// A rank's communicator split arguments for one family: color = index of its group, key = its
// position in the group (ncclCommSplit). Throws std::invalid_argument for a rank outside the plan.
struct SplitArgs {
  int color = 0;
  int key = 0;
};
SplitArgs split_args(const GroupPlan& family, int rank);

// Throws std::invalid_argument when the cluster has fewer GPUs than sizes.world_size.
Plan make_plan(const Cluster& cluster, const ParallelSizes& sizes, ViolationPolicy policy);

nlohmann::json plan_to_json(const Plan& plan, const Cluster& cluster);
// Readable report; lists at most max_ranks placements and max_violations violations.
std::string format_plan(const Plan& plan, const Cluster& cluster, int max_ranks, int max_violations);

}  // namespace gtp::topology
