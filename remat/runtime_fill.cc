// The Runtime's fills: a key's all-gathers and unpacks into its slot (eager or a fill graph), and its views.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/runtime.h"

namespace gtp::remat {
namespace {

// The GEMM-ready sections of `w` in the output region at `region`; absent sections stay null.
kernels::GemmOutputs gemm_outputs(const Weight& w, char* region) {
  const GemmPlacement& p = w.gemm;
  kernels::GemmOutputs out;
  out.scale_layout = p.sizes.scale_layout;
  out.data = region + p.data;
  out.data_capacity = p.sizes.data_bytes;
  if (p.sizes.scales_bytes > 0) {
    out.scales = region + p.scales;
    out.scales_capacity = p.sizes.scales_bytes;
  }
  if (p.sizes.transpose_supported) {
    out.transposed_data = region + p.transposed_data;
    out.transposed_data_capacity = p.sizes.transposed_data_bytes;
    if (p.sizes.transposed_scales_bytes > 0) {
      out.transposed_scales = region + p.transposed_scales;
      out.transposed_scales_capacity = p.sizes.transposed_scales_bytes;
    }
  }
  if (p.sizes.decode_scale_count > 0) {
    out.decode_scales = reinterpret_cast<float*>(region + p.decode_scales);
    out.decode_scales_capacity = p.sizes.decode_scale_count;
  }
  return out;
}

}  // namespace

// Slot layout, per weight of the key: the G gathered chunks, then the output region (BF16 weight or
// GEMM-ready sections, Weight::gemm), sized for the larger of the two.
// A key fills on the gather stream of its first weight's group; a key that spans groups first joins
// the other groups' gather streams, where its chunks were packed.
Stream Runtime::fill_stream(const ChainKey& key) {
  return backend_.side_stream(registry_.get(key.front()).desc.group, Role::kGather);
}

void Runtime::fill_many(const Fill* fills, std::size_t n, const char* why) {
  const double start = trace_.enabled() ? trace_.now_us() : 0;
  const int group = group_of(*fills[0].key);
  Cache& cache = *caches_[group];
  const Stream stream = cache.slot(fills[0].index).filler;
  std::vector<Stream>& joined = joined_scratch_;  // reused: no allocation per fill
  joined.assign(1, stream);
  std::string names;
  for (std::size_t f = 0; f < n; ++f) {
    for (WeightId id : *fills[f].key) {
      registry_.pack_if_pending(id);  // on its gather stream, which the fill stream joins below (or is)
      const Weight& w = registry_.get(id);
      if (id >= static_cast<WeightId>(weight_stats_.size())) weight_stats_.resize(id + 1);
      weight_stats_[id].gathered_bytes += w.geometry.group_size * w.layout.chunk_bytes;
      if (trace_.enabled()) names += (names.empty() ? "" : ",") + w.desc.name;
      const Stream gather = backend_.side_stream(w.desc.group, Role::kGather);
      if (std::find(joined.begin(), joined.end(), gather) != joined.end()) continue;
      joined.push_back(gather);
      backend_.order(stream, gather);
    }
  }
  FillGraphs& graphs = *fill_graphs_[group];
  if (graphs_relocations_[group] != cache.relocations()) {  // a slot moved: its graphs hold the old address
    graphs.clear();
    graphs_relocations_[group] = cache.relocations();
  }
  fill_why_ = why;
  if (backend_.group_size(group) > 1) {
    if (config_.check_every_fill) {
      ++group_stats_[group].tag_checks;  // enqueue_fill checks this fill (a graph launch replays it)
    } else {
      add_to_tag(fills, n, step_tags_[group]);  // checked at drain (check_step)
      group_gathered_[group] = 1;
    }
  }
  if (!graphs.enabled() || backend_.capturing(stream)) {  // a captured step records the work itself
    enqueue_fill(fills, n, stream);
  } else {
    // Rank-uniform: what the slots and keys are, never where they are (fill_graphs.h).
    std::vector<std::int64_t>& signature = signature_scratch_;
    signature.clear();
    for (std::size_t f = 0; f < n; ++f) {
      const ChainKey& key = *fills[f].key;
      signature.push_back(fills[f].index);
      signature.push_back(static_cast<std::int64_t>(key.layout));
      signature.push_back(static_cast<std::int64_t>(key.size()));
      signature.insert(signature.end(), key.begin(), key.end());
    }
    const FillGraphs::Ran ran = graphs.run(signature, stream, [&] { enqueue_fill(fills, n, stream); });
    GroupStats& counters = group_stats_[group];
    counters.graph_recordings += ran == FillGraphs::Ran::kRecorded ? 1 : 0;
    counters.graph_fills += ran == FillGraphs::Ran::kEager ? 0 : 1;
  }
  for (std::size_t f = 0; f < n; ++f) {
    Cache::Slot& slot = cache.slot(fills[f].index);
    slot.key = *fills[f].key;
    slot.versions = versions(slot.key);
    if (slot.ready != 0) backend_.forget(slot.ready);  // a prefetch that was dropped or re-gathered
    slot.ready = backend_.record(stream);
  }
  if (trace_.enabled()) trace_.add("gather " + names, why, start);
}

void Runtime::enqueue_fill(const Fill* fills, std::size_t n, Stream stream) {
  Cache& cache = *caches_[group_of(*fills[0].key)];
  // The keys' all-gathers go out as one batch (one NCCL group on the CUDA backend), then the unpacks:
  // nothing else may sit between them on the stream, because a batch launches at its end.
  {
    Backend::CollectiveBatch batch(backend_);
    // check_every_fill: first in the batch, every rank's list of what it gathers here, checked before
    // any of it can be unpacked (on one rank there is nothing to compare). Otherwise drain checks.
    const int group = group_of(*fills[0].key);
    if (config_.check_every_fill && backend_.group_size(group) > 1) {
      backend_.check_fill_tags(stream, group, fill_tag(fills, n), &fill_tag_check_);
    }
    for (std::size_t f = 0; f < n; ++f) {
      char* next = static_cast<char*>(cache.slot(fills[f].index).ptr);
      for (WeightId id : *fills[f].key) {
        const Weight& w = registry_.get(id);
        backend_.all_gather(stream, w.desc.group, w.send(), next, w.layout.chunk_bytes);
        next += w.geometry.group_size * w.layout.chunk_bytes + w.output_bytes;
      }
    }
    batch.launch();
  }
  // The GEMM layout is unpacked per weight; the BF16 layout in one unpack_many per wire spec over all
  // the keys (one kernel launch for up to kernels::kUnpackJobsPerLaunch weights on CUDA: an MoE expert
  // group is one key of many same-wire weights), the specs in the order the keys first name them.
  unpacks_scratch_.clear();
  for (std::size_t f = 0; f < n; ++f) {
    const ChainKey& key = *fills[f].key;
    char* next = static_cast<char*>(cache.slot(fills[f].index).ptr);
    for (WeightId id : key) {
      const Weight& w = registry_.get(id);
      const std::int64_t gathered = w.geometry.group_size * w.layout.chunk_bytes;
      const kernels::GatheredChunks chunks{next, gathered, w.geometry};
      char* region = next + gathered;
      next = region + w.output_bytes;
      if (w.gathers_in_place) continue;  // the gathered rows are the weight
      if (key.layout == Layout::kGemm && w.desc.wire.format != kernels::WireFormat::kBF16) {
        backend_.unpack_gemm(stream, w.desc.wire, chunks, gemm_outputs(w, region));
      } else {
        unpacks_scratch_.emplace_back(w.desc.wire, kernels::UnpackJob{chunks, region, w.output_bytes});
      }
    }
  }
  unpack_specs_scratch_.clear();
  for (const auto& unpack : unpacks_scratch_) {
    const kernels::WireSpec& spec = unpack.first;
    if (std::find(unpack_specs_scratch_.begin(), unpack_specs_scratch_.end(), spec) != unpack_specs_scratch_.end()) {
      continue;  // unpacked with the first weight of its spec
    }
    unpack_specs_scratch_.push_back(spec);
    unpack_jobs_scratch_.clear();
    for (const auto& [other, job] : unpacks_scratch_) {
      if (other == spec) unpack_jobs_scratch_.push_back(job);
    }
    backend_.unpack_many(stream, spec, unpack_jobs_scratch_);
  }
}

std::vector<Materialized> Runtime::outputs(int index, const ChainKey& key) {
  std::vector<Materialized> out;
  char* next = static_cast<char*>(caches_[group_of(key)]->slot(index).ptr);
  for (WeightId id : key) {
    const Weight& w = registry_.get(id);
    const std::int64_t gathered = w.geometry.group_size * w.layout.chunk_bytes;
    Materialized m;
    m.wire = w.desc.wire;
    m.rows = w.desc.rows;
    m.cols = w.desc.cols;
    m.shard_rows = w.geometry.shard_rows;
    m.data = w.gathers_in_place ? next : next + gathered;
    next += gathered;
    if (key.layout == Layout::kGemm && w.desc.wire.format != kernels::WireFormat::kBF16) {
      const kernels::GemmOutputs g = gemm_outputs(w, next);
      m.layout = Layout::kGemm;
      m.scales = g.scales;
      m.transposed_data = g.transposed_data;
      m.transposed_scales = g.transposed_scales;
      m.decode_scales = g.decode_scales;
      m.gemm = w.gemm.sizes;
    }
    out.push_back(m);
    next += w.output_bytes;
  }
  return out;
}

}  // namespace gtp::remat
