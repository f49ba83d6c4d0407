// graph_launch_probe: which ways of launching CUDA graphs let G ranks that share ONE GPU (threads of one
// process, each with its own stream) wait for each other on the device, as the one-GPU rig's flag
// kernels do (one_gpu_rig.h). The rig's eager collectives pass at G = 2..8, while the runtime's
// fill graphs and captured steps stalled until instantiation was fenced (docs/rig.md); this separates the launch
// patterns. Each "fill" is what a rig fill graph holds: a tiny kernel (the fill tag's write), then K
// collectives, each an arrival round of one-thread flag kernels, a data kernel and a departure round.
// Every flag wait is bounded; the first wait that times out raises an abort word, after which every
// wait returns at once, so a stalled pattern ends in about `timeout` and is reported, not hung.
//
//   graph_launch_probe [--ranks 2,4,8] [--repeats 3] [--fills 16] [--timeout-ms 3000] [--patterns a,b]
// Prints one line per (pattern, G): runs that completed, runs with a timed-out wait, median time.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "graph_launch_probe: %s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

__device__ long long now_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// flags[receiver * size + sender]; a flag belongs to its receiver, which lowers it (as the rig's).
__global__ void flag_round(unsigned* flags, int size, int rank, long long timeout_ns, unsigned* abort_word,
                           unsigned* timeouts) {
  volatile unsigned* f = flags;
  volatile unsigned* abort_flag = abort_word;
  __threadfence();
  for (int q = 0; q < size; ++q)
    if (q != rank) f[q * size + rank] = 1;
  const long long start = now_ns();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    while (f[rank * size + r] != 1) {
      if (*abort_flag != 0) return;
      if (now_ns() - start > timeout_ns) {
        atomicAdd(timeouts, 1u);
        *abort_flag = 1;
        __threadfence_system();
        return;
      }
      __nanosleep(200);
    }
    f[rank * size + r] = 0;
  }
  __threadfence();
}

__global__ void touch(float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = x[i] * 0.5f + 1.0f;
}

struct Shared {
  int size = 0;
  long long timeout_ns = 0;
  unsigned* flags = nullptr;   // [2 rounds][size][size]
  unsigned* flags2 = nullptr;  // a second communicator's, for the two-branch patterns
  unsigned* abort_word = nullptr;
  unsigned* timeouts = nullptr;
  // A host barrier for the patterns that need one (not part of a collective: between phases only).
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0, generation = 0;
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex);
    const int gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      changed.notify_all();
    } else {
      changed.wait(lock, [&] { return generation != gen; });
    }
  }
};

struct Rank {
  Shared* s = nullptr;
  int rank = 0;
  cudaStream_t stream = nullptr, side = nullptr, branch = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;
  float* data = nullptr;
  int n = 1 << 16;

  void collective(cudaStream_t on, unsigned* flags, float* x) {
    flag_round<<<1, 1, 0, on>>>(flags, s->size, rank, s->timeout_ns, s->abort_word, s->timeouts);
    touch<<<64, 256, 0, on>>>(x, n / 2);
    flag_round<<<1, 1, 0, on>>>(flags + s->size * s->size, s->size, rank, s->timeout_ns, s->abort_word, s->timeouts);
  }
  void fill(int k) {
    touch<<<1, 32, 0, stream>>>(data, 16);  // the tag write
    for (int c = 0; c < k; ++c) collective(stream, s->flags, data);
  }
  // A step's shape: the stream forks to a second stream, each runs k collectives of its own
  // communicator, and they join.
  void step(int k) {
    check(cudaEventRecord(forked, stream), "cudaEventRecord");
    check(cudaStreamWaitEvent(branch, forked, 0), "cudaStreamWaitEvent");
    for (int c = 0; c < k; ++c) {
      collective(stream, s->flags, data);
      collective(branch, s->flags2, data + n / 2);
    }
    check(cudaEventRecord(joined, branch), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream, joined, 0), "cudaStreamWaitEvent");
  }
  cudaGraphExec_t record(int k, bool two_branches = false) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    if (two_branches) {
      step(k);
    } else {
      fill(k);
    }
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    return exec;
  }
};

using Pattern = std::function<void(Rank&, int fills, int k)>;

// The patterns. "Fills" are the runtime's: recorded the first time, launched from then on.
const std::vector<std::pair<std::string, Pattern>>& patterns() {
  static const std::vector<std::pair<std::string, Pattern>> p = {
      {"eager", [](Rank& r, int fills, int k) {
         for (int f = 0; f < fills; ++f) r.fill(k);
       }},
      // FillGraphs::run: each new fill recorded, instantiated and launched at once, no host sync.
      {"record-then-launch", [](Rank& r, int fills, int k) {
         std::vector<cudaGraphExec_t> execs;
         for (int f = 0; f < fills; ++f) {
           execs.push_back(r.record(k));
           check(cudaGraphLaunch(execs.back(), r.stream), "cudaGraphLaunch");
         }
         check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
         for (auto e : execs) cudaGraphExecDestroy(e);
       }},
      // The same, each graph uploaded on an idle side stream (synchronized) before its launch.
      {"record-upload-launch", [](Rank& r, int fills, int k) {
         std::vector<cudaGraphExec_t> execs;
         for (int f = 0; f < fills; ++f) {
           execs.push_back(r.record(k));
           check(cudaGraphUpload(execs.back(), r.side), "cudaGraphUpload");
           check(cudaStreamSynchronize(r.side), "cudaStreamSynchronize(side)");
           check(cudaGraphLaunch(execs.back(), r.stream), "cudaGraphLaunch");
         }
         check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
         for (auto e : execs) cudaGraphExecDestroy(e);
       }},
      // Every graph instantiated (and uploaded) first, a host barrier, then all launched back to back.
      {"prebuilt-launch", [](Rank& r, int fills, int k) {
         std::vector<cudaGraphExec_t> execs;
         for (int f = 0; f < fills; ++f) {
           execs.push_back(r.record(k));
           check(cudaGraphUpload(execs.back(), r.side), "cudaGraphUpload");
         }
         check(cudaStreamSynchronize(r.side), "cudaStreamSynchronize(side)");
         r.s->barrier();
         for (auto e : execs) check(cudaGraphLaunch(e, r.stream), "cudaGraphLaunch");
         check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
         for (auto e : execs) cudaGraphExecDestroy(e);
       }},
      // Four graphs relaunched in turn (a step's fills replayed), prebuilt as above.
      {"prebuilt-relaunch", [](Rank& r, int fills, int k) {
         std::vector<cudaGraphExec_t> execs;
         for (int f = 0; f < 4; ++f) {
           execs.push_back(r.record(k));
           check(cudaGraphUpload(execs.back(), r.side), "cudaGraphUpload");
         }
         check(cudaStreamSynchronize(r.side), "cudaStreamSynchronize(side)");
         r.s->barrier();
         for (int f = 0; f < fills; ++f) check(cudaGraphLaunch(execs[f % 4], r.stream), "cudaGraphLaunch");
         check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
         for (auto e : execs) cudaGraphExecDestroy(e);
       }},
      // One graph, recorded once, then launched after eager fills have run ahead (the captured step).
      {"eager-then-graph", [](Rank& r, int fills, int k) {
         cudaGraphExec_t exec = r.record(k);
         for (int f = 0; f < fills / 2; ++f) r.fill(k);
         for (int f = 0; f < fills / 2; ++f) check(cudaGraphLaunch(exec, r.stream), "cudaGraphLaunch");
         check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
         cudaGraphExecDestroy(exec);
       }},
      {"two-branch-eager", [](Rank& r, int fills, int k) {
         for (int f = 0; f < fills / 4; ++f) r.step(k);
         check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
       }},
      // The captured step: two branches in one graph, uploaded first, launched after a barrier.
      {"two-branch-graph", [](Rank& r, int fills, int k) {
         cudaGraphExec_t exec = r.record(k, true);
         check(cudaGraphUpload(exec, r.side), "cudaGraphUpload");
         check(cudaStreamSynchronize(r.side), "cudaStreamSynchronize(side)");
         r.s->barrier();
         for (int f = 0; f < fills / 4; ++f) check(cudaGraphLaunch(exec, r.stream), "cudaGraphLaunch");
         check(cudaStreamSynchronize(r.stream), "cudaStreamSynchronize");
         cudaGraphExecDestroy(exec);
       }},
  };
  return p;
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 1 || v > 64) {
      std::fprintf(stderr, "graph_launch_probe: --ranks wants a list like 2,4,8 (each 1..64), got '%s'\n", text);
      std::exit(2);
    }
    out.push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

}  // namespace

int graph_launch_probe_main(int argc, char** argv) {
  std::vector<int> ranks = {2, 4, 8};
  std::string only;  // --patterns a,b: those only
  int repeats = 3, fills = 16, k = 3;
  long long timeout_ms = 3000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ranks") ranks = parse_list(argv[i + 1]);
    else if (flag == "--repeats") repeats = std::max(1, std::atoi(argv[i + 1]));
    else if (flag == "--fills") fills = std::max(2, std::atoi(argv[i + 1]));
    else if (flag == "--patterns") only = "," + std::string(argv[i + 1]) + ",";
    else if (flag == "--timeout-ms") timeout_ms = std::max(100, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "graph_launch_probe: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);  // before CUDA starts, as the rig does
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  check(cudaSetDevice(0), "cudaSetDevice");
  const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("graph_launch_probe: fills %d x %d collectives, timeout %lld ms, CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
              fills, k, timeout_ms, connections);
  std::printf("%-22s %3s %9s %9s %10s\n", "pattern", "G", "complete", "stalled", "median_ms");
  for (const auto& entry : patterns()) {
    const std::string& name = entry.first;
    const Pattern& pattern = entry.second;
    if (!only.empty() && only.find("," + name + ",") == std::string::npos) continue;
    for (int g : ranks) {
      Shared s;
      s.size = g;
      s.timeout_ns = timeout_ms * 1000000LL;
      check(cudaMalloc(&s.flags, 4 * g * g * sizeof(unsigned)), "cudaMalloc");
      s.flags2 = s.flags + 2 * g * g;
      check(cudaMalloc(&s.abort_word, 2 * sizeof(unsigned)), "cudaMalloc");
      s.timeouts = s.abort_word + 1;
      std::vector<Rank> rs(g);
      for (int r = 0; r < g; ++r) {
        rs[r].s = &s;
        rs[r].rank = r;
        check(cudaStreamCreateWithFlags(&rs[r].stream, cudaStreamNonBlocking), "cudaStreamCreate");
        check(cudaStreamCreateWithFlags(&rs[r].side, cudaStreamNonBlocking), "cudaStreamCreate");
        check(cudaStreamCreateWithFlags(&rs[r].branch, cudaStreamNonBlocking), "cudaStreamCreate");
        check(cudaEventCreateWithFlags(&rs[r].forked, cudaEventDisableTiming), "cudaEventCreate");
        check(cudaEventCreateWithFlags(&rs[r].joined, cudaEventDisableTiming), "cudaEventCreate");
        check(cudaMalloc(&rs[r].data, rs[r].n * sizeof(float)), "cudaMalloc");
        check(cudaMemset(rs[r].data, 0, rs[r].n * sizeof(float)), "cudaMemset");
      }
      int complete = 0, stalled = 0;
      std::vector<double> ms;
      for (int rep = 0; rep < repeats; ++rep) {
        check(cudaMemset(s.flags, 0, 4 * g * g * sizeof(unsigned)), "cudaMemset");
        check(cudaMemset(s.abort_word, 0, 2 * sizeof(unsigned)), "cudaMemset");
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        const auto start = std::chrono::steady_clock::now();
        std::vector<std::thread> threads;
        for (int r = 0; r < g; ++r) threads.emplace_back([&, r] {
          check(cudaSetDevice(0), "cudaSetDevice");
          pattern(rs[r], fills, k);
        });
        for (auto& t : threads) t.join();
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        unsigned words[2] = {0, 0};
        check(cudaMemcpy(words, s.abort_word, sizeof words, cudaMemcpyDeviceToHost), "cudaMemcpy");
        (words[1] == 0 ? complete : stalled) += 1;
      }
      std::sort(ms.begin(), ms.end());
      std::printf("%-22s %3d %9d %9d %10.2f\n", name.c_str(), g, complete, stalled, ms[ms.size() / 2]);
      std::fflush(stdout);
      for (auto& r : rs) {
        cudaStreamDestroy(r.stream);
        cudaStreamDestroy(r.side);
        cudaStreamDestroy(r.branch);
        cudaEventDestroy(r.forked);
        cudaEventDestroy(r.joined);
        cudaFree(r.data);
      }
      cudaFree(s.flags);
      cudaFree(s.abort_word);
    }
  }
  return 0;
}
