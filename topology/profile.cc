#include "topology/profile.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <stdexcept>

#include "topology/discovery.h"
#include "topology/internal/json_reader.h"
#include "topology/internal/json_text.h"

namespace gtp::topology {

using internal::JsonReader;
using nlohmann::json;

namespace {

constexpr int kMaxSize = 1 << 24;   // ranks: well beyond any job, small enough to stay in int math
constexpr int kMaxHosts = 1 << 18;  // template hosts: bounds the memory a typo can request
// Planning time and memory grow with the GPUs (2M GPUs took 83 s and 16 GB): 2^18 plans in seconds.
constexpr std::int64_t kMaxClusterGpus = 1 << 18;

void check_gpu_count(std::int64_t gpus, const std::string& path, const std::string& how) {
  if (gpus > kMaxClusterGpus) {
    throw std::invalid_argument(path + ": " + how + " = " + std::to_string(gpus) + " GPUs, over the " +
                                std::to_string(kMaxClusterGpus) +
                                " a profile may describe (planning time and memory grow with them): describe fewer");
  }
}

const std::vector<std::string> kParallelKeys = {
    "world_size",
    "tensor_model_parallel_size",
    "tensor_parallel_num_weight_shards",
    "context_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "expert_tensor_parallel_num_weight_shards",
};

std::string rethrow_prefix(const std::string& path, const std::exception& error) { return path + ": " + error.what(); }

// NICs replayed from XML have no rate; the profile may supply one for all of them.
void fill_nic_rates(std::vector<HostTopology>* hosts, double gbytes_per_s) {
  for (HostTopology& host : *hosts)
    for (Nic& nic : host.nics)
      if (nic.gbytes_per_s == 0) nic.gbytes_per_s = gbytes_per_s;
}

Cluster parse_cluster(const json& value, const std::string& base_dir, std::string* source) {
  const std::string path = "/cluster";
  if (value.is_string()) {
    if (value.get<std::string>() != "discover") {
      throw std::invalid_argument(path + ": '" + value.get<std::string>() +
                                  "' is not allowed: write \"discover\" or describe the cluster as an object");
    }
    *source = "discover";
    return Cluster({discover_local()});
  }
  JsonReader r(value, path);
  r.allow_only({"hosts", "template", "hwloc_xml", "nic_gbytes_per_s"});
  const int forms = r.has("hosts") + r.has("template") + r.has("hwloc_xml");
  if (forms != 1) {
    r.fail("", "give exactly one of \"hosts\", \"template\" or \"hwloc_xml\" (found " + std::to_string(forms) + ")");
  }
  const double nic_rate = r.number("nic_gbytes_per_s", 0, 0);
  std::vector<HostTopology> hosts;
  if (r.has("hosts")) {
    *source = "hosts";
    const json& list = r.array("hosts");
    for (size_t i = 0; i < list.size(); ++i) hosts.push_back(parse_host(list[i], r.path_of("hosts") + "/" + std::to_string(i)));
  } else if (r.has("template")) {
    *source = "template";
    JsonReader t(r.raw("template"), r.path_of("template"));
    t.allow_only({"host_count", "hosts_per_nvlink_domain", "hostname_prefix", "host"});
    ClusterTemplate shape;
    shape.host_count = static_cast<int>(t.required_integer("host_count", 1, kMaxHosts));
    shape.hosts_per_nvlink_domain = static_cast<int>(t.integer("hosts_per_nvlink_domain", 1, 1, kMaxHosts));
    shape.hostname_prefix = t.string("hostname_prefix", "node");
    if (!t.has("host")) t.fail("host", "missing: add \"host\": {\"gpus\": [...], ...}");
    json host = t.raw("host");
    if (host.is_object() && !host.contains("hostname")) host["hostname"] = "template";
    shape.host = parse_host(host, t.path_of("host"));
    check_gpu_count(static_cast<std::int64_t>(shape.host_count) * static_cast<std::int64_t>(shape.host.gpus.size()),
                    t.path_of("host_count"),
                    "host_count " + std::to_string(shape.host_count) + " x " + std::to_string(shape.host.gpus.size()) +
                        " GPUs per host");
    hosts = make_cluster(shape).hosts();
  } else {
    *source = "hwloc_xml";
    const json& files = r.raw("hwloc_xml");
    std::vector<std::string> paths;
    if (files.is_string()) paths.push_back(files.get<std::string>());
    else if (files.is_array()) {
      for (size_t i = 0; i < files.size(); ++i) {
        if (!files[i].is_string()) r.fail("hwloc_xml", "element " + std::to_string(i) + " is not a string: quote the path");
        paths.push_back(files[i].get<std::string>());
      }
    } else {
      r.fail("hwloc_xml", "expected a path or an array of paths, got " + internal::json_type_name(files));
    }
    for (size_t i = 0; i < paths.size(); ++i) {
      const std::string file = !paths[i].empty() && paths[i][0] == '/' ? paths[i] : base_dir + "/" + paths[i];
      try {
        hosts.push_back(load_hwloc_xml(file));
      } catch (const std::invalid_argument& error) {
        throw std::invalid_argument(rethrow_prefix(r.path_of("hwloc_xml") + (files.is_array() ? "/" + std::to_string(i) : ""), error));
      }
    }
  }
  std::int64_t gpus = 0;
  for (const HostTopology& host : hosts) gpus += static_cast<std::int64_t>(host.gpus.size());
  check_gpu_count(gpus, path, "the hosts hold");
  fill_nic_rates(&hosts, nic_rate);
  try {
    return Cluster(std::move(hosts));
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(rethrow_prefix(path, error));
  }
}

ParallelConfig parse_parallel(const JsonReader& r, const Cluster& cluster) {
  r.allow_only(kParallelKeys);
  ParallelConfig c;
  const int gpus = cluster.gpu_count();
  if (!r.has("world_size") && gpus == 0) {
    r.fail("world_size", "missing, and the cluster has no GPU to count: add \"world_size\": <ranks>");
  }
  c.world_size = static_cast<int>(r.integer("world_size", gpus, 1, kMaxSize));
  c.tensor_model_parallel_size = static_cast<int>(r.integer("tensor_model_parallel_size", 1, 1, kMaxSize));
  c.tensor_parallel_num_weight_shards = static_cast<int>(r.integer("tensor_parallel_num_weight_shards", 0, 0, kMaxSize));
  c.context_parallel_size = static_cast<int>(r.integer("context_parallel_size", 1, 1, kMaxSize));
  c.pipeline_model_parallel_size = static_cast<int>(r.integer("pipeline_model_parallel_size", 1, 1, kMaxSize));
  c.expert_model_parallel_size = static_cast<int>(r.integer("expert_model_parallel_size", 1, 1, kMaxSize));
  c.expert_tensor_parallel_size = static_cast<int>(r.integer("expert_tensor_parallel_size", 0, 0, kMaxSize));
  c.expert_tensor_parallel_num_weight_shards =
      static_cast<int>(r.integer("expert_tensor_parallel_num_weight_shards", 0, 0, kMaxSize));
  return c;
}

// Points an arithmetic error at the knob its message starts with.
std::string parallel_error_path(const std::string& message) {
  std::string best = "world_size";
  size_t best_at = std::string::npos;
  for (const std::string& key : kParallelKeys) {
    const size_t at = message.find(key + "=");
    if (at != std::string::npos && (best_at == std::string::npos || at < best_at)) {
      best_at = at;
      best = key;
    }
  }
  return "/parallel/" + best;
}

// Each fill graph is an instantiated CUDA graph (host memory, and NCCL's per-graph resources); more
// than this many distinct fills per group would mean a graph per fill of a very long step.
constexpr int64_t kMaxFillGraphs = 1 << 16;

GroupSettings parse_group(const json& value, const std::string& path) {
  JsonReader r(value, path);
  r.allow_only({"stream_priority", "reduce_scatter_stream_priority", "nccl", "wire_format", "nvfp4_blocks", "mx_rounding", "prefetch_depth",
                "prefetch_batch", "keep_gathered", "fill_graphs", "grads_into_main_grad", "memory_budget"});
  GroupSettings s;
  s.stream_priority = r.choice("stream_priority", "normal", {"high", "normal", "low"});
  s.reduce_scatter_stream_priority = r.choice("reduce_scatter_stream_priority", "low", {"high", "normal", "low"});
  const std::string wire = r.choice("wire_format", "bf16", {"bf16", "fp8", "mxfp8", "nvfp4"});
  s.wire_format = parse_wire_format(wire);
  // Variants of one wire: setting one for another wire would silently do nothing, so it is an error.
  if (r.has("nvfp4_blocks") && wire != "nvfp4") {
    r.fail("nvfp4_blocks", "applies to wire_format \"nvfp4\" only, but wire_format is \"" + wire +
                               "\"; remove it or set wire_format to \"nvfp4\"");
  }
  if (r.has("mx_rounding") && wire != "mxfp8") {
    r.fail("mx_rounding", "applies to wire_format \"mxfp8\" only, but wire_format is \"" + wire +
                              "\"; remove it or set wire_format to \"mxfp8\"");
  }
  s.nvfp4_2d = r.choice("nvfp4_blocks", "1d", {"1d", "2d"}) == "2d";
  s.mx_rounding_floor = r.choice("mx_rounding", "rceil", {"rceil", "floor"}) == "floor";
  s.prefetch_depth = static_cast<int>(r.integer("prefetch_depth", 1, 0, 64));
  s.prefetch_batch = static_cast<int>(r.integer("prefetch_batch", 1, 1, 64));
  if (s.prefetch_batch > std::max(s.prefetch_depth, 1)) {
    r.fail("prefetch_batch", "prefetch_batch=" + std::to_string(s.prefetch_batch) + " exceeds prefetch_depth=" +
                                 std::to_string(s.prefetch_depth) + "; use 1.." +
                                 std::to_string(std::max(s.prefetch_depth, 1)) +
                                 " (a batch is issued out of the prefetch window)");
  }
  s.keep_gathered = r.boolean("keep_gathered", false);
  s.fill_graphs = r.integer("fill_graphs", 0, 0, kMaxFillGraphs);
  s.grads_into_main_grad = r.boolean("grads_into_main_grad", true);
  if (r.has("memory_budget")) {
    const json& budget = r.raw("memory_budget");
    if (budget.is_number_integer()) {
      s.memory_budget_bytes = r.integer("memory_budget", 0, 0, INT64_MAX);
    } else if (budget.is_string()) {
      try {
        s.memory_budget_bytes = parse_byte_size(budget.get<std::string>());
      } catch (const std::invalid_argument& error) {
        r.fail("memory_budget", error.what());
      }
    } else {
      r.fail("memory_budget", "expected bytes as an integer or a string like \"2GiB\", got " +
                                  internal::json_type_name(budget));
    }
  }
  if (const json* nccl = r.optional_object("nccl")) {
    JsonReader n(*nccl, r.path_of("nccl"));
    n.allow_only({"max_ctas", "min_ctas", "cga_cluster_size", "net_name"});
    // NCCL accepts 1..64 CTAs (MAXCHANNELS) and CGA clusters up to 8; -1 keeps its default.
    s.nccl.max_ctas = static_cast<int>(n.integer("max_ctas", -1, -1, 64));
    s.nccl.min_ctas = static_cast<int>(n.integer("min_ctas", -1, -1, 64));
    s.nccl.cga_cluster_size = static_cast<int>(n.integer("cga_cluster_size", -1, -1, 8));
    s.nccl.net_name = n.string("net_name", "");
    if (s.nccl.max_ctas == 0 || s.nccl.min_ctas == 0) {
      n.fail(s.nccl.max_ctas == 0 ? "max_ctas" : "min_ctas", "0 CTAs cannot run a collective: use 1..64 or -1");
    }
    if (s.nccl.max_ctas > 0 && s.nccl.min_ctas > s.nccl.max_ctas) {
      n.fail("min_ctas", "min_ctas=" + std::to_string(s.nccl.min_ctas) + " exceeds max_ctas=" +
                             std::to_string(s.nccl.max_ctas) + ": lower min_ctas or raise max_ctas");
    }
  }
  return s;
}

}  // namespace

int64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  static const std::vector<std::pair<std::string, int64_t>> kUnits = {
      {"", 1},           {"B", 1},           {"KB", 1000},        {"MB", 1000000},      {"GB", 1000000000},
      {"TB", 1000000000000}, {"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1LL << 30}, {"TiB", 1LL << 40}};
  for (const auto& entry : kUnits) {
    if (digits == 0 || digits > 15 || unit != entry.first) continue;
    const int64_t value = std::stoll(text.substr(0, digits));
    if (value > INT64_MAX / entry.second) break;
    return value * entry.second;
  }
  throw std::invalid_argument("'" + text + "' is not a byte size: write a whole number with an optional unit "
                              "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (e.g. \"2GiB\")");
}

GroupSettings Profile::group(const std::string& group_name) const {
  auto it = groups.find(group_name);
  return it == groups.end() ? GroupSettings{} : it->second;
}

Profile parse_profile(const json& document, const std::string& base_dir) {
  JsonReader r(document, "");
  r.allow_only({"schema_version", "name", "description", "cluster", "parallel", "placement", "groups"});
  Profile profile;
  if (!r.has("schema_version")) r.fail("schema_version", "missing: add \"schema_version\": 1");
  profile.schema_version = static_cast<int>(r.integer("schema_version", 0, INT_MIN, INT_MAX));
  if (profile.schema_version != kProfileSchemaVersion) {
    r.fail("schema_version", "version " + std::to_string(profile.schema_version) +
                                 " is not supported: this build reads version " + std::to_string(kProfileSchemaVersion));
  }
  profile.name = r.string("name", "");
  profile.description = r.string("description", "");
  if (!r.has("cluster")) r.fail("cluster", "missing: add \"cluster\": \"discover\" or a cluster description");
  profile.cluster = parse_cluster(r.raw("cluster"), base_dir, &profile.cluster_source);

  const json* parallel = r.optional_object("parallel");
  if (!parallel) r.fail("parallel", "missing: add \"parallel\": {\"tensor_model_parallel_size\": ..., ...}");
  profile.parallel = parse_parallel(JsonReader(*parallel, r.path_of("parallel")), profile.cluster);
  try {
    profile.sizes = derive_sizes(profile.parallel);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(rethrow_prefix(parallel_error_path(error.what()), error));
  }
  if (profile.sizes.world_size > profile.cluster.gpu_count()) {
    throw std::invalid_argument("/parallel/world_size: world_size=" + std::to_string(profile.sizes.world_size) +
                                " needs that many GPUs but the cluster has " +
                                std::to_string(profile.cluster.gpu_count()) +
                                ": lower world_size or describe more hosts");
  }

  if (const json* placement = r.optional_object("placement")) {
    JsonReader p(*placement, r.path_of("placement"));
    p.allow_only({"on_violation"});
    profile.on_violation = parse_violation_policy(p.choice("on_violation", "warn", {"warn", "fail", "permute"}));
  }
  if (const json* groups = r.optional_object("groups")) {
    const std::vector<std::string> names = standard_group_names();
    for (auto it = groups->begin(); it != groups->end(); ++it) {
      const std::string path = r.path_of("groups") + "/" + it.key();
      if (std::find(names.begin(), names.end(), it.key()) == names.end()) {
        const std::string suggestion = internal::closest_match(it.key(), names);
        throw std::invalid_argument(path + ": unknown group '" + it.key() + "'" +
                                    (suggestion.empty() ? "" : ": did you mean '" + suggestion + "'?") +
                                    " (groups are Megatron's names: see docs/profiles.md)");
      }
      profile.groups[it.key()] = parse_group(it.value(), path);
    }
  }
  return profile;
}

Profile parse_profile_text(const std::string& text, const std::string& base_dir) {
  return parse_profile(internal::parse_json_text(text, "profile_json"), base_dir);
}

Profile load_profile(const std::string& path) {
  const std::string text = internal::read_regular_file(path, "profile");
  const json document = internal::parse_json_text(text, "'" + path + "'");
  const size_t slash = path.find_last_of('/');
  return parse_profile(document, slash == std::string::npos ? "." : path.substr(0, slash));
}

}  // namespace gtp::topology
