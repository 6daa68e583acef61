// Fault (c): writes through a bad pointer: cudaErrorIllegalAddress, a sticky error that
// ruins the CUDA context. The worker must report run_error and be replaced.
#include "naive_gemm.cuh"

L2GEN_FAULT_EXPORTS(l2gen_fault_illegal_address, "kernel illegal_address {}\n")

__global__ void write_through_bad_pointer(__half* p) { p[threadIdx.x] = __float2half(1.f); }

extern "C" int l2gen_fault_illegal_address(L2GEN_FAULT_ARGS) {
  write_through_bad_pointer<<<1, 32, 0, stream>>>(reinterpret_cast<__half*>(0x10));
  return cudaGetLastError() == cudaSuccess ? L2GEN_OK : L2GEN_ERR_LAUNCH;
}
