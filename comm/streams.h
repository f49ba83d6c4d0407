// Side streams and events for GTP communication, and the ordering helper that hands work from a
// producer stream to a side stream and back to a consumer (see docs/comm.md for capture safety).
//
// Streams are created with cudaStreamNonBlocking (never implicitly synchronized with the legacy
// default stream) and a priority inside cudaDeviceGetStreamPriorityRange; GTP groups default to the
// greatest priority so their gathers overtake compute kernels queued earlier. One thread at a time
// per pool.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gtp::comm {

// The phases a weight's collectives run in; each (group, role) gets its own side stream so that, for
// example, a backward re-gather never queues behind a reduce-scatter of the previous layer.
enum class StreamRole { kAllGatherForward, kAllGatherBackward, kAllGatherRecompute, kReduceScatterBackward };

const char* role_name(StreamRole role);  // "ag_fwd", "ag_bwd", "ag_recompute", "rs_bwd"

// CUDA's convention: a numerically lower priority runs first; `greatest` is the highest priority.
struct StreamPriorityRange {
  int least;
  int greatest;
  bool contains(int priority) const { return priority <= least && priority >= greatest; }
};

// Throws CommError when CUDA fails (for example, no device).
StreamPriorityRange stream_priority_range(int device);

class StreamPool {
 public:
  explicit StreamPool(int device);
  ~StreamPool();
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  // The side stream of (group, role), created on first use with `priority` (default: the greatest).
  // Asking again for the same (group, role) returns the same stream; asking with a different explicit
  // priority throws std::invalid_argument, as does a priority outside the device's range.
  cudaStream_t get(const std::string& group, StreamRole role, std::optional<int> priority = std::nullopt);
  int device() const { return device_; }
  const StreamPriorityRange& priority_range() const { return range_; }

 private:
  struct Entry {
    cudaStream_t stream;
    int priority;
  };
  int device_;
  StreamPriorityRange range_;
  std::map<std::pair<std::string, StreamRole>, Entry> streams_;
};

// Reusable events without timing (cheapest to record and wait on). An event may be released as soon
// as the waits on it are enqueued: cudaStreamWaitEvent captures the event's state at call time.
class EventPool {
 public:
  explicit EventPool(int device);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  void reserve(std::size_t count);  // pre-creates events, so later acquires never call cudaEventCreate
  cudaEvent_t acquire();
  void release(cudaEvent_t event);
  std::size_t created() const { return all_.size(); }

 private:
  int device_;
  std::vector<cudaEvent_t> all_;
  std::vector<cudaEvent_t> free_;
};

// Makes `waiter` wait for everything enqueued on `producer` so far (record + wait, no host sync).
void stream_wait(EventPool& events, cudaStream_t waiter, cudaStream_t producer);

// The GTP ordering pattern: `side` waits for `producer`, `issue(side)` enqueues the communication,
// then `consumer` waits for `side`. Host never blocks; capture safe when `issue` is.
template <typename Issue>
void run_ordered(EventPool& events, cudaStream_t producer, cudaStream_t side, cudaStream_t consumer, Issue&& issue) {
  stream_wait(events, side, producer);
  issue(side);
  stream_wait(events, consumer, side);
}

}  // namespace gtp::comm
