// The precondition of CUDA-graph capture, checked on the host backend (the cache and chain logic are
// the same on every backend): from the second step on, a step with the same calls leaves the cache in
// the state it found it, so every materialize and grad_buffer returns the same address as in the step
// before and nothing is allocated, also with per-group depths. The shapes and wires are those of
// cuda_graph_test.
#include <gtest/gtest.h>

#include <chrono>
#include <utility>
#include <vector>

#include "comm/host.h"
#include "comm/thread_bootstrap.h"
#include "remat/host_backend.h"
#include "remat/runtime.h"

namespace gtp::remat {
namespace {

using std::chrono::milliseconds;

struct LayerSpec {
  std::int64_t rows, cols;
  kernels::SourceDtype dtype;
  kernels::WireSpec wire;
};

// Five steps of forward and backward over the layers (the last one in group `last_group`, the others
// in group 0), checking from step 2 on that the addresses repeat and nothing is allocated.
void expect_steady_state(const RuntimeConfig& config, int last_group) {
  const std::vector<LayerSpec> layers = {
      {64, 128, kernels::SourceDtype::kBF16, {kernels::WireFormat::kBF16}},
      {96, 64, kernels::SourceDtype::kFP32, {kernels::WireFormat::kFP8}},
      {128, 96, kernels::SourceDtype::kBF16, {kernels::WireFormat::kNVFP4}},
  };
  auto bootstrap = comm::ThreadBootstrap::create_group(1, milliseconds(30000));
  comm::HostComm comm(*bootstrap[0], milliseconds(30000));
  HostBackend backend(std::vector<comm::HostComm*>(last_group + 1, &comm));
  Runtime runtime(backend, config);
  std::vector<std::vector<float>> shards, main_grads;
  std::vector<WeightId> ids;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    shards.emplace_back(layers[l].rows * layers[l].cols, 0.25f);  // FP32 or BF16 bytes: big enough for both
    main_grads.emplace_back(layers[l].rows * layers[l].cols, 0.0f);
    WeightDesc desc;
    desc.name = "layer" + std::to_string(l);
    desc.shard = shards.back().data();
    desc.dtype = layers[l].dtype;
    desc.rows = layers[l].rows;
    desc.cols = layers[l].cols;
    desc.wire = layers[l].wire;
    desc.group = l + 1 == layers.size() ? last_group : 0;
    desc.main_grad = main_grads.back().data();
    ids.push_back(runtime.register_weight(desc));
  }
  std::vector<void*> previous;
  std::int64_t allocations = 0;
  for (int step = 0; step < 5; ++step) {
    runtime.shard_updated(ids.data(), static_cast<std::int64_t>(ids.size()), nullptr);
    std::vector<void*> addresses;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      addresses.push_back(runtime.materialize(&ids[l], 1, Phase::kForward, 0, Layout::kBF16, nullptr)[0]);
      runtime.release(&ids[l], 1, nullptr);
    }
    for (std::size_t l = layers.size(); l-- > 0;) {
      addresses.push_back(runtime.materialize(&ids[l], 1, Phase::kBackward, 0, Layout::kBF16, nullptr)[0]);
      addresses.push_back(runtime.grad_buffer(ids[l], nullptr).data);
      runtime.release(&ids[l], 1, nullptr);
      runtime.finalize(&ids[l], 1, true, nullptr);
    }
    runtime.drain(nullptr);
    if (step >= 2) {
      EXPECT_EQ(addresses, previous) << "step " << step;
      EXPECT_EQ(backend.memory().allocations, allocations) << "step " << step;
    }
    previous = addresses;
    allocations = backend.memory().allocations;
  }
  EXPECT_EQ(runtime.stats().chain_mismatches, 0) << runtime.stats().last_mismatch;
}

class SteadyState : public ::testing::TestWithParam<int> {};

TEST_P(SteadyState, StepsAfterTheFirstTwoRepeatAddressesAndAllocateNothing) {
  RuntimeConfig config;
  config.depth = GetParam();
  expect_steady_state(config, 0);
}

INSTANTIATE_TEST_SUITE_P(Depths, SteadyState, ::testing::Values(0, 1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "depth" + std::to_string(info.param); });


// Two groups with their own depths (the last layer in group 1): the same precondition per group.
class SteadyStatePerGroup : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(SteadyStatePerGroup, StepsAfterTheFirstTwoRepeatAddressesAndAllocateNothing) {
  RuntimeConfig config;
  config.groups = {{GetParam().first, 0, "dense"}, {GetParam().second, 0, "experts"}};
  expect_steady_state(config, 1);
}

INSTANTIATE_TEST_SUITE_P(Depths, SteadyStatePerGroup,
                         ::testing::Values(std::pair{2, 0}, std::pair{0, 2}, std::pair{1, 3}, std::pair{3, 1}),
                         [](const ::testing::TestParamInfo<std::pair<int, int>>& info) {
                           return "dense" + std::to_string(info.param.first) + "_expert" +
                                  std::to_string(info.param.second);
                         });

}  // namespace
}  // namespace gtp::remat
