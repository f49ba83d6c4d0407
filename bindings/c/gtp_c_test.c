/* The C ABI from C99 on one rank (a single-process callbacks bootstrap): a weight round trip through
 * materialize, its gradient through finalize and drain, stats, and misuse statuses. */
#include "gtp/gtp.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

#define CHECK_STATUS(call, expected, ctx)                                                          \
  do {                                                                                             \
    gtp_status_t status_ = (call);                                                                 \
    if (status_ != (expected)) {                                                                   \
      fprintf(stderr, "%s:%d: %s returned %s (%s), expected %s\n", __FILE__, __LINE__, #call,      \
              gtp_status_string(status_), gtp_last_error(ctx), gtp_status_string(expected));       \
      ++failures;                                                                                  \
    }                                                                                              \
  } while (0)

/* One rank: every collective is a copy. */
static gtp_bootstrap_result_t allgather(void* user, const void* send, void* recv, size_t bytes, int64_t timeout_ms) {
  (void)user;
  (void)timeout_ms;
  memcpy(recv, send, bytes);
  return GTP_BOOTSTRAP_OK;
}
static gtp_bootstrap_result_t broadcast(void* user, void* buffer, size_t bytes, int32_t root, int64_t timeout_ms) {
  (void)user, (void)buffer, (void)bytes, (void)root, (void)timeout_ms;
  return GTP_BOOTSTRAP_OK;
}
static gtp_bootstrap_result_t barrier(void* user, int64_t timeout_ms) {
  (void)user, (void)timeout_ms;
  return GTP_BOOTSTRAP_OK;
}

#define ROWS 32
#define COLS 32

int main(void) {
  gtp_bootstrap_callbacks_t callbacks;
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  gtp_context_t* ctx = NULL;
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  gtp_weight_t w;
  gtp_materialized_t view = GTP_MATERIALIZED_INITIALIZER;
  static uint16_t shard[ROWS * COLS];
  static float main_grad[ROWS * COLS];
  void* full = NULL;
  float* grad = NULL;
  size_t count = 0, len = 0, i;
  char stats[8192];

  memset(&callbacks, 0, sizeof callbacks);
  callbacks.struct_size = sizeof callbacks;
  callbacks.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  callbacks.rank = 0;
  callbacks.world_size = 1;
  callbacks.allgather = allgather;
  callbacks.broadcast = broadcast;
  callbacks.barrier = barrier;
  config.callbacks = &callbacks;

  config.header_version = GTP_HEADER_VERSION + 100;
  CHECK_STATUS(gtp_context_create(&config, &ctx), GTP_ERROR_VERSION, NULL);
  CHECK(ctx == NULL);
  CHECK(strstr(gtp_last_error(NULL), "compiled against") != NULL);
  config.header_version = GTP_HEADER_VERSION;
  CHECK_STATUS(gtp_context_create(&config, &ctx), GTP_SUCCESS, NULL);
  if (ctx == NULL) return 1;

  CHECK_STATUS(gtp_context_sizes(ctx, &sizes), GTP_SUCCESS, ctx);
  CHECK(sizes.world_size == 1 && sizes.gtp_remat == 1 && sizes.data_parallel_count == 1);

  for (i = 0; i < ROWS * COLS; ++i) shard[i] = (uint16_t)(0x3F80 + i % 61);
  desc.name = "c_weight";
  desc.shard = shard;
  desc.rows = ROWS;
  desc.cols = COLS;
  desc.main_grad = main_grad;
  CHECK_STATUS(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS, ctx);
  CHECK_STATUS(gtp_weights_shard_updated(ctx, &w, 1, NULL), GTP_SUCCESS, ctx);
  CHECK_STATUS(gtp_release(ctx, &w, 1, NULL), GTP_ERROR_INVALID_STATE, ctx);
  CHECK_STATUS(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &full, 1, &count, NULL), GTP_SUCCESS,
               ctx);
  CHECK(count == 1 && full != NULL && memcmp(full, shard, sizeof shard) == 0);
  CHECK_STATUS(gtp_release(ctx, &w, 1, NULL), GTP_SUCCESS, ctx);
  CHECK_STATUS(gtp_release(ctx, &w, 1, NULL), GTP_ERROR_INVALID_STATE, ctx);
  /* The GEMM layout of the BF16 wire is the BF16 weight. */
  CHECK_STATUS(gtp_materialize_views(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, &view, 1, &count, NULL),
               GTP_SUCCESS, ctx);
  CHECK(count == 1 && view.layout == GTP_LAYOUT_BF16 && view.data.dtype == GTP_ELEM_BF16 && view.data.rows == ROWS &&
        view.data.ld == COLS && view.scales.ptr == NULL && memcmp(view.data.ptr, shard, sizeof shard) == 0);
  CHECK_STATUS(gtp_release_layout(ctx, &w, 1, GTP_LAYOUT_BF16, NULL), GTP_ERROR_INVALID_STATE, ctx);
  CHECK_STATUS(gtp_release_layout(ctx, &w, 1, GTP_LAYOUT_GEMM, NULL), GTP_SUCCESS, ctx);

  CHECK_STATUS(gtp_finalize(ctx, &w, 1, 1, NULL), GTP_ERROR_INVALID_STATE, ctx);
  CHECK_STATUS(gtp_grad_buffer(ctx, w, &grad, NULL), GTP_SUCCESS, ctx);
  for (i = 0; grad != NULL && i < ROWS * COLS; ++i) grad[i] = (float)i;
  CHECK_STATUS(gtp_finalize(ctx, &w, 1, 1, NULL), GTP_SUCCESS, ctx);
  CHECK_STATUS(gtp_drain_ex(ctx, 4u, NULL), GTP_ERROR_INVALID_ARGUMENT, ctx);
  CHECK(strstr(gtp_last_error(ctx), "flags 4") != NULL);
  CHECK_STATUS(gtp_drain_ex(ctx, GTP_DRAIN_DEFER_HEAD, NULL), GTP_SUCCESS, ctx);
  for (i = 0; i < ROWS * COLS; ++i) CHECK(main_grad[i] == (float)i);
  CHECK_STATUS(gtp_weights_shard_updated(ctx, &w, 1, NULL), GTP_SUCCESS, ctx); /* prefetches the head */

  /* Without the zero-fill on this one-rank group: the buffer is the main grad itself (its reduce-scatter
   * is the identity), so it is added to, then and after; finalize moves nothing. */
  {
    gtp_grad_buffer_t first = GTP_GRAD_BUFFER_INITIALIZER, again = GTP_GRAD_BUFFER_INITIALIZER;
    float* const untouched = first.data;
    CHECK_STATUS(gtp_grad_buffer_ex(ctx, w, 4u, &first, NULL), GTP_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(strstr(gtp_last_error(ctx), "unknown bits 4") != NULL);
    CHECK_STATUS(gtp_grad_buffer_ex(ctx, w, GTP_GRAD_BUFFER_SEPARATE, &first, NULL), GTP_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(strstr(gtp_last_error(ctx), "without GTP_GRAD_BUFFER_UNINITIALIZED") != NULL);
    CHECK_STATUS(gtp_grad_buffer_ex(ctx, w, GTP_GRAD_BUFFER_UNINITIALIZED, NULL, NULL), GTP_ERROR_INVALID_ARGUMENT, ctx);
    first.struct_size -= 1;
    CHECK_STATUS(gtp_grad_buffer_ex(ctx, w, GTP_GRAD_BUFFER_UNINITIALIZED, &first, NULL), GTP_ERROR_INVALID_ARGUMENT, ctx);
    CHECK(strstr(gtp_last_error(ctx), "gtp_grad_buffer_t.struct_size") != NULL);
    CHECK(first.data == untouched && first.overwrite == 0);
    first.struct_size += 1;
    CHECK_STATUS(gtp_grad_buffer_ex(ctx, w, GTP_GRAD_BUFFER_UNINITIALIZED, &first, NULL), GTP_SUCCESS, ctx);
    CHECK(first.data == main_grad && first.overwrite == 0);
    for (i = 0; first.data != NULL && i < ROWS * COLS; ++i) first.data[i] += (float)i;
    CHECK_STATUS(gtp_grad_buffer_ex(ctx, w, GTP_GRAD_BUFFER_UNINITIALIZED, &again, NULL), GTP_SUCCESS, ctx);
    CHECK(again.data == first.data && again.overwrite == 0);
    for (i = 0; again.data != NULL && i < ROWS * COLS; ++i) again.data[i] += 1.0f;
    CHECK_STATUS(gtp_finalize(ctx, &w, 1, 1, NULL), GTP_SUCCESS, ctx);
    CHECK_STATUS(gtp_drain(ctx, NULL), GTP_SUCCESS, ctx);
    for (i = 0; i < ROWS * COLS; ++i) CHECK(main_grad[i] == (float)i + (float)i + 1.0f); /* the earlier i, then i + 1 */
  }

  CHECK_STATUS(gtp_stats_json(ctx, stats, 1, &len), GTP_ERROR_INVALID_ARGUMENT, ctx);
  CHECK(len > 1 && len < sizeof stats);
  CHECK_STATUS(gtp_stats_json(ctx, stats, sizeof stats, &len), GTP_SUCCESS, ctx);
  CHECK(strlen(stats) == len && stats[0] == '{');

  CHECK_STATUS(gtp_weight_unregister(ctx, w), GTP_SUCCESS, ctx);
  CHECK_STATUS(gtp_grad_buffer(ctx, w, &grad, NULL), GTP_ERROR_INVALID_STATE, ctx);
  CHECK(strstr(gtp_last_error(ctx), "not registered") != NULL);
  CHECK_STATUS(gtp_drain(NULL, NULL), GTP_ERROR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(gtp_context_destroy(ctx), GTP_SUCCESS, NULL);

  if (failures != 0) fprintf(stderr, "%d checks failed\n", failures);
  return failures == 0 ? 0 : 1;
}
