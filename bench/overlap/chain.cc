#include "bench/overlap/chain.h"

#include <chrono>
#include <cstring>

namespace gtp::bench::overlap {

void run_step(int layers, int microbatches, WeightSource& weights, ChainOps& ops) {
  ops.mark();
  for (int mb = 0; mb < microbatches; ++mb) {
    for (int i = 0; i < layers; ++i) {
      ops.mark();
      const void* w = weights.acquire(i, GTP_PHASE_FORWARD);
      ops.mark();
      ops.forward(i, w);
      weights.release(i);
    }
    for (int i = layers - 1; i >= 0; --i) {
      ops.mark();
      const void* w = weights.acquire(i, GTP_PHASE_BACKWARD);
      ops.mark();
      ops.dgrad(i, w);
      weights.release(i);  // wgrad does not read the weight: its slot may be refilled after dgrad
      ops.mark();
      const GradTarget grad = weights.grad(i);
      ops.mark();
      ops.wgrad(i, grad);
      weights.finalize(i, mb == microbatches - 1);
    }
  }
  ops.mark();
  weights.end_step();
  ops.mark();
  ops.mark();
}

std::size_t marks_per_step(int layers, int microbatches) {
  return 2 + 2 * (3 * static_cast<std::size_t>(layers) * static_cast<std::size_t>(microbatches) + 1);
}

namespace {

gtp_bootstrap_result_t one_rank_allgather(void*, const void* send, void* recv, size_t bytes, int64_t) {
  std::memcpy(recv, send, bytes);
  return GTP_BOOTSTRAP_OK;
}
gtp_bootstrap_result_t one_rank_broadcast(void*, void*, size_t, int32_t, int64_t) { return GTP_BOOTSTRAP_OK; }
gtp_bootstrap_result_t one_rank_barrier(void*, int64_t) { return GTP_BOOTSTRAP_OK; }

}  // namespace

gtp_bootstrap_callbacks_t one_rank_callbacks() {
  gtp_bootstrap_callbacks_t c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  c.rank = 0;
  c.world_size = 1;
  c.allgather = one_rank_allgather;
  c.broadcast = one_rank_broadcast;
  c.barrier = one_rank_barrier;
  return c;
}

GtpWeights::GtpWeights(gtp_context_config_t config, int world_size, const std::string& stream_priority, int depth,
                       kernels::WireFormat wire, std::vector<LayerShape> shapes, cudaStream_t stream,
                       GroupSwitches switches, bool repack)
    : profile_(profile_json(world_size, stream_priority, depth, wire, switches)),
      wire_(wire),
      shapes_(std::move(shapes)),
      stream_(stream),
      repack_(repack) {
  config.profile_json = profile_.c_str();
  config.profile_path = nullptr;
  config.prefetch_depth = depth;
  const gtp_status_t status = gtp_context_create(&config, &ctx_);
  if (status != GTP_SUCCESS) {
    throw GtpError(status,
                   std::string("gtp_context_create -> ") + gtp_status_string(status) + ": " + gtp_last_error(nullptr));
  }
  try {
    check(gtp_context_sizes(ctx_, &sizes_), "gtp_context_sizes");
  } catch (...) {
    gtp_context_destroy(ctx_);
    throw;
  }
}

GtpWeights::~GtpWeights() { gtp_context_destroy(ctx_); }

void GtpWeights::check(gtp_status_t status, const char* call) const {
  if (status != GTP_SUCCESS) {
    throw GtpError(status, std::string(call) + " -> " + gtp_status_string(status) + ": " + gtp_last_error(ctx_));
  }
}

GtpWeights::Rows GtpWeights::rows(int layer) const {
  const LayerShape& s = shapes_.at(static_cast<size_t>(layer));
  const kernels::WeightGeometry g = kernels::weight_geometry(wire_, s.out_features, s.in_features, sizes_.gtp_remat);
  const std::int64_t rank = sizes_.rank % sizes_.gtp_remat;  // TP 1: the rank within the G group
  return Rows{rank * g.shard_rows, g.valid_rows(rank)};
}

void GtpWeights::register_and_pack(const std::vector<const void*>& shards, const std::vector<float*>& main_grads) {
  if (shards.size() != shapes_.size() || main_grads.size() != shapes_.size()) {
    throw std::invalid_argument("register_and_pack: " + std::to_string(shards.size()) + " shards and " +
                                std::to_string(main_grads.size()) + " main grads for " +
                                std::to_string(shapes_.size()) + " layers; give one of each per layer");
  }
  for (size_t i = 0; i < shapes_.size(); ++i) {
    const std::string name = "layer" + std::to_string(i);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = name.c_str();
    desc.shard = shards[i];
    desc.rows = shapes_[i].out_features;
    desc.cols = shapes_[i].in_features;
    desc.wire = static_cast<gtp_wire_t>(static_cast<int>(wire_));  // same order as kernels::WireFormat
    desc.main_grad = main_grads[i];
    gtp_weight_t w;
    check(gtp_weight_register(ctx_, &desc, &w), "gtp_weight_register");
    weights_.push_back(w);
  }
  check(gtp_weights_shard_updated(ctx_, weights_.data(), weights_.size(), stream_), "gtp_weights_shard_updated");
}

const void* GtpWeights::acquire(int layer, gtp_phase_t phase) {
  void* out = nullptr;
  size_t count = 0;
  const auto t0 = std::chrono::steady_clock::now();
  check(gtp_materialize(ctx_, &weights_.at(static_cast<size_t>(layer)), 1, phase, 0, GTP_LAYOUT_BF16, &out, 1, &count,
                        stream_),
        "gtp_materialize");
  host_us_.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  return out;
}

void GtpWeights::release(int layer) {
  check(gtp_release(ctx_, &weights_.at(static_cast<size_t>(layer)), 1, stream_), "gtp_release");
}

GradTarget GtpWeights::grad(int layer) {
  gtp_grad_buffer_t out = GTP_GRAD_BUFFER_INITIALIZER;
  check(gtp_grad_buffer_ex(ctx_, weights_.at(static_cast<size_t>(layer)), GTP_GRAD_BUFFER_UNINITIALIZED, &out, stream_),
        "gtp_grad_buffer_ex");
  return GradTarget{out.data, out.overwrite != 0};
}

void GtpWeights::finalize(int layer, bool last_microbatch) {
  check(gtp_finalize(ctx_, &weights_.at(static_cast<size_t>(layer)), 1, last_microbatch ? 1 : 0, stream_),
        "gtp_finalize");
}

void GtpWeights::end_step() {
  check(gtp_drain_ex(ctx_, repack_ ? GTP_DRAIN_DEFER_HEAD : 0u, stream_), "gtp_drain_ex");
}

void GtpWeights::between_steps() {
  if (repack_) {
    check(gtp_weights_shard_updated(ctx_, weights_.data(), weights_.size(), stream_), "gtp_weights_shard_updated");
  }
}

std::string GtpWeights::stats_json() const {
  size_t len = 0;
  gtp_stats_json(ctx_, nullptr, 0, &len);  // sizes the text
  std::string text(len + 1, '\0');
  check(gtp_stats_json(ctx_, text.data(), text.size(), &len), "gtp_stats_json");
  text.resize(len);
  return text;
}

}  // namespace gtp::bench::overlap
