// Versioned JSON profiles (schema in docs/profiles.md): the cluster (or "discover"), the parallel
// sizes, the placement policy and per-group settings keyed by Megatron's group names.
// Every error is a std::invalid_argument that starts with the JSON pointer of the offending value
// and says how to fix it; unknown keys get a did-you-mean.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "topology/arithmetic.h"
#include "topology/planner.h"
#include "topology/topology.h"

namespace gtp::topology {

inline constexpr int kProfileSchemaVersion = 1;

// NCCL communicator options; -1 / "" keep NCCL's default (NCCL's own "unset" convention).
struct NcclSettings {
  int max_ctas = -1;
  int min_ctas = -1;
  int cga_cluster_size = -1;
  std::string net_name;
};

struct GroupSettings {
  std::string stream_priority = "normal";  // "high", "normal", "low": the gather stream
  // The reduce-scatter stream (reduce-scatters and main-grad adds, which only the drain waits for).
  std::string reduce_scatter_stream_priority = "low";
  NcclSettings nccl;
  WireFormat wire_format = WireFormat::kBf16;
  bool nvfp4_2d = false;                    // nvfp4 wire: 16x16 scale blocks ("nvfp4_blocks": "2d")
  bool mx_rounding_floor = false;           // mxfp8 wire: OCP FLOOR scale rule ("mx_rounding": "floor")
  int prefetch_depth = 1;                   // weights gathered ahead on the chain; 0 disables prefetch
  int prefetch_batch = 1;                   // due prefetches issued together (1..max(prefetch_depth, 1))
  bool keep_gathered = false;               // released weights stay gathered until their shards change
  int64_t fill_graphs = 0;                  // distinct fills kept as CUDA graphs; 0: fills run eagerly
  bool grads_into_main_grad = true;         // size-1 groups: uninitialized grad buffers are the main grads
  int64_t memory_budget_bytes = 0;          // 0: no limit
};

struct Profile {
  int schema_version = kProfileSchemaVersion;
  std::string name;
  std::string description;
  std::string cluster_source;  // "discover", "hosts", "template" or "hwloc_xml"
  Cluster cluster;
  ParallelConfig parallel;
  ParallelSizes sizes;
  ViolationPolicy on_violation = ViolationPolicy::kWarn;
  std::map<std::string, GroupSettings> groups;  // only the groups the profile mentions

  // Settings for a group, defaults when the profile does not mention it.
  GroupSettings group(const std::string& name) const;
};

// relative paths (hwloc_xml) resolve against base_dir.
Profile parse_profile(const nlohmann::json& document, const std::string& base_dir);
// Parses JSON text (checked as load_profile checks a file's) and then the profile.
Profile parse_profile_text(const std::string& text, const std::string& base_dir);
// Reads and parses a regular file of at most 64 MiB; a missing or irregular file, nesting deeper
// than 64, NUL bytes, duplicate keys or malformed JSON is std::invalid_argument too
// (docs/reliability.md).
Profile load_profile(const std::string& path);

// "512MiB", "2GiB", "1GB", "4096" -> bytes; throws std::invalid_argument on anything else.
int64_t parse_byte_size(const std::string& text);

}  // namespace gtp::topology
