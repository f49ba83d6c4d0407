// FillGraphs: one group's fills recorded once as backend graphs and launched from then on
// (GroupConfig::fill_graphs; docs/remat.md, Fill graphs). A fill is named by a signature the runtime
// builds from rank-uniform state only (slot indices, layouts, weight ids), never from pointers, so that
// every rank of a group records the same fills at the same point and launches the graph of the same
// recording afterwards, as NCCL requires of captured collectives. The pointers a graph holds are
// those of the signature for as long as the table lives: the runtime clears it when a slot's buffer
// moves (Cache::relocations) and on reset_chains.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "remat/backend.h"

namespace gtp::remat {

class FillGraphs {
 public:
  // Holds at most `limit` graphs; 0 holds none (every fill runs eagerly).
  FillGraphs(Backend& backend, std::int64_t limit) : backend_(backend), limit_(limit) {}
  ~FillGraphs() { clear(); }
  FillGraphs(const FillGraphs&) = delete;
  FillGraphs& operator=(const FillGraphs&) = delete;

  enum class Ran { kEager, kRecorded, kLaunched };
  // Runs a fill on `stream`: launches the graph of `signature`; else records `enqueue` (which enqueues
  // the fill's work on `stream`) into a new graph and launches it; else, with the table full, calls
  // `enqueue` eagerly. A failed recording is dropped and rethrown.
  template <typename Enqueue>
  Ran run(const std::vector<std::int64_t>& signature, Stream stream, Enqueue&& enqueue) {
    const auto found = graphs_.find(signature);
    if (found != graphs_.end()) {
      backend_.launch_graph(found->second, stream);
      return Ran::kLaunched;
    }
    if (static_cast<std::int64_t>(graphs_.size()) >= limit_) {
      enqueue();
      return Ran::kEager;
    }
    backend_.begin_graph(stream);
    Backend::Graph graph = 0;
    try {
      enqueue();
      graph = backend_.end_graph(stream);
    } catch (...) {
      backend_.abort_graph(stream);
      throw;
    }
    graphs_.emplace(signature, graph);
    backend_.launch_graph(graph, stream);
    return Ran::kRecorded;
  }

  // Destroys every graph (a launch still running finishes first).
  void clear();
  std::int64_t size() const { return static_cast<std::int64_t>(graphs_.size()); }
  bool enabled() const { return limit_ > 0; }

 private:
  struct SignatureHash {
    std::size_t operator()(const std::vector<std::int64_t>& signature) const;
  };

  Backend& backend_;
  std::int64_t limit_;
  std::unordered_map<std::vector<std::int64_t>, Backend::Graph, SignatureHash> graphs_;
};

}  // namespace gtp::remat
