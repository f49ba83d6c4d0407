// The CUDA backend when a rank fails (docs/reliability.md): a collective batch left open by an
// exception is closed (its NCCL group is poisoned, then ended) and the backend keeps working;
// every call runs on the backend's device and gives the caller's device back; abort_communicators
// makes later collectives fail instead of hanging. Skips without a GPU (device scope: without two).
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "remat/cuda_backend.h"
#include "remat/internal/cuda_test_group.h"

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

// A batch left open by an exception is closed (cancel_collectives), and the backend's next batch runs.
// What the cancel does not do: on the H200 (NCCL 2.28, size-1 communicator) the collective enqueued
// before the exception still ran, although a refused call inside the group made ncclGroupEnd fail.
// Peers of a failing rank are released by the abort of its communicators (AbortedCommunicators...),
// not by the cancel (docs/reliability.md, Failing ranks).
TEST(CudaBackendFailure, ABatchLeftOpenByAnExceptionIsClosedAndTheNextBatchRuns) {
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
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(side)), cudaSuccess);
  ASSERT_EQ(cudaMemset(recv.ptr, 0, 4 * sizeof(float)), cudaSuccess);
  {  // NCCL's group state was reset: the next batch runs
    Backend::CollectiveBatch batch(backend);
    backend.all_gather(side, 0, send.ptr, recv.ptr, 4 * sizeof(float));
    batch.launch();
  }
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(side)), cudaSuccess);
  EXPECT_EQ(recv.host(), (std::vector<float>{1, 2, 3, 4}));
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
