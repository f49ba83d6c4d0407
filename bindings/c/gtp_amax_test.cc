// gtp_weight_amax on the host backend, 2 thread ranks of one group (G = 2): each rank's shard has a
// different amax and both read the group's max, the FP8 decode scale the pack wrote is 1 / (448 /
// that max), a second update gives the new max, a subset update leaves the other weight's amax, the
// value survives the group's amax array growing, and every misuse is refused with nothing written.
#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bindings/c/internal/test_ranks.h"
#include "kernels/codecs.h"

namespace {

using gtp::cabi_test::create;
using gtp::cabi_test::on_ranks;

constexpr int64_t kRows = 64, kCols = 32;  // 32 rows per rank at G = 2 on every wire
constexpr int64_t kShardRows = kRows / 2;

std::string profile() {
  return gtp::cabi_test::profile_with(2, {{"tensor_parallel_num_weight_shards", 2}});
}

gtp_weight_t add(gtp_context_t* ctx, const char* name, gtp_wire_t wire, const std::vector<float>& shard,
                 int32_t nvfp4_2d = 0) {
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = name;
  desc.shard = shard.data();
  desc.dtype = GTP_DTYPE_FP32;
  desc.rows = kRows;
  desc.cols = kCols;
  desc.wire = wire;
  desc.nvfp4_2d = nvfp4_2d;
  gtp_weight_t w{};
  EXPECT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
  return w;
}

// Values of |x| <= 1 everywhere, then `peak` (negated: |x| counts) at one element of this rank's shard.
void fill(std::vector<float>& shard, float peak, int64_t at) {
  for (std::size_t i = 0; i < shard.size(); ++i) shard[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  shard[at] = -peak;
}

float amax_of(gtp_context_t* ctx, gtp_weight_t w) {
  const float* slot = nullptr;
  EXPECT_EQ(gtp_weight_amax(ctx, w, &slot), GTP_SUCCESS) << gtp_last_error(ctx);
  return slot != nullptr ? *slot : std::nanf("");
}

// The decode scale the FP8 pack wrote into the weight's GEMM layout (the same in every chunk).
float fp8_decode_scale(gtp_context_t* ctx, gtp_weight_t w) {
  gtp_materialized_t view = GTP_MATERIALIZED_INITIALIZER;
  size_t count = 0;
  EXPECT_EQ(gtp_materialize_views(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, &view, 1, &count, nullptr),
            GTP_SUCCESS)
      << gtp_last_error(ctx);
  const float scale = static_cast<const float*>(view.decode_scales.ptr)[0];
  EXPECT_EQ(static_cast<const float*>(view.decode_scales.ptr)[1], scale);
  EXPECT_EQ(gtp_release_layout(ctx, &w, 1, GTP_LAYOUT_GEMM, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
  return scale;
}

TEST(WeightAmax, EachRankReadsTheGroupMaxOfTheLatestUpdate) {
  on_ranks(2, [](int rank, const gtp_bootstrap_callbacks_t& callbacks) {
    const std::string text = profile();
    gtp_context_t* ctx = create(callbacks, text.c_str());
    ASSERT_NE(ctx, nullptr);
    std::vector<float> nv(kShardRows * kCols), f8(kShardRows * kCols);
    // Rank 1 holds the NVFP4 weight's max (and an Inf and a NaN, which the amax skips), rank 0 the FP8's.
    fill(nv, rank == 0 ? 3.5f : 5.25f, 17 + rank);
    if (rank == 1) nv[3] = std::numeric_limits<float>::infinity(), nv[4] = std::nanf("");
    fill(f8, rank == 0 ? 9.0f : 2.0f, 40);
    const gtp_weight_t w_nv = add(ctx, "nv", GTP_WIRE_NVFP4, nv, 1);
    const gtp_weight_t w_f8 = add(ctx, "f8", GTP_WIRE_FP8, f8);
    const gtp_weight_t both[] = {w_nv, w_f8};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, both, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(amax_of(ctx, w_nv), 5.25f) << "rank " << rank;
    EXPECT_EQ(amax_of(ctx, w_f8), 9.0f) << "rank " << rank;
    EXPECT_EQ(fp8_decode_scale(ctx, w_f8), 1.0f / gtp::kernels::codec::fp8_encode_scale(9.0f)) << "the amax the pack used";

    // New shards: the max moves to the other rank; the next update gives it to both.
    fill(nv, rank == 0 ? 7.75f : 1.0f, 5);
    fill(f8, rank == 0 ? 1.5f : 12.0f, 9);
    ASSERT_EQ(gtp_weights_shard_updated(ctx, both, 2, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(amax_of(ctx, w_nv), 7.75f) << "rank " << rank;
    EXPECT_EQ(amax_of(ctx, w_f8), 12.0f) << "rank " << rank;
    EXPECT_EQ(fp8_decode_scale(ctx, w_f8), 1.0f / gtp::kernels::codec::fp8_encode_scale(12.0f));

    // An update of the FP8 weight alone leaves the NVFP4 weight's amax as its last update left it.
    fill(f8, 1.75f, 0);  // the background reaches |x| = 1
    ASSERT_EQ(gtp_weights_shard_updated(ctx, &w_f8, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_EQ(amax_of(ctx, w_f8), 1.75f);
    EXPECT_EQ(amax_of(ctx, w_nv), 7.75f);

    // 70 more FP8 weights grow the group's amax array past its first 64 slots: the address may move
    // (queried again), the value stays.
    std::vector<std::string> names;
    for (int i = 0; i < 70; ++i) names.push_back("extra" + std::to_string(i));
    for (const std::string& name : names) add(ctx, name.c_str(), GTP_WIRE_FP8, f8);
    EXPECT_EQ(amax_of(ctx, w_nv), 7.75f);
    EXPECT_EQ(amax_of(ctx, w_f8), 1.75f);
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

TEST(WeightAmax, MisuseIsRefusedNamingTheWeightAndTheFix) {
  const float* untouched = nullptr;
  EXPECT_GTP_ERROR(gtp_weight_amax(nullptr, gtp_weight_t{}, &untouched), GTP_ERROR_INVALID_ARGUMENT, nullptr,
                   "ctx is NULL");
  on_ranks(2, [](int, const gtp_bootstrap_callbacks_t& callbacks) {
    const std::string text = profile();
    gtp_context_t* ctx = create(callbacks, text.c_str());
    ASSERT_NE(ctx, nullptr);
    std::vector<float> shard(kShardRows * kCols);
    fill(shard, 1.0f, 0);
    const gtp_weight_t bf16 = add(ctx, "b", GTP_WIRE_BF16, shard);
    const gtp_weight_t mx = add(ctx, "mx", GTP_WIRE_MXFP8, shard);
    const gtp_weight_t nv = add(ctx, "nv", GTP_WIRE_NVFP4, shard);
    const float* const sentinel = reinterpret_cast<const float*>(&text);
    const float* out = sentinel;
    EXPECT_GTP_ERROR(gtp_weight_amax(ctx, nv, &out), GTP_ERROR_INVALID_STATE, ctx,
                     "weight 'nv' has no amax yet: it was never packed; call gtp_weights_shard_updated");
    const gtp_weight_t all[] = {bf16, mx, nv};
    ASSERT_EQ(gtp_weights_shard_updated(ctx, all, 3, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_weight_amax(ctx, bf16, &out), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "weight 'b' travels on the bf16 wire, which encodes without a tensor amax");
    EXPECT_GTP_ERROR(gtp_weight_amax(ctx, mx, &out), GTP_ERROR_INVALID_ARGUMENT, ctx,
                     "weight 'mx' travels on the mxfp8 wire");
    EXPECT_GTP_ERROR(gtp_weight_amax(ctx, nv, nullptr), GTP_ERROR_INVALID_ARGUMENT, ctx, "out is NULL");
    EXPECT_GTP_ERROR(gtp_weight_amax(ctx, gtp_weight_t{}, &out), GTP_ERROR_INVALID_STATE, ctx,
                     "was issued by another context");
    ASSERT_EQ(gtp_weight_unregister(ctx, nv), GTP_SUCCESS) << gtp_last_error(ctx);
    EXPECT_GTP_ERROR(gtp_weight_amax(ctx, nv, &out), GTP_ERROR_INVALID_STATE, ctx, "is not registered");
    EXPECT_EQ(out, sentinel) << "a refused call writes nothing";
    EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
  });
}

}  // namespace
