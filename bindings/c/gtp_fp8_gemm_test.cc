// The FP8 GEMM layout feeds cuBLASLt's FP8 GEMMs as Hopper takes them: both operands K-major (the
// "TN" form cuBLASLt requires for FP8), the chunk decode scale as the weight operand's scale. The
// forward Y = X W^T reads `data` [N, K]; the input gradient dX = dY W reads `data_t` [K, N], the
// exact transpose, where the row-major `data` would need the "NN" form FP8 does not have. Both
// products are compared with a float64 product of the decoded weight (the downloaded `data` times
// the decode scale) and exactly representable E4M3 activations, so a section that cuBLASLt reads
// differently from how gtp_materialized_t describes it fails. A 1-rank GTP_BACKEND_CUDA context;
// skips without a GPU, printing why.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "gtp/gtp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bindings/c/internal/test_ranks.h"
#include "comm/thread_bootstrap.h"
#include "kernels/codecs.h"
#include "kernels/cuda_kernels.h"

namespace {

// N = out_features (weight rows), K = in_features, M = tokens: multiples of 16 as cuBLASLt's FP8
// kernels require; N != K so a transposed read cannot pass by accident.
constexpr int64_t kN = 256, kK = 512, kM = 64;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call
#define ASSERT_CUBLAS(call) ASSERT_EQ((call), CUBLAS_STATUS_SUCCESS) << #call

// Random E4M3 codes, never NaN (0x7f / 0xff), and their values.
std::vector<uint8_t> random_e4m3(size_t n, std::mt19937& rng) {
  std::vector<uint8_t> codes(n);
  for (uint8_t& c : codes) {
    do c = static_cast<uint8_t>(rng()); while ((c & 0x7f) == 0x7f);
  }
  return codes;
}

// cuBLASLt's FP8 "TN" GEMM: D [rows_d x cols_d, column-major, FP32] = (a_scale A)^T (b_scale B), A stored
// K x rows_d (ld lda) and B stored K x cols_d (ld ldb), both column-major, i.e. K-major.
void fp8_tn_gemm(cublasLtHandle_t lt, const void* a, int64_t lda, const void* b, int64_t ldb, int64_t k,
                 int64_t rows_d, int64_t cols_d, const float* a_scale, const float* b_scale, float* d,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  cublasLtMatmulDesc_t op = nullptr;
  ASSERT_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  ASSERT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  ASSERT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  ASSERT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale));
  ASSERT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale));
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  ASSERT_CUBLAS(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_8F_E4M3, k, rows_d, lda));
  ASSERT_CUBLAS(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_8F_E4M3, k, cols_d, ldb));
  ASSERT_CUBLAS(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_32F, rows_d, cols_d, rows_d));
  cublasLtMatmulPreference_t preference = nullptr;
  ASSERT_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  ASSERT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  ASSERT_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, a_layout, b_layout, d_layout, d_layout, preference, 1,
                                               &heuristic, &found));
  ASSERT_GT(found, 0) << "cuBLASLt offers no FP8 TN algorithm for " << rows_d << " x " << cols_d << " x " << k;
  const float alpha = 1.0f, beta = 0.0f;
  ASSERT_CUBLAS(cublasLtMatmul(lt, op, &alpha, a, a_layout, b, b_layout, &beta, d, d_layout, d, d_layout,
                               &heuristic.algo, workspace, workspace_bytes, stream));
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(a_layout);
  cublasLtMatrixLayoutDestroy(b_layout);
  cublasLtMatrixLayoutDestroy(d_layout);
  cublasLtMatmulDescDestroy(op);
}

// got [rows x cols, column-major] against want(r, c) and its magnitude bound sum |terms|: FP8 tensor
// cores accumulate with fewer bits than FP32 between promotions, so the bound is relative to the
// terms, 2^-10 of them, far below what a misread layout produces (an unrelated sum).
template <typename Want>
void expect_close(const std::vector<float>& got, int64_t rows, int64_t cols, Want want, const char* what) {
  int64_t bad = 0;
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      double magnitude = 0;
      const double expected = want(r, c, &magnitude);
      const double error = std::fabs(got[c * rows + r] - expected);
      if (!(error <= 0x1p-10 * magnitude + 1e-30) && bad++ < 5) {
        ADD_FAILURE() << what << " (" << r << ", " << c << "): got " << got[c * rows + r] << ", want " << expected
                      << " (sum of |terms| " << magnitude << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << rows * cols << " entries off";
}

TEST(CAbiFp8Gemm, GemmLayoutFeedsCublasLtForwardAndInputGradient) {
  std::string why;
  if (!gtp::kernels::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  ASSERT_CUDA(cudaSetDevice(0));
  int device = 0, major = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) GTEST_SKIP() << "this test runs cuBLASLt's Hopper FP8 GEMMs (sm_90+); the device is sm_" << major << "x";

  // The weight: BF16 values over a wide range, so the FP8 decode scale is not 1.
  std::mt19937 rng(20261203);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<uint16_t> weight(kN * kK);
  for (uint16_t& w : weight) w = gtp::kernels::codec::float_to_bf16(normal(rng));
  void* shard = nullptr;
  ASSERT_CUDA(cudaMalloc(&shard, weight.size() * sizeof(uint16_t)));
  ASSERT_CUDA(cudaMemcpy(shard, weight.data(), weight.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));

  auto group = gtp::comm::ThreadBootstrap::create_group(1, gtp::cabi_test::kTimeout);
  const gtp_bootstrap_callbacks_t callbacks = gtp::cabi_test::callbacks_for(*group[0]);
  gtp_context_config_t config = GTP_CONTEXT_CONFIG_INITIALIZER;
  config.callbacks = &callbacks;
  config.backend = GTP_BACKEND_CUDA;
  gtp_context_t* ctx = nullptr;
  ASSERT_EQ(gtp_context_create(&config, &ctx), GTP_SUCCESS) << gtp_last_error(nullptr);
  gtp_weight_desc_t desc = GTP_WEIGHT_DESC_INITIALIZER;
  desc.name = "fc";
  desc.shard = shard;
  desc.rows = kN;
  desc.cols = kK;
  desc.wire = GTP_WIRE_FP8;
  gtp_weight_t w{};
  ASSERT_EQ(gtp_weight_register(ctx, &desc, &w), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(gtp_weights_shard_updated(ctx, &w, 1, nullptr), GTP_SUCCESS) << gtp_last_error(ctx);

  cudaStream_t stream = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gtp_materialized_t view = GTP_MATERIALIZED_INITIALIZER;
  size_t count = 0;
  ASSERT_EQ(gtp_materialize_views(ctx, &w, 1, GTP_PHASE_FORWARD, 0, GTP_LAYOUT_GEMM, &view, 1, &count, stream),
            GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_EQ(view.layout, GTP_LAYOUT_GEMM);
  ASSERT_EQ(view.gemm_rows, kN);
  ASSERT_EQ(view.data.dtype, GTP_ELEM_E4M3);
  ASSERT_EQ(view.data_t.dtype, GTP_ELEM_E4M3);
  ASSERT_EQ(view.data_t.rows, kK);
  ASSERT_EQ(view.data_t.cols, kN);
  ASSERT_EQ(view.decode_scales.rows, 1);  // G = 1: one chunk, one decode scale

  // Activations X [M, K] and output gradient dY [M, N]: E4M3 codes with scale 1.
  const std::vector<uint8_t> x = random_e4m3(kM * kK, rng), dy = random_e4m3(kM * kN, rng);
  void *d_x = nullptr, *d_dy = nullptr, *workspace = nullptr;
  float *d_one = nullptr, *d_y = nullptr, *d_dx = nullptr;
  const size_t workspace_bytes = size_t{32} << 20;
  ASSERT_CUDA(cudaMalloc(&d_x, x.size()));
  ASSERT_CUDA(cudaMalloc(&d_dy, dy.size()));
  ASSERT_CUDA(cudaMalloc(&workspace, workspace_bytes));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_one), sizeof(float)));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_y), kM * kN * sizeof(float)));
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_dx), kM * kK * sizeof(float)));
  const float one = 1.0f;
  ASSERT_CUDA(cudaMemcpy(d_one, &one, sizeof one, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(d_x, x.data(), x.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(d_dy, dy.data(), dy.size(), cudaMemcpyHostToDevice));

  cublasLtHandle_t lt = nullptr;
  ASSERT_CUBLAS(cublasLtCreate(&lt));
  const auto* decode_scale = static_cast<const float*>(view.decode_scales.ptr);
  // Y^T [N x M] = data (stored K x N, ld K)^T . X^T (stored K x M, ld K).
  fp8_tn_gemm(lt, view.data.ptr, kK, d_x, kK, kK, kN, kM, decode_scale, d_one, d_y, workspace, workspace_bytes,
              stream);
  if (HasFatalFailure()) return;
  // dX^T [K x M] = data_t (stored N x K, ld N)^T . dY^T (stored N x M, ld N).
  fp8_tn_gemm(lt, view.data_t.ptr, kN, d_dy, kN, kN, kK, kM, decode_scale, d_one, d_dx, workspace, workspace_bytes,
              stream);
  if (HasFatalFailure()) return;

  std::vector<uint8_t> codes(kN * kK);
  float scale = 0;
  std::vector<float> y(kM * kN), dx(kM * kK);
  ASSERT_CUDA(cudaMemcpyAsync(codes.data(), view.data.ptr, codes.size(), cudaMemcpyDeviceToHost, stream));
  ASSERT_CUDA(cudaMemcpyAsync(&scale, decode_scale, sizeof scale, cudaMemcpyDeviceToHost, stream));
  ASSERT_CUDA(cudaMemcpyAsync(y.data(), d_y, y.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  ASSERT_CUDA(cudaMemcpyAsync(dx.data(), d_dx, dx.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  ASSERT_EQ(gtp_release_layout(ctx, &w, 1, GTP_LAYOUT_GEMM, stream), GTP_SUCCESS) << gtp_last_error(ctx);
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_NE(scale, 1.0f) << "the decode scale is 1: the test would not see it dropped";

  using gtp::kernels::codec::e4m3_to_float;
  auto weight_at = [&](int64_t n, int64_t k) { return double(e4m3_to_float(codes[n * kK + k])) * scale; };
  // Y [M, N] row-major is Y^T [N x M] column-major.
  expect_close(y, kN, kM, [&](int64_t n, int64_t m, double* magnitude) {
    double sum = 0;
    for (int64_t k = 0; k < kK; ++k) {
      const double term = double(e4m3_to_float(x[m * kK + k])) * weight_at(n, k);
      sum += term;
      *magnitude += std::fabs(term);
    }
    return sum;
  }, "forward Y = X W^T from data");
  // dX [M, K] row-major is dX^T [K x M] column-major.
  expect_close(dx, kK, kM, [&](int64_t k, int64_t m, double* magnitude) {
    double sum = 0;
    for (int64_t n = 0; n < kN; ++n) {
      const double term = double(e4m3_to_float(dy[m * kN + n])) * weight_at(n, k);
      sum += term;
      *magnitude += std::fabs(term);
    }
    return sum;
  }, "input gradient dX = dY W from data_t");

  cublasLtDestroy(lt);
  for (void* p : {d_x, d_dy, workspace, static_cast<void*>(d_one), static_cast<void*>(d_y), static_cast<void*>(d_dx),
                  shard}) {
    cudaFree(p);
  }
  cudaStreamDestroy(stream);
  EXPECT_EQ(gtp_weight_unregister(ctx, w), GTP_SUCCESS) << gtp_last_error(ctx);
  EXPECT_EQ(gtp_context_destroy(ctx), GTP_SUCCESS);
}

}  // namespace
