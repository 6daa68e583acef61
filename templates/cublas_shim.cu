// l2gen baselines: cuBLAS and cuBLASLt behind a small C ABI (built by l2gen/baselines.py).
//
// Every GEMM here is C = A @ B with fp16 A, B, C and fp32 compute (CUBLAS_COMPUTE_32F).
// A is M x K row-major; B is K x N row-major (nk = 0) or N x K row-major (nk = 1).
// cuBLAS is column-major, so a row-major C (M x N) is computed as the column-major
// C^T = B^T A^T ("swap"); the "tt" variant instead computes the column-major C = A B with
// both operands transposed, i.e. it writes C column-major (an N x M row-major buffer).
//
// Return codes: 0 success; > 0 a cublasStatus_t; < 0 the negated cudaError_t, or one of
// the L2GEN_SHIM_* codes below. l2gen_shim_error_string() names any of them.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#define L2GEN_SHIM_NOT_INITIALIZED (-1000001)
#define L2GEN_SHIM_NO_ALGORITHM (-1000002)
#define L2GEN_SHIM_NOT_TUNED (-1000003)
#define L2GEN_SHIM_BAD_ARGUMENT (-1000004)

#define CUDA_TRY(expr)                                         \
  do {                                                         \
    cudaError_t e_ = (expr);                                   \
    if (e_ != cudaSuccess) return -static_cast<int>(e_);       \
  } while (0)
#define BLAS_TRY(expr)                                         \
  do {                                                         \
    cublasStatus_t s_ = (expr);                                \
    if (s_ != CUBLAS_STATUS_SUCCESS) return static_cast<int>(s_); \
  } while (0)

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // per handle
constexpr int kMaxAlgos = 16;

struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // the call's A, B, C
  std::vector<cublasLtMatmulHeuristicResult_t> algos;            // heuristic order
  int tuned = -1;  // index into algos after l2gen_cublaslt_autotune, else -1
  float tuned_us = 0.f;
  std::vector<int> ranked;  // after the auto-tune: indices into algos, fastest first
};

struct State {
  std::mutex mu;
  bool ready = false;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* blas_ws = nullptr;
  void* lt_ws = nullptr;
  cudaStream_t blas_stream = nullptr;
  bool blas_stream_set = false;
  std::map<std::tuple<int, int, int, int>, LtPlan> plans;
};

State& state() {
  static State s;
  return s;
}

int set_blas_stream(State& s, cudaStream_t stream) {
  // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
  if (s.blas_stream_set && s.blas_stream == stream) return 0;
  BLAS_TRY(cublasSetStream(s.blas, stream));
  BLAS_TRY(cublasSetWorkspace(s.blas, s.blas_ws, kWorkspaceBytes));
  s.blas_stream = stream;
  s.blas_stream_set = true;
  return 0;
}

// The column-major problem cuBLASLt sees: D^T (N x M) = op(Bbuf) (N x K) * Abuf^T (K x M).
int make_plan(State& s, int M, int N, int K, int nk, LtPlan** out) {
  auto key = std::make_tuple(M, N, K, nk);
  auto it = s.plans.find(key);
  if (it != s.plans.end()) {
    *out = &it->second;
    return 0;
  }
  LtPlan p;
  BLAS_TRY(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = nk ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  BLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  BLAS_TRY(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (nk) {  // B buffer N x K row-major = column-major K x N, ld K; TRANSA makes it N x K
    BLAS_TRY(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16F, K, N, K));
  } else {  // B buffer K x N row-major = column-major N x K, ld N
    BLAS_TRY(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16F, N, K, N));
  }
  BLAS_TRY(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16F, K, M, K));  // A buffer, ld K
  BLAS_TRY(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16F, N, M, N));  // C buffer, ld N

  cublasLtMatmulPreference_t pref = nullptr;
  BLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = kWorkspaceBytes;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos] = {};
  int returned = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(s.lt, p.op, p.a, p.b, p.c, p.c, pref, kMaxAlgos,
                                        results, &returned);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return static_cast<int>(st);
  for (int i = 0; i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes)
      p.algos.push_back(results[i]);
  }
  if (p.algos.empty()) return L2GEN_SHIM_NO_ALGORITHM;
  *out = &(s.plans[key] = p);
  return 0;
}

int lt_run(State& s, const LtPlan& p, int index, const void* A, const void* B, void* C,
           cudaStream_t stream) {
  const float alpha = 1.f, beta = 0.f;
  BLAS_TRY(cublasLtMatmul(s.lt, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c,
                          &p.algos[index].algo, s.lt_ws, kWorkspaceBytes, stream));
  return 0;
}

}  // namespace

extern "C" {

// An L2 flush enqueued on `stream`; returns 0 on success (templates/probes.cu).
typedef int (*l2gen_flush_fn)(void* context, cudaStream_t stream);

// Create the handles and workspaces (idempotent). Call before anything else.
int l2gen_shim_init() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.ready) return 0;
  BLAS_TRY(cublasCreate(&s.blas));
  BLAS_TRY(cublasLtCreate(&s.lt));
  CUDA_TRY(cudaMalloc(&s.blas_ws, kWorkspaceBytes));
  CUDA_TRY(cudaMalloc(&s.lt_ws, kWorkspaceBytes));
  s.ready = true;
  return 0;
}

const char* l2gen_shim_error_string(int code) {
  switch (code) {
    case 0: return "success";
    case L2GEN_SHIM_NOT_INITIALIZED: return "l2gen_shim_init() was not called or failed";
    case L2GEN_SHIM_NO_ALGORITHM: return "cuBLASLt heuristic returned no usable algorithm";
    case L2GEN_SHIM_NOT_TUNED: return "l2gen_cublaslt_autotune() was not run for this shape";
    case L2GEN_SHIM_BAD_ARGUMENT: return "bad argument";
    default: break;
  }
  if (code > 0) return cublasGetStatusString(static_cast<cublasStatus_t>(code));
  return cudaGetErrorString(static_cast<cudaError_t>(-code));
}

// cublasGemmEx. variant 0: row-major C via the swap; variant 1: both operands transposed,
// C written column-major (see the top of this file).
int l2gen_cublas_gemm(int variant, const void* A, const void* B, void* C, int M, int N, int K,
                      int nk, cudaStream_t stream) {
  State& s = state();
  if (!s.ready) return L2GEN_SHIM_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(s.mu);
  int rc = set_blas_stream(s, stream);
  if (rc) return rc;
  const float alpha = 1.f, beta = 0.f;
  if (variant == 0) {
    BLAS_TRY(cublasGemmEx(s.blas, nk ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &alpha,
                          B, CUDA_R_16F, nk ? K : N, A, CUDA_R_16F, K, &beta, C, CUDA_R_16F, N,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else if (variant == 1) {
    BLAS_TRY(cublasGemmEx(s.blas, CUBLAS_OP_T, nk ? CUBLAS_OP_N : CUBLAS_OP_T, M, N, K, &alpha,
                          A, CUDA_R_16F, K, B, CUDA_R_16F, nk ? K : N, &beta, C, CUDA_R_16F, M,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    return L2GEN_SHIM_BAD_ARGUMENT;
  }
  return 0;
}

// cuBLASLt, row-major C. tuned 0: the heuristic's first algorithm; tuned r >= 1: the
// r-th fastest of l2gen_cublaslt_autotune()'s ranking for this shape (1: its choice).
int l2gen_cublaslt_gemm(int tuned, const void* A, const void* B, void* C, int M, int N, int K,
                        int nk, cudaStream_t stream) {
  State& s = state();
  if (!s.ready) return L2GEN_SHIM_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(s.mu);
  LtPlan* p = nullptr;
  int rc = make_plan(s, M, N, K, nk, &p);
  if (rc) return rc;
  if (tuned < 0) return L2GEN_SHIM_BAD_ARGUMENT;
  if (tuned && (p->tuned < 0 || tuned > static_cast<int>(p->ranked.size()))) return L2GEN_SHIM_NOT_TUNED;
  return lt_run(s, *p, tuned ? p->ranked[tuned - 1] : 0, A, B, C, stream);
}

// Time up to 16 heuristic candidates and keep the fastest for this shape. The candidates
// are timed round-robin: round r runs every candidate once, in an order rotated by r, each
// run preceded by `flush(flush_context, stream)` (the timing protocol's L2 flush, from
// l2gen's probes library; null: no flush). A clock or
// temperature drift over the tuning then weighs on all candidates alike (timed one after
// another, the first ones ran on a cooler GPU). The median of `reps` rounds decides. Writes
// how many algorithms ran, the chosen index in heuristic order, and its median in us.
// A second call for a tuned shape returns the cached choice without timing again.
int l2gen_cublaslt_autotune(const void* A, const void* B, void* C, int M, int N, int K, int nk,
                            l2gen_flush_fn flush, void* flush_context, int reps, cudaStream_t stream,
                            int* tried, int* chosen, float* best_us) {
  State& s = state();
  if (!s.ready) return L2GEN_SHIM_NOT_INITIALIZED;
  if (reps < 1 || !tried || !chosen || !best_us) return L2GEN_SHIM_BAD_ARGUMENT;
  std::lock_guard<std::mutex> lock(s.mu);
  LtPlan* p = nullptr;
  int rc = make_plan(s, M, N, K, nk, &p);
  if (rc) return rc;
  if (p->tuned >= 0) {
    *tried = 0;
    *chosen = p->tuned;
    *best_us = p->tuned_us;
    return 0;
  }
  // Candidates that run at all (two warm-up runs each); one that fails is left out.
  std::vector<int> live;
  for (int i = 0; i < static_cast<int>(p->algos.size()); ++i) {
    bool ok = true;
    for (int w = 0; w < 2 && ok; ++w) ok = lt_run(s, *p, i, A, B, C, stream) == 0;
    ok = ok && cudaStreamSynchronize(stream) == cudaSuccess;
    if (ok) {
      live.push_back(i);
    } else {
      cudaGetLastError();  // not sticky: the next candidate may run; a sticky error surfaces below
    }
  }
  CUDA_TRY(cudaStreamSynchronize(stream));
  if (live.empty()) return L2GEN_SHIM_NO_ALGORITHM;
  const size_t n = live.size();
  std::vector<cudaEvent_t> start(n, nullptr), end(n, nullptr);
  std::vector<std::vector<float>> times(n);
  bool ok = true;
  for (size_t j = 0; j < n && ok; ++j) {
    ok = cudaEventCreate(&start[j]) == cudaSuccess && cudaEventCreate(&end[j]) == cudaSuccess;
    times[j].reserve(reps);
  }
  for (int r = 0; r < reps && ok; ++r) {
    for (size_t t = 0; t < n && ok; ++t) {
      const size_t j = (t + static_cast<size_t>(r)) % n;
      if (flush) ok = flush(flush_context, stream) == 0;
      ok = ok && cudaEventRecord(start[j], stream) == cudaSuccess;
      ok = ok && lt_run(s, *p, live[j], A, B, C, stream) == 0;
      ok = ok && cudaEventRecord(end[j], stream) == cudaSuccess;
    }
    ok = ok && cudaStreamSynchronize(stream) == cudaSuccess;
    for (size_t j = 0; j < n && ok; ++j) {
      float ms = 0.f;
      ok = cudaEventElapsedTime(&ms, start[j], end[j]) == cudaSuccess;
      times[j].push_back(1000.f * ms);
    }
  }
  for (size_t j = 0; j < n; ++j) {
    if (start[j]) cudaEventDestroy(start[j]);
    if (end[j]) cudaEventDestroy(end[j]);
  }
  if (!ok) {
    cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? -static_cast<int>(e) : L2GEN_SHIM_NO_ALGORITHM;
  }
  std::vector<std::pair<float, int>> medians;  // (median us, index into algos)
  for (size_t j = 0; j < n; ++j) {
    std::vector<float>& ts = times[j];
    std::nth_element(ts.begin(), ts.begin() + ts.size() / 2, ts.end());
    medians.emplace_back(ts[ts.size() / 2], live[j]);
  }
  std::stable_sort(medians.begin(), medians.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  p->ranked.clear();
  for (const auto& m : medians) p->ranked.push_back(m.second);
  const int best = medians.front().second;
  const float best_time = medians.front().first;
  p->tuned = best;
  p->tuned_us = best_time;
  *tried = static_cast<int>(n);
  *chosen = best;
  *best_us = best_time;
  return 0;
}

}  // extern "C"
