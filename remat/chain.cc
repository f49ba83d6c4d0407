#include "remat/chain.h"

#include <algorithm>

namespace gtp::remat {
namespace {

std::string describe(const ChainKey& key) {
  std::string out = "[";
  for (std::size_t i = 0; i < key.size(); ++i) out += (i ? "," : "") + std::to_string(key.weights[i]);
  return out + (key.layout == Layout::kBF16 ? "]" : "] as " + to_string(key.layout));
}

}  // namespace

std::string to_string(Layout layout) {
  switch (layout) {
    case Layout::kBF16: return "bf16";
    case Layout::kGemm: return "gemm";
  }
  return "layout " + std::to_string(static_cast<int>(layout));
}

std::string to_string(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kRecompute: return "recompute";
  }
  return "phase " + std::to_string(static_cast<int>(phase));
}

void Chain::mismatch(const std::string& what) {
  ++mismatches_;
  last_mismatch_ = what;
}

Chain::Consume Chain::consume(const ChainKey& key) {
  Consume result;
  if (recording_) {
    order_.push_back(key);
    return result;
  }
  if (position_ < length() && order_[position_] == key) {
    result.verified = true;
    result.position = position_++;
    return result;
  }
  if (position_ == length()) {
    mismatch("expected the end of the step after " + std::to_string(length()) + " entries, got " + describe(key));
    return result;
  }
  const auto later = std::find(order_.begin() + position_, order_.end(), key);
  mismatch("expected weights " + describe(order_[position_]) + " at position " + std::to_string(position_) +
           " of " + std::to_string(length()) + ", got " + describe(key));
  if (later != order_.end()) {
    result.position = later - order_.begin();
    position_ = result.position + 1;
  }
  return result;
}

void Chain::end_step() {
  if (recording_) {
    recording_ = order_.empty();
  } else if (position_ != 0 && position_ != length()) {
    mismatch("step ended at position " + std::to_string(position_) + " of " + std::to_string(length()));
  }
  position_ = 0;
}

void Chain::reset() {
  recording_ = true;
  order_.clear();
  position_ = 0;
}

}  // namespace gtp::remat
