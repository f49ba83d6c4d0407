/* Bootstrap callbacks a framework supplies (a torch Store, the JAX distributed KV store, MPI...).
 * C99-compatible so the C ABI (bindings/c) can include it unchanged.
 *
 * Every callback returns GTP_BOOTSTRAP_OK or a failure code and must return within timeout_ms
 * milliseconds; libgtp never calls two callbacks of one vtable at the same time. */
#ifndef GTP_COMM_BOOTSTRAP_CALLBACKS_H_
#define GTP_COMM_BOOTSTRAP_CALLBACKS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  GTP_BOOTSTRAP_OK = 0,
  GTP_BOOTSTRAP_ERROR = 1,   /* a peer or the store failed */
  GTP_BOOTSTRAP_TIMEOUT = 2  /* timeout_ms elapsed before every rank took part */
} gtp_bootstrap_result_t;

#define GTP_BOOTSTRAP_CALLBACKS_VERSION 1

typedef struct gtp_bootstrap_callbacks_v1 {
  size_t struct_size; /* sizeof(gtp_bootstrap_callbacks_t), lets later versions append fields */
  uint32_t version;   /* GTP_BOOTSTRAP_CALLBACKS_VERSION */
  int32_t rank;
  int32_t world_size;
  void* user_data; /* passed back as the first argument of every callback */

  /* recv receives world_size * bytes_per_rank bytes, rank r's send at offset r * bytes_per_rank. */
  gtp_bootstrap_result_t (*allgather)(void* user_data, const void* send, void* recv, size_t bytes_per_rank,
                                      int64_t timeout_ms);
  /* Copies root's buffer into every other rank's buffer. */
  gtp_bootstrap_result_t (*broadcast)(void* user_data, void* buffer, size_t bytes, int32_t root, int64_t timeout_ms);
  gtp_bootstrap_result_t (*barrier)(void* user_data, int64_t timeout_ms);
  /* Optional (may be NULL): a description of the last failure, owned by the callee. */
  const char* (*last_error)(void* user_data);
} gtp_bootstrap_callbacks_t;

#ifdef __cplusplus
}
#endif

#endif /* GTP_COMM_BOOTSTRAP_CALLBACKS_H_ */
