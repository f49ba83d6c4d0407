// Main grads declared zero (Runtime::main_grads_zeroed, Grads::declare_zeroed) on the host backend with
// ranks as threads: the same main grads, bit for bit, as without the declaration (one and two ranks,
// every GradInit, microbatches accumulated or not, over poisoned memory); the first buffer is the main
// grad on one rank and the reduced rows are copied at G = 2 (stats); misuse refused with nothing declared.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "testing/remat/test_model.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using testing::TrainOptions;
using testing::TrainReport;
using testing::on_ranks;

void expect_invalid(const std::function<void()>& call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << text << "'";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
  }
}

const char* init_name(GradInit init) {
  return init == GradInit::kZero ? "kZero" : init == GradInit::kUndefined ? "kUndefined" : "kUndefinedSeparate";
}

// train_and_check compares every step's main grads with the reference and, when declared on one rank,
// checks that the first buffer is the main grad; here the last step's main grads of the declared run
// must also equal the undeclared run's byte for byte, and the stats must show the declaration was used.
TEST(GradsZeroed, DeclaredMainGradsEqualTheUndeclaredRunBitForBit) {
  struct Case {
    int ranks;
    GradInit init;
    bool accumulate;
  };
  std::vector<Case> cases;
  for (int ranks : {1, 2}) {
    for (GradInit init : {GradInit::kZero, GradInit::kUndefined, GradInit::kUndefinedSeparate}) {
      for (bool accumulate : {false, true}) cases.push_back(Case{ranks, init, accumulate});
    }
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.ranks) + " ranks, " + init_name(c.init) + (c.accumulate ? ", accumulated" : ""));
    TrainOptions options;
    options.steps = 3;
    options.microbatches = 3;
    options.grad_init = c.init;
    options.poison_memory = true;
    options.config.grads.accumulate_microbatches = c.accumulate;
    std::vector<TrainReport> plain(c.ranks), declared(c.ranks);
    on_ranks(c.ranks, [&](comm::HostComm& comm) { testing::train_and_check(comm, options, &plain[comm.rank()]); });
    options.declare_zeroed = true;
    on_ranks(c.ranks, [&](comm::HostComm& comm) { testing::train_and_check(comm, options, &declared[comm.rank()]); });
    const auto& shapes = testing::layer_shapes();
    const std::int64_t layers = static_cast<std::int64_t>(shapes.size());
    for (int rank = 0; rank < c.ranks; ++rank) {
      const GradsStats& before = plain[rank].grads;
      const GradsStats& after = declared[rank].grads;
      EXPECT_EQ(before.zeroed_handouts + before.zeroed_copies, 0);
      std::int64_t with_rows = 0;  // weights with rows on this rank: the only ones declared
      for (std::int64_t l = 0; l < layers; ++l) {
        const auto geometry = kernels::weight_geometry(kernels::WireFormat::kBF16, shapes[l].rows, shapes[l].cols,
                                                       c.ranks);
        with_rows += geometry.valid_rows(rank) > 0 ? 1 : 0;
        const auto& a = plain[rank].main_grads[l];
        const auto& b = declared[rank].main_grads[l];
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "rank " << rank << " layer " << l;
      }
      // One declaration per weight and step, each consumed by the step's first buffer.
      if (c.ranks == 1) {
        EXPECT_EQ(after.zeroed_handouts, options.steps * with_rows);
        EXPECT_EQ(after.zeroed_copies, 0);
      } else {
        EXPECT_EQ(after.zeroed_handouts, 0);
        EXPECT_EQ(after.zeroed_copies, options.steps * with_rows);
      }
    }
  }
}

TEST(GradsZeroed, MisuseIsRefusedAndDeclaresNothing) {
  on_ranks(2, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    Runtime runtime(backend, RuntimeConfig{});
    std::vector<std::uint16_t> shard(16 * 16, 0x3F80);
    std::vector<float> grad_a(16 * 16, 0.0f), grad_b(16 * 16, 0.0f);
    WeightDesc desc;
    desc.shard = shard.data();
    desc.rows = 32;
    desc.cols = 16;
    desc.name = "a";
    desc.main_grad = grad_a.data();
    const WeightId a = runtime.register_weight(desc);
    desc.name = "b";
    desc.main_grad = grad_b.data();
    const WeightId b = runtime.register_weight(desc);
    desc.name = "no_grad";
    desc.main_grad = nullptr;
    const WeightId no_grad = runtime.register_weight(desc);

    const WeightId a_and_no_grad[] = {a, no_grad};
    expect_invalid([&] { runtime.main_grads_zeroed(a_and_no_grad, 2); }, "'no_grad' was registered without a main grad");
        const WeightId unknown = 42;
    expect_invalid([&] { runtime.main_grads_zeroed(&unknown, 1); }, "42 is not registered");

    // A buffer handed out, then an add pending (finalized, not drained): both refused, nothing declared.
    runtime.grad_buffer(a, nullptr, GradInit::kUndefined);
    const WeightId b_and_a[] = {b, a};
    expect_invalid([&] { runtime.main_grads_zeroed(b_and_a, 2); }, "'a' has a grad buffer handed out");
    expect_invalid([&] { runtime.main_grads_zeroed(nullptr, 0); }, "drain first");
    runtime.finalize(&a, 1, true, nullptr);
    expect_invalid([&] { runtime.main_grads_zeroed(&a, 1); }, "main-grad add pending");
    runtime.drain(nullptr);
    runtime.grad_buffer(b, nullptr, GradInit::kUndefined);
    runtime.finalize(&b, 1, true, nullptr);
    runtime.drain(nullptr);
    EXPECT_EQ(runtime.grads_stats().zeroed_copies, 0) << "a refused declaration declared b";

    // After drain: every weight with a main grad (no_grad is skipped by n = 0); unregister drops it.
    runtime.main_grads_zeroed(nullptr, 0);
    runtime.unregister_weight(b);
    runtime.grad_buffer(a, nullptr, GradInit::kUndefined);
    runtime.finalize(&a, 1, true, nullptr);
    runtime.drain(nullptr);
    EXPECT_EQ(runtime.grads_stats().zeroed_copies, 1);
  });
}

// A declaration is consumed by the first buffer only: a step without one (zeroed, declared, but the
// second microbatch's main grad already holds the first's) must add, never copy or write.
TEST(GradsZeroed, OnlyTheFirstBufferAfterADeclarationSkipsTheAdd) {
  on_ranks(1, [](comm::HostComm& comm) {
    HostBackend backend({&comm});
    Runtime runtime(backend, RuntimeConfig{});
    std::vector<std::uint16_t> shard(16 * 16, 0x3F80);
    std::vector<float> grad(16 * 16, 5.0f);
    WeightDesc desc;
    desc.name = "w";
    desc.shard = shard.data();
    desc.rows = 16;
    desc.cols = 16;
    desc.main_grad = grad.data();
    const WeightId id = runtime.register_weight(desc);
    std::fill(grad.begin(), grad.end(), 0.0f);
    runtime.main_grads_zeroed(&id, 1);
    for (int mb = 0; mb < 2; ++mb) {
      const GradBuffer g = runtime.grad_buffer(id, nullptr, GradInit::kUndefinedSeparate);
      EXPECT_EQ(g.data == grad.data(), mb == 0) << "mb " << mb;
      EXPECT_TRUE(g.overwrite) << "mb " << mb;
      std::fill(g.data, g.data + 16 * 16, 1.0f + mb);  // the consumer's write
      runtime.finalize(&id, 1, true, nullptr);
    }
    runtime.drain(nullptr);
    for (float v : grad) ASSERT_EQ(v, 3.0f);
    EXPECT_EQ(runtime.grads_stats().zeroed_handouts, 1);
  });
}

// A test double: the host backend reporting every stream as under CUDA graph capture while `on` (the
// host backend has no graphs; only the runtime's reaction to a capture is checked here).
class CaptureReportingHostBackend : public HostBackend {
 public:
  using HostBackend::HostBackend;
  bool capturing(Stream) override { return on; }
  bool on = false;
};

// A replay cannot know that the main grad was zeroed again: a buffer handed out under capture drops the
// declaration and takes the ordinary path (pooled, added at drain).
TEST(GradsZeroed, ABufferHandedOutUnderCaptureDropsTheDeclaration) {
  on_ranks(1, [](comm::HostComm& comm) {
    CaptureReportingHostBackend backend({&comm});
    Runtime runtime(backend, RuntimeConfig{});
    std::vector<std::uint16_t> shard(16 * 16, 0x3F80);
    std::vector<float> grad(16 * 16, 0.0f);
    WeightDesc desc;
    desc.name = "w";
    desc.shard = shard.data();
    desc.rows = 16;
    desc.cols = 16;
    desc.main_grad = grad.data();
    const WeightId id = runtime.register_weight(desc);
    runtime.main_grads_zeroed(&id, 1);
    backend.on = true;
    const GradBuffer g = runtime.grad_buffer(id, nullptr, GradInit::kUndefinedSeparate);
    backend.on = false;
    EXPECT_NE(g.data, grad.data());
    EXPECT_TRUE(g.overwrite);
    std::fill(g.data, g.data + 16 * 16, 4.0f);
    runtime.finalize(&id, 1, true, nullptr);
    runtime.drain(nullptr);
    for (float v : grad) ASSERT_EQ(v, 4.0f);
    EXPECT_EQ(runtime.grads_stats().zeroed_handouts, 0);
    EXPECT_EQ(runtime.grads_stats().reduce_scatters, 1);
    // Dropped, not kept for later: the next eager buffer is the ordinary one too.
    EXPECT_NE(runtime.grad_buffer(id, nullptr, GradInit::kUndefinedSeparate).data, grad.data());
    runtime.finalize(&id, 1, true, nullptr);
    runtime.drain(nullptr);
  });
}

}  // namespace
}  // namespace gtp::remat
