// Internal to the C ABI: gtp_context_create's check that every rank created its context with the
// settings that must agree (docs/reliability.md, "Ranks that disagree").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "kernels/wire_format.h"
#include "remat/runtime.h"
#include "topology/profile.h"

namespace gtp::cabi {

// One setting every rank must give the same value. `labels[value]`, where present, is how a value is
// shown in the message (a wire format's name).
struct AgreedSetting {
  std::string name;  // as the profile or config spells it: "groups.gtp_remat.prefetch_depth"
  std::int64_t value = 0;
  std::vector<std::string> labels;
};

// Collective over the bootstrap's ranks: one allgather of every rank's values (fixed size, so ranks of
// another libgtp version still line up). Throws remat::DivergenceError, the same text on every rank,
// naming each setting that differs and every rank's value of it.
void agree_on_settings(comm::Bootstrap& bootstrap, const std::vector<AgreedSetting>& settings);

// What a context's ranks must agree on: the backend, the grid's sizes, and per group the settings
// that decide which collectives run when (depth, batch, budget, keep_gathered, fill_graphs,
// grads_into_main_grad, the group's wire, NCCL settings), as resolved from config and profile.
// Local settings (timeouts, traces, stream priorities) may differ.
std::vector<AgreedSetting> context_settings(int backend, bool accumulate_microbatches, const topology::Profile& profile,
                                            const remat::RuntimeConfig& runtime, const kernels::WireSpec* group_wire);

}  // namespace gtp::cabi
