// Ranks that disagree: what one rank tells its group about a gather so that every rank can check that
// all of them gather the same weights, and the error they all raise when they do not.
// docs/reliability.md, "Ranks that disagree".
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gtp::remat {

// The ranks of a group broke the collective contract (different weights, registration order,
// shard versions or configuration at the same collective). Raised on every rank of the group, with
// the same message; the runtime's state is then undefined: destroy it.
class DivergenceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// FNV-1a over bytes, 64 bits: identities to compare across ranks, not a defence against tampering.
class Fingerprint {
 public:
  Fingerprint& add(const void* bytes, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(bytes);
    for (std::size_t i = 0; i < n; ++i) hash_ = (hash_ ^ p[i]) * 0x100000001b3ull;
    return *this;
  }
  Fingerprint& add(std::int64_t value) { return add(&value, sizeof value); }
  Fingerprint& add(std::uint64_t value) { return add(&value, sizeof value); }
  // The length first, so "ab" + "c" and "a" + "bc" differ.
  Fingerprint& add(std::string_view text) {
    add(static_cast<std::int64_t>(text.size()));
    return add(text.data(), text.size());
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
};

// What one rank gathers in one fill (all the keys of one collective batch), exchanged over the
// fill's group inside that batch, before the weights' own gathers. 64 bytes (16-byte aligned in a
// gather of G of them); the first weight's name and ordinal travel along so that every rank can say
// what the others gather.
struct FillTag {
  std::uint64_t weights = 0;   // Fingerprint of the Weight::tag of every weight gathered, in order
  std::uint64_t versions = 0;  // Fingerprint of their Weight::version (shard updates so far)
  // The first weight as the sending rank registered it, so every rank's message can describe every
  // rank's weight (its shape and wire too, which the identity in `weights` covers but cannot show).
  std::uint32_t first_rows = 0;  // saturated at 2^32 - 1
  std::uint32_t first_cols = 0;
  std::uint32_t count = 0;     // weights gathered
  std::uint32_t magic = kMagic;
  std::int32_t first_ordinal = 0;   // the first weight's Weight::ordinal
  std::uint32_t first_version = 0;  // its Weight::version, modulo 2^32
  std::uint8_t first_wire = 0;      // its WireSpec: format | mx_rounding << 2 | nvfp4_blocks << 3
  char first_name[23] = {};         // its name, cut to 22 bytes, NUL-padded
  static constexpr std::uint32_t kMagic = 0x47545032;  // "GTP2": the tag's layout version
  // The description fields are not compared: `weights` fingerprints every weight's identity.
  bool operator==(const FillTag& o) const {
    return weights == o.weights && versions == o.versions && count == o.count && magic == o.magic;
  }
  bool operator!=(const FillTag& o) const { return !(*this == o); }
};
static_assert(sizeof(FillTag) == 64, "FillTag is gathered as 64 bytes per rank");

}  // namespace gtp::remat
