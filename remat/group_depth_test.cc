// Per-group prefetch depth and memory budget (docs/remat.md, Per-group depth and budget) on the host
// backend, ranks as threads over real UCX: a dense group (0: three layers) and an expert group (1: two
// keys of two experts each, as an MoE layer materializes them), interleaved along forward and backward
// chains over several steps. Every materialized weight is compared bit for bit with the unsharded one
// of its step; the hits, exposed gathers and slots of each group are predicted from its own depth.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "remat/host_backend.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

constexpr std::chrono::milliseconds kTimeout{60000};
constexpr int kDense = 0, kExpert = 1;

void on_ranks(int n, const std::function<void(comm::HostComm&)>& body) {
  auto group = comm::ThreadBootstrap::create_group(n, kTimeout);
  comm::internal::rethrow_first(comm::internal::run_ranks(n, [&](int rank) {
    comm::HostComm comm(*group[rank], kTimeout);
    body(comm);
  }));
}

template <typename Error>
void expect_error(const std::function<void()>& call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << text << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
  }
}

RuntimeConfig per_group(int dense_depth, std::int64_t dense_budget, int expert_depth, std::int64_t expert_budget) {
  RuntimeConfig config;
  config.groups = {{dense_depth, dense_budget, "dense"}, {expert_depth, expert_budget, "experts"}};
  return config;
}

// The model: keys 0..2 are the dense layers, 3 and 4 the expert keys (a leader and one expert each).
class GroupedModel {
 public:
  struct Shape {
    std::int64_t rows, cols;
    int group;
    int key;
  };
  static constexpr int kKeys = 5;

  GroupedModel(Runtime& runtime, comm::HostComm& comm) : runtime_(runtime), comm_(comm) {
    const Shape shapes[] = {{48, 32, kDense, 0}, {32, 48, kDense, 1}, {24, 32, kDense, 2},
                            {32, 32, kExpert, 3}, {32, 32, kExpert, 3}, {40, 32, kExpert, 4}, {40, 32, kExpert, 4}};
    for (const Shape& shape : shapes) {
      const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, shape.rows, shape.cols, comm.size());
      shapes_.push_back(shape);
      shards_.emplace_back(std::max<std::int64_t>(geometry.valid_rows(comm.rank()), 1) * shape.cols);
      WeightDesc desc;
      desc.name = "w" + std::to_string(ids_.size());
      desc.shard = shards_.back().data();
      desc.rows = shape.rows;
      desc.cols = shape.cols;
      desc.group = shape.group;
      const bool follows_leader = !ids_.empty() && shapes_[shapes_.size() - 2].key == shape.key;
      desc.expert_leader = follows_leader ? key_ids_[shape.key] : kNoWeight;
      ids_.push_back(runtime.register_weight(desc));
      if (!follows_leader) key_ids_.push_back(ids_.back());
    }
  }

  // The unsharded BF16 weight `w` of `step`: any bits (the BF16 wire moves them untouched).
  std::vector<std::uint16_t> full(int w, int step) const {
    std::mt19937 rng(1000 * w + step + 1);
    std::vector<std::uint16_t> out(shapes_[w].rows * shapes_[w].cols);
    for (std::uint16_t& v : out) v = static_cast<std::uint16_t>(rng());
    return out;
  }

  // The optimizer step: every shard takes the weights of `step`, re-packed collectively.
  void update(int step) {
    for (std::size_t w = 0; w < ids_.size(); ++w) {
      const auto geometry = runtime_.registry().get(ids_[w]).geometry;
      const auto weight = full(static_cast<int>(w), step);
      const std::int64_t first = comm_.rank() * geometry.shard_rows * shapes_[w].cols;
      const std::int64_t count = geometry.valid_rows(comm_.rank()) * shapes_[w].cols;
      std::copy(weight.begin() + first, weight.begin() + first + count, shards_[w].begin());
    }
    runtime_.shard_updated(key_ids_.data(), kKeys, nullptr);
    step_ = step;
  }

  // One consumer of `key`: materialize, compare every weight of the key with its full weight, release.
  void use(int key, Phase phase) {
    const auto out = runtime_.materialize(&key_ids_[key], 1, phase, 0, Layout::kBF16, nullptr);
    std::size_t i = 0;
    for (std::size_t w = 0; w < shapes_.size(); ++w) {
      if (shapes_[w].key != key) continue;
      ASSERT_LT(i, out.size());
      const auto weight = full(static_cast<int>(w), step_);
      EXPECT_EQ(std::memcmp(out[i++], weight.data(), weight.size() * 2), 0)
          << "weight " << w << " of key " << key << ", step " << step_ << ", rank " << comm_.rank();
    }
    EXPECT_EQ(i, out.size());
    runtime_.release(&key_ids_[key], 1, nullptr);
  }

  // One microbatch: forward d0 E0 d1 E1 d2, backward in reverse (6 dense, 4 expert consumes).
  void microbatch() {
    for (int key : {0, 3, 1, 4, 2}) use(key, Phase::kForward);
    for (int key : {2, 4, 1, 3, 0}) use(key, Phase::kBackward);
  }

  // The slot bytes of the group's largest key (its chunks gathered in place: BF16).
  std::int64_t largest(int group) const {
    std::int64_t largest = 0;
    for (int key = 0; key < kKeys; ++key) {
      std::int64_t bytes = 0;
      for (std::size_t w = 0; w < shapes_.size(); ++w) {
        if (shapes_[w].key != key || shapes_[w].group != group) continue;
        const Weight& weight = runtime_.registry().get(ids_[w]);
        bytes += weight.geometry.group_size * weight.layout.chunk_bytes + weight.output_bytes;
      }
      largest = std::max(largest, bytes);
    }
    return largest;
  }

  WeightId key_id(int key) const { return key_ids_[key]; }

 private:
  Runtime& runtime_;
  comm::HostComm& comm_;
  std::vector<Shape> shapes_;
  std::vector<std::vector<std::uint16_t>> shards_;
  std::vector<WeightId> ids_, key_ids_;
  int step_ = 0;
};

constexpr int kDenseConsumes = 6, kExpertConsumes = 4;  // per microbatch

// Peak and slot bytes of each group within (depth + 1) x its largest key, exactly depth + 1 slots.
void expect_group_bound(const Runtime& runtime, const GroupedModel& model, int group, const std::string& when) {
  const GroupStats s = runtime.group_stats(group);
  const std::int64_t bound = (s.config.depth + 1) * model.largest(group);
  EXPECT_LE(s.cache.peak_bytes, bound) << s.config.name << " " << when << ": " << runtime.stats_json();
  EXPECT_LE(s.cache.slot_bytes, bound) << s.config.name << " " << when;
  EXPECT_EQ(s.cache.slots, s.config.depth + 1) << s.config.name << " " << when << ": " << runtime.stats_json();
}

struct Depths {
  int dense, expert;
};

class PerGroupDepth : public ::testing::TestWithParam<Depths> {};

TEST_P(PerGroupDepth, EachGroupPrefetchesItsOwnDepthAlongTheSchedule) {
  const Depths depths = GetParam();
  constexpr int kSteps = 4, kMicrobatches = 2;
  on_ranks(2, [&](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});  // both groups over one communicator, as the C ABI when their families coincide
    Runtime runtime(backend, per_group(depths.dense, 0, depths.expert, 0));
    GroupedModel model(runtime, comm);
    std::int64_t warm_allocations = 0;
    for (int step = 0; step < kSteps; ++step) {
      model.update(step);
      for (int mb = 0; mb < kMicrobatches; ++mb) model.microbatch();
      runtime.drain(nullptr);
      if (step == 1) warm_allocations = backend.memory().allocations;
      if (step > 1) {
        EXPECT_EQ(backend.memory().allocations, warm_allocations) << "step " << step;
      }
    }
    for (const auto& [group, depth, consumes] : {std::tuple{kDense, depths.dense, kDenseConsumes},
                                                 std::tuple{kExpert, depths.expert, kExpertConsumes}}) {
      const GroupStats s = runtime.group_stats(group);
      const std::int64_t per_step = consumes * kMicrobatches;
      EXPECT_EQ(s.config.depth, depth);
      EXPECT_EQ(s.materializations, kSteps * per_step);
      if (depth == 0) {  // always on demand, however deep the other group prefetches
        EXPECT_EQ(s.exposed_gathers, kSteps * per_step) << runtime.stats_json();
        EXPECT_EQ(s.prefetch_hits, 0);
        EXPECT_EQ(s.prefetches, 0);
      } else {  // the recording step on demand, then every consume prefetched
        EXPECT_EQ(s.exposed_gathers, per_step) << runtime.stats_json();
        EXPECT_EQ(s.prefetch_hits, (kSteps - 1) * per_step) << runtime.stats_json();
      }
      EXPECT_EQ(s.cache.budget_waits, 0);
      expect_group_bound(runtime, model, group, "after the steps");
    }
    EXPECT_EQ(runtime.stats().chain_mismatches, 0);
    EXPECT_EQ(runtime.stats().schedule_mismatches, 0);
    const nlohmann::json j = nlohmann::json::parse(runtime.stats_json());
    ASSERT_EQ(j["groups"].size(), 2u);
    EXPECT_EQ(j["groups"][kDense]["name"], "dense");
    EXPECT_EQ(j["groups"][kDense]["depth"], depths.dense);
    EXPECT_EQ(j["groups"][kExpert]["depth"], depths.expert);
    EXPECT_EQ(j["groups"][kExpert]["peak_bytes"], runtime.group_stats(kExpert).cache.peak_bytes);

    // Recompute switched on for d1: that chain records, then the schedule records again, a step in
    // which prefetch follows each active chain per group (the fallback window), still within bounds.
    // After the step's first consume (d0 forward), each group holds its depth in prefetches, or what
    // is left of it on the forward chain (5 dense, 4 expert keys): the window looks past the other
    // group's keys.
    auto expect_windows_full = [&](const std::string& when) {
      EXPECT_EQ(runtime.group_stats(kDense).prefetched, std::min(depths.dense, 5)) << when << runtime.stats_json();
      EXPECT_EQ(runtime.group_stats(kExpert).prefetched, std::min(depths.expert, 4)) << when << runtime.stats_json();
    };
    auto with_recompute = [&](int step) {
      model.update(step);
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        model.use(0, Phase::kForward);
        if (mb == 0) expect_windows_full("step " + std::to_string(step) + ": ");
        for (int key : {3, 1, 4, 2}) model.use(key, Phase::kForward);
        for (int key : {2, 4}) model.use(key, Phase::kBackward);
        model.use(1, Phase::kRecompute);
        for (int key : {1, 3, 0}) model.use(key, Phase::kBackward);
      }
      runtime.drain(nullptr);
    };
    with_recompute(kSteps);      // the new chain records
    const GroupStats dense_before = runtime.group_stats(kDense), expert_before = runtime.group_stats(kExpert);
    with_recompute(kSteps + 1);  // the schedule records again: chain windows
    const GroupStats dense_after = runtime.group_stats(kDense), expert_after = runtime.group_stats(kExpert);
    EXPECT_EQ(dense_after.prefetch_hits > dense_before.prefetch_hits, depths.dense > 0);
    EXPECT_EQ(expert_after.prefetch_hits > expert_before.prefetch_hits, depths.expert > 0);
    if (depths.expert == 0) {
      EXPECT_EQ(expert_after.prefetches, 0);
    }
    if (depths.dense == 0) {
      EXPECT_EQ(dense_after.prefetches, 0);
    }
    with_recompute(kSteps + 2);  // on the new schedule: every consume of a prefetching group hits
    for (const auto& [group, depth] : {std::pair{kDense, depths.dense}, std::pair{kExpert, depths.expert}}) {
      const GroupStats before = runtime.group_stats(group);
      with_recompute(kSteps + 3);
      const GroupStats s = runtime.group_stats(group);
      const std::int64_t consumes = (group == kDense ? kDenseConsumes + 1 : kExpertConsumes) * kMicrobatches;
      EXPECT_EQ(s.prefetch_hits - before.prefetch_hits, depth > 0 ? consumes : 0) << runtime.stats_json();
      expect_group_bound(runtime, model, group, "with recompute");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Depths, PerGroupDepth,
                         ::testing::Values(Depths{2, 0}, Depths{1, 3}, Depths{0, 2}, Depths{3, 1}),
                         [](const ::testing::TestParamInfo<Depths>& info) {
                           return "dense" + std::to_string(info.param.dense) + "_expert" +
                                  std::to_string(info.param.expert);
                         });

// The dense group's budget holds one prefetch of its three: it waits every step, while the expert
// group (no budget) still prefetches every one of its consumes.
TEST(PerGroupBudget, OneGroupsBudgetWaitsDoNotBlockTheOther) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});
    std::int64_t dense_largest = 0;
    {  // the key sizes, from a throwaway runtime with the same registrations
      Runtime probe(backend, RuntimeConfig{});
      dense_largest = GroupedModel(probe, comm).largest(kDense);
    }
    const std::int64_t budget = 2 * dense_largest;  // one held, one prefetched
    Runtime runtime(backend, per_group(3, budget, 2, 0));
    GroupedModel model(runtime, comm);
    constexpr int kSteps = 4, kMicrobatches = 2;
    for (int step = 0; step < kSteps; ++step) {
      model.update(step);
      for (int mb = 0; mb < kMicrobatches; ++mb) model.microbatch();
      runtime.drain(nullptr);
      const GroupStats dense = runtime.group_stats(kDense);
      EXPECT_LE(dense.cache.slot_bytes, budget) << "step " << step;
      EXPECT_LE(dense.cache.peak_bytes, budget) << "step " << step;
    }
    const GroupStats dense = runtime.group_stats(kDense), expert = runtime.group_stats(kExpert);
    EXPECT_GT(dense.cache.budget_waits, 0) << runtime.stats_json();
    EXPECT_GT(dense.prefetch_hits, 0) << runtime.stats_json();
    EXPECT_EQ(expert.cache.budget_waits, 0);
    EXPECT_EQ(expert.exposed_gathers, kExpertConsumes * kMicrobatches) << "only the recording step";
    EXPECT_EQ(expert.prefetch_hits, (kSteps - 1) * kExpertConsumes * kMicrobatches) << runtime.stats_json();
    expect_group_bound(runtime, model, kExpert, "");
    const nlohmann::json j = nlohmann::json::parse(runtime.stats_json());
    EXPECT_EQ(j["groups"][kDense]["budget_bytes"], budget);
    EXPECT_EQ(j["groups"][kDense]["budget_waits"], dense.cache.budget_waits);
    EXPECT_EQ(j["groups"][kExpert]["budget_bytes"], 0);
    EXPECT_EQ(j["groups"][kExpert]["budget_waits"], 0);
  });
}

// An on-demand gather evicts its own group's prefetch to stay within that group's budget, never the
// other group's; a budget that cannot hold one key throws naming the group and the budget.
TEST(PerGroupBudget, OnDemandEvictsOnlyItsGroupsPrefetchesAndTooSmallABudgetNamesTheGroup) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});
    std::int64_t expert_largest = 0;
    {
      Runtime probe(backend, RuntimeConfig{});
      expert_largest = GroupedModel(probe, comm).largest(kExpert);
    }
    Runtime runtime(backend, per_group(2, 0, 2, expert_largest));  // the experts: one slot
    GroupedModel model(runtime, comm);
    for (int step = 0; step < 3; ++step) {
      model.update(step);
      model.microbatch();
      runtime.drain(nullptr);
    }
    EXPECT_GT(runtime.group_stats(kExpert).prefetch_hits, 0) << runtime.stats_json();
    const std::int64_t dense_prefetched_hits = runtime.group_stats(kDense).prefetch_hits;
    // E1 before E0: E0 sits prefetched in the experts' only slot, so E1's on-demand gather evicts it.
    model.update(3);
    model.use(0, Phase::kForward);
    model.use(4, Phase::kForward);
    const GroupStats expert = runtime.group_stats(kExpert), dense = runtime.group_stats(kDense);
    EXPECT_GE(expert.cache.evictions, 1) << runtime.stats_json();
    EXPECT_EQ(dense.cache.evictions, 0);
    EXPECT_LE(expert.cache.slot_bytes, expert_largest);
    EXPECT_EQ(dense.prefetch_hits, dense_prefetched_hits + 1);
    model.use(3, Phase::kForward);  // off the chain now: served on demand, correct bits

    Runtime tight(backend, per_group(1, 0, 1, 256));
    GroupedModel small(tight, comm);
    small.update(0);
    small.use(0, Phase::kForward);  // the dense group has no budget
    const WeightId expert_key = small.key_id(3);
    expect_error<std::runtime_error>(
        [&] { tight.materialize(&expert_key, 1, Phase::kForward, 0, Layout::kBF16, nullptr); },
        "experts: memory budget of 256 bytes");
  });
}

// prefetch_batch: the same model with the dense group at depth 4 prefetching in batches of 1, 2 and 4,
// the experts at depth 2 in batches of 2. Every weight stays bit-exact and, after the recording step,
// every consume is still a prefetch hit (a group's next consume never waits for a batch), while
// every batch carries exactly k keys: a short one would go out only when a group's next consume is
// due with fewer behind it, which this model's step lengths (12 dense and 8 expert consumes, the
// next step's head prefetched at drain) never leave.
TEST(PrefetchBatch, KeysGoOutTogetherAndEveryConsumeStillHits) {
  constexpr int kSteps = 5, kMicrobatches = 2;
  for (int dense_batch : {1, 2, 4}) {
    on_ranks(2, [&](comm::HostComm& comm) {
      HostBackend backend({&comm, &comm});
      RuntimeConfig config = per_group(4, 0, 2, 0);
      config.groups[kDense].prefetch_batch = dense_batch;
      config.groups[kExpert].prefetch_batch = 2;
      Runtime runtime(backend, config);
      GroupedModel model(runtime, comm);
      for (int step = 0; step < kSteps; ++step) {
        model.update(step);
        for (int mb = 0; mb < kMicrobatches; ++mb) model.microbatch();
        runtime.drain(nullptr);
      }
      for (const auto& [group, batch, consumes] : {std::tuple{kDense, dense_batch, kDenseConsumes},
                                                   std::tuple{kExpert, 2, kExpertConsumes}}) {
        const GroupStats s = runtime.group_stats(group);
        const std::int64_t per_step = consumes * kMicrobatches;
        EXPECT_EQ(s.config.prefetch_batch, batch);
        EXPECT_EQ(s.exposed_gathers, per_step) << "only the recording step: " << runtime.stats_json();
        EXPECT_EQ(s.prefetch_hits, (kSteps - 1) * per_step) << runtime.stats_json();
        EXPECT_GE(s.prefetches, (kSteps - 1) * per_step);
        EXPECT_EQ(s.prefetch_batches * batch, s.prefetches) << runtime.stats_json();
        expect_group_bound(runtime, model, group, "batch " + std::to_string(batch));
      }
      const RuntimeStats total = runtime.stats();
      EXPECT_EQ(total.prefetch_batches,
                runtime.group_stats(kDense).prefetch_batches + runtime.group_stats(kExpert).prefetch_batches);
      const nlohmann::json j = nlohmann::json::parse(runtime.stats_json());
      EXPECT_EQ(j["materialize"]["prefetch_batches"], total.prefetch_batches);
      EXPECT_EQ(j["groups"][kDense]["prefetch_batch"], dense_batch);
      EXPECT_EQ(j["groups"][kDense]["prefetch_batches"], runtime.group_stats(kDense).prefetch_batches);
    });
  }
}

// The lead a batch leaves: after every consume of a steady step, each group holds at least
// depth - batch + 1 prefetched keys, or every key it has left in the step (its last window goes out
// whole, short batch included: the experts' 8 consumes a step are no multiple of 3).
TEST(PrefetchBatch, EveryGroupKeepsDepthMinusBatchPlusOneAheadAndItsLastWindowWhole) {
  struct Setting {
    int depth, batch;
  };
  const Setting dense{4, 2}, expert{3, 3};
  on_ranks(2, [&](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});
    RuntimeConfig config = per_group(dense.depth, 0, expert.depth, 0);
    config.groups[kDense].prefetch_batch = dense.batch;
    config.groups[kExpert].prefetch_batch = expert.batch;
    Runtime runtime(backend, config);
    GroupedModel model(runtime, comm);
    std::vector<std::pair<int, Phase>> order;  // one step: two microbatches
    for (int mb = 0; mb < 2; ++mb) {
      for (int key : {0, 3, 1, 4, 2}) order.emplace_back(key, Phase::kForward);
      for (int key : {2, 4, 1, 3, 0}) order.emplace_back(key, Phase::kBackward);
    }
    const auto group_of_key = [](int key) { return key < 3 ? kDense : kExpert; };
    for (int step = 0; step < 4; ++step) {
      model.update(step);
      for (std::size_t j = 0; j < order.size(); ++j) {
        model.use(order[j].first, order[j].second);
        if (step < 2) continue;  // recording, then the first step on the schedule
        for (const auto& [group, setting] : {std::pair{kDense, dense}, std::pair{kExpert, expert}}) {
          std::int64_t remaining = 0;
          for (std::size_t later = j + 1; later < order.size(); ++later) {
            remaining += group_of_key(order[later].first) == group ? 1 : 0;
          }
          const std::int64_t prefetched = runtime.group_stats(group).prefetched;
          EXPECT_GE(prefetched, std::min<std::int64_t>(setting.depth - setting.batch + 1, remaining))
              << "group " << group << ", step " << step << ", after consume " << j << ": " << runtime.stats_json();
          EXPECT_LE(prefetched, setting.depth);
          if (remaining <= setting.depth) {
            EXPECT_EQ(prefetched, remaining) << "group " << group << ": the last window goes out whole";
          }
        }
      }
      runtime.drain(nullptr);
    }
    const GroupStats e = runtime.group_stats(kExpert);
    EXPECT_EQ(e.prefetch_hits, 2 * kExpertConsumes * 3) << runtime.stats_json();
    EXPECT_LT(e.prefetch_batches, e.prefetches);
    EXPECT_GT(e.prefetch_batches * expert.batch, e.prefetches) << "a short batch at each step's end";
  });
}

// keep_gathered on the dense group (docs/remat.md, "Keep gathered"), ranks as threads over UCX, with
// freed slots poisoned: each dense key is gathered once per step (the first forward), every later
// consume of the step (its backward, the second microbatch) is served from the kept slot bit-exact;
// shard_updated drops the kept slots and gathers the next step's head from the new shards, so with
// depth >= 1 nothing is exposed after the recording step. The expert group (no keep) is unchanged.
// Slots settle at the group's keys plus its depth; a budget of two keys evicts kept slots instead of
// failing; reset_chains frees them.
class KeepGathered : public ::testing::TestWithParam<int> {};

TEST_P(KeepGathered, EachKeyIsGatheredOncePerStepAndServedFromItsSlotAfter) {
  const int depth = GetParam();
  constexpr int kSteps = 4, kMicrobatches = 2, kDenseKeys = 3;
  on_ranks(2, [&](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});
    RuntimeConfig config = per_group(depth, 0, 1, 0);
    config.groups[kDense].keep_gathered = true;
    config.cache.poison_released = true;
    Runtime runtime(backend, config);
    GroupedModel model(runtime, comm);
    std::int64_t warm_allocations = 0;
    for (int step = 0; step < kSteps; ++step) {
      const GroupStats before = runtime.group_stats(kDense);
      const GroupStats experts_before = runtime.group_stats(kExpert);
      model.update(step);
      EXPECT_EQ(runtime.group_stats(kDense).kept, 0) << "step " << step << ": shard_updated keeps nothing stale";
      for (int mb = 0; mb < kMicrobatches; ++mb) model.microbatch();
      EXPECT_EQ(runtime.group_stats(kDense).kept, kDenseKeys) << "step " << step;
      runtime.drain(nullptr);
      const GroupStats after = runtime.group_stats(kDense);
      const std::int64_t gathered = (after.prefetches - before.prefetches) + (after.exposed_gathers - before.exposed_gathers);
      EXPECT_EQ(gathered, kDenseKeys) << "step " << step << ": " << runtime.stats_json();
      EXPECT_EQ(after.kept_hits - before.kept_hits, kDenseConsumes * kMicrobatches - kDenseKeys) << "step " << step;
      EXPECT_EQ(after.prefetch_hits - before.prefetch_hits, step > 0 && depth > 0 ? kDenseKeys : 0) << "step " << step;
      const GroupStats experts = runtime.group_stats(kExpert);
      EXPECT_EQ(experts.kept_hits, 0);
      EXPECT_EQ(experts.kept, 0);
      EXPECT_EQ(experts.prefetch_hits - experts_before.prefetch_hits, step > 0 ? kExpertConsumes * kMicrobatches : 0);
      EXPECT_LE(after.cache.slots, kDenseKeys + depth) << runtime.stats_json();
      if (step == 1) warm_allocations = backend.memory().allocations;
      if (step > 1) {
        EXPECT_EQ(backend.memory().allocations, warm_allocations) << "step " << step;
      }
    }
    EXPECT_EQ(runtime.stats().kept_hits, runtime.group_stats(kDense).kept_hits);
    EXPECT_EQ(runtime.stats().schedule_mismatches, 0);
    const nlohmann::json j = nlohmann::json::parse(runtime.stats_json());
    EXPECT_EQ(j["groups"][kDense]["keep_gathered"], true);
    EXPECT_EQ(j["groups"][kExpert]["keep_gathered"], false);
    EXPECT_EQ(j["materialize"]["kept_hits"], runtime.stats().kept_hits);
    EXPECT_EQ(j["cache"]["kept_dropped"], kDenseKeys * (kSteps - 1)) << "each update after the first drops the step's";

    runtime.reset_chains();
    EXPECT_EQ(runtime.group_stats(kDense).kept, 0);
    model.microbatch();  // recorded again, still bit-exact
    runtime.drain(nullptr);
  });
}

INSTANTIATE_TEST_SUITE_P(Depths, KeepGathered, ::testing::Values(0, 1, 2));

// The kept slot's edges, with freed slots poisoned: two consumers holding a key at once share its
// slot; a re-pack while the key is held frees the slot at its last release instead of keeping it
// (the next materialize gathers the new weights); unregistering a kept weight drops its slot.
TEST(KeepGathered, SharedHoldersARepackWhileHeldAndUnregister) {
  on_ranks(2, [&](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});
    RuntimeConfig config = per_group(1, 0, 1, 0);
    config.groups[kDense].keep_gathered = true;
    config.cache.poison_released = true;
    Runtime runtime(backend, config);
    GroupedModel model(runtime, comm);
    model.update(0);
    const WeightId d0 = model.key_id(0);
    const auto first = runtime.materialize(&d0, 1, Phase::kForward, 0, Layout::kBF16, nullptr);
    const auto second = runtime.materialize(&d0, 1, Phase::kForward, 0, Layout::kBF16, nullptr);
    EXPECT_EQ(second[0], first[0]) << "the second holder shares the kept slot";
    EXPECT_EQ(runtime.stats().kept_hits, 1);
    runtime.release(&d0, 1, nullptr);
    EXPECT_EQ(runtime.group_stats(kDense).kept, 1);
    runtime.release(&d0, 1, nullptr);
    EXPECT_EQ(runtime.group_stats(kDense).kept, 1) << "kept after its last release";
    EXPECT_THROW(runtime.release(&d0, 1, nullptr), std::invalid_argument) << "a third release: nothing is held";

    runtime.materialize(&d0, 1, Phase::kBackward, 0, Layout::kBF16, nullptr);  // held again
    EXPECT_EQ(runtime.stats().kept_hits, 2);
    model.update(1);  // re-packed while held
    runtime.release(&d0, 1, nullptr);
    EXPECT_EQ(runtime.group_stats(kDense).kept, 0) << "a slot of old weights is not kept";
    model.use(0, Phase::kForward);  // gathers step 1's weights (the comparison is inside use)
    EXPECT_EQ(runtime.stats().kept_hits, 2);
    EXPECT_EQ(runtime.group_stats(kDense).kept, 1);

    const WeightId d2 = model.key_id(2);
    model.use(2, Phase::kForward);
    EXPECT_EQ(runtime.group_stats(kDense).kept, 2);
    runtime.unregister_weight(d2);
    EXPECT_EQ(runtime.group_stats(kDense).kept, 1) << "unregister drops the kept slot";
    model.use(0, Phase::kBackward);  // still served from its kept slot
    EXPECT_EQ(runtime.stats().kept_hits, 3);
  });
}

TEST(KeepGathered, ABudgetEvictsKeptSlotsAndEveryWeightStaysExact) {
  on_ranks(2, [&](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});
    std::int64_t largest = 0;
    {
      Runtime probe(backend, per_group(1, 0, 1, 0));
      largest = GroupedModel(probe, comm).largest(kDense);
    }
    RuntimeConfig config = per_group(1, 2 * largest, 1, 0);
    config.groups[kDense].keep_gathered = true;
    config.cache.poison_released = true;
    Runtime runtime(backend, config);
    GroupedModel model(runtime, comm);
    for (int step = 0; step < 3; ++step) {
      model.update(step);
      for (int mb = 0; mb < 2; ++mb) model.microbatch();
      runtime.drain(nullptr);
    }
    const GroupStats s = runtime.group_stats(kDense);
    EXPECT_GT(s.cache.evictions, 0) << runtime.stats_json();
    EXPECT_LE(s.cache.slot_bytes, 2 * largest);
    EXPECT_LE(s.cache.peak_bytes, 2 * largest);
    EXPECT_GT(s.kept_hits, 0) << runtime.stats_json();
  });
}

TEST(PerGroupConfig, BadValuesNameTheGroupTheValueAndTheFix) {
  on_ranks(1, [](comm::HostComm& comm) {
    HostBackend backend({&comm, &comm});
    expect_error<std::invalid_argument>([&] { Runtime(backend, per_group(1, 0, -1, 0)); },
                                        "experts (RuntimeConfig::groups[1]): prefetch depth -1 is out of range; use 0..64");
    expect_error<std::invalid_argument>([&] { Runtime(backend, per_group(65, 0, 1, 0)); },
                                        "dense (RuntimeConfig::groups[0]): prefetch depth 65 is out of range; use 0..64");
    expect_error<std::invalid_argument>(
        [&] { Runtime(backend, per_group(1, 0, 1, -5)); },
        "experts (RuntimeConfig::groups[1]): memory budget -5 is negative; use 0 (no limit) or a byte count");
    RuntimeConfig batched = per_group(2, 0, 0, 0);
    batched.groups[kDense].prefetch_batch = 3;
    expect_error<std::invalid_argument>([&] { Runtime(backend, batched); },
                                        "dense (RuntimeConfig::groups[0]): prefetch batch 3 is out of range; use 1..2");
    batched.groups[kDense].prefetch_batch = 1;
    batched.groups[kExpert].prefetch_batch = 0;
    expect_error<std::invalid_argument>([&] { Runtime(backend, batched); },
                                        "experts (RuntimeConfig::groups[1]): prefetch batch 0 is out of range; use 1..1");
    RuntimeConfig unnamed;
    unnamed.groups = {GroupConfig{}, GroupConfig{-2, 0, ""}};
    expect_error<std::invalid_argument>([&] { Runtime(backend, unnamed); }, "group 1 (RuntimeConfig::groups[1])");
    RuntimeConfig one;
    one.groups = {GroupConfig{}};
    expect_error<std::invalid_argument>([&] { Runtime(backend, one); },
                                        "RuntimeConfig::groups has 1 entries but the backend has 2 groups");
    RuntimeConfig all;
    all.depth = 3;
    all.cache.budget_bytes = 4096;
    all.prefetch_batch = 2;
    Runtime runtime(backend, all);  // one depth, batch and budget for every group
    for (int g : {kDense, kExpert}) {
      EXPECT_EQ(runtime.group_stats(g).config.depth, 3);
      EXPECT_EQ(runtime.group_stats(g).config.prefetch_batch, 2);
      EXPECT_EQ(runtime.group_stats(g).config.budget_bytes, 4096);
      EXPECT_EQ(runtime.group_stats(g).config.name, "group " + std::to_string(g));
    }
    expect_error<std::invalid_argument>([&] { runtime.group_stats(2); }, "group 2 does not exist");
  });
}

}  // namespace
}  // namespace gtp::remat
