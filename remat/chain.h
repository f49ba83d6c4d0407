// Chain: the order in which one (phase, model chunk) stream of materialize calls consumes weights.
// The first step records it; from the first drain on, every consume is verified against it. The
// chain knows nothing about memory: the runtime asks it which entries come next and prefetches them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "remat/registry.h"

namespace gtp::remat {

enum class Phase { kForward = 0, kBackward = 1, kRecompute = 2 };
std::string to_string(Phase phase);

// How materialized weights are laid out (docs/formats.md, "Unpack"). BF16: [rows, cols] row-major,
// padding stripped (bit-identical to the unsharded BF16 weight on the BF16 wire). GEMM: the GEMM-ready
// codes, scales, exact transpose and per-chunk decode scales (FP8, MXFP8, NVFP4); the BF16 weight on
// the BF16 wire.
enum class Layout { kBF16 = 0, kGemm = 1 };
std::string to_string(Layout layout);

// The expanded weights of one materialize call and the layout it asked for: the same weights in two
// layouts are two keys (two slots, two chain entries).
struct ChainKey {
  std::vector<WeightId> weights;
  Layout layout = Layout::kBF16;

  ChainKey() = default;
  ChainKey(std::vector<WeightId> ids, Layout l = Layout::kBF16) : weights(std::move(ids)), layout(l) {}
  ChainKey(std::initializer_list<WeightId> ids, Layout l = Layout::kBF16) : weights(ids), layout(l) {}
  bool operator==(const ChainKey& other) const { return layout == other.layout && weights == other.weights; }
  bool operator!=(const ChainKey& other) const { return !(*this == other); }
  auto begin() const { return weights.begin(); }
  auto end() const { return weights.end(); }
  std::size_t size() const { return weights.size(); }
  bool empty() const { return weights.empty(); }
  WeightId front() const { return weights.front(); }
  void clear() { weights.clear(); layout = Layout::kBF16; }
};

class Chain {
 public:
  struct Consume {
    bool verified = false;       // the chain was closed and `key` is the entry expected here
    std::int64_t position = -1;  // where `key` sits in the recorded order (-1: recording, or unknown)
  };

  bool recording() const { return recording_; }
  std::int64_t length() const { return static_cast<std::int64_t>(order_.size()); }
  // The entry expected next (after end_step: 0, the head of the next step).
  std::int64_t position() const { return position_; }
  std::int64_t mismatches() const { return mismatches_; }
  // The latest mismatch, in words (empty if none).
  const std::string& last_mismatch() const { return last_mismatch_; }

  // Records `key` (recording) or checks it against the entry at the current position. On a mismatch
  // the chain resynchronises: if `key` occurs later in the step the position jumps past it (entries
  // were skipped), otherwise the position stays (an extra entry, or one past the end of the step).
  Consume consume(const ChainKey& key);

  const ChainKey& at(std::int64_t position) const { return order_[position]; }

  // End of a step (drain): a recording chain with entries closes; a verified chain that stopped inside
  // the step counts a mismatch (one that was not used at all does not). The position returns to 0.
  void end_step();
  // Forgets the order (in-process model rebuild); the next step records again.
  void reset();

 private:
  void mismatch(const std::string& what);

  bool recording_ = true;
  std::vector<ChainKey> order_;
  std::int64_t position_ = 0;
  std::int64_t mismatches_ = 0;
  std::string last_mismatch_;
};

}  // namespace gtp::remat
