// The remat runtime on the host backend with ranks as threads (ThreadBootstrap + HostComm over UCX):
// training against a single-process reference, every wire format against the reference decode,
// chain verification, the memory budget, lifetime under poisoning, and misuse.
#include "remat/runtime.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include <nlohmann/json.hpp>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "testing/remat/test_model.h"

namespace gtp::remat {
namespace {

using testing::TrainOptions;
using testing::TrainReport;
using testing::on_ranks;

template <typename Error>
void expect_error(const std::function<void()>& call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << text << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
  }
}

TEST(Runtime, TrainingMatchesTheSingleProcessReferenceWith2RanksDepth1) {
  on_ranks(2, [](comm::HostComm& comm) { testing::train_and_check(comm, TrainOptions{}); });
}

TEST(Runtime, TrainingMatchesTheSingleProcessReferenceWith4RanksDepth2) {
  TrainOptions options;
  options.config.depth = 2;
  on_ranks(4, [&](comm::HostComm& comm) { testing::train_and_check(comm, options); });
}

TEST(Runtime, DepthZeroGathersEverythingOnDemandInOneSlot) {
  TrainOptions options;
  options.config.depth = 0;
  on_ranks(2, [&](comm::HostComm& comm) {
    TrainReport report;
    testing::train_and_check(comm, options, &report);
    EXPECT_EQ(report.cache.slots, 1);
  });
}

TEST(Runtime, AccumulatingWgradsAcrossMicrobatchesReducesOncePerStep) {
  TrainOptions options;
  options.config.depth = 3;
  options.microbatches = 3;
  options.config.grads.accumulate_microbatches = true;
  on_ranks(2, [&](comm::HostComm& comm) {
    TrainReport report;
    testing::train_and_check(comm, options, &report);
  });
}

// Poisoned memory: every fresh or reduced gradient buffer reads NaN until written, so a kUndefined
// buffer whose rows the consumer did not overwrite, or whose padding rows the runtime did not zero,
// turns the main grads into NaN (train_and_check also checks `overwrite` and the padding rows).
TEST(Runtime, UndefinedGradBuffersAreOverwrittenAndMainGradsStayExactOverPoisonedMemory) {
  const int ranks = 4;
  bool padded = false;  // the check of the padding rows must not be vacuous
  for (const auto& shape : testing::layer_shapes()) {
    padded |= kernels::weight_geometry(kernels::WireFormat::kBF16, shape.rows, shape.cols, ranks).padded_rows > shape.rows;
  }
  ASSERT_TRUE(padded);
  struct Case {
    int microbatches;
    bool accumulate;
    GradInit init;
  };
  for (const Case c : {Case{1, false, GradInit::kUndefined}, Case{3, false, GradInit::kUndefined},
                       Case{3, true, GradInit::kUndefined}, Case{1, true, GradInit::kUndefined},
                       Case{3, true, GradInit::kZero}}) {
    SCOPED_TRACE("microbatches " + std::to_string(c.microbatches) + (c.accumulate ? " accumulated" : "") +
                 (c.init == GradInit::kZero ? " kZero" : " kUndefined"));
    TrainOptions options;
    options.steps = 3;
    options.microbatches = c.microbatches;
    options.config.grads.accumulate_microbatches = c.accumulate;
    options.grad_init = c.init;
    options.poison_memory = true;
    on_ranks(ranks, [&](comm::HostComm& comm) { testing::train_and_check(comm, options); });
  }
}

TEST(Runtime, GradReadyCallbackFiresOncePerWeightAndReduction) {
  std::vector<int> ready(2, 0);
  on_ranks(2, [&](comm::HostComm& comm) {
    TrainOptions options;
    options.steps = 3;
    options.config.grads.grad_ready = [&](WeightId) { ++ready[comm.rank()]; };
    testing::train_and_check(comm, options);
  });
  EXPECT_EQ(ready[0], 3 * 3 * 2);
  EXPECT_EQ(ready[1], 3 * 3 * 2);
}

TEST(Runtime, EveryWeightGetsTheSameGradBufferEveryStep) {
  // Weights 1..3 share a buffer size, weight 0 is larger; backward runs 3, 2, 1, 0. The in-place
  // reduction holds each buffer until the next finalize, so two buffers of the shared size cycle
  // through three weights; each weight must still get the same one every step (stable addresses for
  // a CUDA graph captured after warm-up). Taking the oldest free buffer alternates between steps.
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    Runtime runtime(backend, RuntimeConfig{});
    const std::int64_t cols = 16;
    const std::int64_t rows[4] = {64, 32, 32, 32};
    std::vector<std::uint16_t> shard(32 * cols, 0);
    std::vector<std::vector<float>> main_grads(4, std::vector<float>(32 * cols, 0.0f));
    std::vector<WeightId> ids;
    for (int w = 0; w < 4; ++w) {
      WeightDesc desc;
      desc.name = "w" + std::to_string(w);
      desc.shard = shard.data();
      desc.rows = rows[w];
      desc.cols = cols;
      desc.main_grad = main_grads[w].data();
      ids.push_back(runtime.register_weight(desc));
    }
    std::vector<float*> first(4);
    for (int step = 0; step < 4; ++step) {
      for (int w = 3; w >= 0; --w) {
        float* buffer = runtime.grad_buffer(ids[w], nullptr).data;
        if (step == 0) first[w] = buffer;
        EXPECT_EQ(buffer, first[w]) << "weight " << w << ", step " << step;
        runtime.finalize(&ids[w], 1, true, nullptr);
      }
      runtime.drain(nullptr);
    }
    EXPECT_EQ(runtime.grads_stats().pool_buffers, 3);
  });
}

TEST(Runtime, FinalizingAnExpertLeaderReducesEveryExpertIntoItsMainGrad) {
  on_ranks(4, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    std::vector<WeightId> ready;
    RuntimeConfig config;
    config.grads.grad_ready = [&](WeightId id) { ready.push_back(id); };
    Runtime runtime(backend, config);
    const std::int64_t rows = 40, cols = 32;  // G = 4: 16-row shards, rank 2 holds 8 rows, rank 3 none
    const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, rows, cols, 4);
    const std::int64_t valid = geometry.valid_rows(comm.rank());
    std::vector<std::uint16_t> shard(std::max<std::int64_t>(valid, 1) * cols, 0);
    std::vector<std::vector<float>> main_grads(3, std::vector<float>(std::max<std::int64_t>(valid, 1) * cols, 1.0f));
    std::vector<WeightId> ids;
    for (int e = 0; e < 3; ++e) {
      WeightDesc desc;
      desc.name = "expert" + std::to_string(e);
      desc.shard = shard.data();
      desc.rows = rows;
      desc.cols = cols;
      desc.main_grad = main_grads[e].data();
      desc.expert_leader = e == 0 ? kNoWeight : ids[0];
      ids.push_back(runtime.register_weight(desc));
    }
    // Each rank's wgrad of expert e, element (r, c): (rank + 1) x (e + 1) x (r + 1).
    for (int e = 0; e < 3; ++e) {
      float* g = runtime.grad_buffer(ids[e], nullptr).data;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) g[r * cols + c] = static_cast<float>((comm.rank() + 1) * (e + 1) * (r + 1));
    }
    runtime.finalize(ids.data(), 1, true, nullptr);
    EXPECT_TRUE(ready.empty()) << "the main-grad add is deferred to the next finalize or drain";
    runtime.drain(nullptr);
    EXPECT_EQ(ready, ids);
    for (int e = 0; e < 3; ++e) {
      for (std::int64_t r = 0; r < valid; ++r) {
        const std::int64_t row = comm.rank() * geometry.shard_rows + r;
        // mean over ranks of (rank + 1) is 2.5; the main grad started at 1
        const float expected = 1.0f + 2.5f * static_cast<float>((e + 1) * (row + 1));
        for (std::int64_t c = 0; c < cols; ++c) ASSERT_EQ(main_grads[e][r * cols + c], expected) << e << " " << row;
      }
    }
    const WeightId twice[2] = {ids[1], ids[1]};
    runtime.grad_buffer(ids[1], nullptr);
    expect_error<std::invalid_argument>([&] { runtime.finalize(twice, 2, true, nullptr); }, "listed twice");
  });
}

TEST(Runtime, MemoryBudgetMakesPrefetchWaitAndIsNeverExceeded) {
  // Layer 0 with G = 2 is the largest group: 2 gathered chunks of 32x32 BF16, which hold its 48x32
  // rows in place (a BF16 wire needs no output region).
  const std::int64_t largest = 2 * 2048;
  TrainOptions options;
  options.config.depth = 3;
  options.config.cache.budget_bytes = 2 * largest;
  on_ranks(2, [&](comm::HostComm& comm) {
    TrainReport report;
    testing::train_and_check(comm, options, &report);
    EXPECT_EQ(report.largest_group_bytes, largest);
    EXPECT_GT(report.cache.budget_waits, 0);
    EXPECT_LE(report.cache.slot_bytes, options.config.cache.budget_bytes);
  });
}

TEST(Runtime, GemmLayoutMatchesTheReferenceGemmUnpackWithMixedBf16Consumers) {
  for (int g : {2, 4}) {
    for (const kernels::WireSpec& spec : testing::all_wire_specs()) {
      on_ranks(g, [&](comm::HostComm& comm) { testing::check_gemm_layout(comm, spec); });
    }
  }
}

TEST(Runtime, EveryWireFormatMatchesTheReferenceDecode) {
  for (int g : {2, 4}) {
    for (const kernels::WireSpec& spec : testing::all_wire_specs()) {
      on_ranks(g, [&](comm::HostComm& comm) { testing::check_wire_format(comm, spec); });
    }
  }
}

// Registers the three model layers with the step-0 weights; returns their ids.
std::vector<WeightId> register_model(Runtime& runtime, comm::HostComm& comm, std::vector<std::vector<std::uint16_t>>& shards) {
  const auto& shapes = testing::layer_shapes();
  std::vector<WeightId> ids;
  for (int l = 0; l < static_cast<int>(shapes.size()); ++l) {
    const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, shapes[l].rows, shapes[l].cols, comm.size());
    const auto full = testing::full_weight(l, 0);
    const std::int64_t first = comm.rank() * geometry.shard_rows * shapes[l].cols;
    shards.emplace_back(full.begin() + first, full.begin() + first + geometry.valid_rows(comm.rank()) * shapes[l].cols);
    shards.back().resize(std::max<std::size_t>(shards.back().size(), 1));
    WeightDesc desc;
    desc.name = "layer" + std::to_string(l);
    desc.shard = shards.back().data();
    desc.rows = shapes[l].rows;
    desc.cols = shapes[l].cols;
    ids.push_back(runtime.register_weight(desc));
  }
  runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), nullptr);
  return ids;
}

void expect_layer(const void* out, int layer) {
  const auto full = testing::full_weight(layer, 0);
  EXPECT_EQ(std::memcmp(out, full.data(), full.size() * 2), 0) << "layer " << layer;
}

// One consumer of layer `layer` in (phase, chunk): materialize, check the weight, release.
void use_layer(Runtime& runtime, const std::vector<WeightId>& ids, int layer, Phase phase, int chunk) {
  const auto out = runtime.materialize(&ids[layer], 1, phase, chunk, Layout::kBF16, nullptr);
  expect_layer(out[0], layer);
  runtime.release(&ids[layer], 1, nullptr);
}

TEST(Runtime, ChainMismatchIsCountedReportedAndServedByAnOnDemandGather) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.depth = 2;
    Runtime runtime(backend, config);
    std::vector<std::vector<std::uint16_t>> shards;
    shards.reserve(3);
    const auto ids = register_model(runtime, comm, shards);
    auto pass = [&](const std::vector<int>& order) {
      for (int l : order) {
        const auto out = runtime.materialize(&ids[l], 1, Phase::kForward, 0, Layout::kBF16, nullptr);
        expect_layer(out[0], l);
        runtime.release(&ids[l], 1, nullptr);
      }
      runtime.drain(nullptr);
    };
    pass({0, 1, 2});  // records
    pass({0, 1, 2});
    EXPECT_EQ(runtime.stats().chain_mismatches, 0);
    const std::int64_t hits = runtime.stats().prefetch_hits;
    EXPECT_EQ(hits, 3);
    for (int l : {0, 2, 1}) {  // reordered layers
      const auto out = runtime.materialize(&ids[l], 1, Phase::kForward, 0, Layout::kBF16, nullptr);
      expect_layer(out[0], l);
      if (l == 2) {
        EXPECT_EQ(runtime.stats().chain_mismatches, 1);
        EXPECT_EQ(runtime.stats().last_mismatch, "expected weights [1] at position 1 of 3, got [2]");
      }
      runtime.release(&ids[l], 1, nullptr);
    }
    runtime.drain(nullptr);
    EXPECT_EQ(runtime.stats().chain_mismatches, 2);
    EXPECT_EQ(runtime.stats().last_mismatch, "expected the end of the step after 3 entries, got [1]");
    const std::int64_t mismatches = runtime.stats().chain_mismatches;
    pass({0, 2});  // a conditional branch skips a layer
    EXPECT_GT(runtime.stats().chain_mismatches, mismatches);
    const std::int64_t before = runtime.stats().chain_mismatches;
    pass({0, 1, 2});
    EXPECT_EQ(runtime.stats().chain_mismatches, before);
    runtime.reset_chains();
    pass({2, 1, 0});  // a rebuilt model records afresh
    pass({2, 1, 0});
    EXPECT_EQ(runtime.stats().chain_mismatches, before);
  });
}

TEST(Runtime, ModelChunksAndRecomputeKeepSeparateVerifiedChains) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.depth = 2;
    Runtime runtime(backend, config);
    std::vector<std::vector<std::uint16_t>> shards;
    shards.reserve(3);
    std::vector<WeightId> ids = register_model(runtime, comm, shards);
    auto use = [&](int layer, Phase phase, int chunk) { use_layer(runtime, ids, layer, phase, chunk); };
    auto step = [&] {  // chunk 0 holds layers 0 and 1, chunk 1 holds layer 2, which is recomputed
      use(0, Phase::kForward, 0);
      use(1, Phase::kForward, 0);
      use(2, Phase::kForward, 1);
      use(2, Phase::kRecompute, 1);
      use(2, Phase::kBackward, 1);
      use(1, Phase::kBackward, 0);
      use(0, Phase::kBackward, 0);
      runtime.drain(nullptr);
    };
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(runtime.stats().chain_mismatches, 0) << runtime.stats().last_mismatch;
    EXPECT_GT(runtime.stats().prefetch_hits, 0);
    const std::int64_t allocations = backend.memory().allocations;
    step();
    EXPECT_EQ(backend.memory().allocations, allocations);

    // A rebuilt layer 2 (new id) no longer matches chunk 1's chains: counted, still served correctly.
    runtime.unregister_weight(ids[2]);
    shards.pop_back();
    ids.pop_back();
    const auto& shape = testing::layer_shapes()[2];
    const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, shape.rows, shape.cols, comm.size());
    const auto full = testing::full_weight(2, 0);
    const std::int64_t first = comm.rank() * geometry.shard_rows * shape.cols;
    shards.emplace_back(full.begin() + first, full.begin() + first + geometry.valid_rows(comm.rank()) * shape.cols);
    shards.back().resize(std::max<std::size_t>(shards.back().size(), 1));
    WeightDesc desc;
    desc.name = "layer2 rebuilt";
    desc.shard = shards.back().data();
    desc.rows = shape.rows;
    desc.cols = shape.cols;
    ids.push_back(runtime.register_weight(desc));
    runtime.shard_updated(&ids[2], 1, nullptr);
    step();
    const std::int64_t mismatches = runtime.stats().chain_mismatches;
    EXPECT_EQ(mismatches, 3);  // forward, recompute and backward chains of chunk 1
    runtime.reset_chains();
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(runtime.stats().chain_mismatches, mismatches);
  });
}

// The step schedule looks ahead across chains: after the recording step, forward -> backward switches
// of every microbatch, recompute and VPP chunks are all prefetch hits. A step that leaves the schedule
// (one microbatch fewer) is counted and still served correctly, and the schedule resyncs.
TEST(Runtime, StepScheduleLooksAheadAcrossChainsAndResyncsAfterADeparture) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.depth = 1;
    Runtime runtime(backend, config);
    std::vector<std::vector<std::uint16_t>> shards;
    shards.reserve(3);
    const std::vector<WeightId> ids = register_model(runtime, comm, shards);
    auto use = [&](int layer, Phase phase, int chunk) { use_layer(runtime, ids, layer, phase, chunk); };
    auto microbatch = [&] {  // chunk 0: layers 0, 1; chunk 1: layer 2, recomputed
      use(0, Phase::kForward, 0);
      use(1, Phase::kForward, 0);
      use(2, Phase::kForward, 1);
      use(2, Phase::kRecompute, 1);
      use(2, Phase::kBackward, 1);
      use(1, Phase::kBackward, 0);
      use(0, Phase::kBackward, 0);
    };
    auto step = [&](int microbatches) {
      for (int m = 0; m < microbatches; ++m) microbatch();
      runtime.drain(nullptr);
    };
    step(2);  // records
    const RuntimeStats recorded = runtime.stats();
    EXPECT_EQ(recorded.exposed_gathers, 14);
    step(2);
    step(2);
    RuntimeStats s = runtime.stats();
    EXPECT_EQ(s.exposed_gathers, recorded.exposed_gathers) << "every chain switch was prefetched";
    EXPECT_EQ(s.prefetch_hits, 28);
    EXPECT_EQ(s.schedule_mismatches, 0);
    EXPECT_EQ(s.chain_mismatches, 0);
    const nlohmann::json j = nlohmann::json::parse(runtime.stats_json());
    EXPECT_EQ(j["chains"]["schedule_entries"], 14);

    step(1);  // one microbatch: each chain and the schedule end early
    s = runtime.stats();
    EXPECT_EQ(s.schedule_mismatches, 1);
    EXPECT_GT(s.chain_mismatches, 0);
    EXPECT_EQ(s.exposed_gathers, recorded.exposed_gathers) << "the departure is at the step's end";
    const std::int64_t hits = s.prefetch_hits;
    step(2);  // back on the schedule from the step's head
    s = runtime.stats();
    EXPECT_EQ(s.schedule_mismatches, 1);
    EXPECT_EQ(s.prefetch_hits, hits + 14);

    // A chain first used now (layer 1 recomputed): the schedule is recorded again over the next step,
    // then every consume is a hit once more.
    auto microbatch_with_recompute = [&] {
      use(0, Phase::kForward, 0);
      use(1, Phase::kForward, 0);
      use(2, Phase::kForward, 1);
      use(2, Phase::kRecompute, 1);
      use(2, Phase::kBackward, 1);
      use(1, Phase::kRecompute, 0);
      use(1, Phase::kBackward, 0);
      use(0, Phase::kBackward, 0);
    };
    auto step_with_recompute = [&] {
      for (int m = 0; m < 2; ++m) microbatch_with_recompute();
      runtime.drain(nullptr);
    };
    step_with_recompute();  // the new chain records; the schedule is out of date
    step_with_recompute();  // the schedule records again
    const RuntimeStats rerecorded = runtime.stats();
    step_with_recompute();
    s = runtime.stats();
    EXPECT_EQ(s.schedule_mismatches, rerecorded.schedule_mismatches);
    EXPECT_EQ(s.exposed_gathers, rerecorded.exposed_gathers);
    EXPECT_EQ(s.prefetch_hits, rerecorded.prefetch_hits + 16);
    EXPECT_EQ(nlohmann::json::parse(runtime.stats_json())["chains"]["schedule_entries"], 16);
  });
}

// A consume that mismatches its chain while the schedule records (an extra layer at the end) has no
// chain position: its schedule entry is never prefetched, and the steps that follow stay correct.
TEST(Runtime, AnExtraConsumeWhileTheScheduleRecordsIsNeverPrefetched) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.depth = 3;
    Runtime runtime(backend, config);
    std::vector<std::vector<std::uint16_t>> shards;
    shards.reserve(3);
    const std::vector<WeightId> ids = register_model(runtime, comm, shards);
    auto use = [&](int layer, Phase phase) { use_layer(runtime, ids, layer, phase, 0); };
    auto step = [&](bool recompute, bool extra) {
      for (int l : {0, 1, 2}) use(l, Phase::kForward);
      if (extra) use(0, Phase::kForward);  // past the forward chain's end
      if (recompute) use(2, Phase::kRecompute);
      for (int l : {2, 1, 0}) use(l, Phase::kBackward);
      runtime.drain(nullptr);
    };
    step(false, false);  // records the chains and the schedule
    step(true, false);   // a new chain: the schedule records again over the next step
    step(true, true);    // ... which has an extra consume
    for (int s = 0; s < 3; ++s) step(true, true);
    const RuntimeStats stats = runtime.stats();
    EXPECT_GT(stats.prefetch_hits, 0);
    EXPECT_LE(runtime.cache_stats().slot_bytes, 4 * 2 * 2048) << "(depth + 1) x the largest layer";
  });
}

// drain(.., kAfterShardUpdate): the next step's head is gathered after the optimizer's re-pack
// instead of at drain and again at shard_updated; without a shard_updated the first consume of the
// step gathers it on demand.
TEST(Runtime, DeferringTheHeadToShardUpdatedGathersItOnceFromTheNewShards) {
  on_ranks(2, [](comm::HostComm& comm) {
    for (const Runtime::Head head : {Runtime::Head::kAtDrain, Runtime::Head::kAfterShardUpdate}) {
      HostBackend backend({&comm});
      RuntimeConfig config;
      config.depth = 2;
      Runtime runtime(backend, config);
      std::vector<std::vector<std::uint16_t>> shards;
      shards.reserve(3);
      const std::vector<WeightId> ids = register_model(runtime, comm, shards);
      auto step = [&] {
        for (int l : {0, 1, 2}) use_layer(runtime, ids, l, Phase::kForward, 0);
        for (int l : {2, 1, 0}) use_layer(runtime, ids, l, Phase::kBackward, 0);
        runtime.drain(nullptr, head);
        runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), nullptr);  // the optimizer step
      };
      step();  // records
      const RuntimeStats recorded = runtime.stats();
      for (int i = 0; i < 3; ++i) step();
      const RuntimeStats s = runtime.stats();
      EXPECT_EQ(s.exposed_gathers, recorded.exposed_gathers) << "the head is prefetched either way";
      EXPECT_EQ(s.prefetch_hits, 18);
      const std::int64_t regathers = head == Runtime::Head::kAtDrain ? 2 * 4 : 0;  // depth per step
      EXPECT_EQ(s.stale_prefetches, regathers);

      if (head == Runtime::Head::kAfterShardUpdate) {
        // A step ending in a deferring drain with no shard_updated after it: the next step's head is
        // gathered on demand, the rest is prefetched as usual.
        for (int l : {0, 1, 2}) use_layer(runtime, ids, l, Phase::kForward, 0);
        for (int l : {2, 1, 0}) use_layer(runtime, ids, l, Phase::kBackward, 0);
        runtime.drain(nullptr, head);
        const RuntimeStats before = runtime.stats();
        EXPECT_EQ(before.exposed_gathers, s.exposed_gathers);
        use_layer(runtime, ids, 0, Phase::kForward, 0);
        EXPECT_EQ(runtime.stats().exposed_gathers, before.exposed_gathers + 1);
        for (int l : {1, 2}) use_layer(runtime, ids, l, Phase::kForward, 0);
        EXPECT_EQ(runtime.stats().prefetch_hits, before.prefetch_hits + 2);
      }
    }
  });
}

TEST(Runtime, StatsJsonAndChromeTraceDescribeWhatHappened) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.trace_spans = 8;
    Runtime runtime(backend, config);
    std::vector<std::vector<std::uint16_t>> shards;
    shards.reserve(3);
    const auto ids = register_model(runtime, comm, shards);
    for (int step = 0; step < 3; ++step) {
      for (int l = 0; l < 3; ++l) {
        runtime.materialize(&ids[l], 1, Phase::kForward, 0, Layout::kBF16, nullptr);
        runtime.release(&ids[l], 1, nullptr);
      }
      runtime.drain(nullptr);
    }
    const WeightStats layer0 = runtime.weight_stats(ids[0]);
    EXPECT_EQ(layer0.materializations, 3);
    EXPECT_EQ(layer0.exposed_gathers, 1);  // the recording step
    EXPECT_EQ(layer0.prefetch_hits, 2);
    // Gathers of the head: one exposed while recording, then one prefetch at each of the 3 drains.
    EXPECT_EQ(layer0.gathered_bytes, 4 * 2 * runtime.registry().get(ids[0]).layout.chunk_bytes);
    const auto stats = nlohmann::json::parse(runtime.stats_json());
    EXPECT_EQ(stats["materialize"]["calls"], 9);
    EXPECT_EQ(stats["weights"].size(), 3u);
    EXPECT_EQ(stats["weights"][0]["prefetch_hits"], 2);
    const auto trace = nlohmann::json::parse(runtime.chrome_trace(comm.rank()));
    ASSERT_EQ(trace["traceEvents"].size(), 8u);  // the ring keeps the latest 8 spans
    EXPECT_GT(stats["trace"]["dropped"].get<std::int64_t>(), 0);
    double previous = 0;
    for (const auto& event : trace["traceEvents"]) {
      EXPECT_EQ(event["ph"], "X");
      EXPECT_EQ(event["pid"], comm.rank());
      EXPECT_GE(event["ts"].get<double>(), previous);
      previous = event["ts"].get<double>();
    }
    EXPECT_EQ(trace["traceEvents"].back()["cat"], "prefetch");  // the head, prefetched at the last drain
  });
}

TEST(Runtime, PoisonedReleasedBuffersNeverCorruptWeightsStillInUse) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig config;
    config.depth = 2;
    config.cache.poison_released = true;
    Runtime runtime(backend, config);
    std::vector<std::vector<std::uint16_t>> shards;
    shards.reserve(3);
    const auto ids = register_model(runtime, comm, shards);
    for (int step = 0; step < 4; ++step) {
      std::vector<void*> out(3);
      for (int l = 0; l < 3; ++l) out[l] = runtime.materialize(&ids[l], 1, Phase::kForward, 0, Layout::kBF16, nullptr)[0];
      std::vector<bool> held(3, true);
      for (int l : {1, 0, 2}) {
        runtime.release(&ids[l], 1, nullptr);
        held[l] = false;
        if (step == 0) {  // recording: nothing is prefetched into the freed slot, so it must read poisoned
          const auto* bytes = static_cast<const unsigned char*>(out[l]);
          const std::int64_t n = testing::layer_shapes()[l].rows * testing::layer_shapes()[l].cols * 2;
          EXPECT_TRUE(std::all_of(bytes, bytes + n, [](unsigned char b) { return b == 0xFF; })) << "layer " << l;
        }
        for (int k = 0; k < 3; ++k) {
          if (held[k]) expect_layer(out[k], k);
        }
      }
      runtime.drain(nullptr);
    }
    EXPECT_GT(runtime.stats().prefetch_hits, 0);
  });
}

TEST(Runtime, MisuseIsRefusedWithAMessage) {
  on_ranks(1, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    RuntimeConfig bad_depth;
    bad_depth.depth = -1;
    expect_error<std::invalid_argument>([&] { Runtime(backend, bad_depth); }, "depth -1 is out of range; use 0..64");
    Runtime runtime(backend, RuntimeConfig{});
    std::vector<std::uint16_t> shard(32 * 32, 0x3F80);
    std::vector<float> grad(32 * 32, 0.0f);
    WeightDesc desc;
    desc.name = "w";
    desc.shard = shard.data();
    desc.rows = 32;
    desc.cols = 32;
    desc.group = 5;
    expect_error<std::invalid_argument>([&] { runtime.register_weight(desc); }, "group 5");
    desc.group = 0;
    const WeightId id = runtime.register_weight(desc);
    expect_error<std::invalid_argument>(
        [&] { runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, nullptr); }, "never packed");
    runtime.shard_updated(&id, 1, nullptr);
    const WeightId unknown = 42;
    expect_error<std::invalid_argument>(
        [&] { runtime.materialize(&unknown, 1, Phase::kForward, 0, Layout::kBF16, nullptr); }, "42 is not registered");
    expect_error<std::invalid_argument>([&] { runtime.release(&id, 1, nullptr); }, "not materialized");
    runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, nullptr);
    expect_error<std::invalid_argument>([&] { runtime.unregister_weight(id); }, "release it first");
    runtime.release(&id, 1, nullptr);
    expect_error<std::invalid_argument>([&] { runtime.release(&id, 1, nullptr); }, "double release");
    expect_error<std::invalid_argument>([&] { runtime.grad_buffer(id, nullptr); }, "without a main grad");
    expect_error<std::invalid_argument>([&] { runtime.finalize(&id, 1, true, nullptr); }, "has no grad buffer");
    expect_error<std::invalid_argument>(
        [&] { runtime.materialize(&id, 1, Phase::kForward, -1, Layout::kBF16, nullptr); }, "chunk -1");
    desc.main_grad = grad.data();
    const WeightId with_grad = runtime.register_weight(desc);
    runtime.grad_buffer(with_grad, nullptr);
    expect_error<std::invalid_argument>([&] { runtime.unregister_weight(with_grad); }, "finalize and drain first");
    runtime.unregister_weight(id);
    expect_error<std::invalid_argument>([&] { runtime.shard_updated(&id, 1, nullptr); }, "is not registered");

    RuntimeConfig tight;
    tight.cache.budget_bytes = 256;
    Runtime small(backend, tight);
    const WeightId big = small.register_weight(desc);
    small.shard_updated(&big, 1, nullptr);
    expect_error<std::runtime_error>(
        [&] { small.materialize(&big, 1, Phase::kForward, 0, Layout::kBF16, nullptr); }, "memory budget of 256 bytes");
  });
}

}  // namespace
}  // namespace gtp::remat
