/* libgtp C ABI: materialize GTP-sharded weights, reduce their gradients. C99; see docs/c-abi.md.
 *
 * Conventions: every call returns a gtp_status_t; outputs are written only on GTP_SUCCESS; config and
 * descriptor structs start with `size_t struct_size` (set it with the *_INITIALIZER macros); calls that
 * enqueue work take the stream last; a failed call leaves its message in gtp_last_error(ctx). */
#ifndef GTP_GTP_H_
#define GTP_GTP_H_

#include <stddef.h>
#include <stdint.h>

#include "comm/bootstrap_callbacks.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GTP_VERSION_MAJOR 0
#define GTP_VERSION_MINOR 7
#define GTP_VERSION_PATCH 1
/* What a caller passes to gtp_context_create: the header version it was compiled against. */
#define GTP_HEADER_VERSION ((uint32_t)(GTP_VERSION_MAJOR * 10000 + GTP_VERSION_MINOR * 100 + GTP_VERSION_PATCH))

/* CUDA users: include cuda_runtime_api.h before this header. */
#ifndef __CUDA_RUNTIME_API_H__
typedef struct CUstream_st* cudaStream_t; /* NULL on the host backend, a real stream on the CUDA backend */
#endif

typedef enum {
  GTP_SUCCESS = 0,
  GTP_ERROR_INVALID_ARGUMENT = 1, /* a bad value: null pointer, size, shape, unknown enum, stale handle */
  GTP_ERROR_INVALID_STATE = 2,    /* misuse of the call order or of a handle's lifetime */
  GTP_ERROR_TIMEOUT = 3,          /* a peer did not take part in time */
  GTP_ERROR_SYSTEM = 4,           /* the environment failed (transport, memory, a dead peer) */
  GTP_ERROR_CUDA = 5,             /* a CUDA or NCCL failure, or CUDA unavailable */
  GTP_ERROR_VERSION = 6,          /* header and library versions differ */
  GTP_ERROR_INTERNAL = 7,         /* a bug in libgtp */
  GTP_ERROR_DIVERGED = 8          /* since 0.7: the ranks of a group disagree (config, weights, call order) */
} gtp_status_t;

/* A static string naming the status ("GTP_ERROR_TIMEOUT"); "unknown gtp_status_t" otherwise. */
const char* gtp_status_string(gtp_status_t status);

typedef struct gtp_context gtp_context_t;

typedef enum { GTP_BOOTSTRAP_CALLBACKS = 0, GTP_BOOTSTRAP_UCX_FROM_ENV = 1 } gtp_bootstrap_kind_t;
/* GTP_BACKEND_CUDA runs on the CUDA device current on the thread that calls gtp_context_create
 * (cudaSetDevice first; CUDA's default is device 0). */
typedef enum { GTP_BACKEND_HOST = 0, GTP_BACKEND_CUDA = 1 } gtp_backend_t;

/* prefetch_depth / memory_budget_bytes: each group (gtp_remat, expt_gtp_remat) takes its own profile
 * group's setting (or the defaults without a profile). */
#define GTP_FROM_PROFILE (-1)

/* A registered weight: its id and the generation of the context that issued it. */
typedef struct {
  int64_t id;
  uint64_t generation;
} gtp_weight_t;

/* Runs on the host, on the thread of the call that applied the weight's main-grad add. */
typedef void (*gtp_grad_ready_fn)(void* user_data, gtp_weight_t weight);

typedef struct {
  size_t struct_size;                  /* sizeof(gtp_context_config_t) */
  uint32_t header_version;             /* GTP_HEADER_VERSION */
  gtp_bootstrap_kind_t bootstrap;
  const gtp_bootstrap_callbacks_t* callbacks; /* GTP_BOOTSTRAP_CALLBACKS: copied, used during create only */
  int64_t timeout_ms;                  /* bootstrap and collective timeout, > 0 */
  gtp_backend_t backend;
  const char* profile_json;            /* profile text, or NULL */
  const char* profile_path;            /* profile file, or NULL; at most one of the two */
  int32_t prefetch_depth;              /* keys gathered ahead per group, 0..64 (every group), or GTP_FROM_PROFILE */
  int64_t memory_budget_bytes;         /* each group's cache budget, 0: unlimited, or GTP_FROM_PROFILE */
  int32_t accumulate_microbatches;     /* nonzero: reduce wgrads once per step */
  size_t trace_spans;                  /* spans kept for gtp_trace_json, 0: none */
  gtp_grad_ready_fn grad_ready;        /* optional: called after a weight's main-grad add */
  void* grad_ready_user_data;
  /* Appended after 0.7.0 (the 0.7.0 struct_size is still accepted, with 0 here): the deadline of each
   * collective a call issues, in ms; 0: timeout_ms. timeout_ms then bounds creation (bootstrap,
   * communicators, warm-up). Values up to INT64_MAX mean "very long" (capped at 100 years). */
  int64_t call_timeout_ms;
  /* Appended after 0.7.1 (the 0.7.1 and 0.7.0 struct_size are still accepted, with 0 here): nonzero
   * reduce-scatters each weight gradient as the SUM over its group instead of the mean, as Megatron's
   * GTP does under calculate_per_token_loss (the loss is divided by the token count of every data
   * rank elsewhere). Agreed at create: ranks that differ get GTP_ERROR_DIVERGED. */
  int32_t sum_grads;
  /* Appended after 0.7.1 with sum_grads (0 where a 0.7.1 or 0.7.0 struct_size is given): ranks that
   * disagree (docs/reliability.md). 0 checks each group of G > 1 once per step, at gtp_drain, over every
   * gather since the previous check: one 64-byte collective per group and step, none per gather; a
   * divergence fails the call after that drain on every rank (host backend: the drain itself) with
   * GTP_ERROR_DIVERGED. Nonzero checks every gather before it is unpacked (a tag collective beside each
   * gather, the debugging setting): the diverging gather's output is never the wrong weight. Agreed at
   * create. */
  int32_t check_every_fill;
} gtp_context_config_t;

#define GTP_CONTEXT_CONFIG_INITIALIZER \
  { sizeof(gtp_context_config_t), GTP_HEADER_VERSION, GTP_BOOTSTRAP_CALLBACKS, NULL, 60000, GTP_BACKEND_HOST, \
    NULL, NULL, GTP_FROM_PROFILE, GTP_FROM_PROFILE, 0, 0, NULL, NULL, 0, 0, 0 }

/* Collective over the bootstrap's ranks. */
gtp_status_t gtp_context_create(const gtp_context_config_t* config, gtp_context_t** out);
/* Collective; NULL is accepted. Handles of the context become stale. */
gtp_status_t gtp_context_destroy(gtp_context_t* ctx);
/* Marks the context unusable (every later call but destroy fails with GTP_ERROR_INVALID_STATE); on
 * the CUDA backend aborts its NCCL communicators, cancelling their pending work. */
gtp_status_t gtp_context_abort(gtp_context_t* ctx);
/* Watchdog poll (appended after 0.7.0), for a framework's monitoring thread (as PyTorch's
 * ProcessGroupNCCL watchdog polls): GTP_SUCCESS while every collective the context issued is done or
 * within its call_timeout_ms (deadlines are tracked on the CUDA backend when call_timeout_ms is set).
 * A collective past its deadline, or a communicator error, aborts the context's communicators (peers
 * waiting on this rank fail too) and returns TIMEOUT / SYSTEM / CUDA,
 * with a message naming the call that issued it and its group; an aborted or failed context returns
 * INVALID_STATE with the reason. Waits for a call in progress on another thread (like stats). */
gtp_status_t gtp_context_check(gtp_context_t* ctx);
/* The message of the context's latest failure ("" if none); valid until the next call on ctx. */
const char* gtp_last_error(const gtp_context_t* ctx);

typedef struct {
  size_t struct_size;
  int32_t rank, world_size;
  int32_t tp, gtp_remat, expert_gtp_remat, dp; /* TP, G, EG, DP */
  int32_t data_parallel_index, data_parallel_count; /* this rank among the DP x G data readers */
  /* Since 0.7: this rank's position (0-based) in its TP, gtp_remat, expt_gtp_remat and DP groups of the
   * grid, the order of the group's communicator (a shard's rows are its gtp_remat_rank-th). */
  int32_t tp_rank, gtp_remat_rank, expert_gtp_remat_rank, dp_rank;
} gtp_sizes_t;

#define GTP_SIZES_INITIALIZER { sizeof(gtp_sizes_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }

gtp_status_t gtp_context_sizes(gtp_context_t* ctx, gtp_sizes_t* out);

typedef enum { GTP_DTYPE_BF16 = 0, GTP_DTYPE_FP32 = 1 } gtp_dtype_t;
/* GTP_WIRE_FROM_GROUP: the wire_format of the weight's group in the profile (bf16 without one). */
typedef enum {
  GTP_WIRE_FROM_GROUP = -1,
  GTP_WIRE_BF16 = 0,
  GTP_WIRE_FP8 = 1,
  GTP_WIRE_MXFP8 = 2,
  GTP_WIRE_NVFP4 = 3
} gtp_wire_t;
/* MXFP8 E8M0 block-scale rounding (docs/formats.md); ignored by the other wires. */
typedef enum {
  GTP_MX_ROUNDING_RCEIL = 0, /* TransformerEngine's rule, the default */
  GTP_MX_ROUNDING_FLOOR = 1  /* OCP MX v1.0 */
} gtp_mx_rounding_t;
/* How the GEMM layout stores MXFP8 and NVFP4 block scales (docs/formats.md, "Blocked scales"); wires
 * without block scales ignore it. Since 0.5. */
typedef enum {
  GTP_SCALE_LAYOUT_ROW_MAJOR = 0,    /* the scale matrix row-major, the default */
  GTP_SCALE_LAYOUT_BLOCKED_128X4 = 1 /* cuBLASLt's / cuDNN's 128 x 4 tiles for block-scaled GEMMs */
} gtp_scale_layout_t;
typedef enum { GTP_GROUP_GTP_REMAT = 0, GTP_GROUP_EXPERT_GTP_REMAT = 1 } gtp_group_t;
typedef enum { GTP_PHASE_FORWARD = 0, GTP_PHASE_BACKWARD = 1, GTP_PHASE_RECOMPUTE = 2 } gtp_phase_t;
/* BF16: the BF16 weight [rows, cols]. GEMM: the GEMM-ready codes, scales, exact transpose and decode
 * scales (FP8, MXFP8, NVFP4; the BF16 weight on the BF16 wire), returned by gtp_materialize_views only.
 * The same weights in two layouts are two materializations: two buffers, two releases. */
typedef enum { GTP_LAYOUT_BF16 = 0, GTP_LAYOUT_GEMM = 1 } gtp_layout_t;

typedef struct {
  size_t struct_size;
  const char* name;
  const void* shard;       /* this rank's valid_rows x cols of dtype; NULL if it holds only padding */
  gtp_dtype_t dtype;
  int64_t rows, cols;      /* TP-local weight */
  gtp_wire_t wire;
  gtp_group_t group;
  float* main_grad;        /* FP32 valid_rows x cols, or NULL */
  const gtp_weight_t* expert_leader; /* NULL, or the first expert of this weight's group */
  /* Since 0.3 (fields are only ever added at the end): */
  int32_t nvfp4_2d;        /* nonzero: NVFP4 16x16 scale blocks (exact transpose); NVFP4 wire only */
  int32_t mx_rounding;     /* gtp_mx_rounding_t; MXFP8 only, ignored by the other wires */
  /* Since 0.5: */
  int32_t gemm_scale_layout; /* gtp_scale_layout_t of the GEMM layout's scales and scales_t */
} gtp_weight_desc_t;

#define GTP_WEIGHT_DESC_INITIALIZER \
  { sizeof(gtp_weight_desc_t), NULL, NULL, GTP_DTYPE_BF16, 0, 0, GTP_WIRE_FROM_GROUP, GTP_GROUP_GTP_REMAT, NULL, NULL, \
    0, GTP_MX_ROUNDING_RCEIL, GTP_SCALE_LAYOUT_ROW_MAJOR }

gtp_status_t gtp_weight_register(gtp_context_t* ctx, const gtp_weight_desc_t* desc, gtp_weight_t* out);
gtp_status_t gtp_weight_unregister(gtp_context_t* ctx, gtp_weight_t w);
/* Collective re-pack after the optimizer changed the shards. */
gtp_status_t gtp_weights_shard_updated(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream);
/* Since 0.7.1. The FP32 amax an FP8 or NVFP4 weight was last packed with: the largest finite |x| of the
 * whole weight, reduced over its group by the latest gtp_weights_shard_updated naming it (or its
 * leader), as libgtp keeps it (device memory on the CUDA backend, host memory on the host backend).
 * *out gets its address, nothing is copied and nothing waits. On CUDA the value is that update's once
 * the weight's gather stream has reached it: work ordered after a gtp_materialize(_views) of the
 * weight on `stream` reads it there (FP8 decode scale 448 / amax, NVFP4 global decode scale amax /
 * 2688), until the next gtp_weights_shard_updated naming it (which writes it after the work its own
 * stream holds). The address stays valid until the weight is unregistered, the context destroyed, or another
 * FP8 or NVFP4 weight is registered in the same group (its amax array may then grow and move): query
 * it again after registering. INVALID_ARGUMENT for a wire without an amax (BF16, MXFP8); INVALID_STATE
 * for a stale handle or a weight never packed (no shard_updated yet). */
gtp_status_t gtp_weight_amax(gtp_context_t* ctx, gtp_weight_t w, const float** out);

/* Writes one pointer per expanded weight (experts after their leader) and their count to *out_count. */
gtp_status_t gtp_materialize(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                             int32_t model_chunk, gtp_layout_t layout, void** out_ptrs, size_t out_capacity,
                             size_t* out_count, cudaStream_t stream);
/* Refuses GTP_LAYOUT_GEMM (one pointer cannot carry codes and scales): use gtp_materialize_views. */
gtp_status_t gtp_release(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, cudaStream_t stream);

/* Element types of a materialized section. */
typedef enum {
  GTP_ELEM_NONE = 0, /* the section is absent: ptr NULL, shape 0 */
  GTP_ELEM_BF16 = 1,
  GTP_ELEM_E4M3 = 2, /* OCP FP8 E4M3 ("FN"), one per byte */
  GTP_ELEM_E2M1 = 3, /* FP4, two per byte: element 2k in the low nibble of byte k */
  GTP_ELEM_E8M0 = 4, /* MXFP8 block scale, value 2^(e-127), 0xFF NaN */
  GTP_ELEM_FP32 = 5
} gtp_elem_t;

/* One row-major section of a materialized weight, in elements (not bytes). */
typedef struct {
  void* ptr;
  gtp_elem_t dtype;
  int64_t rows, cols;
  int64_t ld; /* elements from one row to the next; == cols (compact) */
} gtp_section_t;

/* One materialized weight; set struct_size (GTP_MATERIALIZED_INITIALIZER) on every entry passed. */
typedef struct {
  size_t struct_size;          /* sizeof(gtp_materialized_t) */
  gtp_layout_t layout;         /* produced: BF16 for GTP_LAYOUT_BF16 and for GEMM of the BF16 wire */
  gtp_wire_t wire;
  int32_t nvfp4_2d;            /* NVFP4: nonzero for 16x16 scale tiles */
  int64_t rows, cols;          /* the logical weight; the GEMM takes N (or M) = rows */
  gtp_section_t data;          /* BF16 [rows, cols]; GEMM: E4M3 or E2M1 [gemm_rows, cols] */
  gtp_section_t scales;        /* MXFP8 E8M0 [gemm_rows, cols/32]; NVFP4 E4M3 1D [gemm_rows, cols/16],
                                  2D [gemm_rows/16, cols/16]; else NONE */
  gtp_section_t data_t;        /* exact transpose: FP8 E4M3 [cols, gemm_rows], NVFP4 2D E2M1 [cols, gemm_rows];
                                  else NONE */
  gtp_section_t scales_t;      /* NVFP4 2D E4M3 [cols/16, gemm_rows/16]; else NONE */
  gtp_section_t decode_scales; /* FP8, NVFP4: FP32 [G, 1], entry g decodes weight rows
                                  [g * decode_scale_rows, (g + 1) * decode_scale_rows); else NONE */
  int64_t gemm_rows;           /* rows rounded up to the wire's row alignment (extra rows are zero codes) */
  int64_t decode_scale_rows;   /* the shard rows one decode scale covers */
  int32_t scale_block_rows, scale_block_cols; /* elements per scale: 1x32, 1x16, 16x16; 0 without scales */
  /* Since 0.5: the layout of scales and scales_t. GTP_SCALE_LAYOUT_BLOCKED_128X4: each section's bytes
   * are its rows x cols entries in 128 x 4 tile order (rows a multiple of 128, cols of 4, the padding
   * zero), one scale row per code row, so NVFP4 2D tiles repeat their scale and scale_block_rows is 1. */
  int32_t scale_layout;
} gtp_materialized_t;

#define GTP_SECTION_NONE { NULL, GTP_ELEM_NONE, 0, 0, 0 }
#define GTP_MATERIALIZED_INITIALIZER \
  { sizeof(gtp_materialized_t), GTP_LAYOUT_BF16, GTP_WIRE_BF16, 0, 0, 0, GTP_SECTION_NONE, GTP_SECTION_NONE, \
    GTP_SECTION_NONE, GTP_SECTION_NONE, GTP_SECTION_NONE, 0, 0, 0, 0, GTP_SCALE_LAYOUT_ROW_MAJOR }

/* gtp_materialize in any layout: fills out[0 .. *out_count) (experts after their leader); every entry up
 * to the expanded count must carry struct_size. Pointers stay valid until the matching release. */
gtp_status_t gtp_materialize_views(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_phase_t phase,
                                   int32_t model_chunk, gtp_layout_t layout, gtp_materialized_t* out,
                                   size_t out_capacity, size_t* out_count, cudaStream_t stream);
/* gtp_release of the materialization in `layout`. gtp_release works when the weights are held in one
 * layout only; with both held it fails (GTP_ERROR_INVALID_STATE) and this call names the one to end. */
gtp_status_t gtp_release_layout(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, gtp_layout_t layout,
                                cudaStream_t stream);

/* FP32 rows x cols wgrad buffer of w, zero-filled: add the wgrad into it before gtp_finalize. */
gtp_status_t gtp_grad_buffer(gtp_context_t* ctx, gtp_weight_t w, float** out, cudaStream_t stream);

/* Since 0.4. gtp_grad_buffer with flags (0 = gtp_grad_buffer). GTP_GRAD_BUFFER_UNINITIALIZED: a buffer
 * newly handed out is not zero-filled (the fill writes the whole FP32 buffer once per weight per step);
 * its rows x cols hold garbage and `overwrite` is set: the wgrad must be WRITTEN (a GEMM with beta = 0).
 * With `overwrite` 0 (the buffer was already handed out, e.g. an earlier microbatch under
 * accumulate_microbatches, or the flag is absent) the wgrad is ADDED (beta = 1). On a group of one rank
 * (profile groups.<g>.grads_into_main_grad, default true) the uninitialized buffer is the main grad
 * itself with `overwrite` 0: add into it; gtp_finalize then moves nothing. Always honour `overwrite`. */
#define GTP_GRAD_BUFFER_UNINITIALIZED 1u
/* Since 0.6. With GTP_GRAD_BUFFER_UNINITIALIZED: not the main grad (except the first buffer after
 * gtp_main_grads_zeroed, written with `overwrite` set), a buffer of libgtp's own on a
 * size-1 group too, for a consumer that can only WRITE its wgrad (TE's grad_buffer protocol); its first
 * handout then has `overwrite` set as on larger groups, and finalize reduces it and adds it into the main
 * grad on the side stream. Larger groups' buffers are always libgtp's own. */
#define GTP_GRAD_BUFFER_SEPARATE 2u

typedef struct {
  size_t struct_size; /* sizeof(gtp_grad_buffer_t) */
  float* data;        /* FP32 [rows, cols], row-major */
  int32_t overwrite;  /* nonzero: write the wgrad; 0: add it */
} gtp_grad_buffer_t;

#define GTP_GRAD_BUFFER_INITIALIZER { sizeof(gtp_grad_buffer_t), NULL, 0 }

gtp_status_t gtp_grad_buffer_ex(gtp_context_t* ctx, gtp_weight_t w, uint32_t flags, gtp_grad_buffer_t* out,
                                cudaStream_t stream);
gtp_status_t gtp_finalize(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n, int32_t last_microbatch,
                          cudaStream_t stream);
gtp_status_t gtp_drain(gtp_context_t* ctx, cudaStream_t stream);
/* gtp_drain with flags (0 = gtp_drain). GTP_DRAIN_DEFER_HEAD: the next step's first weights are
 * prefetched by the next gtp_weights_shard_updated, after the optimizer's re-pack, instead of here
 * (where they would be gathered from the old shards and again at shard_updated). */
#define GTP_DRAIN_DEFER_HEAD 1u
/* After 0.7.1. GTP_DRAIN_MIDSTEP: more backward passes follow before the optimizer step (gradient
 * accumulation): the per-step divergence check (check_every_fill 0) waits for the drain that ends the
 * step, so a step of N microbatches costs one tag collective per group, not N. It covers every gather
 * since the previous check either way; ranks must pass the same flags. */
#define GTP_DRAIN_MIDSTEP 2u
gtp_status_t gtp_drain_ex(gtp_context_t* ctx, uint32_t flags, cudaStream_t stream);
gtp_status_t gtp_reset_chains(gtp_context_t* ctx);
/* Since 0.7.1. Main grads declared zero: the main grads of ws[0 .. n) (a leader stands for its
 * experts; n = 0 and ws NULL: every weight with a main grad) are zero now, as the caller's optimizer step
 * left them, zeroed on a stream ordered before the next gtp_grad_buffer(_ex) calls' streams. The first
 * buffer each weight is handed out afterwards then needs no add: on a size-1 group (with
 * grads_into_main_grad) it IS the main grad, for any flags, with `overwrite` set unless zero-filled was
 * asked for (GTP_GRAD_BUFFER_SEPARATE included: write the wgrad straight into it); on a larger group its
 * reduced rows are copied into the main grad instead of added. Later buffers (microbatches) are as
 * without the declaration. Host-only, nothing enqueued. INVALID_STATE, nothing declared: a listed weight
 * has a buffer handed out or a main-grad add pending (declare after gtp_drain), or a CUDA graph capture
 * is in progress (a buffer handed out under capture drops its weight's declaration). INVALID_ARGUMENT: a
 * listed weight registered without a main grad, a stale or repeated handle. */
gtp_status_t gtp_main_grads_zeroed(gtp_context_t* ctx, const gtp_weight_t* ws, size_t n);

/* JSON text with its terminating NUL. *len gets the length without the NUL; when cap <= *len the
 * call fails with GTP_ERROR_INVALID_ARGUMENT, writes nothing to buf and still sets *len. */
gtp_status_t gtp_stats_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len);
gtp_status_t gtp_trace_json(gtp_context_t* ctx, char* buf, size_t cap, size_t* len);

#ifdef __cplusplus
}
#endif

#endif /* GTP_GTP_H_ */
