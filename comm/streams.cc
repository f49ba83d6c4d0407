#include "comm/streams.h"

#include <stdexcept>

#include "comm/errors.h"

namespace gtp::comm {
namespace {

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw CommError(std::string(what) + " failed: " + cudaGetErrorString(error), false);
}

// Runs CUDA calls on `device` and restores the caller's current device afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace

const char* role_name(StreamRole role) {
  switch (role) {
    case StreamRole::kAllGatherForward: return "ag_fwd";
    case StreamRole::kAllGatherBackward: return "ag_bwd";
    case StreamRole::kAllGatherRecompute: return "ag_recompute";
    case StreamRole::kReduceScatterBackward: return "rs_bwd";
  }
  return "?";
}

StreamPriorityRange stream_priority_range(int device) {
  DeviceScope scope(device);
  StreamPriorityRange range{};
  check_cuda(cudaDeviceGetStreamPriorityRange(&range.least, &range.greatest), "cudaDeviceGetStreamPriorityRange");
  return range;
}

StreamPool::StreamPool(int device) : device_(device), range_(stream_priority_range(device)) {}

StreamPool::~StreamPool() {
  for (auto& [key, entry] : streams_) cudaStreamDestroy(entry.stream);
}

cudaStream_t StreamPool::get(const std::string& group, StreamRole role, std::optional<int> priority) {
  const std::string name = group + "/" + role_name(role);
  if (priority && !range_.contains(*priority)) {
    throw std::invalid_argument("stream priority " + std::to_string(*priority) + " for " + name +
                                " is outside this device's range [" + std::to_string(range_.greatest) + " (highest), " +
                                std::to_string(range_.least) + " (lowest)]: pick one inside it");
  }
  auto found = streams_.find({group, role});
  if (found != streams_.end()) {
    if (priority && *priority != found->second.priority) {
      throw std::invalid_argument("stream " + name + " already exists with priority " +
                                  std::to_string(found->second.priority) + ", not " + std::to_string(*priority) +
                                  ": request each (group, role) with one priority");
    }
    return found->second.stream;
  }
  DeviceScope scope(device_);
  const int chosen = priority.value_or(range_.greatest);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, chosen), "cudaStreamCreateWithPriority");
  streams_.emplace(std::make_pair(group, role), Entry{stream, chosen});
  return stream;
}

EventPool::EventPool(int device) : device_(device) {}

EventPool::~EventPool() {
  for (cudaEvent_t event : all_) cudaEventDestroy(event);
}

void EventPool::reserve(std::size_t count) {
  DeviceScope scope(device_);
  while (free_.size() < count) {
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    all_.push_back(event);
    free_.push_back(event);
  }
}

cudaEvent_t EventPool::acquire() {
  if (free_.empty()) reserve(1);
  cudaEvent_t event = free_.back();
  free_.pop_back();
  return event;
}

void EventPool::release(cudaEvent_t event) { free_.push_back(event); }

void stream_wait(EventPool& events, cudaStream_t waiter, cudaStream_t producer) {
  cudaEvent_t event = events.acquire();
  const cudaError_t recorded = cudaEventRecord(event, producer);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(waiter, event, 0) : recorded;
  events.release(event);
  check_cuda(waited, recorded == cudaSuccess ? "cudaStreamWaitEvent" : "cudaEventRecord");
}

}  // namespace gtp::comm
