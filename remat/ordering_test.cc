// The runtime's stream protocol against a backend that logs every ordering and work call: gathers on
// each group's gather stream, reduce-scatters on its reduce-scatter stream, and exactly the cross-role
// waits the protocol needs (finalize after the consumer, re-pack after reduce-scatters, drain joining
// both), with no wait that would queue a re-gather behind a reduce-scatter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "testing/remat/logging_backend.h"
#include "remat/registry.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using testing::consumer_stream;
using testing::LoggingBackend;

struct Model {
  explicit Model(LoggingBackend& backend, RuntimeConfig config = {}) : runtime(backend, std::move(config)) {}

  WeightId add(const std::string& name, int group, kernels::WireSpec wire = {kernels::WireFormat::kFP8}) {
    WeightDesc desc;
    desc.name = name;
    desc.shard = shard.data();
    desc.rows = 32;
    desc.cols = 32;
    desc.wire = wire;  // FP8 by default: amax + all_reduce_max + pack on re-pack
    desc.group = group;
    desc.main_grad = main_grads.emplace_back(32 * 32).data();
    return runtime.register_weight(desc);
  }

  std::vector<std::uint16_t> shard = std::vector<std::uint16_t>(32 * 32);
  std::vector<std::vector<float>> main_grads;  // moving an inner vector keeps its data where it is
  Runtime runtime;
};

// Lines of `log` from `from` on.
std::vector<std::string> since(const LoggingBackend& backend, int from) {
  return std::vector<std::string>(backend.log.begin() + from, backend.log.end());
}

bool contains(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

TEST(Ordering, ReduceScattersRunOnTheirOwnStreamAndARegatherNeverWaitsOnThem) {
  LoggingBackend backend;
  Model model(backend);
  const WeightId ids[] = {model.add("w0", 0), model.add("w1", 0)};
  const Stream s = consumer_stream(1);
  model.runtime.shard_updated(ids, 2, s);
  for (WeightId id : ids) {
    model.runtime.materialize(&id, 1, Phase::kForward, 0, Layout::kBF16, s);
    model.runtime.release(&id, 1, s);
  }
  // Backward of w1: a new wgrad buffer, zeroed on the consumer stream, which waits on nothing for it.
  model.runtime.materialize(&ids[1], 1, Phase::kBackward, 0, Layout::kBF16, s);
  int mark = static_cast<int>(backend.log.size());
  model.runtime.grad_buffer(ids[1], s);
  EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"fill on s1"}));
  model.runtime.release(&ids[1], 1, s);
  mark = static_cast<int>(backend.log.size());
  model.runtime.finalize(&ids[1], 1, true, s);
  EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"rs0 waits s1", "reduce_scatter on rs0"}))
      << "the reduce-scatter waits on the consumer's wgrad, on the reduce-scatter stream";
  // The re-gather of w0 (backward) runs on ag0 and does not wait on rs0.
  mark = static_cast<int>(backend.log.size());
  model.runtime.materialize(&ids[0], 1, Phase::kBackward, 0, Layout::kBF16, s);
  const auto regather = since(backend, mark);
  EXPECT_TRUE(contains(regather, "all_gather on ag0")) << ::testing::PrintToString(regather);
  EXPECT_TRUE(contains(regather, "s1 waits ag0"));
  EXPECT_FALSE(contains(regather, "ag0 waits rs0")) << "a re-gather queued behind a reduce-scatter";
  for (const std::string& line : regather) EXPECT_EQ(line.find("on rs0"), std::string::npos) << line;
  model.runtime.release(&ids[0], 1, s);
  // Drain: the deferred add and callback on rs0, then the consumer joins both roles.
  mark = static_cast<int>(backend.log.size());
  model.runtime.drain(s);
  const auto drained = since(backend, mark);
  ASSERT_GE(drained.size(), 3u);
  EXPECT_EQ(drained[0], "add on rs0");
  EXPECT_TRUE(contains(drained, "s1 waits ag0")) << ::testing::PrintToString(drained);
  EXPECT_TRUE(contains(drained, "s1 waits rs0")) << ::testing::PrintToString(drained);
  // The optimizer runs on s2; the re-pack waits on it and on the reduce-scatter stream before amax.
  const Stream optimizer = consumer_stream(2);
  mark = static_cast<int>(backend.log.size());
  model.runtime.shard_updated(ids, 2, optimizer);
  const int first_amax = backend.find("amax on ag0", mark);
  ASSERT_GE(first_amax, 0);
  const int waits_optimizer = backend.find("ag0 waits s2", mark);
  const int waits_rs = backend.find("ag0 waits rs0", mark);
  EXPECT_GE(waits_optimizer, 0);
  EXPECT_GE(waits_rs, 0);
  EXPECT_LT(waits_optimizer, first_amax);
  EXPECT_LT(waits_rs, first_amax);
  EXPECT_GE(backend.find("pack on ag0", first_amax), 0);
  EXPECT_EQ(backend.find("all_reduce_max on ag0", mark), first_amax + 2) << "amax, amax, then one reduction";
}

// The buffer path (what larger groups do; a size-1 group with grads_into_main_grad off).
TEST(Ordering, AnUndefinedGradBufferIsNotFilledButStillWaitsForItsLastReduceScatter) {
  LoggingBackend backend;
  RuntimeConfig config;
  config.grads_into_main_grad = false;
  Model model(backend, config);
  const WeightId id = model.add("w0", 0);  // G = 1, 32 rows: no padding rows to zero
  const Stream s = consumer_stream(1);
  for (int step = 0; step < 2; ++step) {  // step 1 reuses the buffer step 0 reduce-scattered
    const int mark = static_cast<int>(backend.log.size());
    const GradBuffer buffer = model.runtime.grad_buffer(id, s, GradInit::kUndefined);
    EXPECT_TRUE(buffer.overwrite);
    EXPECT_NE(buffer.data, model.main_grads[0].data());
    // A new buffer has no earlier use to wait for; a reused one its last reduce-scatter (and add).
    EXPECT_EQ(since(backend, mark), step == 0 ? std::vector<std::string>{} : std::vector<std::string>{"s1 waits rs0"})
        << "the consumer's first write must follow the buffer's last reduce-scatter, and nothing else";
    EXPECT_FALSE(model.runtime.grad_buffer(id, s, GradInit::kUndefined).overwrite);
    model.runtime.finalize(&id, 1, true, s);
    model.runtime.drain(s);
  }
  EXPECT_EQ(model.runtime.grads_stats().reduce_scatters, 2);
  EXPECT_EQ(model.runtime.grads_stats().into_main_grad, 0);
}

// Backward on a group of 2: grad_buffer(L-1) comes right after finalize(L) issued the reduce-scatter
// of L. The consumer must not wait for that reduce-scatter (it would expose every reduce-scatter of
// the backward behind the next wgrad): a new buffer waits on nothing and is zeroed on the consumer
// stream; a pooled buffer waits on exactly its own last use (its reduce-scatter and main-grad add,
// recorded when it went back to the pool), not on the reduce-scatter issued after that.
TEST(Ordering, AGradBufferWaitsOnlyForItsOwnLastUseNotForTheReduceScatterJustIssued) {
  LoggingBackend backend(1, 2);
  Model model(backend);
  const WeightId w0 = model.add("w0", 0), w1 = model.add("w1", 0), w2 = model.add("w2", 0);
  const Stream s = consumer_stream(1);
  const float* first = model.runtime.grad_buffer(w2, s).data;
  model.runtime.finalize(&w2, 1, true, s);
  const int rs_w2 = backend.find("reduce_scatter on rs0");
  ASSERT_GE(rs_w2, 0);

  // w1: a new buffer (w2's is still held by its reduce-scatter until the next finalize).
  std::size_t waits = backend.waits.size();
  int mark = static_cast<int>(backend.log.size());
  EXPECT_NE(model.runtime.grad_buffer(w1, s).data, first);
  EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"fill on s1"}));
  EXPECT_TRUE(backend.waited_by(s, waits).empty()) << "the consumer waited behind the reduce-scatter of w2";
  model.runtime.finalize(&w1, 1, true, s);  // adds w2's shard into its main grad, pools w2's buffer, reduces w1
  const int add_w2 = backend.find("add on rs0", rs_w2);
  const int rs_w1 = backend.find("reduce_scatter on rs0", rs_w2 + 1);
  ASSERT_GE(add_w2, 0);
  ASSERT_GT(rs_w1, add_w2);

  // w0: w2's buffer again, after its add into w2's main grad read it, not after w1's reduce-scatter.
  waits = backend.waits.size();
  mark = static_cast<int>(backend.log.size());
  EXPECT_EQ(model.runtime.grad_buffer(w0, s).data, first) << "the pooled buffer given back last";
  const std::vector<Event> waited = backend.waited_by(s, waits);
  ASSERT_EQ(waited.size(), 1u) << ::testing::PrintToString(since(backend, mark));
  EXPECT_EQ(backend.stream_name(backend.recorded.at(waited[0])), "rs0");
  EXPECT_GT(backend.recorded_at.at(waited[0]), add_w2) << "reused while its last add may still read it";
  EXPECT_LE(backend.recorded_at.at(waited[0]), rs_w1) << "the consumer waited behind the reduce-scatter of w1";
  EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"s1 waits rs0", "fill on s1"}));
  for (const std::string& line : since(backend, mark)) EXPECT_EQ(line.find("on rs0"), std::string::npos) << line;
  model.runtime.finalize(&w0, 1, true, s);
  model.runtime.drain(s);
  EXPECT_EQ(model.runtime.grads_stats().pool_buffers, 2);
}

// An eager drain prefetches the next step's head after joining the side streams; it then joins the
// head's gathers into its stream too, so synchronizing that stream before a capture covers every gather
// the captured step reads without a wait (docs/remat.md, CUDA graphs, rule 2).
TEST(Ordering, AnEagerDrainJoinsTheHeadItPrefetchesIntoItsStream) {
  LoggingBackend backend;
  Model model(backend);
  const WeightId ids[] = {model.add("w0", 0), model.add("w1", 0)};
  const Stream s = consumer_stream(1);
  model.runtime.shard_updated(ids, 2, s);
  const auto step = [&](Runtime::Head head) {
    for (int i = 0; i < 2; ++i) {
      model.runtime.materialize(&ids[i], 1, Phase::kForward, 0, Layout::kBF16, s);
      model.runtime.release(&ids[i], 1, s);
    }
    for (int i = 1; i >= 0; --i) {
      model.runtime.materialize(&ids[i], 1, Phase::kBackward, 0, Layout::kBF16, s);
      model.runtime.release(&ids[i], 1, s);
    }
    const std::size_t waits = backend.waits.size();
    const int mark = static_cast<int>(backend.log.size());
    model.runtime.drain(s, head);
    int last_gather = -1;  // the head's all-gather, issued by this drain
    for (int i = mark; i < static_cast<int>(backend.log.size()); ++i) {
      if (backend.log[i] == "all_gather on ag0") last_gather = i;
    }
    bool joined = false;  // `s` waited on an event of ag0 recorded after that gather
    for (Event e : backend.waited_by(s, waits)) {
      joined = joined || (backend.stream_name(backend.recorded.at(e)) == "ag0" && backend.recorded_at.at(e) > last_gather);
    }
    return std::make_pair(last_gather, joined);
  };
  step(Runtime::Head::kAtDrain);  // records the chains
  const auto [gathered, joined] = step(Runtime::Head::kAtDrain);
  EXPECT_GE(gathered, 0) << "the drain prefetched no head";
  EXPECT_TRUE(joined) << "syncing the drain's stream would not cover the head's gather";
  model.runtime.shard_updated(ids, 2, s);
  EXPECT_EQ(step(Runtime::Head::kAfterShardUpdate).first, -1) << "the head deferred to shard_updated was gathered at drain";
}

// The warm-up the CUDA backend runs at construction (NCCL connects at a communicator's first
// collective, which must not be a captured fill): per group each collective kind the runtime issues,
// on the stream (and so the communicator) it issues it on, then one synchronization; nothing left
// allocated.
TEST(Ordering, TheWarmUpIssuesEachCollectiveKindOnEachGroupsStreamsThenSynchronizes) {
  LoggingBackend backend(2, 2);
  backend.warm_up_collectives();
  std::vector<std::string> expected;
  for (const char* g : {"0", "1"}) {
    for (const std::string line : {"fill on ag", "all_reduce_max on ag", "all_gather on ag", "fill on rs",
                                   "reduce_scatter on rs"}) {
      expected.push_back(line + g);
    }
  }
  expected.push_back("synchronize");
  EXPECT_EQ(backend.log, expected);
  EXPECT_EQ(backend.memory().bytes_in_use, 0);
  EXPECT_EQ(backend.memory().allocations, 1);
}

// G = 1: the reduce-scatter is the identity, so the wgrad goes straight into the main grad and
// finalize enqueues only the grad-ready callback, after the consumer's wgrad.
TEST(Ordering, OnASizeOneGroupAnUndefinedGradBufferIsTheMainGradAndFinalizeMovesNothing) {
  LoggingBackend backend;
  RuntimeConfig config;
  std::vector<WeightId> ready;
  config.grads.grad_ready = [&ready](WeightId id) { ready.push_back(id); };
  Model model(backend, config);
  const WeightId id = model.add("w0", 0);
  const Stream s = consumer_stream(1);
  for (int step = 0; step < 2; ++step) {
    int mark = static_cast<int>(backend.log.size());
    const GradBuffer buffer = model.runtime.grad_buffer(id, s, GradInit::kUndefined);
    EXPECT_EQ(buffer.data, model.main_grads[0].data());
    EXPECT_FALSE(buffer.overwrite) << "the main grad holds earlier gradients: add into it";
    EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"s1 waits rs0"}));
    EXPECT_EQ(model.runtime.grad_buffer(id, s, GradInit::kUndefined).data, buffer.data);
    mark = static_cast<int>(backend.log.size());
    model.runtime.finalize(&id, 1, true, s);
    EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"rs0 waits s1", "host_callback on rs0"}));
    EXPECT_EQ(ready.size(), static_cast<std::size_t>(step + 1));
    mark = static_cast<int>(backend.log.size());
    model.runtime.drain(s);
    for (const std::string& line : since(backend, mark)) EXPECT_EQ(line.find("add"), std::string::npos) << line;
  }
  EXPECT_EQ(model.runtime.grads_stats().reduce_scatters, 0);
  EXPECT_EQ(model.runtime.grads_stats().into_main_grad, 2);
  EXPECT_EQ(model.runtime.grads_stats().pool_buffers, 0) << "no FP32 buffer allocated";
  // A zero-filled buffer (GradInit::kZero) keeps its promise: it is never the main grad.
  const GradBuffer zeroed = model.runtime.grad_buffer(id, s);
  EXPECT_NE(zeroed.data, model.main_grads[0].data());
  EXPECT_FALSE(zeroed.overwrite);
  model.runtime.finalize(&id, 1, true, s);
  model.runtime.drain(s);
  // Nor is a kUndefinedSeparate one (a consumer that can only write): the buffer path, reduced and added.
  const GradBuffer separate = model.runtime.grad_buffer(id, s, GradInit::kUndefinedSeparate);
  EXPECT_NE(separate.data, model.main_grads[0].data());
  EXPECT_TRUE(separate.overwrite);
  model.runtime.finalize(&id, 1, true, s);
  int mark = static_cast<int>(backend.log.size());
  model.runtime.drain(s);
  EXPECT_EQ(since(backend, mark).front(), "add on rs0");
  EXPECT_EQ(model.runtime.grads_stats().reduce_scatters, 2);
}

// A zero-filled buffer's add into the main grad is deferred; a later uninitialized buffer of the same
// weight (the main grad itself) must not be written before that add: it is enqueued first and the
// consumer waits for it.
TEST(Ordering, TheMainGradIsHandedOutOnlyAfterThePendingAddIntoItIsEnqueued) {
  LoggingBackend backend;
  Model model(backend);
  const WeightId id = model.add("w0", 0);
  const Stream s = consumer_stream(1);
  model.runtime.grad_buffer(id, s);  // kZero: a pooled buffer
  model.runtime.finalize(&id, 1, true, s);
  const int mark = static_cast<int>(backend.log.size());
  EXPECT_EQ(model.runtime.grad_buffer(id, s, GradInit::kUndefined).data, model.main_grads[0].data());
  EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"add on rs0", "s1 waits rs0"}));
  model.runtime.finalize(&id, 1, true, s);
  model.runtime.drain(s);
  EXPECT_EQ(model.runtime.grads_stats().reduce_scatters, 1);
  EXPECT_EQ(model.runtime.grads_stats().into_main_grad, 1);
}

TEST(Ordering, EachGroupHasItsOwnStreamsAndAKeySpanningGroupsJoinsTheirGatherStreams) {
  LoggingBackend backend(2);
  Model model(backend);
  const WeightId ids[] = {model.add("dense", 0), model.add("expert", 1)};
  const Stream s = consumer_stream(1);
  int mark = static_cast<int>(backend.log.size());
  model.runtime.shard_updated(ids, 2, s);
  EXPECT_GE(backend.find("amax on ag0", mark), 0);
  EXPECT_GE(backend.find("amax on ag1", mark), 0);
  EXPECT_GE(backend.find("all_reduce_max on ag1", mark), 0);
  mark = static_cast<int>(backend.log.size());
  model.runtime.materialize(&ids[1], 1, Phase::kForward, 0, Layout::kBF16, s);
  EXPECT_LT(backend.find("pack on ag1", mark), backend.find("all_gather on ag1", mark));
  EXPECT_GE(backend.find("pack on ag1", mark), 0);
  EXPECT_EQ(backend.find("all_gather on ag0", mark), -1);
  EXPECT_EQ(backend.find("pack on ag0", mark), -1) << "packed before its first gather";
  model.runtime.release(&ids[1], 1, s);
  // Both groups in one call: filled on the first weight's gather stream, after its own pack and ag1.
  mark = static_cast<int>(backend.log.size());
  model.runtime.materialize(ids, 2, Phase::kForward, 0, Layout::kBF16, s);
  const int packed = backend.find("pack on ag0", mark);
  const int joined = backend.find("ag0 waits ag1", mark);
  const int gathered = backend.find("all_gather on ag0", mark);
  ASSERT_GE(packed, 0);
  ASSERT_GE(joined, 0);
  ASSERT_GE(gathered, 0);
  EXPECT_LT(packed, gathered);
  EXPECT_LT(joined, gathered);
  EXPECT_EQ(backend.find("pack on ag1", mark), -1) << "packed twice";
  model.runtime.release(ids, 2, s);
  model.runtime.grad_buffer(ids[1], s);
  mark = static_cast<int>(backend.log.size());
  model.runtime.finalize(&ids[1], 1, true, s);
  EXPECT_EQ(since(backend, mark), (std::vector<std::string>{"rs1 waits s1", "reduce_scatter on rs1"}));
  mark = static_cast<int>(backend.log.size());
  model.runtime.drain(s);
  for (const char* line : {"add on rs1", "s1 waits ag0", "s1 waits rs0", "s1 waits ag1", "s1 waits rs1"}) {
    EXPECT_GE(backend.find(line, mark), 0) << line;
  }
}

// An MoE expert group is one key: its gathers go out as one batch, then one unpack_many per wire spec
// (one kernel launch on CUDA) instead of one unpack per weight; BF16 gathers in place (no unpack), and
// the GEMM layout stays one unpack_gemm per weight.
TEST(Ordering, AKeyUnpacksEachWireSpecOfItsWeightsInOneCallAfterItsGathers) {
  LoggingBackend backend;
  Model model(backend);
  const kernels::WireSpec fp8{kernels::WireFormat::kFP8};
  const kernels::WireSpec rceil{kernels::WireFormat::kMXFP8, kernels::ScaleRounding::kRceil};
  const kernels::WireSpec floor{kernels::WireFormat::kMXFP8, kernels::ScaleRounding::kFloor};
  std::vector<WeightId> experts;
  for (int e = 0; e < 8; ++e) experts.push_back(model.add("expert" + std::to_string(e), 0));
  const WeightId mixed[] = {model.add("fp8_a", 0, fp8),   model.add("rceil_a", 0, rceil),
                            model.add("fp8_b", 0, fp8),   model.add("bf16", 0, {kernels::WireFormat::kBF16}),
                            model.add("floor", 0, floor), model.add("rceil_b", 0, rceil),
                            model.add("fp8_c", 0, fp8)};
  const Stream s = consumer_stream(1);
  model.runtime.shard_updated(experts.data(), 8, s);
  model.runtime.shard_updated(mixed, 7, s);
  const auto fill_lines = [&](const WeightId* ids, std::int64_t n, Layout layout) {
    const int mark = static_cast<int>(backend.log.size());
    model.runtime.materialize(ids, n, Phase::kForward, 0, layout, s);
    model.runtime.release(ids, n, s, layout);
    std::vector<std::string> work;  // the fill's gathers and unpacks, in order
    for (const std::string& line : since(backend, mark)) {
      if (line.rfind("all_gather", 0) == 0 || line.rfind("unpack", 0) == 0) work.push_back(line);
    }
    return work;
  };
  std::vector<std::string> expected(8, "all_gather on ag0");
  expected.push_back("unpack_many x8 fp8 on ag0");
  EXPECT_EQ(fill_lines(experts.data(), 8, Layout::kBF16), expected);

  expected.assign(7, "all_gather on ag0");
  for (const char* line : {"unpack_many x3 fp8 on ag0", "unpack_many x2 mxfp8 (rceil) on ag0",
                           "unpack_many x1 mxfp8 (floor) on ag0"}) {
    expected.push_back(line);
  }
  EXPECT_EQ(fill_lines(mixed, 7, Layout::kBF16), expected) << "one call per wire spec, in first-named order";

  // The GEMM layout: one unpack_gemm per quantized weight, the BF16 weight still in place.
  expected.assign(7, "all_gather on ag0");
  expected.insert(expected.end(), 6, "unpack_gemm on ag0");
  EXPECT_EQ(fill_lines(mixed, 7, Layout::kGemm), expected);
}

// Weight i, 32 x 32 FP32 on the BF16 wire (a re-pack is one pack per weight, the cast, and no amax;
// a BF16 shard would be sent as it is, with nothing to pack), reading `shard`.
WeightDesc fp32_desc(int i, std::vector<float>& shard) {
  WeightDesc desc;
  desc.name = "w" + std::to_string(i);
  desc.shard = shard.data();
  desc.dtype = kernels::SourceDtype::kFP32;
  desc.rows = 32;
  desc.cols = 32;
  return desc;
}

// Lines of the log from `mark` on that are packs or all-gathers (the work whose order matters here).
std::vector<std::string> packs_and_gathers(const LoggingBackend& backend, int mark) {
  std::vector<std::string> work;
  for (const std::string& line : since(backend, mark)) {
    if (line.rfind("pack", 0) == 0 || line.rfind("all_gather", 0) == 0) work.push_back(line);
  }
  return work;
}

// shard_updated packs nothing: each weight is packed on its gather stream right before its first
// gather after the update, once; a weight gathered again in the same step is not packed again.
TEST(Ordering, EachWeightIsPackedRightBeforeItsFirstGatherAfterAnUpdate) {
  LoggingBackend backend;
  Runtime runtime(backend, RuntimeConfig{});  // depth 1
  std::vector<float> shard(32 * 32);
  std::vector<WeightId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(runtime.register_weight(fp32_desc(i, shard)));
  const Stream s = consumer_stream(1);
  int mark = static_cast<int>(backend.log.size());
  runtime.shard_updated(ids.data(), 3, s);
  EXPECT_TRUE(packs_and_gathers(backend, mark).empty());
  mark = static_cast<int>(backend.log.size());
  runtime.materialize(&ids[1], 1, Phase::kForward, 0, Layout::kBF16, s);  // recording: on demand
  runtime.release(&ids[1], 1, s);
  runtime.materialize(&ids[1], 1, Phase::kBackward, 0, Layout::kBF16, s);
  runtime.release(&ids[1], 1, s);
  EXPECT_EQ(packs_and_gathers(backend, mark),
            (std::vector<std::string>{"pack on ag0", "all_gather on ag0", "all_gather on ag0"}));
  runtime.drain(s);
  // Another update before weights 0 and 2 were ever gathered: still one pack each, at their gathers.
  runtime.shard_updated(ids.data(), 3, s);
  mark = static_cast<int>(backend.log.size());
  for (WeightId id : {ids[0], ids[2]}) {
    runtime.materialize(&id, 1, Phase::kForward, 1, Layout::kBF16, s);
    runtime.release(&id, 1, s);
  }
  EXPECT_EQ(packs_and_gathers(backend, mark), (std::vector<std::string>{"pack on ag0", "all_gather on ag0",
                                                                       "pack on ag0", "all_gather on ag0"}));
  EXPECT_EQ(runtime.registry().get(ids[0]).version, 2u);
}

// The re-pack after an optimizer step gathers right away only what follows it (a stale prefetch of the
// head, the head deferred to the re-pack, or a head that was kept gathered), each after its own pack;
// every other weight is packed at its first gather of the step. So the next step's first forward
// waits for one pack and one gather, and no gather queues behind the packs of the whole model.
TEST(Ordering, TheRepackGathersTheHeadAfterItsOwnPackOnly) {
  struct Case {
    const char* name;
    Runtime::Head head;
    bool keep;
  };
  for (const Case c : {Case{"head prefetched at drain", Runtime::Head::kAtDrain, false},
                       Case{"head deferred to the re-pack", Runtime::Head::kAfterShardUpdate, false},
                       Case{"head kept gathered", Runtime::Head::kAtDrain, true}}) {
    SCOPED_TRACE(c.name);
    LoggingBackend backend;
    RuntimeConfig config;
    config.keep_gathered = c.keep;
    Runtime runtime(backend, config);
    std::vector<float> shard(32 * 32);
    std::vector<WeightId> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(runtime.register_weight(fp32_desc(i, shard)));
    const Stream s = consumer_stream(1);
    const auto step = [&] {
      for (int i = 0; i < 4; ++i) {
        runtime.materialize(&ids[i], 1, Phase::kForward, 0, Layout::kBF16, s);
        runtime.release(&ids[i], 1, s);
      }
      for (int i = 3; i >= 0; --i) {
        runtime.materialize(&ids[i], 1, Phase::kBackward, 0, Layout::kBF16, s);
        runtime.release(&ids[i], 1, s);
      }
      runtime.drain(s, c.head);
    };
    for (int i = 0; i < 2; ++i) {
      runtime.shard_updated(ids.data(), 4, s);
      step();
    }
    int mark = static_cast<int>(backend.log.size());
    runtime.shard_updated(ids.data(), 4, s);
    EXPECT_EQ(packs_and_gathers(backend, mark), (std::vector<std::string>{"pack on ag0", "all_gather on ag0"}));
    // The step packs each other weight once, each right before its first gather.
    mark = static_cast<int>(backend.log.size());
    const RuntimeStats before = runtime.stats();
    step();
    EXPECT_EQ(runtime.stats().prefetch_hits + runtime.stats().kept_hits, before.prefetch_hits + before.kept_hits + 8)
        << "every consume of the step served without an on-demand gather";
    const std::vector<std::string> work = packs_and_gathers(backend, mark);
    EXPECT_EQ(std::count(work.begin(), work.end(), "pack on ag0"), 3);
    for (std::size_t i = 0; i < work.size(); ++i) {
      if (work[i] == "pack on ag0") {
        ASSERT_LT(i + 1, work.size());
        EXPECT_EQ(work[i + 1], "all_gather on ag0") << "a pack not followed by its gather, at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace gtp::remat
