// Grads: full-shape FP32 gradient buffers for the weights, and their reduction to each rank's shard.
//
// grad_buffer(w) hands out an FP32 buffer of padded_rows x cols (the weight's rows x cols first, then
// the padding rows, always zero: the reduce-scatter reads them and the consumer leaves them alone).
// With GradInit::kZero the rows are zero-filled and the consumer ADDS its wgrad; with
// GradInit::kUndefined a newly handed-out buffer is not filled (the fill writes the whole FP32 buffer
// once per weight per step) and the consumer must WRITE its first wgrad (a GEMM with beta = 0), as
// // GradBuffer::overwrite says. finalize(w) enqueues, on the side stream after the consumer's work, a
// reduce-scatter over the weight's group with the 1/G mean pre-scale, accumulated in FP32, in place:
// this rank's shard of the result lands in its own rows of the buffer (NCCL's in-place form, no staging
// buffer; on a size-1 group nothing moves). The add of those rows into the weight's FP32 main grad is
// deferred to the next finalize or drain, and is followed by the grad-ready callback; the buffer goes
// back to the pool after the add. drain(stream) applies what is pending and orders `stream` after all
// of it.
//
// With accumulate_microbatches, finalize(w, last_microbatch = false) keeps the buffer so the next
// microbatch adds into it; only the last microbatch reduces (one reduce-scatter per step, at the cost
// of holding every buffer for the whole backward). Buffers come from a pool; nothing is allocated in
// steady state.
//
// On a size-1 group the reduce-scatter is the identity, so (GradsConfig::into_main_grad) a
// GradInit::kUndefined buffer is the weight's main grad itself, handed out with overwrite = false: the
// consumer adds its wgrad straight into it, as training without GTP does, and finalize reduces nothing
// and adds nothing; only the grad-ready callback runs. This removes a full-size FP32 buffer's
// reduce-scatter and add (three passes over it) per weight and step.
//
// Main grads declared zero (declare_zeroed): the caller says the main grads of these weights are zero
// now (it zeroed them after its optimizer step, ordered before its next grad_buffer's stream). The
// first buffer handed out afterwards for each such weight then needs no add:
// - where the main grad can be the buffer (the into_main_grad conditions), it IS the main grad, for
//   every GradInit (kUndefinedSeparate too): overwrite = true for the kUndefined kinds (the consumer
//   writes, as a consumer that can only write, TE's DistributedWeight, needs), false for kZero (adding
//   into zeros); finalize adds nothing.
// - otherwise (a larger group, padding rows, into_main_grad off) its reduced rows are COPIED into the
//   main grad instead of added (two passes over the rows instead of three).
// The declaration is consumed by that first buffer; later buffers (microbatches) add as before. It is
// refused for a weight with a buffer handed out or an add pending (declare after drain). A buffer
// handed out under CUDA graph capture drops the declaration (a replay cannot know that the main grad
// is zero again) and takes the ordinary path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "remat/registry.h"

namespace gtp::remat {

struct GradsConfig {
  bool accumulate_microbatches = false;
  // Reduce-scatter the SUM over the group instead of the mean (Megatron's calculate_per_token_loss).
  bool sum = false;
  std::function<void(WeightId)> grad_ready;  // optional; runs on the host after the main-grad add
  // Per backend group: its kUndefined buffers are the main grads when the group has size 1. Empty:
  // every group does. Runtime sets it from GroupConfig::grads_into_main_grad.
  std::vector<bool> into_main_grad;
};

// What a newly handed-out buffer holds in the weight's rows. kUndefined may be the main grad itself
// (GradsConfig::into_main_grad); kUndefinedSeparate is not, for a consumer that can only write, except
// the first buffer after declare_zeroed (then written: overwrite = true).
enum class GradInit { kZero, kUndefined, kUndefinedSeparate };

// `overwrite`: the rows hold garbage and the consumer must write (not add) its wgrad; true only for a
// buffer just handed out with GradInit::kUndefined or kUndefinedSeparate: libgtp's own, or a main grad
// declared zero (declare_zeroed). A buffer
// already handed out (the microbatches of accumulate_microbatches), an undeclared main grad and every kZero
// buffer are added into.
struct GradBuffer {
  float* data = nullptr;
  bool overwrite = false;
};

struct GradsStats {
  std::int64_t reduce_scatters = 0;
  std::int64_t grads_ready = 0;
  std::int64_t pool_buffers = 0;
  std::int64_t into_main_grad = 0;  // finalized grads that were added straight into the main grad
  std::int64_t zeroed_handouts = 0;  // main grads declared zero handed out as the buffer (no add at all)
  std::int64_t zeroed_copies = 0;    // reduced rows copied into a main grad declared zero (not added)
};

class Grads {
 public:
  Grads(Backend& backend, const Registry& registry, GradsConfig config)
      : backend_(backend), registry_(registry), config_(std::move(config)) {}
  ~Grads();
  Grads(const Grads&) = delete;
  Grads& operator=(const Grads&) = delete;

  // The weight's buffer (the one already handed out, if not yet reduced). Throws std::invalid_argument
  // for a weight without a main grad.
  GradBuffer buffer(WeightId id, Stream stream, GradInit init = GradInit::kZero);
  // Throws std::invalid_argument (nothing enqueued) if a weight has no buffer handed out.
  void finalize(const std::vector<WeightId>& ids, bool last_microbatch, Stream stream);
  void drain(Stream stream);
  // True while `id` has a buffer handed out or a reduction pending (unregister must wait for drain).
  bool busy(WeightId id) const;
  // The main grads of `ids` are zero (see the top). Throws std::invalid_argument, declaring nothing, for
  // a weight without a main grad or one that is busy. Weights without rows on this rank are skipped.
  void declare_zeroed(const std::vector<WeightId>& ids);
  // Drops a declaration not yet consumed (unregister, a buffer handed out under graph capture).
  void drop_declaration(WeightId id) { zeroed_.erase(id); }
  bool declared_zero(WeightId id) const { return zeroed_.count(id) != 0; }

  const GradsStats& stats() const { return stats_; }

 private:
  struct Pooled {
    float* ptr = nullptr;
    std::int64_t bytes = 0;
    Event ready = 0;  // after its last use: its reduce-scatter and main-grad add, on that group's stream
    bool main_grad = false;  // the weight's main grad handed out as its buffer: not pooled, not owned
    bool copy = false;       // the main grad was declared zero: the reduced rows are copied, not added
  };
  struct Pending {
    WeightId id = kNoWeight;
    Pooled reduced;  // the grad buffer, its shard rows reduced in place
  };
  // Pool buffers are shared by every group: `stream` (the consumer's) waits on the buffer's last use.
  Pooled take(std::int64_t bytes, Stream stream);
  void give_back(Pooled buffer, Stream stream);
  Stream rs_stream(WeightId id) const;
  void apply_pending();
  void grad_ready(WeightId id, Stream rs);  // the callback (if any) on `rs`, counted
  float* shard_of(const Weight& weight, float* full) const;
  bool into_main_grad(const Weight& weight) const;

  Backend& backend_;
  const Registry& registry_;
  GradsConfig config_;
  std::multimap<std::int64_t, Pooled> pool_;  // free buffers by size
  std::map<WeightId, Pooled> handed_out_;
  std::vector<Pending> pending_;
  std::set<WeightId> zeroed_;  // main grads declared zero, until their next buffer
  GradsStats stats_;
};

}  // namespace gtp::remat
