// A weight materialized again while an earlier use still holds it: both uses share one buffer, each
// release ends one use, and the buffer is reused only after the last one. Release names weights, not
// buffers, so two buffers for one weight would leave it to chance which one a release frees while the
// caller still reads the other. Checked by contents, over random interleavings on 1 and 2 ranks of the
// host backend, and on the CUDA backend (a size-1 NCCL group; skips without a GPU) with each use on
// one of two streams, so a second use on another stream must wait on the first use's fill.
#include <cuda_runtime_api.h>

#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bindings/c/internal/test_ranks.h"
#include "kernels/cuda_kernels.h"

namespace {

using gtp::cabi_test::create;

constexpr int64_t kRows = 32, kCols = 16;

// A weight whose full value is known to every rank: element (r, c) of weight `k` is a BF16 pattern
// drawn from `seed`, so every rank can check any buffer without a gather of its own.
struct Weight {
  std::vector<uint16_t> full;
  std::vector<uint16_t> shard;
  std::vector<float> main_grad;
  void* device_shard = nullptr;  // CUDA backend: the shard (and its main grad after it) in device memory
  gtp_weight_t handle{};
};

std::vector<uint16_t> full_value(uint32_t seed, int k) {
  std::mt19937 random(seed * 31 + static_cast<uint32_t>(k));
  std::uniform_int_distribution<int> exponent(0x70, 0x8F), mantissa(0, 127), sign(0, 1);
  std::vector<uint16_t> out(kRows * kCols);
  for (uint16_t& v : out) v = static_cast<uint16_t>(sign(random) << 15 | exponent(random) << 7 | mantissa(random));
  return out;
}

std::vector<Weight> register_weights(gtp_context_t* ctx, int rank, int world, int count, uint32_t seed,
                                     bool cuda = false) {
  std::vector<Weight> weights(count);
  const int64_t shard_rows = kRows / world;
  for (int k = 0; k < count; ++k) {
    Weight& w = weights[k];
    w.full = full_value(seed, k);
    w.shard.assign(w.full.begin() + rank * shard_rows * kCols, w.full.begin() + (rank + 1) * shard_rows * kCols);
    w.main_grad.assign(w.shard.size(), 0.0f);
    const std::string name = "w" + std::to_string(k);
    gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
    desc.name = name.c_str();
    desc.shard = w.shard.data();
    desc.main_grad = w.main_grad.data();
    if (cuda) {
      const size_t shard_bytes = w.shard.size() * sizeof(uint16_t);
      EXPECT_EQ(cudaMalloc(&w.device_shard, shard_bytes + w.main_grad.size() * sizeof(float)), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(w.device_shard, w.shard.data(), shard_bytes, cudaMemcpyHostToDevice), cudaSuccess);
      desc.shard = w.device_shard;
      desc.main_grad = reinterpret_cast<float*>(static_cast<char*>(w.device_shard) + shard_bytes);
    }
    desc.rows = kRows;
    desc.cols = kCols;
    desc.wire = GTP_WIRE_BF16;  // exact: the buffer must equal the full value bit for bit
    EXPECT_EQ(gtp_weight_register(ctx, &desc, &w.handle), GTP_SUCCESS) << gtp_last_error(ctx);
  }
  std::vector<gtp_weight_t> handles;
  for (const Weight& w : weights) handles.push_back(w.handle);
  EXPECT_EQ(gtp_weights_shard_updated(ctx, handles.data(), handles.size(), nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  return weights;
}

void* materialize(gtp_context_t* ctx, const Weight& w, cudaStream_t stream = nullptr) {
  void* ptr = nullptr;
  size_t count = 0;
  EXPECT_EQ(gtp_materialize(ctx, &w.handle, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, stream),
            GTP_SUCCESS)
      << gtp_last_error(ctx);
  return ptr;
}

// Whether the buffer a use got holds `w`. CUDA: copied out on the use's stream (ordered after the
// fill only if materialize made that stream wait on it).
bool holds(const void* ptr, const Weight& w, bool cuda = false, cudaStream_t stream = nullptr) {
  if (ptr == nullptr) return false;
  const size_t bytes = w.full.size() * sizeof(uint16_t);
  std::vector<uint16_t> got(w.full.size());
  if (cuda) {
    EXPECT_EQ(cudaMemcpyAsync(got.data(), ptr, bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  } else {
    std::memcpy(got.data(), ptr, bytes);
  }
  return got == w.full;
}

TEST(SharedUse, ASecondMaterializeOfAHeldWeightSharesItsBufferUntilTheLastRelease) {
  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  gtp_context_t* ctx = create(callbacks);
  const uint32_t seed = std::random_device{}();
  std::vector<Weight> w = register_weights(ctx, 0, 1, 4, seed);
  void* first = materialize(ctx, w[2]);
  void* second = materialize(ctx, w[2]);
  EXPECT_EQ(first, second) << "two uses of one weight got two buffers";
  ASSERT_EQ(gtp_release(ctx, &w[2].handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  void* other = materialize(ctx, w[3]);  // must not reuse the buffer the remaining use still reads
  EXPECT_NE(other, first);
  EXPECT_TRUE(holds(first, w[2])) << "seed " << seed;
  EXPECT_TRUE(holds(other, w[3])) << "seed " << seed;
  ASSERT_EQ(gtp_release(ctx, &w[2].handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  EXPECT_GTP_ERROR(gtp_release(ctx, &w[2].handle, 1, nullptr), GTP_ERROR_INVALID_STATE, ctx, "is not materialized");
  ASSERT_EQ(gtp_release(ctx, &w[3].handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
  EXPECT_EQ(stats.at("materialize").at("calls").get<int>(), 3) << stats;
  EXPECT_EQ(stats.at("materialize").at("shared_hits").get<int>(), 1) << stats;
  EXPECT_EQ(stats.at("groups").at(0).at("shared_hits").get<int>(), 1) << stats;
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

// A use held across a re-pack reads the old shards; a materialize after the re-pack cannot share it,
// and a second buffer would make the next release ambiguous: refused until that use is released.
TEST(SharedUse, AMaterializeAfterAShardUpdatedWhileAnOldUseIsHeldIsRefusedUntilItsRelease) {
  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  gtp_context_t* ctx = create(callbacks);
  const uint32_t seed = std::random_device{}();
  std::vector<Weight> w = register_weights(ctx, 0, 1, 2, seed);
  void* old_use = materialize(ctx, w[0]);
  const Weight before = w[0];
  w[0].full = full_value(seed + 1, 0);
  w[0].shard = w[0].full;
  ASSERT_EQ(gtp_weights_shard_updated(ctx, &w[0].handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  EXPECT_TRUE(holds(old_use, before)) << "seed " << seed;
  void* ptr = nullptr;
  size_t count = 0;
  EXPECT_GTP_ERROR(gtp_materialize(ctx, &w[0].handle, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, nullptr),
                   GTP_ERROR_INVALID_ARGUMENT, ctx, "weight 'w0' is still materialized from before a shard_updated");
  ASSERT_EQ(gtp_release(ctx, &w[0].handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  void* fresh = materialize(ctx, w[0]);
  EXPECT_TRUE(holds(fresh, w[0])) << "seed " << seed;
  ASSERT_EQ(gtp_release(ctx, &w[0].handle, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

// Random materialize / release over 4 weights, the same sequence on every rank (each step's choice
// from a shared seed); after every step each outstanding use's buffer still holds its weight. With
// `streams`, each use runs on one of them, picked at random, and is released there.
struct Use {
  void* ptr;
  cudaStream_t stream;
};

void interleave(int ctx_rank, gtp_context_t* ctx, std::vector<Weight>& w, uint32_t seed, int steps,
                const std::vector<cudaStream_t>& streams) {
  const bool cuda = !streams.empty();
  std::mt19937 random(seed);
  std::multimap<int, Use> uses;  // weight -> each outstanding use
  int wrong = 0;
  for (int step = 0; step < steps && wrong == 0; ++step) {
    const int k = static_cast<int>(random() % w.size());
    const bool release = uses.count(k) > 0 && (random() % 2 == 0 || uses.size() > 6);
    if (release) {
      auto use = uses.lower_bound(k);  // any of its uses: the caller may go on reading the others
      std::advance(use, static_cast<long>(random() % uses.count(k)));
      ASSERT_EQ(gtp_release(ctx, &w[k].handle, 1, use->second.stream), GTP_SUCCESS) << gtp_last_error(ctx);
      uses.erase(use);
    } else {
      const cudaStream_t stream = cuda ? streams[random() % streams.size()] : nullptr;
      uses.emplace(k, Use{materialize(ctx, w[k], stream), stream});
    }
    for (const auto& [weight, use] : uses) {
      if (!holds(use.ptr, w[weight], cuda, use.stream)) {
        ADD_FAILURE() << "rank " << ctx_rank << " step " << step << ": a held use of w" << weight
                      << " reads other data (seed " << seed << ")";
        ++wrong;
      }
    }
  }
  for (const auto& [weight, use] : uses) {
    EXPECT_EQ(gtp_release(ctx, &w[weight].handle, 1, use.stream), GTP_SUCCESS) << gtp_last_error(ctx);
  }
}

void interleave_on_host(int world, int steps) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  gtp::cabi_test::on_ranks(world, [&](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    gtp_context_t* ctx = create(callbacks);
    std::vector<Weight> w = register_weights(ctx, rank, world, 4, seed);
    interleave(rank, ctx, w, seed, steps, {});
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(SharedUse, RandomInterleavingsOnOneRankNeverHandAHeldBufferToAnotherWeight) { interleave_on_host(1, 3000); }

TEST(SharedUse, RandomInterleavingsOnTwoRanksNeverHandAHeldBufferToAnotherWeight) { interleave_on_host(2, 1000); }

TEST(SharedUse, RandomInterleavingsOnTheCudaBackendOverTwoStreams) {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.backend = GTP_BACKEND_CUDA;
  gtp_context_t* ctx = nullptr;
  ASSERT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::vector<Weight> w = register_weights(ctx, 0, 1, 4, seed, /*cuda=*/true);
  std::vector<cudaStream_t> streams(2);
  for (cudaStream_t& stream : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  interleave(0, ctx, w, seed, 1000, streams);
  const nlohmann::json stats = gtp::cabi_test::stats_of(ctx);
  EXPECT_GT(stats.at("materialize").at("shared_hits").get<int>(), 0) << stats;
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  for (cudaStream_t stream : streams) EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  for (Weight& weight : w) EXPECT_EQ(cudaFree(weight.device_shard), cudaSuccess);
}

}  // namespace
