// gtp-bench all_gather|reduce_scatter [nccl-tests flags]: one rank of the collective benchmark; start
// it with gtp-launch, e.g.
//   tools/gtp-launch -n 4 -- bazel-bin/bench/collectives/gtp-bench all_gather -b 1M -e 64M -f 4
// GPU path (NCCL) when a CUDA device is present, else the host transport; the header says which.
#include <nccl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/collectives/bench_groups.h"
#include "bench/collectives/collective_bench.h"
#include "bench/collectives/nccl_bench.h"
#include "comm/group_bootstrap.h"
#include "comm/host.h"
#include "comm/ucx_bootstrap.h"

namespace {

using namespace gtp;

// One GPU per rank on a host: LOCAL_RANK (torchrun) when set, else the global rank.
int device_for(int rank, int devices) {
  const char* local = std::getenv("LOCAL_RANK");
  return (local != nullptr ? std::atoi(local) : rank) % devices;
}

std::string nccl_version_text() {
  int version = 0;
  ncclGetVersion(&version);
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace

int main(int argc, char** argv) {
  bench::BenchOptions options;
  comm::UcxBootstrapConfig config;
  bench::BenchGroups groups;
  try {  // bad flags, environment or profile: usage errors
    options = bench::parse_bench_args(std::vector<std::string>(argv + 1, argv + argc));
    config = comm::UcxBootstrapConfig::from_env();
    groups = bench::resolve_groups(options, config.world_size);
    bench::check_host_memory(options, groups.group_size, bench::available_host_bytes());
    struct stat target {};
    if (!options.json_path.empty() && stat(options.json_path.c_str(), &target) == 0 && !S_ISREG(target.st_mode)) {
      // Opening a FIFO for writing would block until a reader comes; a directory cannot be written.
      throw std::invalid_argument("--json " + options.json_path +
                                  " exists and is not a regular file (a FIFO, device or directory): pass a file path");
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "gtp-bench: %s\n", e.what());
    return 2;
  }
  // Opened before the run, so an unwritable path fails in a second, not after the sweep.
  std::ofstream json;
  if (config.rank == 0 && !options.json_path.empty()) {
    json.open(options.json_path);
    if (!json) {
      std::fprintf(stderr, "gtp-bench: --json %s: cannot open for writing (%s): pass a path in a writable directory\n",
                   options.json_path.c_str(), std::strerror(errno));
      return 2;
    }
  }
  try {
    comm::UcxBootstrap bootstrap(config);
    const int devices = bench::cuda_device_count();
    if (options.path == bench::BenchPath::kGpu && devices == 0) {
      throw std::invalid_argument("--path gpu, but this machine has no usable CUDA device: use --path host");
    }
    const bool gpu = options.path == bench::BenchPath::kGpu || (options.path == bench::BenchPath::kAuto && devices > 0);
    std::vector<bench::BenchRow> rows;
    std::string transport;
    if (gpu) {
      const int device = device_for(bootstrap.rank(), devices);
      transport = "GPU, NCCL " + nccl_version_text() + ", one GPU per rank (" + std::to_string(devices) +
                  " visible on this host)";
      rows = bench::run_nccl_bench(bootstrap, options, device, config.timeout, groups);
    } else {
      transport = std::string("host memory over UCX (") +
                  (devices == 0 ? "no CUDA device" : "--path host") + "; measures CPU and loopback, not GPUs)";
      // Each group gets its own host communicator; all groups run the sweep side by side.
      comm::GroupBootstrap group(bootstrap, groups.group_of(bootstrap.rank()));
      comm::HostComm host(group, config.timeout);
      rows = bench::run_host_bench(host, bootstrap, options);
    }
    if (bootstrap.rank() == 0) {
      const int ranks = bootstrap.world_size();
      std::fputs(bench::format_header(options, ranks, transport, groups.group_size).c_str(), stdout);
      for (const bench::BenchRow& row : rows) std::fputs(bench::format_row(row).c_str(), stdout);
      if (!options.json_path.empty()) {
        std::string command;
        for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
        json << bench::to_json(options, ranks, rows, command, transport, groups.group_size).dump(2) << "\n";
        json.close();
        if (!json) throw std::runtime_error("--json " + options.json_path + ": writing failed (disk full?)");
      }
    }
    bool any_wrong = false;
    for (const bench::BenchRow& row : rows) any_wrong |= row.wrong > 0;
    return any_wrong ? 1 : 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "gtp-bench: out of memory for the buffers of -b %zu .. -e %zu: pass a smaller -e\n",
                 options.min_bytes, options.max_bytes);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gtp-bench: %s\n", e.what());
    return 1;
  }
}
