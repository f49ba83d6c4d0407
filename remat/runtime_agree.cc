// The Runtime's part in "ranks that disagree": the tag of a fill (what this rank gathers in it) and
// the check of every rank's tag, raised identically on every rank (docs/reliability.md).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "remat/runtime.h"

namespace gtp::remat {
namespace {

std::string hex(std::uint64_t value) {
  static const char digits[] = "0123456789abcdef";
  std::string out = "0x";
  for (int shift = 60; shift >= 0; shift -= 4) out += digits[(value >> shift) & 0xF];
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

void Runtime::add_to_tag(const Fill* fills, std::size_t n, StepTag& into) const {
  FillTag& tag = into.tag;
  for (std::size_t f = 0; f < n; ++f) {
    for (WeightId id : *fills[f].key) {
      const Weight& w = registry_.get(id);
      if (tag.count++ == 0) {
        const auto saturated = [](std::int64_t v) {
          return static_cast<std::uint32_t>(std::min<std::int64_t>(v, std::numeric_limits<std::uint32_t>::max()));
        };
        tag.first_rows = saturated(w.desc.rows);
        tag.first_cols = saturated(w.desc.cols);
        tag.first_wire = static_cast<std::uint8_t>(static_cast<int>(w.desc.wire.format) |
                                                   static_cast<int>(w.desc.wire.mx_rounding) << 2 |
                                                   static_cast<int>(w.desc.wire.nvfp4_blocks) << 3);
        tag.first_ordinal = static_cast<std::int32_t>(w.ordinal);
        tag.first_version = static_cast<std::uint32_t>(w.version);
        w.desc.name.copy(tag.first_name, sizeof tag.first_name - 1);
      }
      into.weights.add(w.tag);
      into.versions.add(w.version);
    }
  }
  tag.weights = into.weights.value();
  tag.versions = into.versions.value();
}

FillTag Runtime::fill_tag(const Fill* fills, std::size_t n) const {
  StepTag one;
  add_to_tag(fills, n, one);
  return one.tag;
}

void Runtime::check_step() {
  for (int g = 0; g < backend_.group_count(); ++g) {
    // Every group of G > 1 that ever gathered, on every drain, gathers this step or not: whether a rank
    // gathered this step is what may differ. A group that never gathered costs nothing.
    if (backend_.group_size(g) == 1 || !group_gathered_[g]) continue;
    // On the group's gather stream, after its fills (nothing of the caller's stream is read).
    Backend::CollectiveBatch batch(backend_);
    backend_.check_fill_tags(backend_.side_stream(g, Role::kGather), g, step_tags_[g].tag, &fill_tag_check_);
    batch.launch();
    step_tags_[g] = StepTag();
    ++group_stats_[g].tag_checks;
  }
}

// Every rank sees the same G tags, so every rank writes the same message: the ranks grouped by the tag
// they sent, each group described from this rank's registry (a weight is named where a weight with
// that identity is registered here).
void Runtime::check_fill_tags(int group, const FillTag* tags, int count, const char* when) const {
  bool same = true;
  for (int r = 1; r < count; ++r) same = same && tags[r] == tags[0];
  if (same) return;
  std::vector<int> seen(static_cast<std::size_t>(count), 0);
  std::string parts;
  bool weights_differ = false;
  for (int r = 0; r < count; ++r) {
    if (seen[r]) continue;
    std::vector<int> ranks;
    for (int o = r; o < count; ++o) {
      if (!seen[o] && tags[o] == tags[r]) {
        seen[o] = 1;
        ranks.push_back(o);
      }
      weights_differ = weights_differ || tags[o].weights != tags[r].weights || tags[o].count != tags[r].count;
    }
    const FillTag& t = tags[r];
    std::string what;
    if (t.magic != FillTag::kMagic) {
      what = "a tag this libgtp cannot read (magic " + hex(t.magic) + ": another libgtp version?)";
    } else {
      const std::string name(t.first_name, strnlen(t.first_name, sizeof t.first_name));
      what = "'" + name + "' (registration #" + std::to_string(t.first_ordinal) + " of the group on that rank, shard version " +
             std::to_string(t.first_version) + ")";
      // Its shape and wire as that rank registered it.
      const auto dim = [](std::uint32_t v) {
        return std::to_string(v) + (v == std::numeric_limits<std::uint32_t>::max() ? "+" : "");
      };
      kernels::WireSpec wire;
      wire.format = static_cast<kernels::WireFormat>(t.first_wire & 3);
      wire.mx_rounding = static_cast<kernels::ScaleRounding>(t.first_wire >> 2 & 1);
      wire.nvfp4_blocks = static_cast<kernels::Nvfp4Blocks>(t.first_wire >> 3 & 1);
      what += " " + dim(t.first_rows) + " x " + dim(t.first_cols) + " " + kernels::to_string(wire);
      if (t.count > 1) what += " and " + std::to_string(t.count - 1) + " more weight" + (t.count > 2 ? "s" : "");
    }
    parts += (parts.empty() ? "" : "; ") + ranks_text(ranks) + (ranks.size() == 1 ? " gathers " : " gather ") + what;
  }
  const std::string cause =
      weights_differ ? "the ranks named different weights at this collective, or registered them in a different "
                       "order or shape (every rank of a group registers the group's weights in the same order and "
                       "makes the same materialize / release / drain calls with the same settings)"
                     : "the same weights at different shard versions: gtp_weights_shard_updated was not called on "
                       "every rank of the group the same number of times";
  const std::string consequence =
      config_.check_every_fill
          ? "Nothing was unpacked (CUDA: the fill's outputs were set to NaN)"
          : "The step's gathers were used as they came (check_every_fill checks each gather before it is unpacked)";
  throw DivergenceError("ranks of group '" + groups_[group].name + "' diverged at a gather (" + when + ", this is rank " +
                        std::to_string(backend_.group_rank(group)) + "): " + parts + ". Cause: " + cause + ". " +
                        consequence + "; destroy the context (docs/reliability.md, Ranks that disagree)");
}

}  // namespace gtp::remat
