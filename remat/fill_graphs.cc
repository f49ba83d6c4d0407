#include "remat/fill_graphs.h"

namespace gtp::remat {

void FillGraphs::clear() {
  for (const auto& [signature, graph] : graphs_) backend_.destroy_graph(graph);
  graphs_.clear();
}

std::size_t FillGraphs::SignatureHash::operator()(const std::vector<std::int64_t>& signature) const {
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over the values
  for (const std::int64_t value : signature) {
    hash ^= static_cast<std::uint64_t>(value);
    hash *= 1099511628211ull;
  }
  return static_cast<std::size_t>(hash);
}

}  // namespace gtp::remat
