// A naive, correct fp16 GEMM behind the l2gen C ABI (templates/common.cuh.j2), for the
// planted-fault libraries of tests/gpu/test_faults.py. One thread per output element,
// fp32 accumulation; C = A @ B with A M x K, B K x N ("kn"), C M x N, all row-major.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#define L2GEN_OK 0
#define L2GEN_ERR_PROBLEM 1
#define L2GEN_ERR_LAUNCH 3

// Reads K elements but accumulates only the first k_used of them.
__global__ void naive_gemm(const __half* A, const __half* B, __half* C, int M, int N, int K,
                           int lda, int ldb, int ldc, int k_used) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.f;
  for (int k = 0; k < k_used; ++k)
    acc += __half2float(A[(size_t)row * lda + k]) * __half2float(B[(size_t)k * ldb + col]);
  C[(size_t)row * ldc + col] = __float2half(acc);
}

static inline int naive_launch(const void* A, const void* B, void* C, int M, int N, int K,
                               int lda, int ldb, int ldc, int k_used, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0 || K % 8 != 0 || lda < K || ldb < N || ldc < N)
    return L2GEN_ERR_PROBLEM;
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  naive_gemm<<<grid, block, 0, stream>>>(static_cast<const __half*>(A),
                                         static_cast<const __half*>(B),
                                         static_cast<__half*>(C), M, N, K, lda, ldb, ldc, k_used);
  return cudaGetLastError() == cudaSuccess ? L2GEN_OK : L2GEN_ERR_LAUNCH;
}

// E_workspace, E_program and E_abi (version 2: with the knob grid) for an entry named ENTRY.
#define L2GEN_FAULT_EXPORTS(ENTRY, TEXT)                                                     \
  extern "C" size_t ENTRY##_workspace(int, int, int, int, int, int, int, int) { return 0; } \
  extern "C" const char* ENTRY##_program() { return TEXT; }                                 \
  extern "C" int ENTRY##_abi() { return 2; }

#define L2GEN_FAULT_ARGS                                                                     \
  const void *A, const void *B, void *C, int M, int N, int K, int lda, int ldb, int ldc,    \
      int raster, int swizzle, int splits, int decomposition, int grid, void *workspace,    \
      size_t workspace_bytes, cudaStream_t stream
