// A Backend that does no device work and logs every ordering and work call with the stream it names,
// so tests can assert the event protocol: which stream waited on which stream's event before what.
// Side streams are named "ag<g>" (gather) and "rs<g>" (reduce-scatter); consumer streams "s<i>".
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "remat/backend.h"

namespace gtp::remat::testing {

inline Stream consumer_stream(int i) { return reinterpret_cast<Stream>(static_cast<std::intptr_t>(i)); }

class LoggingBackend : public Backend {
 public:
  explicit LoggingBackend(int groups = 1, int group_size = 1) : groups_(groups), group_size_(group_size) {}

  std::string name() const override { return "logging"; }
  int group_size(int) const override { return group_size_; }
  int group_rank(int) const override { return 0; }
  int group_count() const override { return groups_; }

  void amax(Stream s, const void*, kernels::SourceDtype, std::int64_t, std::int64_t, float* out) override {
    *out = 1.0f;
    work("amax", s);
  }
  void pack(Stream s, const kernels::WireSpec&, const kernels::PackArgs&) override { work("pack", s); }
  void unpack(Stream s, const kernels::WireSpec&, const kernels::GatheredChunks&, void*, std::int64_t) override {
    work("unpack", s);
  }
  // Logged as "unpack_many x<jobs> <spec> on <stream>", e.g. "unpack_many x3 mxfp8 (rceil) on ag0".
  void unpack_many(Stream s, const kernels::WireSpec& spec, const std::vector<kernels::UnpackJob>& jobs) override {
    log.push_back("unpack_many x" + std::to_string(jobs.size()) + " " + kernels::to_string(spec) + " on " +
                  stream_name(s));
  }
  void unpack_gemm(Stream s, const kernels::WireSpec&, const kernels::GatheredChunks&,
                   const kernels::GemmOutputs&) override {
    work("unpack_gemm", s);
  }
  void all_gather(Stream s, int, const void*, void*, std::int64_t) override { work("all_gather", s); }
  void all_reduce_max(Stream s, int, float*, std::int64_t) override { work("all_reduce_max", s); }
  void reduce_scatter_mean(Stream s, int, const float*, float*, std::int64_t) override { work("reduce_scatter", s); }
  void add(Stream s, const float*, float*, std::int64_t) override { work("add", s); }
  void fill(Stream s, void* dst, unsigned char byte, std::int64_t bytes) override {
    std::memset(dst, byte, static_cast<std::size_t>(bytes));
    work("fill", s);
  }
  void host_callback(Stream s, std::function<void()> callback) override {
    work("host_callback", s);
    callback();
  }

  Stream side_stream(int group, Role role) override {
    return consumer_stream(1000 + 2 * group + static_cast<int>(role));
  }
  Event record(Stream s) override {
    recorded[++events] = s;
    recorded_at[events] = static_cast<int>(log.size());
    return events;
  }
  // Logged as "<waiter> waits <producer>", the producer being the stream the event was recorded on.
  void wait(Stream s, Event e) override {
    waits.emplace_back(s, e);
    log.push_back(stream_name(s) + " waits " + stream_name(recorded.at(e)));
  }
  void forget(Event e) override { forgotten.push_back(e); }
  void synchronize_side_streams() override { log.push_back("synchronize"); }

  std::string stream_name(Stream s) const {
    const auto i = static_cast<int>(reinterpret_cast<std::intptr_t>(s));
    if (i >= 1000) return std::string((i - 1000) % 2 == 0 ? "ag" : "rs") + std::to_string((i - 1000) / 2);
    return "s" + std::to_string(i);
  }
  // The events `s` waited on from the `from`-th wait on (waits.size() at some point), in order.
  std::vector<Event> waited_by(Stream s, std::size_t from = 0) const {
    std::vector<Event> out;
    for (std::size_t i = from; i < waits.size(); ++i) {
      if (waits[i].first == s) out.push_back(waits[i].second);
    }
    return out;
  }
  // The index of the first log line equal to `line` at or after `from`, or -1.
  int find(const std::string& line, int from = 0) const {
    for (int i = from; i < static_cast<int>(log.size()); ++i) {
      if (log[i] == line) return i;
    }
    return -1;
  }

  Event events = 0;
  std::map<Event, Stream> recorded;
  std::map<Event, int> recorded_at;  // the event marks the log lines before this index
  std::vector<std::pair<Stream, Event>> waits;
  std::vector<Event> forgotten;
  std::vector<std::string> log;  // "<work> on <stream>" and "<waiter> waits <producer>", in call order

 protected:
  void* do_allocate(std::int64_t bytes) override { return std::calloc(1, static_cast<std::size_t>(bytes)); }
  void do_deallocate(void* ptr) override { std::free(ptr); }

 private:
  void work(const char* what, Stream s) { log.push_back(std::string(what) + " on " + stream_name(s)); }

  int groups_;
  int group_size_;
};

}  // namespace gtp::remat::testing
