// One step of gtp-overlap-bench's chain and its libgtp side, independent of the device: the
// benchmark runs it with cuBLAS GEMMs and CUDA events on the CUDA backend, chain_test on the host
// backend with CPU GEMMs (so the call sequence is checked against the real runtime in CI).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/overlap/overlap_options.h"
#include "gtp/gtp.h"

namespace gtp::bench::overlap {

// Where a wgrad goes: written into `data` when `overwrite` (a GEMM with beta = 0; libgtp's buffer
// newly handed out without its zero-fill), else added to what it holds (beta = 1).
struct GradTarget {
  float* data = nullptr;
  bool overwrite = false;
};

// Where a step gets its weights: resident pointers, or libgtp calls around each GEMM.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual const void* acquire(int layer, gtp_phase_t phase) = 0;
  virtual void release(int layer) = 0;
  virtual GradTarget grad(int layer) = 0;  // FP32 [out, in] the wgrad is written or added into
  virtual void finalize(int layer, bool last_microbatch) = 0;
  virtual void end_step() = 0;
  // Between two steps, outside their timing: what the optimizer step leaves for the weights to do.
  virtual void between_steps() {}
};

// What a step does around the weight calls.
class ChainOps {
 public:
  virtual ~ChainOps() = default;
  virtual void mark() = 0;                                  // a timing point (the benchmark records a CUDA event)
  virtual void forward(int layer, const void* weight) = 0;  // x[layer+1] = x[layer] Wᵀ
  virtual void dgrad(int layer, const void* weight) = 0;    // dx[layer] = dy[layer] W
  virtual void wgrad(int layer, GradTarget grad) = 0;       // grad (+)= dy[layer]ᵀ x[layer]
};

// One step: `microbatches` x (forward over every layer, backward in reverse), then end_step. Marks,
// in order: the start; a (before, after) pair around every acquire of the forward, then per
// backward layer around its acquire and around its grad(); a pair around end_step; the end.
void run_step(int layers, int microbatches, WeightSource& weights, ChainOps& ops);
std::size_t marks_per_step(int layers, int microbatches);

// The times between a step's marks, split by what the pairs bracket (units of `elapsed`).
struct StepSplit {
  double step = 0;
  double materialize = 0;  // sum over the acquire pairs
  double grad_buffer = 0;  // sum over the grad() pairs
  double end_step = 0;
};
// marks[i] is a time point; elapsed(a, b) the time from mark a to mark b.
template <typename Elapsed>
StepSplit split_step(int layers, int microbatches, Elapsed&& elapsed) {
  StepSplit s;
  std::size_t pair = 1;
  for (int mb = 0; mb < microbatches; ++mb) {
    for (int i = 0; i < layers; ++i, pair += 2) s.materialize += elapsed(pair, pair + 1);
    for (int i = 0; i < layers; ++i, pair += 4) {
      s.materialize += elapsed(pair, pair + 1);
      s.grad_buffer += elapsed(pair + 2, pair + 3);
    }
  }
  s.end_step = elapsed(pair, pair + 1);
  s.step = elapsed(0, pair + 2);
  return s;
}

// The chain's weights materialized by libgtp through the C ABI. Two phases: the constructor creates
// the context (collective), the caller then allocates this rank's rows (`rows()`), and
// `register_and_pack` registers them and packs every weight (collective).
class GtpWeights : public WeightSource {
 public:
  struct Rows {
    std::int64_t first = 0;  // the first weight row this rank holds
    std::int64_t count = 0;  // rows it holds (0: only padding)
  };
  // `config` is complete but for the profile, which is built here from the world size, the
  // priority, the depth, the wire and the switches (profile_json). Throws GtpError when a call fails.
  GtpWeights(gtp_context_config_t config, int world_size, const std::string& stream_priority, int depth,
             kernels::WireFormat wire, std::vector<LayerShape> shapes, cudaStream_t stream,
             GroupSwitches switches = {}, bool repack = false);
  ~GtpWeights() override;
  GtpWeights(const GtpWeights&) = delete;
  GtpWeights& operator=(const GtpWeights&) = delete;

  Rows rows(int layer) const;
  // shards[i]: rows(i).count x in_features BF16 (null when count is 0); main_grads[i]: FP32, same rows.
  void register_and_pack(const std::vector<const void*>& shards, const std::vector<float*>& main_grads);

  const void* acquire(int layer, gtp_phase_t phase) override;
  void release(int layer) override;
  // gtp_grad_buffer_ex without the zero-fill: `overwrite` on the first microbatch of each step.
  GradTarget grad(int layer) override;
  void finalize(int layer, bool last_microbatch) override;
  // With `repack`: the drain defers the next step's head to the re-pack (GTP_DRAIN_DEFER_HEAD).
  void end_step() override;
  // With `repack`: gtp_weights_shard_updated over every weight, as after an optimizer step.
  void between_steps() override;

  std::string stats_json() const;
  const std::vector<double>& materialize_host_us() const { return host_us_; }

 private:
  void check(gtp_status_t status, const char* call) const;

  std::string profile_;
  kernels::WireFormat wire_;
  std::vector<LayerShape> shapes_;
  cudaStream_t stream_;
  bool repack_;
  gtp_context_t* ctx_ = nullptr;
  gtp_sizes_t sizes_ = GTP_SIZES_INITIALIZER;
  std::vector<gtp_weight_t> weights_;
  std::vector<double> host_us_;  // host time of every gtp_materialize call
};

// A failed libgtp call: its status and gtp_last_error's message, prefixed by the call's name.
class GtpError : public std::runtime_error {
 public:
  GtpError(gtp_status_t status, const std::string& message) : std::runtime_error(message), status(status) {}
  gtp_status_t status;
};

// A bootstrap vtable for one rank in this process (allgather copies, the rest are no-ops).
gtp_bootstrap_callbacks_t one_rank_callbacks();

}  // namespace gtp::bench::overlap
