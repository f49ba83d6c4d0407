// The CUDA backend when a rank fails (docs/reliability.md): a collective batch left open by an
// exception enqueues nothing (the backend records a batch's collectives and issues them at its end),
// on NCCL and on a test transport, and the backend keeps working; every call runs on the backend's
// device and gives the caller's device back; abort_communicators makes later collectives fail instead
// of hanging. Skips without a GPU (device scope: without two).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/device_collectives.h"
#include "testing/remat/cuda_test_group.h"

namespace gtp::remat {
namespace {

using std::chrono::milliseconds;
using testing::SizeOneGroup;

struct DeviceFloats {
  explicit DeviceFloats(std::vector<float> values) : count(values.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, count * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, values.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(ptr); }
  std::vector<float> host() const {
    std::vector<float> values(count);
    EXPECT_EQ(cudaMemcpy(values.data(), ptr, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return values;
  }
  float* ptr = nullptr;
  std::size_t count;
};

// A batch left open by an exception is dropped: on a size-1 communicator a gather is a copy, so the
// cancelled batch's gather would show in `recv`. (Before batches were recorded, NCCL 2.28 on the H200
// ran it although the cancel made ncclGroupEnd fail.) The backend's next batch runs.
TEST(CudaBackendFailure, ABatchLeftOpenByAnExceptionEnqueuesNothingAndTheNextBatchRuns) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  const Stream side = backend.side_stream(0, Role::kGather);
  DeviceFloats send({1, 2, 3, 4}), recv({0, 0, 0, 0});
  try {
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(side, 0, send.ptr, recv.ptr, 4 * sizeof(float));  // a size-1 gather: a copy
    throw std::runtime_error("the next weight's pack failed");
  } catch (const std::runtime_error&) {
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(recv.host(), (std::vector<float>{0, 0, 0, 0})) << "the cancelled batch's gather ran";
  {
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(side, 0, send.ptr, recv.ptr, 4 * sizeof(float));
    batch.launch();
  }
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(side)), cudaSuccess);
  EXPECT_EQ(recv.host(), (std::vector<float>{1, 2, 3, 4}));
}

// A test transport of one rank that logs each collective as it receives it (a size-1 gather: a copy).
class LoggingTransport : public DeviceCollectives {
 public:
  explicit LoggingTransport(std::vector<std::string>* log) : log_(log) {}
  int group_count() const override { return 1; }
  int size(int) const override { return 1; }
  int rank(int) const override { return 0; }
  void all_gather(cudaStream_t stream, int, const void* send, void* recv, std::int64_t bytes) override {
    log_->push_back("all_gather " + std::to_string(bytes));
    if (recv == send) return;  // the warm-up gathers in place
    EXPECT_EQ(cudaMemcpyAsync(recv, send, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
  }
  void all_reduce_max(cudaStream_t, int, float*, std::int64_t count) override {
    log_->push_back("all_reduce_max " + std::to_string(count));
  }
  void reduce_scatter_mean(cudaStream_t stream, int, const float* send, float* recv, std::int64_t count) override {
    log_->push_back("reduce_scatter_mean " + std::to_string(count));
    if (recv != send) {
      EXPECT_EQ(cudaMemcpyAsync(recv, send, count * sizeof(float), cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    }
  }
  void* allocate(std::int64_t bytes) override {
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, static_cast<std::size_t>(bytes)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    return ptr;
  }
  void deallocate(void* ptr) override { cudaFree(ptr); }

 private:
  std::vector<std::string>* log_;
};

// The test transport follows the same rule: a batch's collectives reach it at launch, in call order;
// a cancelled batch's never do.
TEST(CudaBackendFailure, TheTestTransportGetsABatchAtItsEndAndNothingOfACancelledOne) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  std::vector<std::string> log;
  CudaBackend backend(0, std::make_unique<LoggingTransport>(&log));
  log.clear();  // the warm-up's collectives
  const Stream side = backend.side_stream(0, Role::kGather);
  DeviceFloats send({1, 2}), recv({0, 0});
  try {
    Backend::CollectiveBatch batch(backend);
    backend.all_reduce_max(side, 0, recv.ptr, 2);
    backend.all_gather(side, 0, send.ptr, recv.ptr, 2 * sizeof(float));
    throw std::runtime_error("the next weight's pack failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(log.empty()) << "the cancelled batch reached the transport: " << log.front();
  {
    Backend::CollectiveBatch batch(backend);
    backend.all_reduce_max(side, 0, recv.ptr, 2);
    backend.all_gather(side, 0, send.ptr, recv.ptr, 2 * sizeof(float));
    EXPECT_TRUE(log.empty()) << "a collective reached the transport before the batch ended";
    batch.launch();
  }
  EXPECT_EQ(log, (std::vector<std::string>{"all_reduce_max 2", "all_gather 8"}));
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(side)), cudaSuccess);
  EXPECT_EQ(recv.host(), (std::vector<float>{1, 2}));
}

TEST(CudaBackendFailure, AbortedCommunicatorsRefuseLaterCollectives) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  backend.abort_communicators("a test");
  EXPECT_FALSE(group.gather.valid());
  EXPECT_FALSE(group.reduce_scatter.valid());
  DeviceFloats data({1});
  EXPECT_THROW(backend.all_reduce_max(backend.side_stream(0, Role::kGather), 0, data.ptr, 1), CudaError);
}

TEST(CudaBackendFailure, EveryCallRunsOnTheBackendsDeviceAndRestoresTheCallers) {
  std::string why;
  if (!kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  SizeOneGroup group;
  CudaBackend backend(0, group.groups(), milliseconds(30000));
  DeviceFloats data({1, 2});
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);  // the caller works on another device
  {
    const Backend::CallScope call(backend);
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 0);
    backend.fill(backend.side_stream(0, Role::kGather), data.ptr, 0, 2 * sizeof(float));
  }
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(data.host(), (std::vector<float>{0, 0}));
}

}  // namespace
}  // namespace gtp::remat
