// Ranks as threads for the one-GPU rig's tests and benchmark: one function per rank, and a watchdog.
// A rig collective that a peer never joins waits forever when flags are stream memory operations, so
// instead of hanging, the watchdog prints what it knows and ends the process with status 3.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "remat/one_gpu_rig.h"

namespace gtp::remat::testing {

// GTP_RIG_FLAGS=memops or auto picks how the rig raises its flags (bench/rig_h200.sh runs both);
// unset or anything else: kKernels (every wait bounded).
inline OneGpuRig::Flags rig_flags_from_env() {
  const char* v = std::getenv("GTP_RIG_FLAGS");
  const std::string value = v == nullptr ? "" : v;
  if (value == "kernels") return OneGpuRig::Flags::kKernels;
  if (value == "memops") return OneGpuRig::Flags::kStreamMemOps;
  if (value == "auto") return OneGpuRig::Flags::kAuto;
  return OneGpuRig::Flags::kKernels;
}

// The flag modes a rig test covers: the one GTP_RIG_FLAGS names, else both kAuto and kKernels.
inline std::vector<OneGpuRig::Flags> rig_flag_modes() {
  const char* v = std::getenv("GTP_RIG_FLAGS");
  if (v != nullptr && *v != '\0') return {rig_flags_from_env()};
  return {OneGpuRig::Flags::kKernels, OneGpuRig::Flags::kAuto};
}

// The watchdog's limit: GTP_RIG_WATCHDOG_S seconds (a whole number), else 300.
inline std::chrono::seconds rig_watchdog() {
  const char* v = std::getenv("GTP_RIG_WATCHDOG_S");
  char* end = nullptr;
  const long seconds = v == nullptr ? 0 : std::strtol(v, &end, 10);
  return std::chrono::seconds(seconds > 0 && end != nullptr && *end == '\0' ? seconds : 300);
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
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      ++done;
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
      std::_Exit(3);
    }
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace gtp::remat::testing
