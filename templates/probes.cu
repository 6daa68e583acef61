// l2gen probes: what the timing protocols need on the device, behind a small C ABI
// (built and loaded by l2gen/probes.py).
//
//   * a read pass: 16-byte loads over a buffer, grid-stride. Over a buffer of several
//     times the L2 it is the clean flush (the L2 ends up holding clean lines of that
//     buffer; whatever was dirty is written back during the pass); timed over a large
//     buffer it is the stream rate.
//   * an empty kernel: the launch floor.
//   * a flush context: one call that flushes by protocol (warm: nothing; dirty: a memset of
//     the buffer with a new byte each time; clean: the read pass), usable from C (the cuBLAS
//     shim's auto-tuner calls it through a function pointer) and from Python alike.
//
// Return codes: 0 success; < 0 the negated cudaError_t, or one of the L2GEN_PROBE_* codes.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <new>

#define L2GEN_PROBE_BAD_ARGUMENT (-2000001)

#define L2GEN_PROBE_WARM 0
#define L2GEN_PROBE_DIRTY 1
#define L2GEN_PROBE_CLEAN 2

namespace {

constexpr int kThreads = 256;
// Written to `sink` only if the loads fold to it. The read buffers are filled with one
// byte value, so every 16-byte vector folds to 0 and the store never happens; the compiler
// cannot know that, so it must keep every load.
constexpr unsigned kNeverFolded = 0x9E3779B9u;

__device__ __forceinline__ unsigned fold(int4 v) {
  return static_cast<unsigned>(v.x ^ v.y ^ v.z ^ v.w);
}

// Four independent loads per iteration keep enough bytes in flight to stream at full rate.
__global__ void __launch_bounds__(kThreads) read_kernel(const int4* __restrict__ p, size_t n,
                                                        unsigned* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const int4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= fold(a) ^ fold(b) ^ fold(c) ^ fold(d);
  }
  for (; i < n; i += stride) acc ^= fold(p[i]);
  if (acc == kNeverFolded) *sink = acc;
}

__global__ void empty_kernel() {}

// An empty kernel of any block size and dynamic shared memory: what the cluster residency
// query below asks the occupancy calculator about, and what the empty grid launches.
__global__ void residency_kernel() {}

int read_blocks(int* blocks) {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_kernel, kThreads, 0);
  if (e != cudaSuccess) return -static_cast<int>(e);
  *blocks = sms * (per_sm > 0 ? per_sm : 1);
  return 0;
}

// The launch configuration of residency_kernel as a clustered GEMM would launch: `blocks`
// CTAs in clusters of `cluster` along x, `threads` threads, `smem_bytes` of dynamic shared
// memory (the kernel's attributes set to allow it).
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr = {};

  cudaError_t set(int blocks, int cluster, int threads, int smem_bytes) {
    cudaError_t e = cudaFuncSetAttribute(residency_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         smem_bytes);
    if (e == cudaSuccess && cluster > 8)
      e = cudaFuncSetAttribute(residency_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(cluster);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.attrs = &attr;
    config.numAttrs = 1;
    return e;
  }
};

struct Flush {
  int protocol;
  void* buffer;
  size_t bytes;
  unsigned* sink;
  unsigned value;  // the dirty flush's last byte value
};

}  // namespace

extern "C" {

typedef int (*l2gen_flush_fn)(void* context, cudaStream_t stream);

// Read `bytes` (a multiple of 16) at `buffer` (16-byte aligned) on `stream`; `sink` is 4
// writable bytes of device memory that the kernel leaves alone unless the data folds to
// kNeverFolded (it cannot for a buffer filled with one byte value).
int l2gen_probe_read(const void* buffer, size_t bytes, void* sink, cudaStream_t stream) {
  if (!buffer || !sink || bytes % 16 || reinterpret_cast<uintptr_t>(buffer) % 16)
    return L2GEN_PROBE_BAD_ARGUMENT;
  static int blocks = 0;  // one device per process (the worker's)
  if (!blocks) {
    int rc = read_blocks(&blocks);
    if (rc) return rc;
  }
  read_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const int4*>(buffer), bytes / 16,
                                              static_cast<unsigned*>(sink));
  return -static_cast<int>(cudaGetLastError());
}

// One empty kernel (one thread) on `stream`.
int l2gen_probe_empty(cudaStream_t stream) {
  empty_kernel<<<1, 1, 0, stream>>>();
  return -static_cast<int>(cudaGetLastError());
}

// A flush context over `buffer` (`bytes`, device memory filled with one byte value) for a
// protocol (L2GEN_PROBE_WARM, _DIRTY, _CLEAN); null on a bad argument. Free it with
// l2gen_probe_flush_destroy.
void* l2gen_probe_flush_create(int protocol, void* buffer, size_t bytes, void* sink) {
  if (protocol < L2GEN_PROBE_WARM || protocol > L2GEN_PROBE_CLEAN) return nullptr;
  if (protocol != L2GEN_PROBE_WARM && (!buffer || !sink || bytes % 16)) return nullptr;
  return new (std::nothrow) Flush{protocol, buffer, bytes, static_cast<unsigned*>(sink), 0u};
}

void l2gen_probe_flush_destroy(void* context) { delete static_cast<Flush*>(context); }

// Flush the L2 by the context's protocol, on `stream` (an l2gen_flush_fn).
int l2gen_probe_flush(void* context, cudaStream_t stream) {
  Flush* f = static_cast<Flush*>(context);
  if (!f) return L2GEN_PROBE_BAD_ARGUMENT;
  switch (f->protocol) {
    case L2GEN_PROBE_WARM:
      return 0;
    case L2GEN_PROBE_DIRTY:
      f->value = (f->value + 1) & 0xFF;  // a new value each time: no write is elided
      return -static_cast<int>(cudaMemsetAsync(f->buffer, static_cast<int>(f->value), f->bytes, stream));
    case L2GEN_PROBE_CLEAN:
      return l2gen_probe_read(f->buffer, f->bytes, f->sink, stream);
    default:
      return L2GEN_PROBE_BAD_ARGUMENT;
  }
}

// An empty grid shaped like a GEMM launch: `blocks` CTAs (a multiple of `cluster`) of
// `threads` threads and `smem_bytes` of dynamic shared memory, in clusters of `cluster`. Its
// time beside l2gen_probe_empty's is what the launch's shape costs before any work.
int l2gen_probe_empty_grid(int blocks, int cluster, int threads, int smem_bytes, cudaStream_t stream) {
  if (blocks < 1 || cluster < 1 || blocks % cluster || threads < 1 || smem_bytes < 0)
    return L2GEN_PROBE_BAD_ARGUMENT;
  ClusterLaunch launch;
  cudaError_t e = launch.set(blocks, cluster, threads, smem_bytes);
  if (e != cudaSuccess) return -static_cast<int>(e);
  launch.config.stream = stream;
  return -static_cast<int>(cudaLaunchKernelEx(&launch.config, residency_kernel));
}

// How many clusters of `cluster` CTAs, each of `threads` threads and `smem_bytes` of dynamic
// shared memory, the current device holds at once (cudaOccupancyMaxActiveClusters): a
// cluster's CTAs share a GPC, so on a chip whose GPCs hold different numbers of SMs this
// can be fewer than (SMs / CTAs per cluster) even where every SM holds a CTA.
int l2gen_probe_max_active_clusters(int cluster, int threads, int smem_bytes, int* clusters) {
  if (cluster < 1 || threads < 1 || smem_bytes < 0 || !clusters) return L2GEN_PROBE_BAD_ARGUMENT;
  ClusterLaunch launch;
  cudaError_t e = launch.set(cluster, cluster, threads, smem_bytes);
  if (e != cudaSuccess) return -static_cast<int>(e);
  *clusters = 0;
  return -static_cast<int>(cudaOccupancyMaxActiveClusters(clusters, residency_kernel, &launch.config));
}

const char* l2gen_probe_error_string(int code) {
  if (code == 0) return "success";
  if (code == L2GEN_PROBE_BAD_ARGUMENT) return "bad argument";
  return cudaGetErrorString(static_cast<cudaError_t>(-code));
}

}  // extern "C"
