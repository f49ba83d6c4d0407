// gtp_context_create's agreement on the settings that must be equal on every rank: one bootstrap
// allgather of a fixed-size record (its layout version, the count and names of the settings, their
// values), compared on every rank, so all ranks fail together with the same message.
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/c/internal/agree_config.h"
#include "remat/divergence.h"

namespace gtp::cabi {
namespace {

constexpr std::int64_t kRecordVersion = 0x47545043;  // "GTPC", bumped when the record's layout changes
constexpr std::size_t kMaxSettings = 64;
// version, count, names fingerprint, then the values.
constexpr std::size_t kRecordWords = 3 + kMaxSettings;

std::string shown(const AgreedSetting& s, std::int64_t value) {
  const std::string number = std::to_string(value);
  if (value >= 0 && value < static_cast<std::int64_t>(s.labels.size())) return s.labels[value];
  return number;
}

}  // namespace

void agree_on_settings(comm::Bootstrap& bootstrap, const std::vector<AgreedSetting>& settings) {
  if (settings.size() > kMaxSettings) throw std::logic_error("agree_on_settings: more settings than the record holds");
  remat::Fingerprint names;
  for (const AgreedSetting& s : settings) names.add(s.name);
  std::vector<std::int64_t> mine(kRecordWords, 0);
  mine[0] = kRecordVersion;
  mine[1] = static_cast<std::int64_t>(settings.size());
  mine[2] = static_cast<std::int64_t>(names.value());
  for (std::size_t i = 0; i < settings.size(); ++i) mine[3 + i] = settings[i].value;
  const int world = bootstrap.world_size();
  std::vector<std::int64_t> all(kRecordWords * static_cast<std::size_t>(world));
  bootstrap.allgather(mine.data(), all.data(), kRecordWords * sizeof(std::int64_t));

  const auto word = [&](int rank, std::size_t i) { return all[static_cast<std::size_t>(rank) * kRecordWords + i]; };
  std::vector<int> other_layout;
  for (int r = 0; r < world; ++r) {
    if (word(r, 0) != mine[0] || word(r, 1) != mine[1] || word(r, 2) != mine[2]) other_layout.push_back(r);
  }
  std::string differences;
  if (!other_layout.empty()) {
    std::string ranks;
    for (int r : other_layout) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    differences = "ranks " + ranks + " run a libgtp whose settings record differs from rank " +
                  std::to_string(bootstrap.rank()) + "'s (another libgtp version): use one libgtp on every rank";
  } else {
    for (std::size_t i = 0; i < settings.size(); ++i) {
      bool same = true;
      for (int r = 1; r < world; ++r) same = same && word(r, 3 + i) == word(0, 3 + i);
      if (same) continue;
      // Ranks grouped by value, in the order of their first rank: "0 on ranks 0, 2; 1 on rank 1".
      std::vector<std::pair<std::int64_t, std::string>> groups;
      for (int r = 0; r < world; ++r) {
        const std::int64_t v = word(r, 3 + i);
        auto found = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
        if (found == groups.end()) {
          groups.push_back({v, "rank " + std::to_string(r)});
        } else {
          found->second += ", " + std::to_string(r);
          if (found->second.compare(0, 5, "rank ") == 0) found->second.insert(4, "s");
        }
      }
      std::string values;
      for (const auto& [v, ranks] : groups) values += (values.empty() ? "" : ", ") + shown(settings[i], v) + " on " + ranks;
      differences += (differences.empty() ? "" : "; ") + settings[i].name + ": " + values;
    }
  }
  if (differences.empty()) return;
  throw remat::DivergenceError("the ranks created their contexts with different settings: " + differences +
                               ". Give every rank the same profile and the same gtp_context_config_t values "
                               "(docs/reliability.md, Ranks that disagree)");
}

std::vector<AgreedSetting> context_settings(int backend, bool accumulate_microbatches, const topology::Profile& profile,
                                            const remat::RuntimeConfig& runtime, const kernels::WireSpec* group_wire) {
  const topology::ParallelSizes& s = profile.sizes;
  std::vector<AgreedSetting> out = {
      {"backend", backend, {"GTP_BACKEND_HOST", "GTP_BACKEND_CUDA"}},
      {"parallel.world_size", s.world_size, {}},
      {"tp", s.tp, {}},
      {"gtp_remat", s.gtp_remat, {}},
      {"cp", s.cp, {}},
      {"dp", s.dp, {}},
      {"pp", s.pp, {}},
      {"expt_tp", s.expt_tp, {}},
      {"ep", s.ep, {}},
      {"expt_gtp_remat", s.expt_gtp_remat, {}},
      {"accumulate_microbatches", accumulate_microbatches ? 1 : 0, {}},
      {"sum_grads", runtime.grads.sum ? 1 : 0, {}},
      {"check_every_fill", runtime.check_every_fill ? 1 : 0, {}},
  };
  const std::vector<std::string> formats = {"bf16", "fp8", "mxfp8", "nvfp4"};
  for (std::size_t g = 0; g < runtime.groups.size(); ++g) {
    const remat::GroupConfig& c = runtime.groups[g];
    const std::string p = "groups." + c.name + ".";
    const topology::GroupSettings settings = profile.group(c.name);
    const kernels::WireSpec& wire = group_wire[g];
    out.push_back({p + "prefetch_depth", c.depth, {}});
    out.push_back({p + "prefetch_batch", c.prefetch_batch, {}});
    out.push_back({p + "memory_budget_bytes", c.budget_bytes, {}});
    out.push_back({p + "keep_gathered", c.keep_gathered ? 1 : 0, {}});
    out.push_back({p + "fill_graphs", c.fill_graphs, {}});
    out.push_back({p + "grads_into_main_grad", c.grads_into_main_grad ? 1 : 0, {}});
    out.push_back({p + "wire_format", static_cast<std::int64_t>(wire.format), formats});
    out.push_back({p + "nvfp4_blocks", static_cast<std::int64_t>(wire.nvfp4_blocks), {"1d", "2d"}});
    out.push_back({p + "mx_rounding", static_cast<std::int64_t>(wire.mx_rounding), {"rceil", "floor"}});
    out.push_back({p + "nccl.max_ctas", settings.nccl.max_ctas, {}});
    out.push_back({p + "nccl.min_ctas", settings.nccl.min_ctas, {}});
    out.push_back({p + "nccl.cga_cluster_size", settings.nccl.cga_cluster_size, {}});
    out.push_back({p + "nccl.net_name (fingerprint)",
                   static_cast<std::int64_t>(remat::Fingerprint().add(settings.nccl.net_name).value()), {}});
  }
  return out;
}

}  // namespace gtp::cabi
