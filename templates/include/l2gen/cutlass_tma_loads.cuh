// ---- l2gen: CUTLASS's TMA loads without the default L2 cache policy ---------------------
// Included by the sm90a CUTLASS family (templates/sm90_gemm.cu.j2) after CuTe's headers.
//
// Why. Every TMA load CuTe issues carries `.L2::cache_hint` with a policy operand, and the
// CUTLASS collectives pass TMA::CacheHintSm90::EVICT_NORMAL when they ask for nothing
// else. A load that carries a policy is never merged by the GPC's L2 request coalescer
// (LRC) with the same load from another SM of the GPC: measured on l2gen's own kernel
// (H100, 1024^3, ncu lrc__request_sectors_op_read_coalescing_achieved_type_hardware),
// 0 sectors merged with the policy, 168 K without it, and the L2 read requests fell from
// 272 K to 225 K. EVICT_NORMAL asks for what the L2 does anyway, so a load asking for it is
// issued here without a policy; a load asking for evict-first or evict-last keeps its hint.
//
// How. CuTe executes a TMA load atom through detail::CallCOPY<SM90_TMA_LOAD_OP> (and its
// multicast twin); the explicit specializations below take that call. They change nothing
// else: the same descriptor, barrier, multicast mask, box and coordinates.
//
// Build with -DL2GEN_CUTLASS_TMA_HINT=1 to keep CuTe's loads as they are (for measuring).
// The build cache keys every library on this file's text (l2gen/build.py).
#pragma once

#include <cstdint>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/util.hpp"
#include "cute/atom/copy_traits_sm90_tma.hpp"

#if !defined(L2GEN_CUTLASS_TMA_HINT) || !L2GEN_CUTLASS_TMA_HINT

namespace l2gen_tma {

constexpr uint64_t kEvictNormal = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);

// One TMA tile load of a 1-5 dimensional box, without an L2 policy; `mask` != 0 multicasts
// it to the CTAs of the cluster in the mask.
template <bool kMulticast, class... Crd>
CUTE_HOST_DEVICE void load_without_policy(void const* desc, uint64_t* mbar, uint16_t mask, void* smem,
                                          Crd const&... crd) {
#if defined(CUTE_ARCH_TMA_SM90_ENABLED)
  constexpr int kRank = sizeof...(Crd);
  static_assert(kRank >= 1 && kRank <= 5, "a TMA box has 1 to 5 dimensions");
  uint64_t const d = reinterpret_cast<uint64_t>(desc);
  uint32_t const b = cute::cast_smem_ptr_to_uint(mbar);
  uint32_t const s = cute::cast_smem_ptr_to_uint(smem);
  int32_t const c[5] = {static_cast<int32_t>(crd)...};
#define L2GEN_TMA_OP(dims) "cp.async.bulk.tensor." dims ".shared::cluster.global.mbarrier::complete_tx::bytes"
#define L2GEN_TMA_MC ".multicast::cluster"
  if constexpr (!kMulticast) {
    if constexpr (kRank == 1) {
      asm volatile(L2GEN_TMA_OP("1d") " [%0], [%1, {%3}], [%2];" ::"r"(s), "l"(d), "r"(b), "r"(c[0]) : "memory");
    } else if constexpr (kRank == 2) {
      asm volatile(L2GEN_TMA_OP("2d") " [%0], [%1, {%3, %4}], [%2];" ::"r"(s), "l"(d), "r"(b), "r"(c[0]),
                   "r"(c[1]) : "memory");
    } else if constexpr (kRank == 3) {
      asm volatile(L2GEN_TMA_OP("3d") " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(s), "l"(d), "r"(b), "r"(c[0]),
                   "r"(c[1]), "r"(c[2]) : "memory");
    } else if constexpr (kRank == 4) {
      asm volatile(L2GEN_TMA_OP("4d") " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(s), "l"(d), "r"(b),
                   "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
    } else {
      asm volatile(L2GEN_TMA_OP("5d") " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(s), "l"(d), "r"(b),
                   "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
    }
  } else {
    if constexpr (kRank == 1) {
      asm volatile(L2GEN_TMA_OP("1d") L2GEN_TMA_MC " [%0], [%1, {%4}], [%2], %3;" ::"r"(s), "l"(d), "r"(b),
                   "h"(mask), "r"(c[0]) : "memory");
    } else if constexpr (kRank == 2) {
      asm volatile(L2GEN_TMA_OP("2d") L2GEN_TMA_MC " [%0], [%1, {%4, %5}], [%2], %3;" ::"r"(s), "l"(d), "r"(b),
                   "h"(mask), "r"(c[0]), "r"(c[1]) : "memory");
    } else if constexpr (kRank == 3) {
      asm volatile(L2GEN_TMA_OP("3d") L2GEN_TMA_MC " [%0], [%1, {%4, %5, %6}], [%2], %3;" ::"r"(s), "l"(d),
                   "r"(b), "h"(mask), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
    } else if constexpr (kRank == 4) {
      asm volatile(L2GEN_TMA_OP("4d") L2GEN_TMA_MC " [%0], [%1, {%4, %5, %6, %7}], [%2], %3;" ::"r"(s), "l"(d),
                   "r"(b), "h"(mask), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
    } else {
      asm volatile(L2GEN_TMA_OP("5d") L2GEN_TMA_MC " [%0], [%1, {%4, %5, %6, %7, %8}], [%2], %3;" ::"r"(s),
                   "l"(d), "r"(b), "h"(mask), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
    }
  }
#undef L2GEN_TMA_MC
#undef L2GEN_TMA_OP
#else
  CUTE_INVALID_CONTROL_PATH("l2gen: TMA loads need sm_90a");
#endif
}

}  // namespace l2gen_tma

namespace cute::detail {

template <>
struct CallCOPY<cute::SM90_TMA_LOAD_OP> {
  template <class... Crd>
  CUTE_HOST_DEVICE void operator()(void const* desc, uint64_t* mbar, uint64_t cache_hint, void* smem,
                                   Crd const&... crd) const {
    if (cache_hint == l2gen_tma::kEvictNormal) {
      l2gen_tma::load_without_policy<false>(desc, mbar, 0, smem, crd...);
    } else {
      cute::SM90_TMA_LOAD::copy(desc, mbar, cache_hint, smem, static_cast<int32_t>(crd)...);
    }
  }
};

template <>
struct CallCOPY<cute::SM90_TMA_LOAD_MULTICAST_OP> {
  template <class... Crd>
  CUTE_HOST_DEVICE void operator()(void const* desc, uint64_t* mbar, uint16_t mask, uint64_t cache_hint,
                                   void* smem, Crd const&... crd) const {
    if (cache_hint == l2gen_tma::kEvictNormal) {
      l2gen_tma::load_without_policy<true>(desc, mbar, mask, smem, crd...);
    } else {
      cute::SM90_TMA_LOAD_MULTICAST::copy(desc, mbar, mask, cache_hint, smem, static_cast<int32_t>(crd)...);
    }
  }
};

}  // namespace cute::detail

#endif  // !L2GEN_CUTLASS_TMA_HINT
