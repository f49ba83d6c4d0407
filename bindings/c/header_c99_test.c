/* gtp.h compiles alone as C99 (-pedantic-errors -Werror) without CUDA, and its initializers fill in
 * the struct sizes, the header version and the descriptor's defaults (0.3: 1D NVFP4, RCEIL; 0.5: row-major GEMM
 * scales), the grad buffer's (0.4) and the materialized view's (0.5: row-major scales). */
#include "gtp/gtp.h"

#include <stdio.h>

int main(void) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  gtp_grad_buffer_t grad = GTP_GRAD_BUFFER_INITIALIZER;
  gtp_materialized_t view = GTP_MATERIALIZED_INITIALIZER;
  cudaStream_t stream = NULL;
  if (config.struct_size != sizeof config || config.header_version != GTP_HEADER_VERSION ||
      desc.struct_size != sizeof desc || desc.wire != GTP_WIRE_FROM_GROUP || desc.expert_leader != NULL ||
      desc.nvfp4_2d != 0 || desc.mx_rounding != GTP_MX_ROUNDING_RCEIL || sizes.struct_size != sizeof sizes ||
      grad.struct_size != sizeof grad || grad.data != NULL || grad.overwrite != 0 ||
      desc.gemm_scale_layout != GTP_SCALE_LAYOUT_ROW_MAJOR || view.struct_size != sizeof view ||
      view.scale_layout != GTP_SCALE_LAYOUT_ROW_MAJOR || view.data.ptr != NULL ||
      GTP_GRAD_BUFFER_UNINITIALIZED != 1u || GTP_GRAD_BUFFER_SEPARATE != 2u || GTP_HEADER_VERSION != 701u ||
      stream != NULL) {
    fprintf(stderr, "an initializer is wrong\n");
    return 1;
  }
  return 0;
}
