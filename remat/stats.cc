#include "remat/stats.h"

#include <nlohmann/json.hpp>

namespace gtp::remat {

Trace::Trace(std::size_t capacity) : capacity_(capacity), origin_(std::chrono::steady_clock::now()) {
  spans_.reserve(capacity);
}

double Trace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void Trace::add(const std::string& name, const char* category, double start_us) {
  if (!enabled()) return;
  Span span{name, category, start_us, now_us() - start_us};
  if (spans_.size() < capacity_) {
    spans_.push_back(std::move(span));
  } else {
    spans_[next_] = std::move(span);
    ++dropped_;
  }
  next_ = (next_ + 1) % capacity_;
}

std::string Trace::chrome_json(int pid) const {
  nlohmann::json events = nlohmann::json::array();
  const std::size_t first = spans_.size() < capacity_ ? 0 : next_;
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    const Span& span = spans_[(first + i) % spans_.size()];
    events.push_back({{"name", span.name}, {"cat", span.category}, {"ph", "X"}, {"ts", span.start_us},
                      {"dur", span.duration_us}, {"pid", pid}, {"tid", 0}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace gtp::remat
