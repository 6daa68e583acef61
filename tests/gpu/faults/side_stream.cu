// Fault (b): correct results, but computed on a stream of its own and not on the stream it
// was given, which stays empty; it returns at once. Events on the given stream see nothing;
// the event-vs-wall check must flag it (verification, which synchronizes the device, passes).
#include "naive_gemm.cuh"

L2GEN_FAULT_EXPORTS(l2gen_fault_side_stream, "kernel side_stream {}\n")

extern "C" int l2gen_fault_side_stream(L2GEN_FAULT_ARGS) {
  static cudaStream_t side = nullptr;
  if (!side && cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess)
    return L2GEN_ERR_LAUNCH;
  return naive_launch(A, B, C, M, N, K, lda, ldb, ldc, K, side);
}
