/* gtp.h compiles alone as C99 (-pedantic-errors -Werror) without CUDA, and its initializers fill in
 * the struct sizes, the header version and the descriptor's defaults (0.3: 1D NVFP4, RCEIL). */
#include "gtp/gtp.h"

#include <stdio.h>

int main(void) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  cudaStream_t stream = NULL;
  if (config.struct_size != sizeof config || config.header_version != GTP_HEADER_VERSION ||
      desc.struct_size != sizeof desc || desc.wire != GTP_WIRE_FROM_GROUP || desc.expert_leader != NULL ||
      desc.nvfp4_2d != 0 || desc.mx_rounding != GTP_MX_ROUNDING_RCEIL || sizes.struct_size != sizeof sizes ||
      stream != NULL) {
    fprintf(stderr, "an initializer is wrong\n");
    return 1;
  }
  return 0;
}
