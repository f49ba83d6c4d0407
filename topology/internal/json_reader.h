// Strict, path-aware reading of JSON objects: every error is a std::invalid_argument that starts
// with the JSON pointer of the offending value and ends with the fix; unknown keys get a
// did-you-mean. Shared by the host-record and profile parsers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gtp::topology::internal {

// The closest candidate by edit distance, or "" when nothing is close enough to be a typo.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

// JSON type name for messages ("string", "integer", "array", ...).
std::string json_type_name(const nlohmann::json& value);

class JsonReader {
 public:
  // Throws unless value is an object.
  JsonReader(const nlohmann::json& value, std::string path);

  const std::string& path() const { return path_; }
  std::string path_of(const std::string& key) const;
  bool has(const std::string& key) const { return value_.contains(key); }
  const nlohmann::json& raw(const std::string& key) const { return value_.at(key); }

  // Rejects keys not in allowed, suggesting the closest allowed key.
  void allow_only(const std::vector<std::string>& allowed) const;

  // Missing optional keys give the fallback; present keys must have the right type and range.
  int64_t integer(const std::string& key, int64_t fallback, int64_t min, int64_t max) const;
  int64_t required_integer(const std::string& key, int64_t min, int64_t max) const;
  double number(const std::string& key, double fallback, double min) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  std::string required_string(const std::string& key) const;
  // A string that must be one of choices.
  std::string choice(const std::string& key, const std::string& fallback, const std::vector<std::string>& choices) const;
  const nlohmann::json& array(const std::string& key) const;    // required, must be an array
  const nlohmann::json* optional_array(const std::string& key) const;
  const nlohmann::json* optional_object(const std::string& key) const;

  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  const nlohmann::json& value_;
  std::string path_;
};

}  // namespace gtp::topology::internal
