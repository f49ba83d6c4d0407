// C ABI call sequences on the host backend (one rank): each input is a program of register,
// unregister, shard_updated, materialize, release, grad_buffer, finalize, drain, reset_chains, stats,
// abort and destroy calls with chosen arguments, good and bad. A model of docs/c-abi.md predicts each
// call's status; a status outside the prediction is a finding (the process aborts, printing the call),
// as is a crash, a leak or undefined behaviour. A materialized BF16 weight on the BF16 wire must be
// bit-identical to its shard.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/thread_bootstrap.h"
#include "gtp/gtp.h"

namespace {

// Reads the program; past its end every read is 0.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  unsigned next() { return pos_ < size_ ? data_[pos_++] : 0u; }
  unsigned below(unsigned n) { return next() % n; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

struct Weight {
  gtp_weight_t handle{};
  bool registered = false;
  bool packed = false;            // shard_updated since register
  uint64_t version = 0;           // successful shard_updated calls naming it
  int uses = 0;                   // outstanding materializations that include it
  bool grad_out = false;          // grad buffer handed out, not finalized
  bool add_pending = false;       // finalized, not drained
  bool direct = false;            // the grad buffer is the main grad (G = 1, UNINITIALIZED): no add follows
  bool declared = false;          // main grad zeroed and declared (gtp_main_grads_zeroed), not yet consumed
  bool exact = false;             // BF16 shard on the BF16 wire: materialize returns its bits
  std::vector<uint16_t> shard;    // BF16 or FP32 (two halves) payload
  std::vector<float> main_grad;   // empty: no main grad
  int64_t rows = 0, cols = 0;
};

// An outstanding materialization: its weight list (in order), layout and the weights' versions then.
struct Use {
  std::vector<size_t> picks;
  int layout;
  std::vector<uint64_t> versions;
  // A use is found by its weights and layout; `versions` tells whether a re-pack came since.
  bool operator==(const Use& other) const { return picks == other.picks && layout == other.layout; }
};

// The bytes of a section: every one is read, so ASan checks the section's extent.
size_t section_bytes(const gtp_section_t& s) {
  switch (s.dtype) {
    case GTP_ELEM_BF16: return static_cast<size_t>(s.rows * s.ld) * 2;
    case GTP_ELEM_E2M1: return static_cast<size_t>(s.rows * s.ld) / 2;
    case GTP_ELEM_FP32: return static_cast<size_t>(s.rows * s.ld) * 4;
    default: return static_cast<size_t>(s.rows * s.ld);
  }
}

[[noreturn]] void finding(const std::string& call, gtp_status_t got, const std::string& expected, gtp_context_t* ctx) {
  std::fprintf(stderr, "FINDING: %s returned %s, docs/c-abi.md says %s; last error: %s\n", call.c_str(),
               gtp_status_string(got), expected.c_str(), ctx ? gtp_last_error(ctx) : gtp_last_error(nullptr));
  std::abort();
}

// GTP_FUZZ_TRACE=1 prints every call and its status (to replay a finding step by step).
const bool kTrace = std::getenv("GTP_FUZZ_TRACE") != nullptr;

void expect(const std::string& call, gtp_status_t got, gtp_status_t want, gtp_context_t* ctx) {
  if (kTrace) std::fprintf(stderr, "%s -> %s\n", call.c_str(), gtp_status_string(got));
  if (got != want) finding(call, got, gtp_status_string(want), ctx);
}

// Either of two statuses (where the docs leave the order of two checks open).
void expect_either(const std::string& call, gtp_status_t got, gtp_status_t a, gtp_status_t b, gtp_context_t* ctx) {
  if (kTrace) std::fprintf(stderr, "%s -> %s\n", call.c_str(), gtp_status_string(got));
  if (got != a && got != b) finding(call, got, std::string(gtp_status_string(a)) + " or " + gtp_status_string(b), ctx);
}

class Program {
 public:
  Program(Bytes* in, gtp_context_t* ctx) : in_(in), ctx_(ctx) {}

  void run() {
    while (!in_->empty() && ctx_ != nullptr) step();
    if (ctx_ != nullptr) expect("gtp_context_destroy", gtp_context_destroy(ctx_), GTP_SUCCESS, ctx_);
  }

 private:
  static constexpr size_t kMaxWeights = 8;

  void step() {
    switch (in_->below(13)) {
      case 0: register_weight(); break;
      case 1: unregister(); break;
      case 2: shard_updated(); break;
      case 3: materialize(); break;
      case 4: materialize_views(); break;
      case 5: release(); break;
      case 6: grad_buffer(); break;
      case 7: finalize(); break;
      case 8: drain(); break;
      case 9: call("gtp_reset_chains", gtp_reset_chains(ctx_), GTP_SUCCESS); break;
      case 10: stats(); break;
      case 11: main_grads_zeroed(); break;
      default: end(); break;
    }
  }

  // After gtp_context_abort every call but destroy is INVALID_STATE.
  void call(const std::string& name, gtp_status_t got, gtp_status_t want) {
    expect(name, got, aborted_ ? GTP_ERROR_INVALID_STATE : want, ctx_);
  }

  void register_weight() {
    if (weights_.size() >= kMaxWeights) return;
    static constexpr int64_t kRows[] = {16, 32, 33, 64, 1, 0, -1, int64_t{1} << 60};
    static constexpr int64_t kCols[] = {32, 64, 16, 17, 0, -5};
    Weight w;
    w.rows = kRows[in_->below(8)];
    w.cols = kCols[in_->below(6)];
    const unsigned dtype = in_->below(3);   // 2: not a dtype
    const int wire = static_cast<int>(in_->below(6)) - 1;  // -1 FROM_GROUP .. 3 NVFP4, 4: not a wire
    const bool with_grad = in_->below(2) != 0;
    const bool null_shard = in_->below(8) == 7;
    const bool sane_shape = w.rows >= 16 && w.rows <= 64 && w.rows % 16 == 0 && w.cols >= 32 && w.cols % 32 == 0;
    const bool bad_shape = w.rows < 0 || w.cols < 0 || w.rows > (int64_t{1} << 40);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = "w";
    desc.rows = w.rows;
    desc.cols = w.cols;
    desc.dtype = static_cast<gtp_dtype_t>(dtype);
    desc.wire = static_cast<gtp_wire_t>(wire);
    const size_t elements = sane_shape ? static_cast<size_t>(w.rows * w.cols) : 0;
    w.shard.resize(elements * (dtype == GTP_DTYPE_FP32 ? 2 : 1));
    for (size_t i = 0; i < w.shard.size(); ++i) w.shard[i] = static_cast<uint16_t>(0x3f80 + (i * 7 + weights_.size()) % 97);
    desc.shard = null_shard || !sane_shape ? nullptr : w.shard.data();
    if (with_grad && sane_shape) {
      w.main_grad.assign(elements, 0.0f);
      desc.main_grad = w.main_grad.data();
    }
    const bool bad_enum = dtype > 1 || wire > 3;
    const gtp_status_t got = gtp_weight_register(ctx_, &desc, &w.handle);
    const std::string name = "gtp_weight_register(rows=" + std::to_string(w.rows) + ", cols=" + std::to_string(w.cols) +
                             ", dtype=" + std::to_string(dtype) + ", wire=" + std::to_string(wire) +
                             (desc.shard ? "" : ", shard=NULL") + ")";
    if (aborted_) return expect(name, got, GTP_ERROR_INVALID_STATE, ctx_);
    if (bad_enum || bad_shape || (sane_shape && null_shard)) return expect(name, got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (sane_shape) expect(name, got, GTP_SUCCESS, ctx_);
    else expect_either(name, got, GTP_SUCCESS, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (got != GTP_SUCCESS) return;
    w.registered = true;
    w.exact = dtype == GTP_DTYPE_BF16 && (wire == GTP_WIRE_BF16 || wire == GTP_WIRE_FROM_GROUP);
    weights_.push_back(std::move(w));
  }

  // A weight list: picks of registered (or unregistered) weights, sometimes one twice, sometimes a
  // handle never issued.
  std::vector<size_t> pick(bool* forged) {
    *forged = false;
    std::vector<size_t> out;
    if (weights_.empty()) return out;
    const unsigned n = 1 + in_->below(3);
    for (unsigned i = 0; i < n; ++i) out.push_back(in_->below(static_cast<unsigned>(weights_.size())));
    *forged = in_->below(16) == 15;
    return out;
  }

  std::vector<gtp_weight_t> handles(const std::vector<size_t>& picks, bool forged) {
    std::vector<gtp_weight_t> out;
    for (size_t i : picks) out.push_back(weights_[i].handle);
    if (forged) out.push_back(gtp_weight_t{999, weights_.empty() ? 1 : weights_[0].handle.generation});
    return out;
  }

  static bool repeats(const std::vector<size_t>& picks) {
    return std::set<size_t>(picks.begin(), picks.end()).size() != picks.size();
  }

  std::vector<uint64_t> versions(const std::vector<size_t>& picks) const {
    std::vector<uint64_t> out;
    for (size_t i : picks) out.push_back(weights_[i].version);
    return out;
  }

  // The same weights held in `layout` by a use from before a shard_updated of any of them: its buffer
  // has the old shards, so materializing them again is refused (docs/c-abi.md).
  bool held_from_before_repack(const std::vector<size_t>& picks, bool forged, int layout) const {
    if (forged) return false;
    auto use = std::find(held_.begin(), held_.end(), Use{picks, layout, {}});
    return use != held_.end() && use->versions != versions(picks);
  }

  bool any_stale(const std::vector<size_t>& picks, bool forged) const {
    if (forged) return true;
    for (size_t i : picks)
      if (!weights_[i].registered) return true;
    return false;
  }

  void unregister() {
    if (weights_.empty()) return;
    Weight& w = weights_[in_->below(static_cast<unsigned>(weights_.size()))];
    const gtp_status_t got = gtp_weight_unregister(ctx_, w.handle);
    const bool busy = w.uses > 0 || w.grad_out || w.add_pending;
    call("gtp_weight_unregister", got, !w.registered || busy ? GTP_ERROR_INVALID_STATE : GTP_SUCCESS);
    if (got == GTP_SUCCESS) {
      w.registered = false;
      w.declared = false;
    }
  }

  void shard_updated() {
    bool forged;
    const std::vector<size_t> picks = pick(&forged);
    if (picks.empty()) return;
    const std::vector<gtp_weight_t> ws = handles(picks, forged);
    const gtp_status_t got = gtp_weights_shard_updated(ctx_, ws.data(), ws.size(), nullptr);
    if (aborted_) return call("gtp_weights_shard_updated", got, GTP_ERROR_INVALID_STATE);
    const bool stale = any_stale(picks, forged), twice = repeats(picks);
    if (stale && twice) return expect_either("gtp_weights_shard_updated", got, GTP_ERROR_INVALID_STATE, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (stale) return expect("gtp_weights_shard_updated", got, GTP_ERROR_INVALID_STATE, ctx_);
    if (twice) return expect("gtp_weights_shard_updated", got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    expect("gtp_weights_shard_updated", got, GTP_SUCCESS, ctx_);
    for (size_t i : picks) {
      weights_[i].packed = true;
      ++weights_[i].version;
    }
  }

  void materialize() {
    bool forged;
    const std::vector<size_t> picks = pick(&forged);
    if (picks.empty()) return;
    const std::vector<gtp_weight_t> ws = handles(picks, forged);
    const unsigned phase = in_->below(4);                  // 3: not a phase
    const int chunk = in_->below(16) == 15 ? 1024 : static_cast<int>(in_->below(3));
    const bool short_capacity = in_->below(16) == 15;
    std::vector<void*> ptrs(ws.size(), nullptr);
    size_t count = 0;
    const gtp_status_t got = gtp_materialize(ctx_, ws.data(), ws.size(), static_cast<gtp_phase_t>(phase), chunk,
                                             GTP_LAYOUT_BF16, ptrs.data(), ptrs.size() - (short_capacity ? 1 : 0),
                                             &count, nullptr);
    const std::string name = "gtp_materialize(n=" + std::to_string(ws.size()) + ", phase=" + std::to_string(phase) +
                             ", model_chunk=" + std::to_string(chunk) + (short_capacity ? ", short capacity" : "") + ")";
    if (aborted_) return call(name, got, GTP_ERROR_INVALID_STATE);
    bool unpacked = false;  // call-order misuse ("never packed: call shard_updated after register")
    for (size_t i : picks) unpacked |= i < weights_.size() && !weights_[i].packed;
    const bool misuse = any_stale(picks, forged) || unpacked;
    const bool bad_argument = repeats(picks) || phase > 2 || chunk > 1023 || short_capacity ||
                              held_from_before_repack(picks, forged, GTP_LAYOUT_BF16);
    if (misuse && bad_argument) return expect_either(name, got, GTP_ERROR_INVALID_STATE, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (misuse) return expect(name, got, GTP_ERROR_INVALID_STATE, ctx_);
    if (bad_argument) return expect(name, got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    expect(name, got, GTP_SUCCESS, ctx_);
    if (count != ws.size()) finding(name + " out_count " + std::to_string(count), got, "one pointer per weight", ctx_);
    held_.push_back(Use{picks, GTP_LAYOUT_BF16, versions(picks)});
    for (size_t k = 0; k < picks.size(); ++k) {
      Weight& w = weights_[picks[k]];
      ++w.uses;
      if (w.exact && std::memcmp(ptrs[k], w.shard.data(), w.shard.size() * sizeof(uint16_t)) != 0) {
        finding(name + ": the BF16 weight differs from its shard", got, "bit-identical data", ctx_);
      }
    }
  }

  // gtp_materialize_views in either layout (2: not a layout), sometimes with a wrong struct_size.
  void materialize_views() {
    bool forged;
    const std::vector<size_t> picks = pick(&forged);
    if (picks.empty()) return;
    const std::vector<gtp_weight_t> ws = handles(picks, forged);
    const unsigned layout = in_->below(3);
    const bool bad_struct = in_->below(16) == 15;
    std::vector<gtp_materialized_t> out(ws.size(), GTP_MATERIALIZED_INITIALIZER);
    if (bad_struct) out.back().struct_size = 8;
    size_t count = 0;
    const gtp_status_t got = gtp_materialize_views(ctx_, ws.data(), ws.size(), GTP_PHASE_BACKWARD, 0,
                                                   static_cast<gtp_layout_t>(layout == 2 ? 5 : layout), out.data(),
                                                   out.size(), &count, nullptr);
    const std::string name = "gtp_materialize_views(n=" + std::to_string(ws.size()) + ", layout=" +
                             std::to_string(layout) + (bad_struct ? ", a wrong struct_size" : "") + ")";
    if (aborted_) return call(name, got, GTP_ERROR_INVALID_STATE);
    bool unpacked = false;
    for (size_t i : picks) unpacked |= !weights_[i].packed;
    const bool misuse = any_stale(picks, forged) || unpacked;
    const bool bad_argument = repeats(picks) || layout == 2 || bad_struct ||
                              (layout < 2 && held_from_before_repack(picks, forged, static_cast<int>(layout)));
    if (misuse && bad_argument) return expect_either(name, got, GTP_ERROR_INVALID_STATE, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (misuse) return expect(name, got, GTP_ERROR_INVALID_STATE, ctx_);
    if (bad_argument) return expect(name, got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    expect(name, got, GTP_SUCCESS, ctx_);
    if (count != ws.size()) finding(name + " out_count " + std::to_string(count), got, "one view per weight", ctx_);
    held_.push_back(Use{picks, static_cast<int>(layout), versions(picks)});
    for (size_t k = 0; k < picks.size(); ++k) {
      Weight& w = weights_[picks[k]];
      ++w.uses;
      const gtp_materialized_t& v = out[k];
      if (v.rows != w.rows || v.cols != w.cols || v.data.ptr == nullptr) {
        finding(name + ": view " + std::to_string(k) + " has shape " + std::to_string(v.rows) + " x " +
                    std::to_string(v.cols) + (v.data.ptr ? "" : " and no data"), got, "the weight's shape", ctx_);
      }
      unsigned sum = 0;
      for (const gtp_section_t* section : {&v.data, &v.scales, &v.data_t, &v.scales_t, &v.decode_scales}) {
        const auto* bytes = static_cast<const unsigned char*>(section->ptr);
        for (size_t b = 0; bytes && b < section_bytes(*section); ++b) sum += bytes[b];
      }
      (void)sum;
      if (w.exact && v.layout == GTP_LAYOUT_BF16 &&
          std::memcmp(v.data.ptr, w.shard.data(), w.shard.size() * sizeof(uint16_t)) != 0) {
        finding(name + ": the BF16 view differs from its shard", got, "bit-identical data", ctx_);
      }
    }
  }

  // gtp_release (mode 0, 1) or gtp_release_layout in BF16 (2), GEMM (3) or a layout that is none (4).
  void release() {
    bool forged;
    const std::vector<size_t> picks = pick(&forged);
    if (picks.empty()) return;
    const std::vector<gtp_weight_t> ws = handles(picks, forged);
    const unsigned mode = in_->below(5);
    const int layout = mode < 2 ? -1 : mode == 4 ? 7 : static_cast<int>(mode) - 2;
    const gtp_status_t got = layout < 0 ? gtp_release(ctx_, ws.data(), ws.size(), nullptr)
                                        : gtp_release_layout(ctx_, ws.data(), ws.size(),
                                                             static_cast<gtp_layout_t>(layout), nullptr);
    const std::string name = layout < 0 ? "gtp_release" : "gtp_release_layout(" + std::to_string(layout) + ")";
    if (aborted_) return call(name, got, GTP_ERROR_INVALID_STATE);
    const bool stale = any_stale(picks, forged);
    const bool bad_argument = repeats(picks) || layout == 7;
    // A release names exactly the weights of one outstanding materialize, in its order; a plain
    // release is refused when they are held in both layouts.
    auto bf16 = forged ? held_.end() : std::find(held_.begin(), held_.end(), Use{picks, GTP_LAYOUT_BF16, {}});
    auto gemm = forged ? held_.end() : std::find(held_.begin(), held_.end(), Use{picks, GTP_LAYOUT_GEMM, {}});
    auto use = layout == GTP_LAYOUT_BF16 ? bf16 : layout == GTP_LAYOUT_GEMM ? gemm : bf16 != held_.end() ? bf16 : gemm;
    const bool misuse = stale || use == held_.end() || (layout < 0 && bf16 != held_.end() && gemm != held_.end());
    if (bad_argument && misuse) return expect_either(name, got, GTP_ERROR_INVALID_STATE, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (bad_argument) return expect(name, got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (misuse) return expect(name, got, GTP_ERROR_INVALID_STATE, ctx_);
    expect(name, got, GTP_SUCCESS, ctx_);
    held_.erase(use);
    for (size_t i : picks) --weights_[i].uses;
  }

  void grad_buffer() {
    if (weights_.empty()) return;
    Weight& w = weights_[in_->below(static_cast<unsigned>(weights_.size()))];
    const uint32_t flags = in_->below(5);  // 0..3 defined combinations, 4: an unknown bit
    gtp_grad_buffer_t out = GTP_GRAD_BUFFER_INITIALIZER;
    const bool null_out = in_->below(16) == 15;
    const gtp_status_t got = gtp_grad_buffer_ex(ctx_, w.handle, flags, null_out ? nullptr : &out, nullptr);
    const std::string name = "gtp_grad_buffer_ex(flags=" + std::to_string(flags) + (null_out ? ", out=NULL" : "") + ")";
    if (aborted_) return call(name, got, GTP_ERROR_INVALID_STATE);
    const bool bad_argument = null_out || flags == 4 || flags == GTP_GRAD_BUFFER_SEPARATE || w.main_grad.empty();
    if (!w.registered && bad_argument) return expect_either(name, got, GTP_ERROR_INVALID_STATE, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (!w.registered) return expect(name, got, GTP_ERROR_INVALID_STATE, ctx_);
    if (bad_argument) return expect(name, got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    expect(name, got, GTP_SUCCESS, ctx_);
    // The whole FP32 rows x cols buffer is the caller's: touch every element (ASan checks the bounds).
    if (!out.overwrite && flags == 0 && !w.grad_out) {
      for (int64_t i = 0; i < w.rows * w.cols; ++i)
        if (out.data[i] != 0.0f) finding(name + ": a new buffer is not zero-filled", got, "zeros", ctx_);
    }
    for (int64_t i = 0; i < w.rows * w.cols; ++i) out.data[i] = out.overwrite ? 1.0f : out.data[i] + 1.0f;
    // On one rank an uninitialized buffer is the main grad itself (docs/c-abi.md, gtp_grad_buffer_ex).
    // After gtp_main_grads_zeroed the first buffer is the main grad whatever the flags.
    if (!w.grad_out) w.direct = w.declared || flags == GTP_GRAD_BUFFER_UNINITIALIZED;
    w.declared = false;
    w.grad_out = true;
  }

  // gtp_main_grads_zeroed over a weight list or (n = 0) every weight with a main grad, after zeroing
  // those main grads as a caller does (only when none is busy: libgtp may still write a busy one).
  void main_grads_zeroed() {
    const bool all = in_->below(4) == 0;
    bool forged = false;
    const std::vector<size_t> picks = all ? std::vector<size_t>{} : pick(&forged);
    if (!all && picks.empty()) return;
    std::vector<size_t> listed = picks;
    if (all) {
      for (size_t i = 0; i < weights_.size(); ++i)
        if (weights_[i].registered && !weights_[i].main_grad.empty()) listed.push_back(i);
    }
    bool busy = false, no_grad = false;
    for (size_t i : listed) {
      const Weight& w = weights_[i];
      if (!w.registered) continue;
      busy |= w.grad_out || w.add_pending;
      no_grad |= w.main_grad.empty() && w.rows > 0;
    }
    if (!busy && !aborted_) {
      for (size_t i : listed) std::fill(weights_[i].main_grad.begin(), weights_[i].main_grad.end(), 0.0f);
    }
    const std::vector<gtp_weight_t> ws = handles(picks, forged);
    const gtp_status_t got = gtp_main_grads_zeroed(ctx_, all ? nullptr : ws.data(), all ? 0 : ws.size());
    const std::string name = "gtp_main_grads_zeroed(n=" + std::to_string(all ? 0 : ws.size()) + ")";
    if (aborted_) return call(name, got, GTP_ERROR_INVALID_STATE);
    const bool stale = !all && any_stale(picks, forged), twice = !all && repeats(picks);
    if (stale && twice) return expect_either(name, got, GTP_ERROR_INVALID_STATE, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (stale) return expect(name, got, GTP_ERROR_INVALID_STATE, ctx_);
    if (twice || no_grad) return expect(name, got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (busy) return expect(name, got, GTP_ERROR_INVALID_STATE, ctx_);
    expect(name, got, GTP_SUCCESS, ctx_);
    for (size_t i : listed) weights_[i].declared = !weights_[i].main_grad.empty();
  }

  void finalize() {
    bool forged;
    const std::vector<size_t> picks = pick(&forged);
    if (picks.empty()) return;
    const std::vector<gtp_weight_t> ws = handles(picks, forged);
    const gtp_status_t got = gtp_finalize(ctx_, ws.data(), ws.size(), 1, nullptr);
    if (aborted_) return call("gtp_finalize", got, GTP_ERROR_INVALID_STATE);
    const bool stale = any_stale(picks, forged), twice = repeats(picks);
    bool no_buffer = false;
    for (size_t i : picks) no_buffer |= !weights_[i].grad_out;
    if (twice && (stale || no_buffer)) return expect_either("gtp_finalize", got, GTP_ERROR_INVALID_STATE, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (twice) return expect("gtp_finalize", got, GTP_ERROR_INVALID_ARGUMENT, ctx_);
    if (stale || no_buffer) return expect("gtp_finalize", got, GTP_ERROR_INVALID_STATE, ctx_);
    expect("gtp_finalize", got, GTP_SUCCESS, ctx_);
    for (size_t i : picks) {
      weights_[i].grad_out = false;
      weights_[i].add_pending = !weights_[i].direct;
    }
  }

  void drain() {
    const uint32_t flags = in_->below(5);  // DEFER_HEAD | MIDSTEP combined, or 4: an unknown bit
    const gtp_status_t got = gtp_drain_ex(ctx_, flags, nullptr);
    call("gtp_drain_ex(flags=" + std::to_string(flags) + ")", got, flags > 3 ? GTP_ERROR_INVALID_ARGUMENT : GTP_SUCCESS);
    if (got == GTP_SUCCESS)
      for (Weight& w : weights_) w.add_pending = false;
  }

  void stats() {
    size_t len = 0;
    const gtp_status_t sized = gtp_stats_json(ctx_, nullptr, 0, &len);
    call("gtp_stats_json(cap=0)", sized, GTP_ERROR_INVALID_ARGUMENT);
    if (aborted_) return;
    std::vector<char> text(len + 1);
    call("gtp_stats_json", gtp_stats_json(ctx_, text.data(), text.size(), &len), GTP_SUCCESS);
    if (!nlohmann::json::accept(text.data())) finding("gtp_stats_json: not JSON", GTP_SUCCESS, "JSON text", ctx_);
  }

  void end() {
    if (in_->below(2) == 0 && !aborted_) {
      expect("gtp_context_abort", gtp_context_abort(ctx_), GTP_SUCCESS, ctx_);
      aborted_ = true;
      return;
    }
    expect("gtp_context_destroy", gtp_context_destroy(ctx_), GTP_SUCCESS, nullptr);
    ctx_ = nullptr;
    // Handles of a destroyed context are stale; the program ends here.
  }

  Bytes* in_;
  gtp_context_t* ctx_;
  bool aborted_ = false;
  std::vector<Weight> weights_;
  std::vector<Use> held_;  // outstanding materializations
};

// The bootstrap vtable over a ThreadBootstrap of one rank.
gtp_bootstrap_result_t guarded(const std::function<void()>& body) {
  try {
    body();
    return GTP_BOOTSTRAP_OK;
  } catch (...) {
    return GTP_BOOTSTRAP_ERROR;
  }
}

gtp_bootstrap_callbacks_t callbacks_for(gtp::comm::Bootstrap* bootstrap) {
  gtp_bootstrap_callbacks_t c{};
  c.struct_size = sizeof(c);
  c.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  c.rank = bootstrap->rank();
  c.world_size = bootstrap->world_size();
  c.user_data = bootstrap;
  c.allgather = [](void* u, const void* send, void* recv, size_t bytes, int64_t) {
    return guarded([&] { static_cast<gtp::comm::Bootstrap*>(u)->allgather(send, recv, bytes); });
  };
  c.broadcast = [](void* u, void* buffer, size_t bytes, int32_t root, int64_t) {
    return guarded([&] { static_cast<gtp::comm::Bootstrap*>(u)->broadcast(buffer, bytes, root); });
  };
  c.barrier = [](void* u, int64_t) { return guarded([&] { static_cast<gtp::comm::Bootstrap*>(u)->barrier(); }); };
  return c;
}

// The input's last byte picks the create config: a good one (prefetch depth 0..3, microbatch
// accumulation on or off) or one bad field, whose status is checked before the program ends.
gtp_context_t* create(unsigned mode, const gtp_bootstrap_callbacks_t& callbacks) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.prefetch_depth = static_cast<int32_t>(mode % 4);
  config.accumulate_microbatches = static_cast<int32_t>(mode / 4 % 2);
  gtp_status_t want = GTP_ERROR_INVALID_ARGUMENT;
  std::string what;
  switch (mode % 16) {
    case 10: config.struct_size -= 4; what = "struct_size"; break;  // -8 is the 0.7.0 layout: valid
    case 11: config.header_version += 100; want = GTP_ERROR_VERSION; what = "header_version"; break;
    case 12: config.prefetch_depth = 65; what = "prefetch_depth=65"; break;
    case 13: config.timeout_ms = 0; what = "timeout_ms=0"; break;
    case 14: config.trace_spans = (size_t{1} << 24) + 1; what = "trace_spans=2^24+1"; break;
    case 15: config.profile_json = "{}"; config.profile_path = "p.json"; what = "profile_json and profile_path"; break;
    default: want = GTP_SUCCESS; what = "a good config"; break;
  }
  gtp_context_t* ctx = nullptr;
  expect("gtp_context_create(" + what + ")", gtp_context_create(&config, &ctx), want, nullptr);
  if (want != GTP_SUCCESS && ctx != nullptr) finding("gtp_context_create wrote *out on failure", want, "no context", nullptr);
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto group = gtp::comm::ThreadBootstrap::create_group(1, std::chrono::milliseconds(10000));
  const gtp_bootstrap_callbacks_t callbacks = callbacks_for(group[0].get());
  gtp_context_t* ctx = create(size > 0 ? data[size - 1] : 0u, callbacks);
  if (ctx == nullptr) return 0;
  Bytes in(data, size > 0 ? size - 1 : 0);
  Program(&in, ctx).run();
  return 0;
}
