/* gtp.h compiles alone as C99 (-pedantic-errors -Werror) without CUDA, and its initializers fill in
 * the struct sizes and the header version. */
#include "gtp/gtp.h"

#include <stdio.h>

int main(void) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  gtp_sizes_t sizes = GTP_SIZES_INITIALIZER;
  cudaStream_t stream = NULL;
  if (config.struct_size != sizeof config || config.header_version != GTP_HEADER_VERSION ||
      desc.struct_size != sizeof desc || sizes.struct_size != sizeof sizes || stream != NULL) {
    fprintf(stderr, "an initializer is wrong\n");
    return 1;
  }
  return 0;
}
