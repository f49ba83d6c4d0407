/* Built against an installed libgtp with `pkg-config --cflags --libs gtp`: one rank on the host
 * backend registers a weight, materializes it and checks every BF16 value. */
#include <gtp/gtp.h>

#include <stdio.h>
#include <string.h>

static gtp_bootstrap_result_t allgather(void* user, const void* send, void* recv, size_t bytes, int64_t timeout_ms) {
  (void)user;
  (void)timeout_ms;
  memcpy(recv, send, bytes); /* one rank */
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

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    gtp_status_t s_ = (call);                                                                         \
    if (s_ != GTP_SUCCESS) {                                                                          \
      fprintf(stderr, "%s failed: %s: %s\n", #call, gtp_status_string(s_), gtp_last_error(ctx));     \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)

enum { ROWS = 32, COLS = 16 };

int main(void) {
  gtp_context_t* ctx = NULL;
  gtp_bootstrap_callbacks_t callbacks = {sizeof(gtp_bootstrap_callbacks_t), GTP_BOOTSTRAP_CALLBACKS_VERSION, 0, 1, NULL,
                                         allgather, broadcast, barrier, NULL};
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  CHECK(gtp_context_create(&config, &ctx));
  float shard[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; ++i) shard[i] = (float)(i % 97) - 48.0f; /* exact in BF16 */
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "w";
  desc.shard = shard;
  desc.dtype = GTP_DTYPE_FP32;
  desc.rows = ROWS;
  desc.cols = COLS;
  gtp_weight_t w;
  CHECK(gtp_weight_register(ctx, &desc, &w));
  CHECK(gtp_weights_shard_updated(ctx, &w, 1, NULL));
  void* ptr = NULL;
  size_t count = 0;
  CHECK(gtp_materialize(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_BF16, &ptr, 1, &count, NULL));
  const unsigned short* bf16 = (const unsigned short*)ptr;
  int wrong = 0;
  for (int i = 0; i < ROWS * COLS; ++i) {
    unsigned int bits = (unsigned int)bf16[i] << 16;
    float value;
    memcpy(&value, &bits, sizeof(value));
    wrong += value != shard[i];
  }
  CHECK(gtp_release(ctx, &w, 1, NULL));
  CHECK(gtp_context_destroy(ctx));
  printf("installed libgtp %d.%d.%d: %zu weight materialized, %d wrong values\n", GTP_VERSION_MAJOR, GTP_VERSION_MINOR,
         GTP_VERSION_PATCH, count, wrong);
  return wrong == 0 && count == 1 ? 0 : 1;
}
