// Test helpers for the C ABI: thread ranks (ThreadBootstrap) behind the callbacks vtable, profiles
// for a single-host cluster, and an expectation on a status and its message.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/internal/test_util.h"
#include "comm/thread_bootstrap.h"
#include "gtp/gtp.h"

namespace gtp::cabi_test {

inline constexpr std::chrono::milliseconds kTimeout{60000};

inline gtp_bootstrap_result_t run(void* user, const std::function<void(comm::Bootstrap&)>& body) {
  try {
    body(*static_cast<comm::Bootstrap*>(user));
    return GTP_BOOTSTRAP_OK;
  } catch (...) {
    return GTP_BOOTSTRAP_ERROR;
  }
}

inline gtp_bootstrap_callbacks_t callbacks_for(comm::Bootstrap& bootstrap) {
  gtp_bootstrap_callbacks_t c{};
  c.struct_size = sizeof(c);
  c.version = GTP_BOOTSTRAP_CALLBACKS_VERSION;
  c.rank = bootstrap.rank();
  c.world_size = bootstrap.world_size();
  c.user_data = &bootstrap;
  c.allgather = [](void* u, const void* send, void* recv, size_t bytes, int64_t) {
    return run(u, [&](comm::Bootstrap& b) { b.allgather(send, recv, bytes); });
  };
  c.broadcast = [](void* u, void* buffer, size_t bytes, int32_t root, int64_t) {
    return run(u, [&](comm::Bootstrap& b) { b.broadcast(buffer, bytes, root); });
  };
  c.barrier = [](void* u, int64_t) { return run(u, [](comm::Bootstrap& b) { b.barrier(); }); };
  return c;
}

// Runs body(rank, callbacks) on `world` threads.
inline void on_ranks(int world, const std::function<void(int, const gtp_bootstrap_callbacks_t&)>& body) {
  auto group = comm::ThreadBootstrap::create_group(world, kTimeout);
  comm::internal::rethrow_first(comm::internal::run_ranks(world, [&](int rank) {
    const gtp_bootstrap_callbacks_t callbacks = callbacks_for(*group[rank]);
    body(rank, callbacks);
  }));
}

// A profile over one host of `world` GPUs with the given "parallel" section (world_size added) and
// "groups" section (omitted when null).
inline std::string profile_with(int world, nlohmann::json parallel, const nlohmann::json& groups = nullptr) {
  std::vector<nlohmann::json> gpus;
  for (int i = 0; i < world; ++i) gpus.push_back({{"index", i}, {"numa_node", 0}});
  parallel["world_size"] = world;
  nlohmann::json doc = {
      {"schema_version", 1},
      {"cluster", {{"template", {{"host_count", 1}, {"host", {{"numa_nodes", {{{"os_index", 0}, {"cpuset", "0xff"}}}},
                                                               {"gpus", gpus}}}}}}},
      {"parallel", parallel}};
  if (!groups.is_null()) doc["groups"] = groups;
  return doc.dump();
}

// The stats JSON of a context.
inline nlohmann::json stats_of(gtp_context_t* ctx) {
  size_t len = 0;
  EXPECT_EQ(gtp_stats_json(ctx, nullptr, 0, &len), GTP_ERROR_INVALID_ARGUMENT);
  std::vector<char> text(len + 1);
  EXPECT_EQ(gtp_stats_json(ctx, text.data(), text.size(), &len), GTP_SUCCESS) << gtp_last_error(ctx);
  return nlohmann::json::parse(text.data());
}

// A context on `callbacks` (host backend), EXPECTing success.
inline gtp_context_t* create(const gtp_bootstrap_callbacks_t& callbacks, const char* profile = nullptr, size_t trace = 0,
                      gtp_grad_ready_fn ready = nullptr, void* ready_user = nullptr) {
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.profile_json = profile;
  config.trace_spans = trace;
  config.grad_ready = ready;
  config.grad_ready_user_data = ready_user;
  gtp_context_t* ctx = nullptr;
  const gtp_status_t status = gtp_context_create(&config, &ctx);
  EXPECT_EQ(status, GTP_SUCCESS) << gtp_last_error(nullptr);
  return ctx;
}

}  // namespace gtp::cabi_test

// Expects `status` with a last error of `ctx` (nullptr: the thread's context-free error) containing `text`.
#define EXPECT_GTP_ERROR(call, expected, ctx, text)                                                     \
  do {                                                                                                  \
    const gtp_status_t status_ = (call);                                                                \
    EXPECT_EQ(status_, expected) << gtp_status_string(status_) << ": " << gtp_last_error(ctx);          \
    EXPECT_NE(std::string(gtp_last_error(ctx)).find(text), std::string::npos) << gtp_last_error(ctx);   \
  } while (0)
