// gtp_context_create's work: the profile (or the default grid), the grid's gtp_remat and
// expt_gtp_remat groups, the host or CUDA backend over them, and the runtime with the precedence of
// config and profile settings (docs/c-abi.md).
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "bindings/c/internal/agree_config.h"
#include "bindings/c/internal/context.h"
#include "comm/callback_bootstrap.h"
#include "comm/errors.h"
#include "comm/streams.h"
#include "comm/ucx_bootstrap.h"
#include "remat/cuda_backend.h"
#include "remat/host_backend.h"
#include "topology/grid.h"
#include "topology/profile.h"

namespace gtp::cabi {
namespace {

using remat::WeightId;

std::atomic<std::uint64_t> next_generation{1};

// The profile (or, without one, TP = 1 and G = EG = world size with default group settings).
gtp::topology::Profile profile_for(const gtp_context_config_t& config, int world_size) {
  require(config.profile_json == nullptr || config.profile_path == nullptr,
          "both profile_json and profile_path are set; give at most one");
  if (config.profile_json == nullptr && config.profile_path == nullptr) {
    gtp::topology::Profile profile;
    gtp::topology::ParallelConfig& parallel = profile.parallel;
    parallel.world_size = world_size;
    parallel.tensor_parallel_num_weight_shards = world_size;
    parallel.expert_tensor_parallel_num_weight_shards = world_size;
    profile.sizes = gtp::topology::derive_sizes(parallel);
    return profile;
  }
  gtp::topology::Profile profile =
      config.profile_json != nullptr ? gtp::topology::parse_profile_text(config.profile_json, ".")
                                     : gtp::topology::load_profile(config.profile_path);
  require(profile.sizes.world_size == world_size, "the profile's world_size is " + std::to_string(profile.sizes.world_size) +
                                                      " but the bootstrap has " + std::to_string(world_size) + " ranks");
  return profile;
}

constexpr const char* kDenseGroup = "gtp_remat";
constexpr const char* kExpertGroup = "expt_gtp_remat";

// The grid's groups the runtime gathers over, indexed by gtp_group_t (gtp_remat, expt_gtp_remat),
// each as every group of its family (lists of world ranks). With EG = 1 every expert group is one rank.
std::vector<std::vector<std::vector<int>>> remat_groups(const gtp::topology::ParallelSizes& sizes) {
  const gtp::topology::HyperCommGrid grid = gtp::topology::make_gtp_grid(sizes);
  return {grid.rank_enum({kDenseGroup}).to_lists(),
          grid.rank_enum({kExpertGroup}, gtp::topology::kExpertView).to_lists()};
}

const std::vector<int>& group_containing(const std::vector<std::vector<int>>& family, int rank) {
  for (const std::vector<int>& group : family) {
    if (std::find(group.begin(), group.end(), rank) != group.end()) return group;
  }
  throw std::logic_error("rank " + std::to_string(rank) + " is in no group of its grid family");
}

gtp::kernels::WireFormat wire_of(gtp::topology::WireFormat format) {
  switch (format) {
    case gtp::topology::WireFormat::kBf16: return gtp::kernels::WireFormat::kBF16;
    case gtp::topology::WireFormat::kFp8: return gtp::kernels::WireFormat::kFP8;
    case gtp::topology::WireFormat::kMxfp8: return gtp::kernels::WireFormat::kMXFP8;
    case gtp::topology::WireFormat::kNvfp4: return gtp::kernels::WireFormat::kNVFP4;
  }
  throw std::logic_error("unknown topology::WireFormat");
}

// The wire a group's profile settings describe (GTP_WIRE_FROM_GROUP).
gtp::kernels::WireSpec wire_spec_of(const gtp::topology::GroupSettings& settings) {
  gtp::kernels::WireSpec spec;
  spec.format = wire_of(settings.wire_format);
  if (settings.nvfp4_2d) spec.nvfp4_blocks = gtp::kernels::Nvfp4Blocks::k2D;
  if (settings.mx_rounding_floor) spec.mx_rounding = gtp::kernels::ScaleRounding::kFloor;
  return spec;
}

// Precedence (docs/c-abi.md): a config value other than GTP_FROM_PROFILE sets every group; with
// GTP_FROM_PROFILE each group takes its own profile group's setting (the defaults when the profile
// does not mention the group). The runtime prefetches and budgets each group on its own.
int depth_for(const gtp_context_config_t& config, const gtp::topology::Profile& profile, const char* group) {
  if (config.prefetch_depth != GTP_FROM_PROFILE) {
    require(config.prefetch_depth >= 0 && config.prefetch_depth <= gtp::remat::kMaxDepth,
            "prefetch_depth is " + std::to_string(config.prefetch_depth) + "; give 0.." +
                std::to_string(gtp::remat::kMaxDepth) + " or GTP_FROM_PROFILE (a value here sets every group)");
    return config.prefetch_depth;
  }
  return profile.group(group).prefetch_depth;  // the profile's reader checked the range, naming the group
}

std::int64_t budget_for(const gtp_context_config_t& config, const gtp::topology::Profile& profile, const char* group) {
  if (config.memory_budget_bytes != GTP_FROM_PROFILE) {
    require(config.memory_budget_bytes >= 0, "memory_budget_bytes is " + std::to_string(config.memory_budget_bytes) +
                                                 "; give 0 (no limit), a byte count or GTP_FROM_PROFILE (a value here is each group's budget)");
    return config.memory_budget_bytes;
  }
  return profile.group(group).memory_budget_bytes;
}

// Priority classes of the profile onto the device's range (a lower number runs first).
int stream_priority(const std::string& name, const gtp::comm::StreamPriorityRange& range) {
  if (name == "high") return range.greatest;
  if (name == "low") return range.least;
  return range.least + (range.greatest - range.least) / 2;  // "normal": the middle, rounded toward least
}

gtp::comm::NcclGroupConfig nccl_config(const gtp::topology::GroupSettings& settings, const char* name) {
  gtp::comm::NcclGroupConfig config;
  config.cga_cluster_size = settings.nccl.cga_cluster_size;
  config.min_ctas = settings.nccl.min_ctas;
  config.max_ctas = settings.nccl.max_ctas;
  config.net_name = settings.nccl.net_name;
  config.comm_name = name;
  return config;
}

// The device current on the calling thread, or GTP_ERROR_CUDA saying why there is none.
int current_device() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaSuccess && count == 0) {
    throw StatusError(GTP_ERROR_CUDA, "GTP_BACKEND_CUDA needs a CUDA device but none is present; use GTP_BACKEND_HOST");
  }
  int device = -1;
  if (error == cudaSuccess) error = cudaGetDevice(&device);
  if (error != cudaSuccess) {
    throw StatusError(GTP_ERROR_CUDA, std::string("GTP_BACKEND_CUDA needs a CUDA device and driver, but CUDA reports: ") +
                                          cudaGetErrorString(error) + "; use GTP_BACKEND_HOST on machines without GPUs");
  }
  return device;
}

// Host backend: one HostComm per distinct grid group family (a family equal to an earlier one shares
// its communicator), each over a GroupBootstrap of the world bootstrap. Every rank builds the same
// families in the same order, as GroupBootstrap requires.
void build_host(gtp_context& ctx, const std::vector<std::vector<std::vector<int>>>& families,
                std::chrono::milliseconds timeout, std::chrono::milliseconds call_timeout) {
  const char* names[] = {kDenseGroup, kExpertGroup};
  std::vector<gtp::comm::HostComm*> groups;
  for (std::size_t f = 0; f < families.size(); ++f) {
    const auto same = std::find(families.begin(), families.begin() + f, families[f]);
    if (same != families.begin() + f) {
      groups.push_back(groups[same - families.begin()]);
      continue;
    }
    ctx.group_bootstraps.push_back(
        std::make_unique<gtp::comm::GroupBootstrap>(*ctx.bootstrap, group_containing(families[f], ctx.rank)));
    // Named after the group (both, when the families are equal), so every error says which.
    std::string label = std::string("host comm ") + names[f];
    for (std::size_t later = f + 1; later < families.size(); ++later) {
      if (families[later] == families[f]) label += std::string("/") + names[later];
    }
    ctx.host_comms.push_back(std::make_unique<gtp::comm::HostComm>(*ctx.group_bootstraps.back(), timeout, label));
    ctx.host_comms.back()->set_timeout(call_timeout);
    groups.push_back(ctx.host_comms.back().get());
  }
  ctx.backend = std::make_unique<gtp::remat::HostBackend>(groups);
}

// CUDA backend: a world NcclComm over the bootstrap, split once per distinct group family with that
// group's nccl settings (the gather communicator), each of those split once more into a copy over the
// same ranks in the same order (the reduce-scatter communicator, same settings, so that gathers and
// reduce-scatters of a group can run at once; it costs a second set of NCCL buffers per group, see
// docs/remat.md), and one CudaBackend over them whose side streams (gather
// and reduce-scatter per group) run at their profile group's stream_priority and
// reduce_scatter_stream_priority. Every rank makes the
// same splits in the same order: world splits on all ranks, then its group's copy with its group.
void build_cuda(gtp_context& ctx, int device, const gtp::topology::Profile& profile,
                const std::vector<std::vector<std::vector<int>>>& families, std::chrono::milliseconds timeout,
                std::chrono::milliseconds call_timeout) {
  const char* names[] = {kDenseGroup, kExpertGroup};
  std::vector<gtp::remat::CudaStreamPriorities> priorities;  // per group, from its profile group
  try {
    const gtp::comm::StreamPriorityRange range = gtp::comm::stream_priority_range(device);
    for (std::size_t f = 0; f < families.size(); ++f) {
      const gtp::topology::GroupSettings settings = profile.group(names[f]);
      priorities.push_back({stream_priority(settings.stream_priority, range),
                            stream_priority(settings.reduce_scatter_stream_priority, range)});
    }
  } catch (const std::runtime_error& e) {  // the comm layer reports CUDA failures as comm::CommError
    throw StatusError(GTP_ERROR_CUDA, "reading the stream priorities of device " + std::to_string(device) + ": " + e.what());
  }
  try {
    ctx.nccl_world = std::make_unique<gtp::comm::NcclComm>(gtp::comm::NcclComm::create_world(*ctx.bootstrap, timeout));
    std::vector<gtp::remat::CudaGroup> groups;
    for (std::size_t f = 0; f < families.size(); ++f) {
      const auto same = std::find(families.begin(), families.begin() + f, families[f]);
      if (same != families.begin() + f) {
        groups.push_back(groups[same - families.begin()]);
        continue;
      }
      const gtp::comm::NcclGroupConfig config = nccl_config(profile.group(names[f]), names[f]);
      ctx.nccl_groups.push_back(std::make_unique<gtp::comm::NcclComm>(ctx.nccl_world->split(families[f], config, timeout)));
      gtp::comm::NcclComm& gather = *ctx.nccl_groups.back();
      gtp::comm::NcclGroupConfig copy = config;
      copy.comm_name = std::string(names[f]) + "_reduce_scatter";
      std::vector<int> positions(static_cast<std::size_t>(gather.size()));
      std::iota(positions.begin(), positions.end(), 0);  // one group of all, key = rank: the same order
      ctx.nccl_reduce_scatter.push_back(std::make_unique<gtp::comm::NcclComm>(gather.split({positions}, copy, timeout)));
      groups.push_back({&gather, ctx.nccl_reduce_scatter.back().get()});
    }
    ctx.backend = std::make_unique<gtp::remat::CudaBackend>(device, groups, call_timeout, priorities);
  } catch (const gtp::comm::CommError&) {
    throw;  // NCCL init or the bootstrap: TIMEOUT or SYSTEM
  } catch (const std::runtime_error& e) {
    throw StatusError(GTP_ERROR_CUDA, std::string("setting up the CUDA backend on device ") + std::to_string(device) +
                                          ": " + e.what());
  }
}

}  // namespace

void create_context(const gtp_context_config_t* config, gtp_context_t** out) {
  require(config != nullptr, "config is NULL; pass a gtp_context_config_t from GTP_CONTEXT_CONFIG_INITIALIZER");
  require(out != nullptr, "out is NULL");
  // The 0.7.0 layout ends before call_timeout_ms, the 0.7.1 one before sum_grads (and check_every_fill): still accepted,
  // with the fields they lack taken as 0.
  constexpr size_t kSize070 = offsetof(gtp_context_config_t, call_timeout_ms);
  constexpr size_t kSize071 = offsetof(gtp_context_config_t, sum_grads);
  if (config->struct_size != kSize070 && config->struct_size != kSize071) {
    check_struct_size(config->struct_size, sizeof(gtp_context_config_t), "gtp_context_config_t");
  }
  const std::int64_t call_timeout_ms = config->struct_size == kSize070 ? 0 : config->call_timeout_ms;
  const bool sum_grads = config->struct_size == sizeof(gtp_context_config_t) && config->sum_grads != 0;
  const bool check_every_fill = config->struct_size == sizeof(gtp_context_config_t) && config->check_every_fill != 0;
  const std::uint32_t major = config->header_version / 10000, minor = config->header_version / 100 % 100;
  if (major != GTP_VERSION_MAJOR || minor != GTP_VERSION_MINOR) {
    throw StatusError(GTP_ERROR_VERSION, "the caller was compiled against gtp.h " + std::to_string(major) + "." +
                                             std::to_string(minor) + " but this libgtp is " +
                                             std::to_string(GTP_VERSION_MAJOR) + "." + std::to_string(GTP_VERSION_MINOR) +
                                             "; rebuild against this library's header");
  }
  require(config->timeout_ms > 0, "timeout_ms is " + std::to_string(config->timeout_ms) + "; give a positive timeout");
  const int backend = as_int(config->backend), bootstrap = as_int(config->bootstrap);
  require(backend == GTP_BACKEND_HOST || backend == GTP_BACKEND_CUDA,
          "backend " + std::to_string(backend) + " is unknown; use GTP_BACKEND_HOST or GTP_BACKEND_CUDA");
  // Before any collective: a rank without a device fails here instead of stalling its peers' NCCL init.
  const int device = backend == GTP_BACKEND_CUDA ? current_device() : -1;
  require(call_timeout_ms >= 0, "call_timeout_ms is " + std::to_string(call_timeout_ms) +
                                    "; give a positive timeout, or 0 for timeout_ms");
  // Creation (bootstrap, communicators, warm-up) and each later collective: INT64_MAX is "very long".
  const std::chrono::milliseconds timeout(config->timeout_ms);
  const std::chrono::milliseconds call_timeout(call_timeout_ms == 0 ? config->timeout_ms : call_timeout_ms);

  auto ctx = std::make_unique<gtp_context>();
  if (bootstrap == GTP_BOOTSTRAP_CALLBACKS) {
    require(config->callbacks != nullptr, "bootstrap is GTP_BOOTSTRAP_CALLBACKS but callbacks is NULL");
    ctx->bootstrap = std::make_unique<gtp::comm::CallbackBootstrap>(*config->callbacks, timeout);
  } else {
    require(bootstrap == GTP_BOOTSTRAP_UCX_FROM_ENV,
            "bootstrap " + std::to_string(bootstrap) + " is unknown; use GTP_BOOTSTRAP_CALLBACKS or _UCX_FROM_ENV");
    gtp::comm::UcxBootstrapConfig ucx = gtp::comm::UcxBootstrapConfig::from_env();
    ucx.timeout = timeout;  // the config's creation timeout, not GTP_BOOTSTRAP_TIMEOUT's default
    ctx->bootstrap = std::make_unique<gtp::comm::UcxBootstrap>(ucx);
  }
  ctx->rank = ctx->bootstrap->rank();
  const gtp::topology::Profile profile = profile_for(*config, ctx->bootstrap->world_size());
  ctx->sizes = profile.sizes;
  const gtp::topology::ParallelSizes& s = ctx->sizes;
  ctx->group_wire[GTP_GROUP_GTP_REMAT] = wire_spec_of(profile.group(kDenseGroup));
  ctx->group_wire[GTP_GROUP_EXPERT_GTP_REMAT] = wire_spec_of(profile.group(kExpertGroup));

  gtp::remat::RuntimeConfig runtime;
  for (const char* group : {kDenseGroup, kExpertGroup}) {  // indexed by gtp_group_t, as the backend's groups
    // A config depth below the profile's batch would make that batch invalid: the batch follows it down.
    const int depth = depth_for(*config, profile, group);
    runtime.groups.push_back({depth, budget_for(*config, profile, group), group,
                              std::min(profile.group(group).prefetch_batch, std::max(depth, 1)),
                              profile.group(group).keep_gathered, profile.group(group).fill_graphs,
                              profile.group(group).grads_into_main_grad});
  }
  runtime.grads.accumulate_microbatches = config->accumulate_microbatches != 0;
  runtime.grads.sum = sum_grads;
  runtime.check_every_fill = check_every_fill;
  require(config->trace_spans <= kMaxTraceSpans, "trace_spans is " + std::to_string(config->trace_spans) +
                                                      "; give 0 (no trace) .. " + std::to_string(kMaxTraceSpans));
  runtime.trace_spans = config->trace_spans;

  // Before any communicator: ranks that disagree fail here, together, naming the settings.
  agree_on_settings(*ctx->bootstrap, context_settings(backend, runtime.grads.accumulate_microbatches, profile, runtime,
                                                      ctx->group_wire));
  const std::vector<std::vector<std::vector<int>>> families = remat_groups(s);
  if (backend == GTP_BACKEND_CUDA) {
    build_cuda(*ctx, device, profile, families, timeout, call_timeout);
  } else {
    build_host(*ctx, families, timeout, call_timeout);
  }
  ctx->call_timeout = call_timeout;
  ctx->watch_collectives = backend == GTP_BACKEND_CUDA && call_timeout_ms != 0;

  ctx->generation = next_generation.fetch_add(1);
  ctx->call_wait = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));  // no clock overflow
  ctx->grad_ready = config->grad_ready;
  ctx->grad_ready_user_data = config->grad_ready_user_data;
  if (ctx->grad_ready != nullptr) {
    gtp_context* raw = ctx.get();
    runtime.grads.grad_ready = [raw](WeightId id) { raw->grad_ready(raw->grad_ready_user_data, gtp_weight_t{id, raw->generation}); };
  }
  ctx->runtime = std::make_unique<gtp::remat::Runtime>(*ctx->backend, runtime);
  *out = ctx.release();
}

}  // namespace gtp::cabi
