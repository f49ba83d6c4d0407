// Chain: the order in which one (phase, model chunk) stream of materialize calls consumes weights.
// The first step records it; from the first drain on, every consume is verified against it. The
// chain knows nothing about memory: the runtime asks it which entries come next and prefetches them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/registry.h"

namespace gtp::remat {

enum class Phase { kForward = 0, kBackward = 1, kRecompute = 2 };
std::string to_string(Phase phase);

using ChainKey = std::vector<WeightId>;  // the expanded weights of one materialize call

class Chain {
 public:
  struct Consume {
    bool verified = false;       // the chain was closed and `key` is the entry expected here
    std::int64_t position = -1;  // where `key` sits in the recorded order (-1: recording, or unknown)
  };

  bool recording() const { return recording_; }
  std::int64_t length() const { return static_cast<std::int64_t>(order_.size()); }
  std::int64_t position() const { return position_; }
  std::int64_t mismatches() const { return mismatches_; }
  // The latest mismatch, in words (empty if none).
  const std::string& last_mismatch() const { return last_mismatch_; }

  // Records `key` (recording) or checks it against the entry at the current position. On a mismatch
  // the chain resynchronises: if `key` occurs later in the step the position jumps past it (entries
  // were skipped), otherwise the position stays (an extra entry, or one past the end of the step).
  Consume consume(const ChainKey& key);

  // The positions of the next `depth` entries from the current one, up to the end of the step (after
  // end_step the current position is the head of the next step). Empty while recording.
  std::vector<std::int64_t> upcoming(int depth) const;
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
