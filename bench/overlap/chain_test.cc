// gtp-overlap-bench's step (run_step + GtpWeights) against the real runtime on the host backend,
// one rank, with CPU GEMMs: the same call sequence the benchmark makes on the GPU.
#include "bench/overlap/chain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bindings/c/internal/test_ranks.h"
#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
namespace gtp::bench::overlap {
namespace {

float from_bf16(std::uint16_t v) {
  const std::uint32_t bits = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
std::uint16_t to_bf16(float f) {  // truncation: deterministic, the same on both sides of the test
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<std::uint16_t>(bits >> 16);
}

// The chain on the CPU: BF16 activations, FP32 accumulation in a fixed order. Checks that every
// weight a GEMM reads is bit-identical to the original.
class HostOps : public ChainOps {
 public:
  HostOps(const Options& o, std::int64_t m, const std::vector<std::vector<std::uint16_t>>& originals)
      : o_(o), m_(m), originals_(originals) {
    for (int i = 0; i <= o.layers; ++i) {
      const std::int64_t width =
          i < o.layers ? layer_shape(o, i).in_features : layer_shape(o, o.layers - 1).out_features;
      std::vector<std::uint16_t> x(static_cast<size_t>(m * width));
      for (size_t j = 0; j < x.size(); ++j) x[j] = to_bf16(static_cast<float>(static_cast<int>(j % 3) - 1));
      x_.push_back(x);
    }
    dy_out_ = x_.back();
    dx_[0].resize(static_cast<size_t>(m * std::max(o.n, o.k)));
    dx_[1] = dx_[0];
  }
  void mark() override { ++marks; }
  void forward(int l, const void* w) override {
    const LayerShape s = check(l, w);
    const auto* wt = static_cast<const std::uint16_t*>(w);
    for (std::int64_t r = 0; r < m_; ++r)
      for (std::int64_t c = 0; c < s.out_features; ++c) {
        float acc = 0;
        for (std::int64_t k = 0; k < s.in_features; ++k)
          acc += from_bf16(x_[l][r * s.in_features + k]) * from_bf16(wt[c * s.in_features + k]);
        x_[l + 1][r * s.out_features + c] = to_bf16(acc);
      }
  }
  void dgrad(int l, const void* w) override {
    const LayerShape s = check(l, w);
    const auto* wt = static_cast<const std::uint16_t*>(w);
    const std::uint16_t* d = dy(l);
    for (std::int64_t r = 0; r < m_; ++r)
      for (std::int64_t k = 0; k < s.in_features; ++k) {
        float acc = 0;
        for (std::int64_t c = 0; c < s.out_features; ++c)
          acc += from_bf16(d[r * s.out_features + c]) * from_bf16(wt[c * s.in_features + k]);
        dx_[l % 2][r * s.in_features + k] = to_bf16(acc);
      }
  }
  void wgrad(int l, GradTarget grad) override {
    const LayerShape s = layer_shape(o_, l);
    overwrites += grad.overwrite ? 1 : 0;
    const std::uint16_t* d = dy(l);
    for (std::int64_t c = 0; c < s.out_features; ++c)
      for (std::int64_t k = 0; k < s.in_features; ++k) {
        float acc = 0;
        for (std::int64_t r = 0; r < m_; ++r)
          acc += from_bf16(d[r * s.out_features + c]) * from_bf16(x_[l][r * s.in_features + k]);
        float& out = grad.data[c * s.in_features + k];
        out = grad.overwrite ? acc : out + acc;  // beta = 0 or 1
      }
  }
  int marks = 0;
  int wrong_weights = 0;
  int overwrites = 0;  // wgrads written (beta = 0) rather than added

 private:
  LayerShape check(int l, const void* w) {
    const std::vector<std::uint16_t>& original = originals_[static_cast<size_t>(l)];
    if (std::memcmp(w, original.data(), original.size() * 2) != 0) ++wrong_weights;
    return layer_shape(o_, l);
  }
  const std::uint16_t* dy(int l) const { return l == o_.layers - 1 ? dy_out_.data() : dx_[(l + 1) % 2].data(); }

  const Options& o_;
  std::int64_t m_;
  const std::vector<std::vector<std::uint16_t>>& originals_;
  std::vector<std::vector<std::uint16_t>> x_;
  std::vector<std::uint16_t> dy_out_;
  std::vector<std::uint16_t> dx_[2];
};

// The reference: resident weights; a grad buffer zeroed when first handed out (every wgrad added) and added into the
// main grad at the last microbatch's finalize (then handed out fresh again), as the runtime does
// with one rank (mean over G = 1).
class HostResident : public WeightSource {
 public:
  explicit HostResident(const std::vector<std::vector<std::uint16_t>>& weights) : weights_(weights) {
    for (const auto& w : weights) {
      buffers_.emplace_back(w.size(), 0.0f);
      main.emplace_back(w.size(), 0.0f);
    }
    handed_out_.assign(weights.size(), false);
  }
  const void* acquire(int l, gtp_phase_t) override { return weights_[static_cast<size_t>(l)].data(); }
  void release(int) override {}
  GradTarget grad(int l) override {
    auto& b = buffers_[static_cast<size_t>(l)];
    if (!handed_out_[static_cast<size_t>(l)]) std::fill(b.begin(), b.end(), 0.0f);
    handed_out_[static_cast<size_t>(l)] = true;
    return GradTarget{b.data(), false};
  }
  void finalize(int l, bool last) override {
    if (!last) return;
    auto& m = main[static_cast<size_t>(l)];
    for (size_t j = 0; j < m.size(); ++j) m[j] += buffers_[static_cast<size_t>(l)][j];
    handed_out_[static_cast<size_t>(l)] = false;
  }
  void end_step() override {}
  std::vector<std::vector<float>> main;

 private:
  const std::vector<std::vector<std::uint16_t>>& weights_;
  std::vector<std::vector<float>> buffers_;
  std::vector<bool> handed_out_;
};

struct Case {
  int world;  // ranks (threads); G = world
  int depth;
  int microbatches;
  bool keep = false;    // keep_gathered
  bool repack = false;  // re-pack between steps (GtpWeights::between_steps), as after an optimizer step
  bool into_main_grad = true;  // grads_into_main_grad (acts at world 1 only)
};

class ChainOnHostBackend : public ::testing::TestWithParam<Case> {};

TEST_P(ChainOnHostBackend, WeightsExactMainGradsMatchPrefetchHits) {
  const Case param = GetParam();
  Options o;
  o.n = 64;
  o.k = 32;
  o.layers = 3;
  o.microbatches = param.microbatches;
  const std::int64_t m = 4;
  const int steps = 3;
  std::vector<std::vector<std::uint16_t>> weights;
  std::vector<LayerShape> shapes;
  for (int l = 0; l < o.layers; ++l) {
    shapes.push_back(layer_shape(o, l));
    std::vector<std::uint16_t> w(static_cast<size_t>(o.n * o.k));
    for (size_t j = 0; j < w.size(); ++j)
      w[j] = to_bf16(0.25f * static_cast<float>(static_cast<int>((j * 7 + l) % 5) - 2));
    weights.push_back(w);
  }
  // The reference: every rank computes the same wgrads, so their mean over G is the same value.
  HostOps ref_ops(o, m, weights);
  HostResident reference(weights);
  for (int step = 0; step < steps; ++step) run_step(o.layers, o.microbatches, reference, ref_ops);

  auto rank_body = [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
    config.callbacks = &callbacks;
    config.backend = GTP_BACKEND_HOST;
    config.accumulate_microbatches = o.microbatches > 1;
    GtpWeights gtp(config, param.world, "high", param.depth, kernels::WireFormat::kBF16, shapes, nullptr,
                   GroupSwitches{param.keep, param.into_main_grad}, param.repack);
    // One rank with grads_into_main_grad: each wgrad buffer is the main grad, always added into.
    const bool direct = param.world == 1 && param.into_main_grad;
    std::vector<std::vector<float>> main_grads;
    std::vector<const void*> shards;
    std::vector<float*> main_ptrs;
    std::vector<GtpWeights::Rows> held;
    for (int l = 0; l < o.layers; ++l) {
      const GtpWeights::Rows rows = gtp.rows(l);
      const std::int64_t cols = shapes[static_cast<size_t>(l)].in_features;
      EXPECT_EQ(rows.count, shapes[static_cast<size_t>(l)].out_features / param.world);  // no padding here
      EXPECT_EQ(rows.first, rank * rows.count);
      held.push_back(rows);
      shards.push_back(weights[static_cast<size_t>(l)].data() + rows.first * cols);
      main_grads.emplace_back(static_cast<size_t>(rows.count * cols), 0.0f);
      main_ptrs.push_back(main_grads.back().data());
    }
    gtp.register_and_pack(shards, main_ptrs);

    HostOps ops(o, m, weights);
    for (int step = 0; step < steps; ++step) {
      if (step > 0) gtp.between_steps();
      run_step(o.layers, o.microbatches, gtp, ops);
    }

    EXPECT_EQ(ops.wrong_weights, 0) << "rank " << rank;
    // Written once per weight per step (the first microbatch; later ones add). The runtime's pool hands
    // back the previous step's reduced buffer, so a wgrad added instead of written shows in main grads.
    EXPECT_EQ(ops.overwrites, direct ? 0 : steps * o.layers) << "rank " << rank;
    EXPECT_EQ(ops.marks, static_cast<int>(marks_per_step(o.layers, o.microbatches)) * steps);
    for (int l = 0; l < o.layers; ++l) {
      const std::int64_t cols = shapes[static_cast<size_t>(l)].in_features;
      const std::vector<float>& full = reference.main[static_cast<size_t>(l)];
      const std::vector<float> rows(
          full.begin() + held[static_cast<size_t>(l)].first * cols,
          full.begin() + (held[static_cast<size_t>(l)].first + held[static_cast<size_t>(l)].count) * cols);
      EXPECT_EQ(main_grads[static_cast<size_t>(l)], rows) << "rank " << rank << " layer " << l;
    }
    bool nonzero = false;
    for (float g : main_grads[0]) nonzero = nonzero || g != 0.0f;
    EXPECT_TRUE(nonzero) << "the test's gradients must not vanish";

    const nlohmann::json stats = nlohmann::json::parse(gtp.stats_json());
    const int calls = steps * o.microbatches * 2 * o.layers;
    EXPECT_EQ(stats["materialize"]["calls"].get<int>(), calls);
    EXPECT_EQ(stats["chains"]["mismatches"].get<int>(), 0) << stats["chains"].dump();
    // Once per weight per step; none when each wgrad went straight into its main grad.
    EXPECT_EQ(stats["grads"]["reduce_scatters"].get<int>(), direct ? 0 : steps * o.layers);
    EXPECT_EQ(stats["grads"]["into_main_grad"].get<int>(), direct ? steps * o.layers : 0);
    if (param.keep && !param.repack) {
      // Nothing re-packs between steps, so each weight is gathered once, by the recording step's first
      // forward, and every later consume reads its kept slot.
      EXPECT_EQ(stats["materialize"]["exposed_gathers"].get<int>(), o.layers) << stats.dump();
      EXPECT_EQ(stats["materialize"]["prefetches"].get<int>(), 0) << stats.dump();
      EXPECT_EQ(stats["materialize"]["kept_hits"].get<int>(), calls - o.layers) << stats.dump();
    } else if (param.keep) {
      // Each step's weights are new: each is gathered once a step (the recording step's on demand,
      // then prefetched, the head by the re-pack), every other consume reads the kept slot.
      const int gathers = steps * o.layers;
      EXPECT_EQ(stats["materialize"]["exposed_gathers"].get<int>(), param.depth > 0 ? o.layers : gathers)
          << stats.dump();
      EXPECT_EQ(stats["materialize"]["prefetch_hits"].get<int>(), param.depth > 0 ? gathers - o.layers : 0)
          << stats.dump();
      EXPECT_EQ(stats["materialize"]["kept_hits"].get<int>(), calls - gathers) << stats.dump();
      EXPECT_EQ(stats["materialize"]["stale_prefetches"].get<int>(), 0) << stats.dump();
    } else if (param.depth == 0) {
      EXPECT_EQ(stats["materialize"]["prefetch_hits"].get<int>(), 0);
      EXPECT_EQ(stats["materialize"]["exposed_gathers"].get<int>(), calls);
    } else {
      // The first step records the chains and the step schedule (all on demand). Later steps are
      // all prefetch hits: drain prefetches the step's head, and the schedule looks ahead across
      // every forward <-> backward switch (docs/remat.md, "Step schedule").
      const int exposed = o.microbatches * 2 * o.layers;
      EXPECT_EQ(stats["chains"]["schedule_mismatches"].get<int>(), 0);
      EXPECT_EQ(stats["materialize"]["exposed_gathers"].get<int>(), exposed);
      EXPECT_EQ(stats["materialize"]["prefetch_hits"].get<int>(), calls - exposed);
    }
    EXPECT_EQ(gtp.materialize_host_us().size(), static_cast<size_t>(calls));
  };
  if (param.world == 1) {
    const gtp_bootstrap_callbacks_t callbacks = one_rank_callbacks();
    rank_body(0, callbacks);
  } else {
    auto group = comm::ThreadBootstrap::create_group(param.world, std::chrono::milliseconds(30000));
    comm::internal::rethrow_first(comm::internal::run_ranks(
        param.world, [&](int rank) { rank_body(rank, cabi_test::callbacks_for(*group[static_cast<size_t>(rank)])); }));
  }
}

INSTANTIATE_TEST_SUITE_P(RanksDepthsAndMicrobatches, ChainOnHostBackend,
                         ::testing::Values(Case{1, 0, 1}, Case{1, 1, 1}, Case{1, 2, 1}, Case{1, 1, 2}, Case{1, 2, 3},
                                           Case{2, 0, 1}, Case{2, 1, 2}, Case{1, 1, 2, true}, Case{2, 0, 1, true},
                                           Case{2, 2, 3, true}, Case{1, 1, 2, true, true}, Case{2, 2, 3, true, true},
                                           Case{2, 0, 1, true, true}, Case{2, 1, 2, false, true},
                                           Case{1, 2, 3, false, false, false}, Case{1, 1, 2, true, true, false}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "world" + std::to_string(info.param.world) + "_depth" +
                                  std::to_string(info.param.depth) + "_mb" + std::to_string(info.param.microbatches) +
                                  (info.param.keep ? "_keep" : "") + (info.param.repack ? "_repack" : "") +
                                  (info.param.into_main_grad ? "" : "_buffers");
                         });

TEST(ChainSplit, PairsAreSummedByWhatTheyBracket) {
  // Mark i at time i: every pair spans 1, so the sums count the pairs.
  const int layers = 4, microbatches = 2;
  const StepSplit s = split_step(layers, microbatches, [](size_t a, size_t b) { return static_cast<double>(b) - a; });
  EXPECT_EQ(s.materialize, 2.0 * layers * microbatches);
  EXPECT_EQ(s.grad_buffer, 1.0 * layers * microbatches);
  EXPECT_EQ(s.end_step, 1.0);
  EXPECT_EQ(s.step, static_cast<double>(marks_per_step(layers, microbatches) - 1));
}

TEST(ChainSplit, MarksFollowTheCalls) {
  // A step's marks, labelled by the call between each pair, from a recording source.
  struct Log : WeightSource, ChainOps {
    std::vector<std::string> events;
    const void* acquire(int l, gtp_phase_t p) override {
      events.push_back((p == GTP_PHASE_FORWARD ? "F" : "B") + std::to_string(l));
      return nullptr;
    }
    void release(int) override {}
    GradTarget grad(int l) override {
      events.push_back("G" + std::to_string(l));
      return GradTarget{};
    }
    void finalize(int l, bool last) override { events.push_back(std::string(last ? "R" : "r") + std::to_string(l)); }
    void end_step() override { events.push_back("D"); }
    void mark() override { events.push_back("|"); }
    void forward(int, const void*) override {}
    void dgrad(int, const void*) override {}
    void wgrad(int, GradTarget) override {}
  } log;
  run_step(2, 2, log, log);
  // clang-format off
  const std::vector<std::string> expected = {
      "|",                                                                         // start
      "|", "F0", "|", "|", "F1", "|",                                              // microbatch 0 forward
      "|", "B1", "|", "|", "G1", "|", "r1", "|", "B0", "|", "|", "G0", "|", "r0",  // its backward
      "|", "F0", "|", "|", "F1", "|",                                              // microbatch 1 forward
      "|", "B1", "|", "|", "G1", "|", "R1", "|", "B0", "|", "|", "G0", "|", "R0",  // its backward
      "|", "D", "|",                                                               // drain
      "|"};                                                                        // end
  // clang-format on
  EXPECT_EQ(log.events, expected);
  size_t marks = 0;
  for (const std::string& e : log.events) marks += e == "|";
  EXPECT_EQ(marks, marks_per_step(2, 2));
}

}  // namespace
}  // namespace gtp::bench::overlap
