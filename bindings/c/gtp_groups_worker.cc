// One rank of gtp_multiprocess_test, started by gtp-launch: the grid training of grid_training.h
// through the C ABI with GTP_BOOTSTRAP_UCX_FROM_ENV, on the grid given as arguments WORLD TP G DP
// (profile depth 2 and budget 1 MiB for gtp_remat, taken from the profile).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "bindings/c/internal/grid_training.h"
#include "gtp/gtp.h"

namespace {

gtp::cabi_test::Grid g_grid;

TEST(CAbiAcrossProcesses, GridTrainingOnTheRanksGtpRematGroup) {
  const std::string profile = gtp::cabi_test::grid_profile(g_grid);
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.bootstrap = GTP_BOOTSTRAP_UCX_FROM_ENV;
  config.profile_json = profile.c_str();
  gtp_context_t* ctx = nullptr;
  ASSERT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  ASSERT_EQ(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS) << gtp_last_error(ctx);
  gtp::cabi_test::train_rank(ctx, sizes.rank, g_grid);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 5) {
    std::fprintf(stderr, "usage: gtp_groups_worker WORLD TP G DP\n");
    return 2;
  }
  const int world = std::atoi(argv[1]), tp = std::atoi(argv[2]), g = std::atoi(argv[3]), dp = std::atoi(argv[4]);
  g_grid = {world, tp, g, dp, {{"gtp_remat", {{"prefetch_depth", 2}, {"memory_budget", "1MiB"}}}}, GTP_FROM_PROFILE, 2,
            1 << 20};
  return RUN_ALL_TESTS();
}
