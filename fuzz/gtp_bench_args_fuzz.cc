// gtp-bench's arguments: refusals are std::invalid_argument; accepted sizes are whole bytes in
// [1, 1 TiB] with -b <= -e, and the sweep they make is finite and small (-b 0.5 used to loop until
// memory ran out).
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "bench/collectives/collective_bench.h"
#include "fuzz/cli_args.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gtp::bench::BenchOptions options;
  try {
    options = gtp::bench::parse_bench_args(gtp::fuzz::split_args(data, size));
  } catch (const std::invalid_argument&) {
    return 0;
  }
  if (options.min_bytes < 1 || options.max_bytes > gtp::bench::kMaxBytes || options.min_bytes > options.max_bytes ||
      options.factor < 2 || options.iters < 1 || options.warmup < 0) {
    std::fprintf(stderr, "FINDING: gtp-bench accepted -b %zu -e %zu -f %zu -n %d -w %d\n", options.min_bytes,
                 options.max_bytes, options.factor, options.iters, options.warmup);
    std::abort();
  }
  for (int ranks : {1, 3, 8}) {
    try {
      if (gtp::bench::sweep(options, ranks).size() > 64) {
        std::fprintf(stderr, "FINDING: gtp-bench sweep of more than 64 sizes\n");
        std::abort();
      }
    } catch (const std::invalid_argument&) {
    }
  }
  return 0;
}
