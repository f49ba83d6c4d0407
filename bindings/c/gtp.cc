// The C ABI of include/gtp/gtp.h over remat::Runtime on the host backend (HostComm per grid group)
// or the CUDA backend (NCCL communicators split per grid group). Every entry point catches everything
// and maps it to a gtp_status_t; see docs/c-abi.md.
#include "gtp/gtp.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <cuda_runtime_api.h>

#include "comm/callback_bootstrap.h"
#include "comm/errors.h"
#include "comm/group_bootstrap.h"
#include "comm/host.h"
#include "comm/nccl.h"
#include "comm/streams.h"
#include "comm/ucx_bootstrap.h"
#include "remat/cuda_backend.h"
#include "remat/host_backend.h"
#include "remat/runtime.h"
#include "topology/arithmetic.h"
#include "topology/grid.h"
#include "topology/profile.h"

namespace {

using gtp::remat::WeightId;

// Misuse of call order or handle lifetime: GTP_ERROR_INVALID_STATE.
class StateError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A failure with an explicit status (version mismatch, CUDA unavailable).
class StatusError : public std::runtime_error {
 public:
  StatusError(gtp_status_t status, const std::string& message) : std::runtime_error(message), status(status) {}
  gtp_status_t status;
};

std::atomic<std::uint64_t> next_generation{1};
thread_local std::string context_free_error;  // failures with no context: create, a null ctx

}  // namespace

struct gtp_context {
  std::uint64_t generation = 0;
  std::string last_error;
  bool aborted = false;
  int rank = 0;
  gtp::topology::ParallelSizes sizes;
  gtp::kernels::WireSpec group_wire[2] = {};  // GTP_WIRE_FROM_GROUP, by gtp_group_t
  gtp_grad_ready_fn grad_ready = nullptr;
  void* grad_ready_user_data = nullptr;
  // Destroyed bottom-up: the runtime before its backend, the backend before its communicators and
  // streams, the communicators before the bootstraps they were built over.
  std::unique_ptr<gtp::comm::Bootstrap> bootstrap;
  std::vector<std::unique_ptr<gtp::comm::GroupBootstrap>> group_bootstraps;  // host: one per grid group
  std::vector<std::unique_ptr<gtp::comm::HostComm>> host_comms;               // host: one per distinct group
  std::unique_ptr<gtp::comm::NcclComm> nccl_world;                            // cuda
  std::vector<std::unique_ptr<gtp::comm::NcclComm>> nccl_groups;              // cuda: one per distinct group
  std::unique_ptr<gtp::remat::Backend> backend;
  std::unique_ptr<gtp::remat::Runtime> runtime;
};

namespace {

// How std::invalid_argument from the runtime is reported: release and finalize raise it only for
// call-order misuse once their handles and arguments have been checked here.
enum class InvalidArgumentIs { kArgument, kState };

template <typename Body>
gtp_status_t guarded(gtp_context_t* ctx, const char* call, Body&& body,
                     InvalidArgumentIs invalid = InvalidArgumentIs::kArgument) {
  std::string* error = ctx != nullptr ? &ctx->last_error : &context_free_error;
  gtp_status_t status = GTP_SUCCESS;
  std::string message;
  try {
    if (ctx != nullptr && ctx->aborted) throw StateError("the context was aborted; destroy it");
    body();
  } catch (const StatusError& e) {
    status = e.status;
    message = e.what();
  } catch (const gtp::remat::CudaError& e) {
    status = GTP_ERROR_CUDA;
    message = e.what();
  } catch (const StateError& e) {
    status = GTP_ERROR_INVALID_STATE;
    message = e.what();
  } catch (const std::invalid_argument& e) {
    status = invalid == InvalidArgumentIs::kState ? GTP_ERROR_INVALID_STATE : GTP_ERROR_INVALID_ARGUMENT;
    message = e.what();
  } catch (const nlohmann::json::exception& e) {
    status = GTP_ERROR_INVALID_ARGUMENT;
    message = e.what();
  } catch (const gtp::comm::CommError& e) {
    status = e.timed_out() ? GTP_ERROR_TIMEOUT : GTP_ERROR_SYSTEM;
    message = e.what();
  } catch (const std::runtime_error& e) {
    status = GTP_ERROR_SYSTEM;
    message = e.what();
  } catch (const std::bad_alloc& e) {
    status = GTP_ERROR_SYSTEM;
    message = std::string("out of host memory: ") + e.what();
  } catch (const std::exception& e) {
    status = GTP_ERROR_INTERNAL;
    message = e.what();
  } catch (...) {
    status = GTP_ERROR_INTERNAL;
    message = "unknown exception";
  }
  if (status != GTP_SUCCESS) {
    try {
      *error = std::string(call) + ": " + message;
    } catch (...) {
      error->clear();
    }
  } else {
    error->clear();
  }
  return status;
}

// A C enum's value as an int, read without an enum-typed load: C callers may pass any int, which
// would be undefined behaviour to load as a C++ enum whose values do not cover it.
template <typename Enum>
int as_int(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized");
  int result;
  std::memcpy(&result, &value, sizeof(result));
  return result;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// A context's entry point: a null ctx is INVALID_ARGUMENT with the message kept per thread.
template <typename Body>
gtp_status_t on_context(gtp_context_t* ctx, const char* call, Body&& body,
                        InvalidArgumentIs invalid = InvalidArgumentIs::kArgument) {
  if (ctx == nullptr) {
    return guarded(nullptr, call, [] { throw std::invalid_argument("ctx is NULL; pass a context from gtp_context_create"); });
  }
  return guarded(ctx, call, body, invalid);
}

WeightId id_of(const gtp_context_t& ctx, gtp_weight_t w) {
  if (w.generation != ctx.generation) {
    throw StateError("weight handle (id " + std::to_string(w.id) + ", generation " + std::to_string(w.generation) +
                     ") was issued by another context, one since destroyed, or never (this context's generation is " +
                     std::to_string(ctx.generation) + ")");
  }
  if (!ctx.runtime->registry().contains(w.id)) {
    throw StateError("weight id " + std::to_string(w.id) + " is not registered (unregistered already?)");
  }
  return w.id;
}

// The ids of ws[0..n), each listed once. This runs on every materialize and release, so messages are
// built only on failure and duplicates are found by sorting a copy rather than with a node-based set.
std::vector<WeightId> ids_of(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n) {
  if (ws == nullptr && n != 0) require(false, "ws is NULL but n is " + std::to_string(n));
  std::vector<WeightId> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = id_of(ctx, ws[i]);
  if (n > 1) {
    std::vector<WeightId> sorted(ids);
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end()) {
      require(false, "weight id " + std::to_string(*twice) + " is listed twice; list each weight once");
    }
  }
  return ids;
}

// The weights of a materialize call, checked: at least one, and room in the output for every weight
// once expert leaders are expanded.
std::vector<WeightId> materialize_ids(const gtp_context_t& ctx, const gtp_weight_t* ws, size_t n, size_t out_capacity) {
  if (n == 0) require(false, "n is 0; materialize at least one weight");
  std::vector<WeightId> ids = ids_of(ctx, ws, n);
  const size_t expanded = ctx.runtime->registry().expand(ids.data(), static_cast<std::int64_t>(ids.size())).size();
  if (out_capacity < expanded) {
    require(false, "out_capacity is " + std::to_string(out_capacity) + " but the weights expand to " +
                       std::to_string(expanded) + " (experts follow their leader)");
  }
  return ids;
}

gtp_section_t section(void* ptr, gtp_elem_t dtype, std::int64_t rows, std::int64_t cols) {
  if (ptr == nullptr) return gtp_section_t{nullptr, GTP_ELEM_NONE, 0, 0, 0};
  return gtp_section_t{ptr, dtype, rows, cols, cols};
}

// A runtime view as the C struct (docs/c-abi.md, gtp_materialized_t).
gtp_materialized_t to_c(const gtp::remat::Materialized& m) {
  using gtp::kernels::WireFormat;
  gtp_materialized_t c = GTP_MATERIALIZED_INITIALIZER;
  c.wire = static_cast<gtp_wire_t>(static_cast<int>(m.wire.format));
  c.nvfp4_2d = m.wire.format == WireFormat::kNVFP4 && m.wire.nvfp4_blocks == gtp::kernels::Nvfp4Blocks::k2D;
  c.rows = m.rows;
  c.cols = m.cols;
  if (m.layout == gtp::remat::Layout::kBF16) {
    c.layout = GTP_LAYOUT_BF16;
    c.data = section(m.data, GTP_ELEM_BF16, m.rows, m.cols);
    return c;
  }
  c.layout = GTP_LAYOUT_GEMM;
  const std::int64_t r = m.gemm.gemm_rows;
  const bool nvfp4 = m.wire.format == WireFormat::kNVFP4;
  const gtp_elem_t code = nvfp4 ? GTP_ELEM_E2M1 : GTP_ELEM_E4M3;
  c.gemm_rows = r;
  c.data = section(m.data, code, r, m.cols);
  c.data_t = section(m.transposed_data, code, m.cols, r);
  if (m.wire.format == WireFormat::kMXFP8) {
    c.scales = section(m.scales, GTP_ELEM_E8M0, r, m.cols / 32);
    c.scale_block_rows = 1;
    c.scale_block_cols = 32;
  } else if (nvfp4) {
    c.scale_block_rows = c.nvfp4_2d ? 16 : 1;
    c.scale_block_cols = 16;
    c.scales = section(m.scales, GTP_ELEM_E4M3, r / c.scale_block_rows, m.cols / 16);
    c.scales_t = section(m.transposed_scales, GTP_ELEM_E4M3, m.cols / 16, r / 16);
  }
  c.decode_scales = section(const_cast<float*>(m.decode_scales), GTP_ELEM_FP32, m.gemm.decode_scale_count, 1);
  if (m.gemm.decode_scale_count > 0) c.decode_scale_rows = m.shard_rows;
  return c;
}

void check_struct_size(size_t given, size_t expected, const char* type) {
  require(given == expected, std::string(type) + ".struct_size is " + std::to_string(given) + " but this library expects " +
                                 std::to_string(expected) + "; initialize it with the header's *_INITIALIZER");
}

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
      config.profile_json != nullptr ? gtp::topology::parse_profile(nlohmann::json::parse(config.profile_json), ".")
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

// Precedence (docs/c-abi.md): a config value other than GTP_FROM_PROFILE wins; GTP_FROM_PROFILE takes
// the profile's gtp_remat group setting, and expt_gtp_remat's when the profile mentions that group. The
// runtime prefetches one chain at one depth and has one cache, so those groups must agree on the depth,
// and the budget is the sum of their budgets (0, no limit, if any is 0).
int depth_for(const gtp_context_config_t& config, const gtp::topology::Profile& profile) {
  if (config.prefetch_depth != GTP_FROM_PROFILE) {
    require(config.prefetch_depth >= 0 && config.prefetch_depth <= gtp::remat::kMaxDepth,
            "prefetch_depth is " + std::to_string(config.prefetch_depth) + "; give 0.." +
                std::to_string(gtp::remat::kMaxDepth) + " or GTP_FROM_PROFILE");
    return config.prefetch_depth;
  }
  const int dense = profile.group(kDenseGroup).prefetch_depth;
  if (profile.groups.count(kExpertGroup) != 0) {
    const int expert = profile.group(kExpertGroup).prefetch_depth;
    require(expert == dense, "/groups/expt_gtp_remat/prefetch_depth is " + std::to_string(expert) +
                                 " but /groups/gtp_remat/prefetch_depth is " + std::to_string(dense) +
                                 ": the runtime prefetches one chain at one depth; set both to the same value "
                                 "(or set gtp_context_config_t.prefetch_depth)");
  }
  return dense;
}

std::int64_t budget_for(const gtp_context_config_t& config, const gtp::topology::Profile& profile) {
  if (config.memory_budget_bytes != GTP_FROM_PROFILE) {
    require(config.memory_budget_bytes >= 0, "memory_budget_bytes is " + std::to_string(config.memory_budget_bytes) +
                                                 "; give 0 (no limit), a byte count or GTP_FROM_PROFILE");
    return config.memory_budget_bytes;
  }
  const std::int64_t dense = profile.group(kDenseGroup).memory_budget_bytes;
  if (profile.groups.count(kExpertGroup) == 0) return dense;
  const std::int64_t expert = profile.group(kExpertGroup).memory_budget_bytes;
  return dense == 0 || expert == 0 ? 0 : dense + expert;
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
                std::chrono::milliseconds timeout) {
  std::vector<gtp::comm::HostComm*> groups;
  for (std::size_t f = 0; f < families.size(); ++f) {
    const auto same = std::find(families.begin(), families.begin() + f, families[f]);
    if (same != families.begin() + f) {
      groups.push_back(groups[same - families.begin()]);
      continue;
    }
    ctx.group_bootstraps.push_back(
        std::make_unique<gtp::comm::GroupBootstrap>(*ctx.bootstrap, group_containing(families[f], ctx.rank)));
    ctx.host_comms.push_back(std::make_unique<gtp::comm::HostComm>(*ctx.group_bootstraps.back(), timeout));
    groups.push_back(ctx.host_comms.back().get());
  }
  ctx.backend = std::make_unique<gtp::remat::HostBackend>(groups);
}

// CUDA backend: a world NcclComm over the bootstrap, split once per distinct group family with that
// group's nccl settings, and one CudaBackend over them whose side streams (gather and reduce-scatter
// per group) run at the gtp_remat group's stream_priority.
void build_cuda(gtp_context& ctx, int device, const gtp::topology::Profile& profile,
                const std::vector<std::vector<std::vector<int>>>& families, std::chrono::milliseconds timeout) {
  gtp::remat::CudaStreamPriorities priorities;
  try {
    const int priority = stream_priority(profile.group(kDenseGroup).stream_priority,
                                         gtp::comm::stream_priority_range(device));
    priorities.gather = priority;
    priorities.reduce_scatter = priority;
  } catch (const std::runtime_error& e) {  // the comm layer reports CUDA failures as comm::CommError
    throw StatusError(GTP_ERROR_CUDA, "reading the stream priorities of device " + std::to_string(device) + ": " + e.what());
  }
  try {
    ctx.nccl_world = std::make_unique<gtp::comm::NcclComm>(gtp::comm::NcclComm::create_world(*ctx.bootstrap, timeout));
    const char* names[] = {kDenseGroup, kExpertGroup};
    std::vector<gtp::comm::NcclComm*> groups;
    for (std::size_t f = 0; f < families.size(); ++f) {
      const auto same = std::find(families.begin(), families.begin() + f, families[f]);
      if (same != families.begin() + f) {
        groups.push_back(groups[same - families.begin()]);
        continue;
      }
      const gtp::comm::NcclGroupConfig config = nccl_config(profile.group(names[f]), names[f]);
      ctx.nccl_groups.push_back(std::make_unique<gtp::comm::NcclComm>(ctx.nccl_world->split(families[f], config, timeout)));
      groups.push_back(ctx.nccl_groups.back().get());
    }
    ctx.backend = std::make_unique<gtp::remat::CudaBackend>(device, groups, timeout, priorities);
  } catch (const gtp::comm::CommError&) {
    throw;  // NCCL init or the bootstrap: TIMEOUT or SYSTEM
  } catch (const std::runtime_error& e) {
    throw StatusError(GTP_ERROR_CUDA, std::string("setting up the CUDA backend on device ") + std::to_string(device) +
                                          ": " + e.what());
  }
}

void create(const gtp_context_config_t* config, gtp_context_t** out) {
  require(config != nullptr, "config is NULL; pass a gtp_context_config_t from GTP_CONTEXT_CONFIG_INITIALIZER");
  require(out != nullptr, "out is NULL");
  check_struct_size(config->struct_size, sizeof(gtp_context_config_t), "gtp_context_config_t");
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
  const std::chrono::milliseconds timeout(config->timeout_ms);

  auto ctx = std::make_unique<gtp_context>();
  if (bootstrap == GTP_BOOTSTRAP_CALLBACKS) {
    require(config->callbacks != nullptr, "bootstrap is GTP_BOOTSTRAP_CALLBACKS but callbacks is NULL");
    ctx->bootstrap = std::make_unique<gtp::comm::CallbackBootstrap>(*config->callbacks, timeout);
  } else {
    require(bootstrap == GTP_BOOTSTRAP_UCX_FROM_ENV,
            "bootstrap " + std::to_string(bootstrap) + " is unknown; use GTP_BOOTSTRAP_CALLBACKS or _UCX_FROM_ENV");
    ctx->bootstrap = std::make_unique<gtp::comm::UcxBootstrap>(gtp::comm::UcxBootstrapConfig::from_env());
  }
  ctx->rank = ctx->bootstrap->rank();
  const gtp::topology::Profile profile = profile_for(*config, ctx->bootstrap->world_size());
  ctx->sizes = profile.sizes;
  const gtp::topology::ParallelSizes& s = ctx->sizes;
  ctx->group_wire[GTP_GROUP_GTP_REMAT] = wire_spec_of(profile.group(kDenseGroup));
  ctx->group_wire[GTP_GROUP_EXPERT_GTP_REMAT] = wire_spec_of(profile.group(kExpertGroup));

  gtp::remat::RuntimeConfig runtime;
  runtime.depth = depth_for(*config, profile);
  runtime.cache.budget_bytes = budget_for(*config, profile);
  runtime.grads.accumulate_microbatches = config->accumulate_microbatches != 0;
  runtime.trace_spans = config->trace_spans;

  const std::vector<std::vector<std::vector<int>>> families = remat_groups(s);
  if (backend == GTP_BACKEND_CUDA) {
    build_cuda(*ctx, device, profile, families, timeout);
  } else {
    build_host(*ctx, families, timeout);
  }

  ctx->generation = next_generation.fetch_add(1);
  ctx->grad_ready = config->grad_ready;
  ctx->grad_ready_user_data = config->grad_ready_user_data;
  if (ctx->grad_ready != nullptr) {
    gtp_context* raw = ctx.get();
    runtime.grads.grad_ready = [raw](WeightId id) { raw->grad_ready(raw->grad_ready_user_data, gtp_weight_t{id, raw->generation}); };
  }
  ctx->runtime = std::make_unique<gtp::remat::Runtime>(*ctx->backend, runtime);
  *out = ctx.release();
}

gtp_status_t copy_text(gtp_context_t* ctx, const char* call, char* buf, size_t cap, size_t* len,
                       std::string (*text)(const gtp_context&)) {
  return on_context(ctx, call, [&] {
    require(len != nullptr, "len is NULL");
    require(buf != nullptr || cap == 0, "buf is NULL but cap is " + std::to_string(cap));
    const std::string s = text(*ctx);
    if (cap <= s.size()) {
      *len = s.size();
      throw std::invalid_argument("the buffer holds " + std::to_string(cap) + " bytes but the text needs " +
                                  std::to_string(s.size() + 1) + " with its NUL; *len has the length");
    }
    std::memcpy(buf, s.c_str(), s.size() + 1);
    *len = s.size();
  });
}

}  // namespace

extern "C" {

const char* gtp_status_string(gtp_status_t status) {
  switch (as_int(status)) {
    case GTP_SUCCESS: return "GTP_SUCCESS";
    case GTP_ERROR_INVALID_ARGUMENT: return "GTP_ERROR_INVALID_ARGUMENT";
    case GTP_ERROR_INVALID_STATE: return "GTP_ERROR_INVALID_STATE";
    case GTP_ERROR_TIMEOUT: return "GTP_ERROR_TIMEOUT";
    case GTP_ERROR_SYSTEM: return "GTP_ERROR_SYSTEM";
    case GTP_ERROR_CUDA: return "GTP_ERROR_CUDA";
    case GTP_ERROR_VERSION: return "GTP_ERROR_VERSION";
    case GTP_ERROR_INTERNAL: return "GTP_ERROR_INTERNAL";
  }
  return "unknown gtp_status_t";
}

const char* gtp_last_error(const gtp_context_t* ctx) {
  return ctx != nullptr ? ctx->last_error.c_str() : context_free_error.c_str();
}

gtp_status_t gtp_context_create(const gtp_context_config_t* config, gtp_context_t** out) {
  return guarded(nullptr, "gtp_context_create", [&] { create(config, out); });
}

gtp_status_t gtp_context_destroy(gtp_context_t* ctx) {
  if (ctx == nullptr) return GTP_SUCCESS;
  const gtp_status_t status = guarded(nullptr, "gtp_context_destroy", [&] {
    ctx->runtime.reset();
    ctx->backend.reset();
    ctx->nccl_groups.clear();
    ctx->nccl_world.reset();
    ctx->host_comms.clear();
    ctx->group_bootstraps.clear();
  });
  delete ctx;
  return status;
}

gtp_status_t gtp_context_abort(gtp_context_t* ctx) {
  return on_context(ctx, "gtp_context_abort", [&] {
    ctx->aborted = true;
    // Cancels pending NCCL work so that a peer stuck in a collective cannot hang destroy.
    for (auto& comm : ctx->nccl_groups) comm->abort();
    if (ctx->nccl_world != nullptr) ctx->nccl_world->abort();
  });
}

gtp_status_t gtp_context_sizes(gtp_context_t* ctx, gtp_sizes_t* out) {
  return on_context(ctx, "gtp_context_sizes", [&] {
    require(out != nullptr, "out is NULL");
    check_struct_size(out->struct_size, sizeof(gtp_sizes_t), "gtp_sizes_t");
    const gtp::topology::ParallelSizes& s = ctx->sizes;
    const gtp::topology::DataParallelRank data = gtp::topology::data_parallel_rank(s, ctx->rank);
    *out = gtp_sizes_t{sizeof(gtp_sizes_t), ctx->rank, s.world_size, s.tp, s.gtp_remat, s.expt_gtp_remat, s.dp,
                       data.index, data.count};
  });
}

gtp_status_t gtp_weight_register(gtp_context_t* ctx, const gtp_weight_desc_t* desc, gtp_weight_t* out) {
  return on_context(ctx, "gtp_weight_register", [&] {
    require(desc != nullptr, "desc is NULL");
    require(out != nullptr, "out is NULL");
    check_struct_size(desc->struct_size, sizeof(gtp_weight_desc_t), "gtp_weight_desc_t");
    gtp::remat::WeightDesc d;
    d.name = desc->name != nullptr ? desc->name : "";
    d.shard = desc->shard;
    const int dtype = as_int(desc->dtype), wire = as_int(desc->wire), group = as_int(desc->group);
    require(dtype == GTP_DTYPE_BF16 || dtype == GTP_DTYPE_FP32,
            "dtype " + std::to_string(dtype) + " is unknown; use GTP_DTYPE_BF16 or GTP_DTYPE_FP32");
    d.dtype = dtype == GTP_DTYPE_BF16 ? gtp::kernels::SourceDtype::kBF16 : gtp::kernels::SourceDtype::kFP32;
    d.rows = desc->rows;
    d.cols = desc->cols;
    require(wire >= GTP_WIRE_FROM_GROUP && wire <= GTP_WIRE_NVFP4,
            "wire " + std::to_string(wire) + " is unknown; use GTP_WIRE_FROM_GROUP, _BF16, _FP8, _MXFP8 or _NVFP4");
    require(group == GTP_GROUP_GTP_REMAT || group == GTP_GROUP_EXPERT_GTP_REMAT,
            "group " + std::to_string(group) + " is unknown; use GTP_GROUP_GTP_REMAT or GTP_GROUP_EXPERT_GTP_REMAT");
    // FROM_GROUP takes the group's whole spec (format, NVFP4 block shape, MXFP8 rounding); the
    // descriptor's nvfp4_2d / FLOOR below can only add to it.
    if (wire == GTP_WIRE_FROM_GROUP) {
      d.wire = ctx->group_wire[group];
    } else {
      d.wire.format = static_cast<gtp::kernels::WireFormat>(wire);
    }
    const std::string resolved = gtp::kernels::to_string(d.wire.format);
    require(desc->mx_rounding == GTP_MX_ROUNDING_RCEIL || desc->mx_rounding == GTP_MX_ROUNDING_FLOOR,
            "mx_rounding " + std::to_string(desc->mx_rounding) +
                " is unknown; use GTP_MX_ROUNDING_RCEIL (TransformerEngine) or GTP_MX_ROUNDING_FLOOR (OCP MX v1.0)");
    require(desc->nvfp4_2d == 0 || d.wire.format == gtp::kernels::WireFormat::kNVFP4,
            "nvfp4_2d is " + std::to_string(desc->nvfp4_2d) + " but the wire is " + resolved +
                "; 16x16 blocks exist for the nvfp4 wire only: set nvfp4_2d = 0 or wire = GTP_WIRE_NVFP4");
    if (desc->nvfp4_2d != 0) d.wire.nvfp4_blocks = gtp::kernels::Nvfp4Blocks::k2D;
    // Other wires ignore the rounding; keeping their spec at the default keeps expert-leader equality
    // about what the bytes depend on.
    if (d.wire.format == gtp::kernels::WireFormat::kMXFP8 && desc->mx_rounding == GTP_MX_ROUNDING_FLOOR) {
      d.wire.mx_rounding = gtp::kernels::ScaleRounding::kFloor;
    }
    d.group = group;
    d.main_grad = desc->main_grad;
    if (desc->expert_leader != nullptr) d.expert_leader = id_of(*ctx, *desc->expert_leader);
    const WeightId id = ctx->runtime->register_weight(d);
    *out = gtp_weight_t{id, ctx->generation};
  });
}

gtp_status_t gtp_weight_unregister(gtp_context_t* ctx, gtp_weight_t w) {
  return on_context(ctx, "gtp_weight_unregister", [&] { ctx->runtime->unregister_weight(id_of(*ctx, w)); },
                    InvalidArgumentIs::kState);
}

gtp_status_t gtp_weights_shard_updated(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream) {
  return on_context(ctx, "gtp_weights_shard_updated", [&] {
    const std::vector<WeightId> ids = ids_of(*ctx, ws, n);
    ctx->runtime->shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
  });
}

gtp_status_t gtp_materialize(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                             int32_t model_chunk, gtp_layout_t layout, void** out_ptrs, size_t out_capacity,
                             size_t* out_count, cudaStream_t stream) {
  return on_context(ctx, "gtp_materialize", [&] {
    require(out_ptrs != nullptr, "out_ptrs is NULL");
    require(out_count != nullptr, "out_count is NULL");
    const std::vector<WeightId> ids = materialize_ids(*ctx, ws, n, out_capacity);
    const std::int64_t count = static_cast<std::int64_t>(ids.size());
    require(as_int(layout) != GTP_LAYOUT_GEMM,
            "layout GTP_LAYOUT_GEMM needs several pointers per weight; call gtp_materialize_views");
    const std::vector<void*> ptrs = ctx->runtime->materialize(ids.data(), count, static_cast<gtp::remat::Phase>(as_int(phase)),
                                                              model_chunk, static_cast<gtp::remat::Layout>(as_int(layout)), stream);
    std::copy(ptrs.begin(), ptrs.end(), out_ptrs);
    *out_count = ptrs.size();
  });
}

gtp_status_t gtp_release(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_release", [&] { ids = ids_of(*ctx, ws, n); });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_release", [&] {
    ctx->runtime->release(ids.data(), static_cast<std::int64_t>(ids.size()), stream);
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_materialize_views(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                                   int32_t model_chunk, gtp_layout_t layout, gtp_materialized_t* out,
                                   size_t out_capacity, size_t* out_count, cudaStream_t stream) {
  return on_context(ctx, "gtp_materialize_views", [&] {
    require(out != nullptr, "out is NULL");
    require(out_count != nullptr, "out_count is NULL");
    const std::vector<WeightId> ids = materialize_ids(*ctx, ws, n, out_capacity);
    const std::int64_t count = static_cast<std::int64_t>(ids.size());
    const size_t expanded = ctx->runtime->registry().expand(ids.data(), count).size();
    for (size_t i = 0; i < expanded; ++i) {
      check_struct_size(out[i].struct_size, sizeof(gtp_materialized_t),
                        ("gtp_materialized_t (out[" + std::to_string(i) + "])").c_str());
    }
    const std::vector<gtp::remat::Materialized> views = ctx->runtime->materialize_views(
        ids.data(), count, static_cast<gtp::remat::Phase>(as_int(phase)), model_chunk,
        static_cast<gtp::remat::Layout>(as_int(layout)), stream);
    for (size_t i = 0; i < views.size(); ++i) out[i] = to_c(views[i]);
    *out_count = views.size();
  });
}

gtp_status_t gtp_release_layout(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_layout_t layout,
                                cudaStream_t stream) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_release_layout", [&] {
    ids = ids_of(*ctx, ws, n);
    const int l = as_int(layout);
    require(l == GTP_LAYOUT_BF16 || l == GTP_LAYOUT_GEMM,
            "layout " + std::to_string(l) + " is unknown; use GTP_LAYOUT_BF16 or GTP_LAYOUT_GEMM");
  });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_release_layout", [&] {
    ctx->runtime->release(ids.data(), static_cast<std::int64_t>(ids.size()), stream,
                          static_cast<gtp::remat::Layout>(as_int(layout)));
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_grad_buffer(gtp_context_t* ctx, gtp_weight_t w, float** out, cudaStream_t stream) {
  return on_context(ctx, "gtp_grad_buffer", [&] {
    require(out != nullptr, "out is NULL");
    *out = ctx->runtime->grad_buffer(id_of(*ctx, w), stream);
  });
}

gtp_status_t gtp_finalize(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, int32_t last_microbatch,
                          cudaStream_t stream) {
  std::vector<WeightId> ids;
  const gtp_status_t status = on_context(ctx, "gtp_finalize", [&] { ids = ids_of(*ctx, ws, n); });
  if (status != GTP_SUCCESS) return status;
  return on_context(ctx, "gtp_finalize", [&] {
    ctx->runtime->finalize(ids.data(), static_cast<std::int64_t>(ids.size()), last_microbatch != 0, stream);
  }, InvalidArgumentIs::kState);
}

gtp_status_t gtp_drain(gtp_context_t* ctx, cudaStream_t stream) {
  return on_context(ctx, "gtp_drain", [&] { ctx->runtime->drain(stream); });
}

gtp_status_t gtp_drain_ex(gtp_context_t* ctx, uint32_t flags, cudaStream_t stream) {
  return on_context(ctx, "gtp_drain_ex", [&] {
    if ((flags & ~GTP_DRAIN_DEFER_HEAD) != 0) {
      require(false, "flags " + std::to_string(flags) + " has unknown bits; use 0 or GTP_DRAIN_DEFER_HEAD");
    }
    ctx->runtime->drain(stream, (flags & GTP_DRAIN_DEFER_HEAD) != 0 ? gtp::remat::Runtime::Head::kAfterShardUpdate
                                                                    : gtp::remat::Runtime::Head::kAtDrain);
  });
}

gtp_status_t gtp_reset_chains(gtp_context_t* ctx) {
  return on_context(ctx, "gtp_reset_chains", [&] { ctx->runtime->reset_chains(); });
}

gtp_status_t gtp_stats_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len) {
  return copy_text(ctx, "gtp_stats_json", buf, cap, len, [](const gtp_context& c) { return c.runtime->stats_json(); });
}

gtp_status_t gtp_trace_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len) {
  return copy_text(ctx, "gtp_trace_json", buf, cap, len,
                   [](const gtp_context& c) { return c.runtime->chrome_trace(c.rank); });
}

}  // extern "C"
