// Fault (a): skips the last 8 elements of K. Verification must call it wrong.
#include "naive_gemm.cuh"

L2GEN_FAULT_EXPORTS(l2gen_fault_skip_k, "kernel skip_k {}\n")

extern "C" int l2gen_fault_skip_k(L2GEN_FAULT_ARGS) {
  return naive_launch(A, B, C, M, N, K, lda, ldb, ldc, K - 8, stream);
}
