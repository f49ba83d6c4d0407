// gtp-topo: inspect this machine's topology, plan a GTP job from a profile, validate profiles.
// Exit codes: 0 ok, 1 violations or invalid input, 2 usage error.
#include "topology/gtp_topo_cli.h"

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "topology/discovery.h"
#include "topology/planner.h"
#include "topology/profile.h"

namespace gtp::topology {
namespace {

constexpr int kOk = 0, kInvalid = 1, kUsage = 2;

constexpr const char* kMainHelp = R"(usage: gtp-topo <verb> [options]

Topology tools of libgtp (Generalized Tensor Parallelism).

verbs:
  probe [--xml FILE] [--json]     this machine's topology (or an hwloc XML export) as a table or JSON
  plan --profile FILE [--json]    placement, groups, link classes, bandwidths and violations
  validate FILE                   check a profile (.json) or an hwloc XML export (.xml)

Run 'gtp-topo <verb> --help' for a verb's options.
exit codes: 0 ok, 1 violations or invalid input, 2 usage error
)";

constexpr const char* kProbeHelp = R"(usage: gtp-topo probe [--xml FILE] [--json]

Discovers packages, NUMA nodes, GPUs (PCI bus id, NUMA node, cpuset, NVLink peers and domain) and NICs.
Without --xml it probes this machine with hwloc, the CUDA driver and NVML (all optional: whatever is
missing is listed as a note). --json prints the host record the runtime exchanges between hosts.

  --xml FILE   replay an hwloc XML export (lstopo --of xml) instead of probing this machine
  --json       print JSON instead of a table
)";

constexpr const char* kPlanHelp = R"(usage: gtp-topo plan --profile FILE [--json]

Reads a profile (docs/profiles.md), places every rank on a GPU, lists every group with its link class
and predicted bandwidth, and checks the placement rules (tp x gtp_remat inside one NVLink domain, then
cp and ep where they fit). The profile's placement.on_violation decides the outcome: warn prints the
violations and exits 0; fail exits 1; permute reorders ranks and exits 1 only if violations remain.

  --profile FILE   the JSON profile
  --json           print the whole plan as JSON (every rank and every group)
)";

constexpr const char* kValidateHelp = R"(usage: gtp-topo validate FILE

FILE ending in .xml: checks that it is a loadable hwloc XML export.
Otherwise FILE is a profile: checks its schema, its parallel sizes against the GTP rules, and plans it.
Stricter than plan: any violation that the placement does not resolve exits 1, whatever the policy.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int print_help(const char* text) {
  std::fputs(text, stdout);
  return kOk;
}

bool wants_help(const std::vector<std::string>& args) {
  for (const std::string& arg : args)
    if (arg == "--help" || arg == "-h") return true;
  return false;
}

// Parses "--flag" and "--option VALUE" arguments; anything else is a usage error.
struct Options {
  bool json = false;
  std::string xml, profile;
  std::vector<std::string> positional;
};

Options parse_options(const std::vector<std::string>& args, const std::vector<std::string>& allowed) {
  Options options;
  auto allow = [&](const std::string& flag) {
    for (const std::string& a : allowed)
      if (a == flag) return;
    throw UsageError("unknown option '" + flag + "'");
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      options.positional.push_back(arg);
      continue;
    }
    allow(arg);
    if (arg == "--json") {
      options.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw UsageError(arg + " needs a value");
    (arg == "--xml" ? options.xml : options.profile) = args[++i];
  }
  return options;
}

int probe(const std::vector<std::string>& args) {
  if (wants_help(args)) return print_help(kProbeHelp);
  const Options options = parse_options(args, {"--xml", "--json"});
  if (!options.positional.empty()) throw UsageError("probe takes no positional argument '" + options.positional[0] + "'");
  const HostTopology host = options.xml.empty() ? discover_local() : load_hwloc_xml(options.xml);
  if (options.json) std::cout << nlohmann::json(host).dump(2) << "\n";
  else std::cout << format_host(host);
  return kOk;
}

Plan plan_profile(const Profile& profile) { return make_plan(profile.cluster, profile.sizes, profile.on_violation); }

int plan(const std::vector<std::string>& args) {
  if (wants_help(args)) return print_help(kPlanHelp);
  const Options options = parse_options(args, {"--profile", "--json"});
  if (options.profile.empty()) throw UsageError("plan needs --profile FILE");
  if (!options.positional.empty()) throw UsageError("plan takes no positional argument '" + options.positional[0] + "'");
  const Profile profile = load_profile(options.profile);
  const Plan result = plan_profile(profile);
  if (options.json) std::cout << plan_to_json(result, profile.cluster).dump(2) << "\n";
  else std::cout << format_plan(result, profile.cluster, /*max_ranks=*/64, /*max_violations=*/20);
  if (!result.ok()) {
    std::fprintf(stderr, "gtp-topo: %d placement violation(s) under policy '%s'\n", result.unresolved_violations(),
                 to_string(result.policy));
    return kInvalid;
  }
  return kOk;
}

int validate(const std::vector<std::string>& args) {
  if (wants_help(args)) return print_help(kValidateHelp);
  const Options options = parse_options(args, {});
  if (options.positional.size() != 1) throw UsageError("validate needs exactly one FILE");
  const std::string& file = options.positional[0];
  if (file.size() > 4 && file.compare(file.size() - 4, 4, ".xml") == 0) {
    const HostTopology host = load_hwloc_xml(file);
    std::printf("%s: valid hwloc XML: host %s, %zu NUMA nodes, %zu GPUs, %zu NICs\n", file.c_str(),
                host.hostname.c_str(), host.numa_nodes.size(), host.gpus.size(), host.nics.size());
    return kOk;
  }
  const Profile profile = load_profile(file);
  const Plan result = plan_profile(profile);
  for (const Violation& v : result.violations) {
    if (!v.resolved) std::printf("violation [%s]: %s\n", v.rule.c_str(), v.reason.c_str());
  }
  const int unresolved = result.unresolved_violations();
  std::printf("%s: %s: schema version %d, %d GPUs on %zu hosts, world %d (tp %d x gtp_remat %d x cp %d x dp %d x pp %d), "
              "%d unresolved violation(s)\n",
              file.c_str(), unresolved ? "INVALID" : "OK", profile.schema_version, profile.cluster.gpu_count(),
              profile.cluster.hosts().size(), profile.sizes.world_size, profile.sizes.tp, profile.sizes.gtp_remat,
              profile.sizes.cp, profile.sizes.dp, profile.sizes.pp, unresolved);
  return unresolved ? kInvalid : kOk;
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) throw UsageError("no verb given");
  const std::string verb = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (verb == "--help" || verb == "-h" || verb == "help") return print_help(kMainHelp);
  if (verb == "probe") return probe(rest);
  if (verb == "plan") return plan(rest);
  if (verb == "validate") return validate(rest);
  throw UsageError("unknown verb '" + verb + "'");
}

}  // namespace

int gtp_topo_main(const std::vector<std::string>& args) {
  try {
    return run(args);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "gtp-topo: %s\n\n%s", error.what(), kMainHelp);
    return kUsage;
  } catch (const std::invalid_argument& error) {
    std::fprintf(stderr, "gtp-topo: invalid input: %s\n", error.what());
    return kInvalid;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gtp-topo: error: %s\n", error.what());
    return kInvalid;
  }
}

}  // namespace gtp::topology
