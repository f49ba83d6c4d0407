// Ranks as threads for the one-GPU rig's tests: one function per rank, and a watchdog.
// A rig collective that a peer never joins waits forever when flags are stream memory operations, so
// instead of hanging, the watchdog prints what it knows and ends the process with status 3.
#pragma once

#include <cuda_runtime_api.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "testing/rig/one_gpu_rig_kernels.h"
#include "testing/rig/one_gpu_rig.h"

namespace gtp::remat::testing {

// GTP_RIG_FLAGS=memops, host or auto picks how the rig raises its flags (tools/gpu/run.sh rig runs them);
// unset or anything else: kKernels (every wait bounded).
inline OneGpuRig::Flags rig_flags_from_env() {
  const char* v = std::getenv("GTP_RIG_FLAGS");
  const std::string value = v == nullptr ? "" : v;
  if (value == "kernels") return OneGpuRig::Flags::kKernels;
  if (value == "memops") return OneGpuRig::Flags::kStreamMemOps;
  if (value == "host") return OneGpuRig::Flags::kHostRendezvous;
  if (value == "auto") return OneGpuRig::Flags::kAuto;
  return OneGpuRig::Flags::kKernels;
}

// The flag modes a rig test covers: the one GTP_RIG_FLAGS names, else both kAuto and kKernels.
inline std::vector<OneGpuRig::Flags> rig_flag_modes() {
  const char* v = std::getenv("GTP_RIG_FLAGS");
  if (v != nullptr && *v != '\0') return {rig_flags_from_env()};
  return {OneGpuRig::Flags::kKernels, OneGpuRig::Flags::kAuto};
}

// Page-locked host memory for one rank's copies, allocated before the ranks start: a copy from or to
// pageable memory is staged by the driver and may wait for more than its own stream, and
// cudaHostAlloc itself may wait for the device, while a peer may be waiting for this rank.
// upload / download copy through it on `stream`; downloads land in their host destination at finish()
// (after synchronizing `stream`), which also makes the stage's room free again.
// The copies are cudaMemcpyAsync, or with GTP_RIG_STAGE=kernel kernels (rig::copy_bytes) on the
// stream's compute queue: a test of the suspected cause of one_gpu_rig_test's stalls (docs/rig.md),
// the ranks' copies sharing the device's few copy-engine queues in submission order, where one rank's
// download queued behind its own collective (waiting for a peer) could hold back a peer's upload.
class PinnedStage {
 public:
  explicit PinnedStage(std::int64_t bytes) : bytes_(bytes), copy_engine_(copy_engine_from_env()) {
    if (cudaHostAlloc(&base_, static_cast<std::size_t>(bytes), cudaHostAllocDefault) != cudaSuccess) {
      throw std::runtime_error("one-GPU rig test: cudaHostAlloc of " + std::to_string(bytes) + " bytes failed");
    }
  }
  ~PinnedStage() { cudaFreeHost(base_); }
  PinnedStage(const PinnedStage&) = delete;
  PinnedStage& operator=(const PinnedStage&) = delete;

  void upload(void* device, const void* host, std::int64_t bytes, cudaStream_t stream) {
    if (bytes <= 0) return;
    char* staged = take(bytes);
    std::memcpy(staged, host, static_cast<std::size_t>(bytes));
    copy(device, staged, bytes, cudaMemcpyHostToDevice, stream);
  }
  void download(void* host, const void* device, std::int64_t bytes, cudaStream_t stream) {
    if (bytes <= 0) return;
    char* staged = take(bytes);
    copy(staged, device, bytes, cudaMemcpyDeviceToHost, stream);
    pending_.push_back({host, staged, bytes});
  }
  void finish(cudaStream_t stream) {
    check(cudaStreamSynchronize(stream));
    for (const Pending& p : pending_) std::memcpy(p.host, p.staged, static_cast<std::size_t>(p.bytes));
    pending_.clear();
    used_ = 0;
  }

 private:
  struct Pending {
    void* host;
    const char* staged;
    std::int64_t bytes;
  };
  static bool copy_engine_from_env() {
    const char* v = std::getenv("GTP_RIG_STAGE");
    return v == nullptr || std::strcmp(v, "kernel") != 0;
  }
  void copy(void* dst, const void* src, std::int64_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    if (copy_engine_) {
      check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), kind, stream));
    } else {
      rig::copy_bytes(stream, dst, src, bytes);
    }
  }
  static void check(cudaError_t e) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("one-GPU rig test copy: ") + cudaGetErrorString(e));
  }
  char* take(std::int64_t bytes) {
    const std::int64_t at = (used_ + 255) / 256 * 256;
    if (at + bytes > bytes_) {
      throw std::runtime_error("one-GPU rig test: the pinned stage of " + std::to_string(bytes_) +
                               " bytes is too small for " + std::to_string(bytes) + " more");
    }
    used_ = at + bytes;
    return static_cast<char*>(base_) + at;
  }
  void* base_ = nullptr;
  std::int64_t bytes_, used_ = 0;
  bool copy_engine_;
  std::vector<Pending> pending_;
};

// One stage per rank, allocated here (call it before the ranks start).
inline std::vector<std::unique_ptr<PinnedStage>> pinned_stages(int ranks, std::int64_t bytes_each) {
  std::vector<std::unique_ptr<PinnedStage>> stages;
  for (int r = 0; r < ranks; ++r) stages.push_back(std::make_unique<PinnedStage>(bytes_each));
  return stages;
}

// The watchdog's limit: GTP_RIG_WATCHDOG_S seconds (a whole number), else 300.
inline std::chrono::seconds rig_watchdog() {
  const char* v = std::getenv("GTP_RIG_WATCHDOG_S");
  char* end = nullptr;
  const long seconds = v == nullptr ? 0 : std::strtol(v, &end, 10);
  return std::chrono::seconds(seconds > 0 && end != nullptr && *end == '\0' ? seconds : 300);
}

// The watchdog's view of a hung rank: its thread's host stack, printed by the thread itself on
// SIGUSR2 (backtrace_symbols_fd is async-signal-safe once backtrace has been called before). Frames
// read "binary(+0xOFFSET)": `addr2line -Cfe BINARY OFFSET` on the same binary names them.
inline thread_local int rig_rank_of_thread = -1;
inline void print_rig_rank_stack(int) {
  void* frames[48];
  const int n = backtrace(frames, 48);
  char header[64];
  const int len = std::snprintf(header, sizeof header, "one-GPU rig: rank %d host stack:\n", rig_rank_of_thread);
  if (len > 0) (void)!write(2, header, static_cast<std::size_t>(len));
  backtrace_symbols_fd(frames, n, 2);
}

// Runs body(rank) for every rank of `rig` on its own thread; rethrows the first rank's exception.
inline void on_rig_ranks(OneGpuRig& rig, const std::function<void(int rank)>& body,
                         std::chrono::seconds watchdog = rig_watchdog()) {
  const int n = rig.world();
  std::vector<std::exception_ptr> errors(n);
  std::mutex mutex;
  std::condition_variable finished;
  int done = 0;
  std::vector<std::thread> threads;
  std::vector<char> finished_rank(n, 0);
  {
    void* warm[1];
    backtrace(warm, 1);  // loads what backtrace needs now, not inside the signal handler
    struct sigaction action = {};
    action.sa_handler = print_rig_rank_stack;
    sigaction(SIGUSR2, &action, nullptr);
  }
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      rig_rank_of_thread = rank;
      try {
        body(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      ++done;
      finished_rank[rank] = 1;
      finished.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!finished.wait_for(lock, watchdog, [&] { return done == n; })) {
      std::fprintf(stderr,
                   "one-GPU rig: %d of %d ranks still running after %lld s: a collective that a peer never "
                   "joined, or a host call that synchronizes the whole device while a peer waits for this "
                   "rank (cudaDeviceSynchronize, cudaFree, the legacy default stream). %s\n",
                   n - done, n, static_cast<long long>(watchdog.count()), rig.timeout_report().c_str());
      std::fprintf(stderr, "%s", rig.progress_report().c_str());
      std::fflush(stderr);
      for (int rank = 0; rank < n; ++rank) {  // where each hung rank's thread is, one at a time
        if (finished_rank[rank]) continue;
        pthread_kill(threads[rank].native_handle(), SIGUSR2);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
      std::_Exit(3);
    }
  }
  for (std::thread& t : threads) t.join();
  // Every rank's failure, with the rig's reports: the first rank's error is often only the sticky
  // CUDA error another rank's timed-out wait left, and the cause is on a later rank.
  std::exception_ptr first;
  for (int rank = 0; rank < n; ++rank) {
    if (!errors[rank]) continue;
    if (!first) first = errors[rank];
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "one-GPU rig: rank %d failed: %s\n", rank, e.what());
    } catch (...) {
      std::fprintf(stderr, "one-GPU rig: rank %d failed with a non-standard exception\n", rank);
    }
  }
  if (first) {
    std::fprintf(stderr, "%s\n%s", rig.timeout_report().c_str(), rig.progress_report().c_str());
    std::fflush(stderr);
    std::rethrow_exception(first);
  }
}

}  // namespace gtp::remat::testing
