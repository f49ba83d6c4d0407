// Stats of the remat runtime beyond its counters: per-weight figures and a trace of the runtime's
// host-side spans (gathers, re-packs, reductions) in Chrome's trace-event format. On the host backend
// a span is the work itself; on the CUDA backend it is the time to enqueue it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gtp::remat {

struct WeightStats {
  std::int64_t materializations = 0;
  std::int64_t prefetch_hits = 0;
  std::int64_t exposed_gathers = 0;
  std::int64_t gathered_bytes = 0;  // wire bytes this rank received for the weight (G chunks a gather)
};

// A ring of the latest `capacity` spans; capacity 0 records nothing. Storage is reserved up front.
class Trace {
 public:
  explicit Trace(std::size_t capacity);

  bool enabled() const { return capacity_ > 0; }
  // Microseconds since the trace was created.
  double now_us() const;
  // A span from `start_us` to now.
  void add(const std::string& name, const char* category, double start_us);
  // {"traceEvents": [...]} with complete ("X") events, oldest first, on process `pid`.
  std::string chrome_json(int pid) const;
  std::int64_t dropped() const { return dropped_; }

 private:
  struct Span {
    std::string name;
    const char* category = "";
    double start_us = 0;
    double duration_us = 0;
  };
  std::size_t capacity_;
  std::vector<Span> spans_;
  std::size_t next_ = 0;
  std::int64_t dropped_ = 0;
  std::chrono::steady_clock::time_point origin_;
};

}  // namespace gtp::remat
