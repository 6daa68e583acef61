/* l2gen's bound call: one launch through a generated library's entry (entry ABI 2,
 * templates/common.cuh.j2) whose arguments other than the three operand addresses were
 * set once, in an l2gen_bound record that the caller owns.
 *
 * A Python caller pays for every argument it passes through ctypes (a conversion and a
 * check each); the entry takes 17. A shape's M, N, K, leading dimensions and knobs do not
 * change between its calls, nor, on one stream, do its workspace and the stream itself:
 * l2gen_bound_call takes the record and A, B, C, and makes the entry's call in C.
 * It is built with the host compiler, on its own, so that it serves libraries already
 * built (and l2gen/dispatch.py falls back to the entry's own call where it cannot be). */
#include <stddef.h>

typedef int (*l2gen_entry)(const void* A, const void* B, void* C, int M, int N, int K,
                           int lda, int ldb, int ldc, int raster, int swizzle_log2,
                           int splits, int decomposition, int grid, void* workspace,
                           size_t workspace_bytes, void* stream);

/* Mirrored by l2gen.bound.Bound (ctypes): keep the two in step. */
typedef struct {
  l2gen_entry entry; /* E or E_pdl */
  int args[11];      /* M N K lda ldb ldc raster swizzle_log2 splits decomposition grid */
  void* workspace;
  size_t workspace_bytes;
  void* stream;      /* cudaStream_t */
} l2gen_bound;

int l2gen_bound_call(const l2gen_bound* b, const void* A, const void* B, void* C) {
  const int* x = b->args;
  return b->entry(A, B, C, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10],
                  b->workspace, b->workspace_bytes, b->stream);
}

/* sizeof(l2gen_bound), which the loader compares with its mirror's before any call. */
size_t l2gen_bound_size(void) { return sizeof(l2gen_bound); }
