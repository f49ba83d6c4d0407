#include "remat/registry.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace gtp::remat {
namespace {

bool needs_tensor_amax(kernels::WireFormat format) {
  return format == kernels::WireFormat::kFP8 || format == kernels::WireFormat::kNVFP4;
}

std::string quoted(const WeightDesc& desc) { return "weight '" + desc.name + "'"; }

}  // namespace

Registry::~Registry() {
  for (std::size_t id = 0; id < weights_.size(); ++id) {
    if (live_[id]) backend_.deallocate(weights_[id].chunk, weights_[id].layout.chunk_bytes);
  }
  for (auto& [group, array] : amax_) {
    backend_.deallocate(array.values, array.capacity * static_cast<std::int64_t>(sizeof(float)));
  }
}

bool Registry::contains(WeightId id) const {
  return id >= 0 && id < static_cast<WeightId>(weights_.size()) && live_[id];
}

std::vector<WeightId> Registry::ids() const {
  std::vector<WeightId> out;
  for (WeightId id = 0; id < static_cast<WeightId>(weights_.size()); ++id) {
    if (live_[id]) out.push_back(id);
  }
  return out;
}

const Weight& Registry::get(WeightId id) const {
  if (!contains(id)) {
    throw std::invalid_argument("weight id " + std::to_string(id) +
                                " is not registered (unregistered, or never returned by register)");
  }
  return weights_[id];
}

Stream Registry::gather_stream(const Weight& weight) const {
  return backend_.side_stream(weight.desc.group, Role::kGather);
}

Weight& Registry::at(WeightId id) { return const_cast<Weight&>(get(id)); }

const float* Registry::amax_of(WeightId id) const {
  const Weight& weight = get(id);
  if (weight.amax_slot < 0) return nullptr;
  return amax_.at(weight.desc.group).values + weight.amax_slot;
}

// A slot in the group's amax array. Growing the array keeps every value (a pack enqueued later reads
// its weight's slot in the new array); registration is not capture-safe, so no graph holds the old one.
std::int64_t Registry::take_amax_slot(int group) {
  AmaxArray& array = amax_[group];
  if (!array.free.empty()) {
    const std::int64_t slot = array.free.back();
    array.free.pop_back();
    return slot;
  }
  if (array.used == array.capacity) {
    const std::int64_t capacity = std::max<std::int64_t>(64, 2 * array.capacity);
    const std::int64_t bytes = capacity * static_cast<std::int64_t>(sizeof(float));
    auto* values = static_cast<float*>(backend_.allocate(bytes));
    const Stream stream = backend_.side_stream(group, Role::kGather);  // where the values are written and read
    backend_.fill(stream, values, 0, bytes);
    if (array.used > 0) backend_.add(stream, array.values, values, array.used);
    backend_.deallocate(array.values, array.capacity * static_cast<std::int64_t>(sizeof(float)));
    array.values = values;
    array.capacity = capacity;
  }
  return array.used++;
}

GemmPlacement gemm_placement(const kernels::WireSpec& spec, const kernels::WeightGeometry& geometry,
                             kernels::ScaleLayout scale_layout) {
  GemmPlacement p;
  p.sizes = kernels::gemm_layout_sizes(spec, geometry, scale_layout);  // checks scale_layout
  if (spec.format == kernels::WireFormat::kBF16) return GemmPlacement{};
  std::int64_t next = 0;
  const auto section = [&](std::int64_t bytes) {
    const std::int64_t offset = next;
    next += kernels::round_up(bytes, kernels::kSectionAlignment);
    return offset;
  };
  p.data = section(p.sizes.data_bytes);
  p.scales = section(p.sizes.scales_bytes);
  // The exact transpose is always produced where it exists (FP8 for Hopper's other operand
  // orientation, NVFP4 2D); MXFP8 and NVFP4 1D have none.
  p.transposed_data = section(p.sizes.transpose_supported ? p.sizes.transposed_data_bytes : 0);
  p.transposed_scales = section(p.sizes.transpose_supported ? p.sizes.transposed_scales_bytes : 0);
  p.decode_scales = section(p.sizes.decode_scale_count * static_cast<std::int64_t>(sizeof(float)));
  p.bytes = next;
  return p;
}

WeightId Registry::add(const WeightDesc& desc) {
  Weight weight;
  weight.desc = desc;
  const int g = backend_.group_size(desc.group);  // throws for an unknown group
  weight.geometry = kernels::weight_geometry(desc.wire.format, desc.rows, desc.cols, g);
  weight.layout = kernels::chunk_layout(desc.wire, weight.geometry.shard_rows, desc.cols);
  weight.valid_rows = weight.geometry.valid_rows(backend_.group_rank(desc.group));
  weight.gemm = gemm_placement(desc.wire, weight.geometry, desc.gemm_scales);
  weight.gathers_in_place = desc.wire.format == kernels::WireFormat::kBF16 && weight.layout.data_offset == 0 &&
                            weight.layout.chunk_bytes == weight.geometry.shard_rows * desc.cols * 2;
  weight.sends_from_shard = weight.gathers_in_place && desc.dtype == kernels::SourceDtype::kBF16 &&
                            weight.valid_rows == weight.geometry.shard_rows && desc.shard != nullptr;
  weight.output_bytes =
      weight.gathers_in_place
          ? 0
          : std::max(kernels::round_up(desc.rows * desc.cols * 2, kernels::kSectionAlignment), weight.gemm.bytes);
  if (weight.valid_rows > 0 && desc.shard == nullptr) {
    throw std::invalid_argument(quoted(desc) + ": shard is null but this rank holds " +
                                std::to_string(weight.valid_rows) + " rows; pass the shard pointer");
  }
  if (desc.expert_leader != kNoWeight) {
    const Weight& leader = get(desc.expert_leader);
    if (leader.desc.expert_leader != kNoWeight) {
      throw std::invalid_argument(quoted(desc) + ": expert_leader " + std::to_string(desc.expert_leader) +
                                  " is itself an expert; name the group's first weight");
    }
    // The whole WireSpec: experts are gathered and unpacked as one batch with the leader's spec.
    if (leader.desc.group != desc.group || leader.desc.wire != desc.wire || leader.desc.dtype != desc.dtype ||
        leader.desc.rows != desc.rows || leader.desc.cols != desc.cols) {
      throw std::invalid_argument(quoted(desc) + ": an expert must match its leader '" + leader.desc.name +
                                  "' in group, dtype, wire format (with its NVFP4 block shape and MXFP8 rounding), "
                                  "rows and cols; this expert's wire is " + kernels::to_string(desc.wire) +
                                  ", the leader's " + kernels::to_string(leader.desc.wire));
    }
    // A grouped GEMM reads every expert's scales the same way.
    if (leader.desc.gemm_scales != desc.gemm_scales) {
      throw std::invalid_argument(quoted(desc) + ": an expert's GEMM scales must be laid out like its leader '" +
                                  leader.desc.name + "'s: this expert asks for " +
                                  kernels::to_string(desc.gemm_scales) + ", the leader has " +
                                  kernels::to_string(leader.desc.gemm_scales) +
                                  "; register the group's experts with one gemm_scale_layout");
    }
  }
  if (needs_tensor_amax(desc.wire.format)) weight.amax_slot = take_amax_slot(desc.group);
  if (!weight.sends_from_shard) {
    try {
      weight.chunk = backend_.allocate(weight.layout.chunk_bytes);
    } catch (...) {
      if (weight.amax_slot >= 0) amax_[desc.group].free.push_back(weight.amax_slot);
      throw;
    }
  }
  weight.ordinal = registered_[desc.group]++;
  weight.tag = Fingerprint()
                   .add(desc.name)
                   .add(desc.rows)
                   .add(desc.cols)
                   .add(kernels::to_string(desc.wire))
                   .add(static_cast<std::int64_t>(desc.group))
                   .add(weight.ordinal)
                   .add(weight.amax_slot)
                   .add(desc.expert_leader == kNoWeight ? std::int64_t{-1} : weights_[desc.expert_leader].ordinal)
                   .value();
  const WeightId id = static_cast<WeightId>(weights_.size());
  weights_.push_back(std::move(weight));
  live_.push_back(true);
  if (desc.expert_leader != kNoWeight) weights_[desc.expert_leader].members.push_back(id);
  return id;
}

void Registry::remove(WeightId id) {
  Weight& weight = at(id);
  if (!weight.members.empty()) {
    throw std::invalid_argument(quoted(weight.desc) + " leads " + std::to_string(weight.members.size()) +
                                " experts; unregister them first");
  }
  if (weight.desc.expert_leader != kNoWeight) {
    std::vector<WeightId>& members = weights_[weight.desc.expert_leader].members;
    members.erase(std::find(members.begin(), members.end(), id));
  }
  backend_.deallocate(weight.chunk, weight.layout.chunk_bytes);
  weight.chunk = nullptr;
  if (weight.amax_slot >= 0) amax_[weight.desc.group].free.push_back(weight.amax_slot);
  live_[id] = false;
}

std::vector<WeightId> Registry::expand(const WeightId* ids, std::int64_t n) const {
  if (n <= 0 || ids == nullptr) {
    throw std::invalid_argument("weight list: n = " + std::to_string(n) + (ids == nullptr ? " with null ids" : "") +
                                "; pass at least one weight id");
  }
  std::vector<WeightId> out;
  for (std::int64_t i = 0; i < n; ++i) {
    const Weight& weight = get(ids[i]);
    out.push_back(ids[i]);
    out.insert(out.end(), weight.members.begin(), weight.members.end());
  }
  return out;
}

void Registry::shard_updated(const WeightId* ids, std::int64_t n, Stream stream) {
  const std::vector<WeightId> all = expand(ids, n);
  std::set<int> groups;
  for (WeightId id : all) groups.insert(weights_[id].desc.group);
  // Once per optimizer step: each involved gather stream joins the optimizer's stream and every side
  // stream (reduce-scatters included), so the amax and every later pack are ordered after all of them.
  for (int group : groups) {
    const Stream gather = backend_.side_stream(group, Role::kGather);
    backend_.order(gather, stream);
    backend_.join_all(gather);
  }
  // Each weight's local amax into its own slot, then one reduction per group, groups in ascending
  // order (the same on every rank), over the span of the slots written: slots follow registration,
  // which is the same on every rank.
  std::map<int, std::pair<std::int64_t, std::int64_t>> spans;  // group -> [first, last] slot written
  for (WeightId id : all) {
    Weight& weight = weights_[id];
    if (weight.amax_slot < 0) continue;
    float* slot = amax_.at(weight.desc.group).values + weight.amax_slot;
    if (weight.valid_rows > 0) {
      backend_.amax(gather_stream(weight), weight.desc.shard, weight.desc.dtype, weight.valid_rows, weight.desc.cols,
                    slot);
    } else {
      backend_.fill(gather_stream(weight), slot, 0, sizeof(float));
    }
    const auto [span, fresh] = spans.try_emplace(weight.desc.group, weight.amax_slot, weight.amax_slot);
    if (!fresh) {
      span->second.first = std::min(span->second.first, weight.amax_slot);
      span->second.second = std::max(span->second.second, weight.amax_slot);
    }
  }
  for (const auto& [group, span] : spans) {
    backend_.all_reduce_max(backend_.side_stream(group, Role::kGather), group, amax_.at(group).values + span.first,
                            span.second - span.first + 1);
  }
  for (WeightId id : all) {
    Weight& weight = weights_[id];
    ++weight.version;
    weight.pack_pending = !weight.sends_from_shard;  // the shard is the wire chunk
    if (pack_on_update_) pack_if_pending(id);
  }
}

void Registry::pack_if_pending(WeightId id) {
  Weight& weight = at(id);
  if (weight.pack_pending) pack(weight);
}

void Registry::pack(Weight& weight) {
  kernels::PackArgs args;
  args.shard = weight.desc.shard;
  args.src_dtype = weight.desc.dtype;
  args.shard_rows = weight.geometry.shard_rows;
  args.valid_rows = weight.valid_rows;
  args.cols = weight.desc.cols;
  args.amax = weight.amax_slot < 0 ? nullptr : amax_.at(weight.desc.group).values + weight.amax_slot;
  args.chunk = weight.chunk;
  args.chunk_capacity = weight.layout.chunk_bytes;
  backend_.pack(gather_stream(weight), weight.desc.wire, args);
  weight.pack_pending = false;
}

}  // namespace gtp::remat
