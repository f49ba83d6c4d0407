// Reading untrusted JSON text: regular files only and bounded in size, nesting bounded before the
// parser sees it, NUL bytes and duplicate keys refused; errors name the JSON pointer where known.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace gtp::topology::internal {

inline constexpr int kMaxJsonDepth = 64;                        // profiles nest about 8 deep
inline constexpr std::int64_t kMaxJsonBytes = std::int64_t{64} << 20;  // 64 MiB

// The bytes of a regular file of at most kMaxJsonBytes; a FIFO, device or directory is refused
// without reading (so a FIFO cannot block and /dev/zero is not read). Throws std::invalid_argument.
std::string read_regular_file(const std::string& path, const std::string& what);

// Parses `text`; std::invalid_argument naming `source` and the fix for anything refused.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

}  // namespace gtp::topology::internal
