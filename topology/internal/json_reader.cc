#include "topology/internal/json_reader.h"

#include <algorithm>
#include <stdexcept>

namespace gtp::topology::internal {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// RFC 6901: "~" and "/" inside a key are escaped.
std::string escape_pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    // A truncated or extended name ("high" for "highest") is as likely a slip as a typo.
    const bool prefix = std::min(word.size(), candidate.size()) >= 3 &&
                        (word.rfind(candidate, 0) == 0 || candidate.rfind(word, 0) == 0);
    const size_t distance = prefix ? 1 : edit_distance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

std::string json_type_name(const nlohmann::json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

JsonReader::JsonReader(const nlohmann::json& value, std::string path) : value_(value), path_(std::move(path)) {
  if (!value_.is_object()) {
    throw std::invalid_argument((path_.empty() ? "/" : path_) + ": expected an object, got " +
                                json_type_name(value_) + ": write {...}");
  }
}

std::string JsonReader::path_of(const std::string& key) const { return path_ + "/" + escape_pointer_token(key); }

void JsonReader::fail(const std::string& key, const std::string& message) const {
  throw std::invalid_argument((key.empty() ? (path_.empty() ? "/" : path_) : path_of(key)) + ": " + message);
}

void JsonReader::allow_only(const std::vector<std::string>& allowed) const {
  for (auto it = value_.begin(); it != value_.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end()) continue;
    const std::string suggestion = closest_match(it.key(), allowed);
    fail(it.key(), "unknown key '" + it.key() + "'" +
                       (suggestion.empty() ? "" : ": did you mean '" + suggestion + "'?") +
                       " (allowed here: " + join(allowed) + ")");
  }
}

int64_t JsonReader::integer(const std::string& key, int64_t fallback, int64_t min, int64_t max) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = value_.at(key);
  if (!v.is_number_integer()) {
    fail(key, "expected an integer, got " + json_type_name(v) + " " + v.dump() +
                  (v.is_string() ? ": write the number without quotes" : ": write a whole number"));
  }
  const int64_t out = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                          ? INT64_MAX
                          : v.get<int64_t>();
  if (out < min || out > max) {
    fail(key, "value " + v.dump() + " is out of range: use " + std::to_string(min) + ".." + std::to_string(max));
  }
  return out;
}

int64_t JsonReader::required_integer(const std::string& key, int64_t min, int64_t max) const {
  if (!has(key)) fail(key, "missing: add \"" + key + "\": <integer>");
  return integer(key, 0, min, max);
}

double JsonReader::number(const std::string& key, double fallback, double min) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = value_.at(key);
  if (!v.is_number()) fail(key, "expected a number, got " + json_type_name(v) + " " + v.dump() + ": write a number");
  const double out = v.get<double>();
  if (out < min) fail(key, "value " + v.dump() + " is too small: use " + std::to_string(min) + " or more");
  return out;
}

bool JsonReader::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = value_.at(key);
  if (!v.is_boolean()) {
    fail(key, "expected true or false, got " + json_type_name(v) + " " + v.dump() + ": write true or false, unquoted");
  }
  return v.get<bool>();
}

std::string JsonReader::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& v = value_.at(key);
  if (!v.is_string()) fail(key, "expected a string, got " + json_type_name(v) + " " + v.dump() + ": quote it");
  return v.get<std::string>();
}

std::string JsonReader::required_string(const std::string& key) const {
  if (!has(key)) fail(key, "missing: add \"" + key + "\": \"...\"");
  return string(key, "");
}

std::string JsonReader::choice(const std::string& key, const std::string& fallback,
                               const std::vector<std::string>& choices) const {
  const std::string value = string(key, fallback);
  if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
    const std::string suggestion = closest_match(value, choices);
    fail(key, "'" + value + "' is not allowed" + (suggestion.empty() ? "" : ": did you mean '" + suggestion + "'?") +
                  " (use one of " + join(choices) + ")");
  }
  return value;
}

const nlohmann::json& JsonReader::array(const std::string& key) const {
  if (!has(key)) fail(key, "missing: add \"" + key + "\": [...]");
  const nlohmann::json* out = optional_array(key);
  return *out;
}

const nlohmann::json* JsonReader::optional_array(const std::string& key) const {
  if (!has(key)) return nullptr;
  const nlohmann::json& v = value_.at(key);
  if (!v.is_array()) fail(key, "expected an array, got " + json_type_name(v) + ": write [...]");
  return &v;
}

const nlohmann::json* JsonReader::optional_object(const std::string& key) const {
  if (!has(key)) return nullptr;
  const nlohmann::json& v = value_.at(key);
  if (!v.is_object()) fail(key, "expected an object, got " + json_type_name(v) + ": write {...}");
  return &v;
}

}  // namespace gtp::topology::internal
