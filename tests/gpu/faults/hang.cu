// Fault (d): never finishes (spins on a flag nothing sets). The worker must be killed at
// the task's timeout and the result be "timeout".
#include "naive_gemm.cuh"

L2GEN_FAULT_EXPORTS(l2gen_fault_hang, "kernel hang {}\n")

__device__ volatile int l2gen_fault_never_set = 0;

__global__ void spin_forever() {
  while (l2gen_fault_never_set == 0) {
  }
}

extern "C" int l2gen_fault_hang(L2GEN_FAULT_ARGS) {
  spin_forever<<<1, 1, 0, stream>>>();
  return cudaGetLastError() == cudaSuccess ? L2GEN_OK : L2GEN_ERR_LAUNCH;
}
