#include "topology/planner.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <unordered_set>

namespace gtp::topology {
namespace {

// Per-slot facts the group evaluation reads, precomputed once so planning stays linear in ranks.
struct SlotFacts {
  std::vector<int> host, domain;
  std::vector<char> has_nvlink;
  std::vector<double> nvswitch, pcie, network;
  std::vector<int> domain_size;  // by domain id, over the whole cluster
};

// A GPU's share of its host's NICs: the NICs on its NUMA node split among that node's GPUs, or
// all of the host's NICs split among all its GPUs when its node has none with a known rate.
void network_shares(const HostTopology& host, std::vector<double>* out) {
  double total = 0;
  std::vector<std::pair<int, double>> numa_bw;  // (numa, GB/s)
  for (const Nic& nic : host.nics) {
    total += nic.gbytes_per_s;
    numa_bw.emplace_back(nic.numa_node, nic.gbytes_per_s);
  }
  for (const Gpu& gpu : host.gpus) {
    double local = 0;
    int sharing = 0;
    for (const auto& entry : numa_bw)
      if (entry.first == gpu.numa_node && gpu.numa_node >= 0) local += entry.second;
    for (const Gpu& other : host.gpus)
      if (other.numa_node == gpu.numa_node) ++sharing;
    out->push_back(local > 0 ? local / sharing : (host.gpus.empty() ? 0 : total / host.gpus.size()));
  }
}

SlotFacts slot_facts(const Cluster& cluster) {
  SlotFacts facts;
  const int slots = cluster.gpu_count();
  facts.domain_size.assign(cluster.domain_count(), 0);
  for (const HostTopology& host : cluster.hosts()) network_shares(host, &facts.network);
  for (int s = 0; s < slots; ++s) {
    const Gpu& gpu = cluster.slot(s);
    facts.host.push_back(cluster.slot_host(s));
    facts.domain.push_back(cluster.slot_domain(s));
    facts.has_nvlink.push_back(!gpu.nvlink_domain.empty());
    facts.nvswitch.push_back(gpu.nvswitch_gbytes_per_s());
    facts.pcie.push_back(gpu.pcie_gbytes_per_s);
    ++facts.domain_size[cluster.slot_domain(s)];
  }
  return facts;
}

struct LinkEstimate {
  LinkClass link;
  double gbytes_per_s;
  const char* source;
};

// The group's slowest class, and the bandwidth each member can push into the group over it.
LinkEstimate estimate(const Cluster& cluster, const SlotFacts& f, const int* slots, int count) {
  if (count == 1) return {LinkClass::kLocal, 0, "single rank"};
  bool same_domain = f.has_nvlink[slots[0]], same_host = true, all_switched = true;
  for (int i = 0; i < count; ++i) {
    same_domain = same_domain && f.domain[slots[i]] == f.domain[slots[0]];
    same_host = same_host && f.host[slots[i]] == f.host[slots[0]];
    all_switched = all_switched && f.nvswitch[slots[i]] > 0;
  }
  if (same_domain && all_switched) {
    double bw = f.nvswitch[slots[0]];
    for (int i = 1; i < count; ++i) bw = std::min(bw, f.nvswitch[slots[i]]);
    return {LinkClass::kNvlink, bw, "nvswitch links"};
  }
  if (same_domain) {  // directly linked GPUs: each member's links into the rest of the group
    double bw = -1;
    for (int i = 0; i < count; ++i) {
      double into_group = 0;
      for (int j = 0; j < count; ++j)
        if (j != i) into_group += cluster.slot(slots[i]).nvlink_gbytes_per_s_to(cluster.slot(slots[j]).bus_id);
      bw = bw < 0 ? into_group : std::min(bw, into_group);
    }
    if (bw > 0) return {LinkClass::kNvlink, bw, "nvlink matrix"};
  }
  if (same_host) {
    double bw = f.pcie[slots[0]];
    for (int i = 1; i < count; ++i) bw = std::min(bw, f.pcie[slots[i]]);
    return {LinkClass::kPcie, bw, bw > 0 ? "pcie link" : "pcie link (rate unknown)"};
  }
  double bw = f.network[slots[0]];
  for (int i = 1; i < count; ++i) bw = std::min(bw, f.network[slots[i]]);
  return {LinkClass::kNetwork, bw, bw > 0 ? "nic share" : "nic (rate unknown)"};
}

std::string domain_label(const Cluster& cluster, int slot) {
  const Gpu& gpu = cluster.slot(slot);
  const std::string& host = cluster.hosts()[cluster.slot_host(slot)].hostname;
  return gpu.nvlink_domain.empty() ? "none (" + host + " GPU " + std::to_string(gpu.index) + " has no NVLink)"
                                   : gpu.nvlink_domain;
}

// One rule: every group of `family` must sit inside one NVLink domain.
struct DomainRule {
  std::string rule;
  std::string family;
  std::string block_name;  // e.g. "tp*gtp_remat"
  int block = 1;
};

struct Evaluation {
  std::vector<RankPlacement> placement;
  std::vector<GroupPlan> groups;
  std::vector<Violation> violations;
};

std::string cause_of(const DomainRule& rule, const Cluster& cluster, const SlotFacts& f, const std::vector<int>& order,
                     const std::vector<int>& members, int largest) {
  for (int rank : members) {
    if (!f.has_nvlink[order[rank]]) {
      return "GPU " + std::to_string(cluster.slot(order[rank]).index) + " of " +
             cluster.hosts()[f.host[order[rank]]].hostname + " has no NVLink: " + rule.family +
             " groups need NVLink-connected GPUs (lower " + rule.block_name + " to 1 or use NVLink GPUs)";
    }
  }
  if (rule.block > largest) {
    return rule.block_name + "=" + std::to_string(rule.block) + " is larger than the largest NVLink domain (" +
           std::to_string(largest) + " GPUs): lower it to at most " + std::to_string(largest);
  }
  for (int rank : members) {
    const int size = f.domain_size[f.domain[order[rank]]];
    if (size % rule.block != 0) {
      return "NVLink domain " + domain_label(cluster, order[rank]) + " has " + std::to_string(size) +
             " GPUs, not a multiple of " + rule.block_name + "=" + std::to_string(rule.block) +
             ", so consecutive ranks straddle domains: use placement policy \"permute\" or a size that divides " +
             std::to_string(size);
    }
  }
  return "the rank order interleaves NVLink domains (host order in the cluster description): use placement "
         "policy \"permute\"";
}

void check_rule(const DomainRule& rule, const GroupPlan& family, const Cluster& cluster, const SlotFacts& f,
                const std::vector<int>& order, std::vector<Violation>* out) {
  const int size = family.groups.group_size;
  const int largest = *std::max_element(f.domain_size.begin(), f.domain_size.end());
  for (int g = 0; g < family.groups.num_groups(); ++g) {
    const int* ranks = family.groups.ranks.data() + static_cast<size_t>(g) * size;
    bool inside = f.has_nvlink[order[ranks[0]]];
    int other = ranks[0];
    for (int i = 1; i < size && inside; ++i) {
      if (f.domain[order[ranks[i]]] != f.domain[order[ranks[0]]] || !f.has_nvlink[order[ranks[i]]]) {
        inside = false;
        other = ranks[i];
      }
    }
    if (inside) continue;
    const std::vector<int> members(ranks, ranks + size);
    const std::string& host_a = cluster.hosts()[f.host[order[ranks[0]]]].hostname;
    const std::string& host_b = cluster.hosts()[f.host[order[other]]].hostname;
    // other == ranks[0]: the first rank itself has no NVLink, so there is no second rank to name.
    const std::string first = "rank " + std::to_string(ranks[0]) + " is on " + host_a + " in " +
                              domain_label(cluster, order[ranks[0]]);
    const std::string where = other == ranks[0] ? first
                                                : first + ", rank " + std::to_string(other) + " on " + host_b + " in " +
                                                      domain_label(cluster, order[other]);
    std::string reason = rule.family + " group " + std::to_string(g) + " (ranks " + std::to_string(ranks[0]) + ".." +
                         std::to_string(ranks[size - 1]) + ") is not inside one NVLink domain: " + where + "; " +
                         cause_of(rule, cluster, f, order, members, largest);
    out->push_back(Violation{rule.rule, rule.family, g, std::move(reason), false});
  }
}

const GroupPlan* find_family(const std::vector<GroupPlan>& groups, const std::string& name) {
  for (const GroupPlan& plan : groups)
    if (plan.spec.name == name) return &plan;
  return nullptr;
}

Evaluation evaluate(const Cluster& cluster, const SlotFacts& f, const std::vector<int>& order,
                    const std::vector<GroupPlan>& enumerations, const std::vector<DomainRule>& rules) {
  Evaluation eval;
  eval.placement.reserve(order.size());
  for (int slot : order) {
    const Gpu& gpu = cluster.slot(slot);
    eval.placement.push_back(RankPlacement{slot, cluster.slot_host(slot), cluster.slot_gpu(slot), gpu.numa_node});
  }
  std::vector<int> slots;
  for (const GroupPlan& enumeration : enumerations) {
    GroupPlan plan = enumeration;
    const int size = plan.groups.group_size, count = plan.groups.num_groups();
    plan.link.reserve(count);
    plan.gbytes_per_s.reserve(count);
    plan.bandwidth_source.reserve(count);
    slots.resize(size);
    bool any_traffic = false;
    for (int g = 0; g < count; ++g) {
      for (int i = 0; i < size; ++i) slots[i] = order[plan.groups.ranks[static_cast<size_t>(g) * size + i]];
      const LinkEstimate e = estimate(cluster, f, slots.data(), size);
      plan.link.push_back(e.link);
      plan.gbytes_per_s.push_back(e.gbytes_per_s);
      plan.bandwidth_source.emplace_back(e.source);
      plan.worst_link = std::max(plan.worst_link, e.link);
      if (e.link != LinkClass::kLocal) {
        plan.min_gbytes_per_s = any_traffic ? std::min(plan.min_gbytes_per_s, e.gbytes_per_s) : e.gbytes_per_s;
        any_traffic = true;
      }
    }
    eval.groups.push_back(std::move(plan));
  }
  for (const DomainRule& rule : rules) check_rule(rule, *find_family(eval.groups, rule.family), cluster, f, order, &eval.violations);
  return eval;
}

// Whole blocks of `block` consecutive ranks packed into domains first, leftovers last. Returns an
// empty order when the whole blocks cannot hold world_size ranks.
std::vector<int> packed_order(const SlotFacts& f, int world_size, int block) {
  std::vector<std::vector<int>> domains(f.domain_size.size());
  for (size_t slot = 0; slot < f.domain.size(); ++slot) domains[f.domain[slot]].push_back(static_cast<int>(slot));
  std::vector<int> order, leftovers;
  for (const std::vector<int>& slots : domains) {
    const size_t whole = slots.size() / block * block;
    order.insert(order.end(), slots.begin(), slots.begin() + whole);
    leftovers.insert(leftovers.end(), slots.begin() + whole, slots.end());
  }
  if (static_cast<int>(order.size()) < world_size) return {};
  order.resize(world_size);
  return order;
}

int lcm(int a, int b) { return a / std::gcd(a, b) * b; }

}  // namespace

const char* to_string(LinkClass link) {
  switch (link) {
    case LinkClass::kLocal: return "local";
    case LinkClass::kNvlink: return "nvlink";
    case LinkClass::kPcie: return "pcie";
    case LinkClass::kNetwork: return "network";
  }
  return "unknown";
}

ViolationPolicy parse_violation_policy(const std::string& name) {
  if (name == "warn") return ViolationPolicy::kWarn;
  if (name == "fail") return ViolationPolicy::kFail;
  if (name == "permute") return ViolationPolicy::kPermute;
  throw std::invalid_argument("violation policy '" + name + "' is unknown: use warn, fail or permute");
}

const char* to_string(ViolationPolicy policy) {
  switch (policy) {
    case ViolationPolicy::kWarn: return "warn";
    case ViolationPolicy::kFail: return "fail";
    case ViolationPolicy::kPermute: return "permute";
  }
  return "unknown";
}

const std::vector<GroupSpec>& standard_groups() {
  static const std::vector<GroupSpec> groups = {
      {"tp", "", {"tp"}},
      {"gtp_remat", "", {"gtp_remat"}},
      {"tp_gtp_remat", "", {"tp", "gtp_remat"}},
      {"cp", "", {"cp"}},
      {"dp", "", {"dp"}},
      {"dp_cp", "", {"cp", "dp"}},
      {"gtp_remat_dp", "", {"gtp_remat", "dp"}},
      {"gtp_remat_dp_cp", "", {"gtp_remat", "cp", "dp"}},
      {"pp", "", {"pp"}},
      {"mp", "", {"tp", "gtp_remat", "pp"}},
      {"expt_tp", kExpertView, {"expt_tp"}},
      {"ep", kExpertView, {"ep"}},
      {"tp_ep", kExpertView, {"expt_tp", "ep"}},
      {"expt_gtp_remat", kExpertView, {"expt_gtp_remat"}},
      {"expt_dp", kExpertView, {"expt_dp"}},
      {"expt_dp_gtp_remat", kExpertView, {"expt_gtp_remat", "expt_dp"}},
  };
  return groups;
}

std::vector<std::string> standard_group_names() {
  std::vector<std::string> names;
  for (const GroupSpec& spec : standard_groups()) names.push_back(spec.name);
  return names;
}

std::vector<int> Plan::rank_by_slot(int slot_count) const {
  std::vector<int> ranks(slot_count, -1);
  for (size_t rank = 0; rank < placement.size(); ++rank) ranks.at(placement[rank].slot) = static_cast<int>(rank);
  return ranks;
}

SplitArgs split_args(const GroupPlan& family, int rank) {
  const std::vector<int>& ranks = family.groups.ranks;
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  if (it == ranks.end()) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is not in any " + family.spec.name + " group");
  }
  const int flat = static_cast<int>(it - ranks.begin());
  return SplitArgs{flat / family.groups.group_size, flat % family.groups.group_size};
}

int Plan::unresolved_violations() const {
  return static_cast<int>(std::count_if(violations.begin(), violations.end(), [](const Violation& v) { return !v.resolved; }));
}

bool Plan::ok() const { return policy == ViolationPolicy::kWarn || unresolved_violations() == 0; }

const GroupPlan& Plan::group(const std::string& name) const {
  const GroupPlan* found = find_family(groups, name);
  if (!found) throw std::invalid_argument("no group family '" + name + "' in the plan");
  return *found;
}

Plan make_plan(const Cluster& cluster, const ParallelSizes& sizes, ViolationPolicy policy) {
  if (sizes.world_size > cluster.gpu_count()) {
    throw std::invalid_argument("world_size=" + std::to_string(sizes.world_size) + " needs that many GPUs but the cluster has " +
                                std::to_string(cluster.gpu_count()) + ": add hosts or lower the parallel sizes");
  }
  const HyperCommGrid grid = make_gtp_grid(sizes);
  std::vector<GroupPlan> enumerations;
  for (const GroupSpec& spec : standard_groups()) {
    GroupPlan family;
    family.spec = spec;
    family.key = grid.canonical_key(spec.dims, spec.view);
    family.groups = grid.rank_enum(spec.dims, spec.view);
    enumerations.push_back(std::move(family));
  }
  const SlotFacts f = slot_facts(cluster);

  Plan plan;
  plan.sizes = sizes;
  plan.policy = policy;
  std::vector<int> order(sizes.world_size);  // the launcher's order: rank r on slot r
  std::iota(order.begin(), order.end(), 0);
  int smallest = INT32_MAX;
  for (int s = 0; s < sizes.world_size; ++s) smallest = std::min(smallest, f.domain_size[f.domain[s]]);

  // Rule 1 always applies; the cp and ep rules only where their block fits in the smallest domain in
  // use. pack_block is what permute packs: the LCM of every block that must stay inside a domain.
  const int dense_block = sizes.tp * sizes.gtp_remat;
  std::vector<DomainRule> rules;
  if (dense_block > 1) rules.push_back({"tp_gtp_remat_in_nvlink_domain", "tp_gtp_remat", "tp*gtp_remat", dense_block});
  int pack_block = dense_block;
  const int cp_block = dense_block * sizes.cp;
  if (sizes.cp > 1 && cp_block <= smallest) {
    rules.push_back({"cp_in_nvlink_domain", "tp_gtp_remat_cp", "tp*gtp_remat*cp", cp_block});
    pack_block = cp_block;
    // No standard family spans exactly tp x gtp_remat x cp, so the rule gets a helper enumeration.
    GroupPlan block;
    block.spec = GroupSpec{"tp_gtp_remat_cp", "", {"tp", "gtp_remat", "cp"}};
    block.key = grid.canonical_key(block.spec.dims);
    block.groups = grid.rank_enum(block.spec.dims);
    enumerations.push_back(std::move(block));
  } else if (sizes.cp > 1) {
    plan.notes.push_back("tp*gtp_remat*cp=" + std::to_string(cp_block) + " exceeds the smallest NVLink domain (" +
                         std::to_string(smallest) + " GPUs): cp groups cross domains");
  }
  const int ep_block = sizes.expt_tp * sizes.ep;
  const bool ep_fits = sizes.ep > 1 && ep_block <= smallest;
  if (ep_fits) {
    rules.push_back({"ep_in_nvlink_domain", "tp_ep", "expt_tp*ep", ep_block});
    pack_block = lcm(pack_block, ep_block);
  } else if (sizes.ep > 1) {
    plan.notes.push_back("expt_tp*ep=" + std::to_string(ep_block) + " exceeds the smallest NVLink domain (" +
                         std::to_string(smallest) + " GPUs): ep all-to-all crosses domains");
  }

  Evaluation eval = evaluate(cluster, f, order, enumerations, rules);
  if (policy == ViolationPolicy::kPermute && !eval.violations.empty()) {
    // Pack the largest block that still leaves room for every rank; smaller blocks keep at least
    // the required rules when the largest one wastes too many GPUs per domain.
    std::vector<int> packed;
    for (int block : {pack_block, lcm(dense_block, ep_fits ? ep_block : 1), dense_block}) {
      packed = packed_order(f, sizes.world_size, block);
      if (!packed.empty()) break;
    }
    if (!packed.empty()) {
      Evaluation permuted = evaluate(cluster, f, packed, enumerations, rules);
      if (permuted.violations.size() < eval.violations.size()) {
        std::unordered_set<std::string> remaining;
        for (const Violation& v : permuted.violations) remaining.insert(v.rule + "#" + std::to_string(v.group_index));
        for (Violation& v : eval.violations) {
          v.resolved = !remaining.count(v.rule + "#" + std::to_string(v.group_index));
          if (v.resolved) v.reason += " [fixed by permutation]";
        }
        eval.violations.erase(std::remove_if(eval.violations.begin(), eval.violations.end(),
                                             [](const Violation& v) { return !v.resolved; }),
                              eval.violations.end());
        eval.violations.insert(eval.violations.end(), permuted.violations.begin(), permuted.violations.end());
        eval.placement = std::move(permuted.placement);
        eval.groups = std::move(permuted.groups);
        plan.permuted = true;
      }
    }
    if (!plan.permuted) plan.notes.push_back("permutation could not reduce the violations; kept the launcher order");
  }
  // The helper block is for the rule check only; the reported families are the standard ones.
  eval.groups.resize(standard_groups().size());
  plan.placement = std::move(eval.placement);
  plan.groups = std::move(eval.groups);
  plan.violations = std::move(eval.violations);
  if (cluster.gpu_count() > sizes.world_size) {
    plan.notes.push_back(std::to_string(cluster.gpu_count() - sizes.world_size) + " of " +
                         std::to_string(cluster.gpu_count()) + " GPUs are left unused");
  }
  return plan;
}

}  // namespace gtp::topology
