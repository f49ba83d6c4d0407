// gtp-bench all_gather|reduce_scatter [nccl-tests flags]: one rank of the collective benchmark on the
// host transport; start it with gtp-launch, e.g.
//   tools/gtp-launch -n 4 -- bazel-bin/bench/collectives/gtp-bench all_gather -b 1M -e 64M -f 4
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/collectives/collective_bench.h"
#include "comm/host.h"
#include "comm/ucx_bootstrap.h"

int main(int argc, char** argv) {
  using namespace gtp;
  bench::BenchOptions options;
  try {
    options = bench::parse_bench_args(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-bench: %s\n", e.what());
    return 2;
  }
  try {
    const comm::UcxBootstrapConfig config = comm::UcxBootstrapConfig::from_env();
    comm::UcxBootstrap bootstrap(config);
    comm::HostComm host(bootstrap, config.timeout);
    const std::vector<bench::BenchRow> rows = bench::run_bench(host, bootstrap, options);
    if (bootstrap.rank() == 0) {
      std::fputs(bench::format_header(options, host.size()).c_str(), stdout);
      for (const bench::BenchRow& row : rows) std::fputs(bench::format_row(row).c_str(), stdout);
      if (!options.json_path.empty()) {
        std::string command;
        for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
        std::ofstream(options.json_path) << bench::to_json(options, host.size(), rows, command).dump(2) << "\n";
      }
    }
    bool any_wrong = false;
    for (const bench::BenchRow& row : rows) any_wrong |= row.wrong > 0;
    return any_wrong ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gtp-bench: %s\n", e.what());
    return 1;
  }
}
