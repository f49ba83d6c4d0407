// Backend::CollectiveBatch: launched, it ends the backend's batch; left open by an exception, it
// cancels it instead of ending it (on NCCL the group is poisoned so ncclGroupEnd fails; NCCL 2.28 was
// seen to run the collectives enqueued before anyway, so peers are released by the abort of the
// communicators: docs/reliability.md).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "remat/internal/logging_backend.h"

namespace gtp::remat {
namespace {

class BatchLoggingBackend : public testing::LoggingBackend {
 protected:
  void begin_collectives() override { log.push_back("begin"); }
  void end_collectives() override { log.push_back("end"); }
  void cancel_collectives() noexcept override { log.push_back("cancel"); }
};

TEST(CollectiveBatch, LaunchEndsTheBatch) {
  BatchLoggingBackend backend;
  {
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(backend.side_stream(0, Role::kGather), 0, nullptr, nullptr, 0);
    batch.launch();
  }
  EXPECT_EQ(backend.log, (std::vector<std::string>{"begin", "all_gather on ag0", "end"}));
}

TEST(CollectiveBatch, AnExceptionCancelsTheBatchInsteadOfLaunchingIt) {
  BatchLoggingBackend backend;
  try {
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(backend.side_stream(0, Role::kGather), 0, nullptr, nullptr, 0);
    throw std::runtime_error("the second weight's pack failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(backend.log, (std::vector<std::string>{"begin", "all_gather on ag0", "cancel"}));
}

}  // namespace
}  // namespace gtp::remat
