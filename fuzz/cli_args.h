// Fuzz input -> argv for the CLI targets: one argument per line (a line may be empty).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtp::fuzz {

inline std::vector<std::string> split_args(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string arg;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(arg);
      arg.clear();
    } else {
      arg.push_back(static_cast<char>(data[i]));
    }
  }
  if (!arg.empty()) args.push_back(arg);
  return args;
}

}  // namespace gtp::fuzz
