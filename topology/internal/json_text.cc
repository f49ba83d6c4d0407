#include "topology/internal/json_text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>
#include <vector>

namespace gtp::topology::internal {
namespace {

std::string mebibytes(std::int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// nlohmann's dump, copy and comparison recurse once per level: deep text is refused before parsing.
void check_depth_and_bytes(const std::string& text, const std::string& source) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0') {
      throw std::invalid_argument(source + ": byte " + std::to_string(i) +
                                  " is a NUL: JSON text has none; the file is truncated, binary or padded");
    }
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        throw std::invalid_argument(source + ": nesting deeper than " + std::to_string(kMaxJsonDepth) +
                                    " levels at byte " + std::to_string(i) +
                                    " (the most libgtp reads; a profile nests about 8): flatten the document");
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

// Where the parser is, as a JSON pointer: one frame per open object or array.
struct Frame {
  bool object = false;
  std::string token;            // this container's key or index in its parent
  std::set<std::string> keys;   // objects: the keys seen so far
  std::string key;              // objects: the key whose value is being read
  std::int64_t next_index = 0;  // arrays: the index of the next element
};

std::string pointer(const std::vector<Frame>& frames, bool with_current) {
  std::string out;
  for (std::size_t i = 1; i < frames.size(); ++i) out += "/" + frames[i].token;
  if (with_current && !frames.empty()) {
    out += "/" + (frames.back().object ? frames.back().key : std::to_string(frames.back().next_index));
  }
  return out.empty() ? "/" : out;
}

}  // namespace

std::string read_regular_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw std::invalid_argument("cannot open " + what + " '" + path + "': " + std::strerror(errno) + "; check the path");
  }
  struct stat st {};
  std::string text;
  std::string error;
  if (::fstat(fd, &st) != 0) {
    error = std::string("fstat failed: ") + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    error = "is not a regular file (a FIFO, device, socket or directory): libgtp reads " + what +
            "s from regular files only; copy it into one";
  } else if (st.st_size > kMaxJsonBytes) {
    error = "is " + std::to_string(st.st_size) + " bytes, over the " + mebibytes(kMaxJsonBytes) + " limit on " + what +
            "s: is it the right file?";
  } else {
    char buffer[1 << 16];
    for (;;) {  // the size may change while reading: the limit holds on what is read
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = std::string("read failed: ") + std::strerror(errno);
        break;
      }
      if (n == 0) break;
      text.append(buffer, static_cast<std::size_t>(n));
      if (static_cast<std::int64_t>(text.size()) > kMaxJsonBytes) {
        error = "grew past the " + mebibytes(kMaxJsonBytes) + " limit on " + what + "s while being read";
        break;
      }
    }
  }
  ::close(fd);
  if (!error.empty()) throw std::invalid_argument(what + " '" + path + "' " + error);
  return text;
}

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  if (static_cast<std::int64_t>(text.size()) > kMaxJsonBytes) {
    throw std::invalid_argument(source + ": " + std::to_string(text.size()) + " bytes, over the " +
                                mebibytes(kMaxJsonBytes) + " limit");
  }
  check_depth_and_bytes(text, source);
  std::vector<Frame> frames;
  using Event = nlohmann::json::parse_event_t;
  const auto track = [&](int, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start: {
        Frame frame;
        frame.object = event == Event::object_start;
        if (!frames.empty()) {
          Frame& parent = frames.back();
          frame.token = parent.object ? parent.key : std::to_string(parent.next_index++);
        }
        frames.push_back(std::move(frame));
        break;
      }
      case Event::object_end:
      case Event::array_end: frames.pop_back(); break;
      case Event::key: {
        Frame& top = frames.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second) {
          throw std::invalid_argument(source + ": " + pointer(frames, true) +
                                      ": duplicate key (JSON readers disagree on which one wins): keep one");
        }
        break;
      }
      case Event::value:
        if (!frames.empty() && !frames.back().object) ++frames.back().next_index;
        break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, track);
  } catch (const nlohmann::json::out_of_range& error) {  // a number past double's range
    throw std::invalid_argument(source + ": " + pointer(frames, true) + ": " + error.what() +
                                ": write a number within +-1.8e308");
  } catch (const nlohmann::json::parse_error& error) {
    throw std::invalid_argument(source + " is not valid JSON: " + error.what());
  }
}

}  // namespace gtp::topology::internal
