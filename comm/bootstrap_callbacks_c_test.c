/* Compiles bootstrap_callbacks.h as C99 (the C ABI will include it) and fills a vtable the way a C
 * framework binding would. Fails to build if the header stops being valid C. */
#include "comm/bootstrap_callbacks.h"

#include <stdio.h>
#include <string.h>

static gtp_bootstrap_result_t single_rank_allgather(void* user_data, const void* send, void* recv,
                                                    size_t bytes_per_rank, int64_t timeout_ms) {
  (void)user_data;
  (void)timeout_ms;
  if (bytes_per_rank > 0) memcpy(recv, send, bytes_per_rank);
  return GTP_BOOTSTRAP_OK;
}

static gtp_bootstrap_result_t single_rank_broadcast(void* user_data, void* buffer, size_t bytes, int32_t root,
                                                    int64_t timeout_ms) {
  (void)user_data;
  (void)buffer;
  (void)bytes;
  (void)timeout_ms;
  return root == 0 ? GTP_BOOTSTRAP_OK : GTP_BOOTSTRAP_ERROR;
}

static gtp_bootstrap_result_t single_rank_barrier(void* user_data, int64_t timeout_ms) {
  (void)user_data;
  (void)timeout_ms;
  return GTP_BOOTSTRAP_OK;
}

int main(void) {
  gtp_bootstrap_callbacks_t callbacks;
  memset(&callbacks, 0, sizeof(callbacks));
  callbacks.struct_size = sizeof(callbacks);
  callbacks.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  callbacks.rank = 0;
  callbacks.world_size = 1;
  callbacks.allgather = single_rank_allgather;
  callbacks.broadcast = single_rank_broadcast;
  callbacks.barrier = single_rank_barrier;

  int sent = 42, received = 0;
  if (callbacks.allgather(callbacks.user_data, &sent, &received, sizeof(sent), 1000) != GTP_BOOTSTRAP_OK ||
      received != 42 || callbacks.broadcast(callbacks.user_data, &sent, sizeof(sent), 1, 1000) != GTP_BOOTSTRAP_ERROR ||
      callbacks.barrier(callbacks.user_data, 1000) != GTP_BOOTSTRAP_OK) {
    fprintf(stderr, "vtable calls from C did not behave\n");
    return 1;
  }
  printf("bootstrap_callbacks.h compiles and works as C99\n");
  return 0;
}
