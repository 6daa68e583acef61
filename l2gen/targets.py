"""Target GPUs: the device limits the checker enforces and the flags the build uses.

One record per GPU; nothing else in l2gen hard-codes a device limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from .diagnostics import Diagnostic, DiagnosticError
from .ir import Family


@dataclass(frozen=True)
class Gpu:
    name: str
    sm: int  # compute capability as an integer, 80 or 90
    sms: int  # streaming multiprocessors
    smem_per_block: int  # bytes of shared memory one block may opt in to
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_block: int
    l2_bytes: int
    peak_tflops_fp16: float  # dense fp16 tensor-core rate with fp32 accumulation, measured
    bandwidth_tbs: float  # device-memory bandwidth, measured
    max_cluster: int  # portable cluster size limit (0: no clusters)
    # Clusters of 2, 4, 8 CTAs held at once at one CTA per SM (cudaOccupancyMaxActiveClusters,
    # `bench/device.sh clusters`): a cluster's CTAs share a GPC, so a GPC whose SMs are not a
    # multiple of the cluster size leaves some idle. Empty: SMs // size.
    clusters_held: tuple[int, int, int] = ()

    def cluster_ctas(self, size: int) -> int:
        """CTAs resident at once (one per SM) when launched in clusters of ``size``."""
        if size <= 1:
            return self.sms
        sizes = (2, 4, 8)
        if self.clusters_held and size in sizes:
            return self.clusters_held[sizes.index(size)] * size
        return self.sms // size * size

    def families(self) -> tuple[Family, ...]:
        return (Family.SM80, Family.SM90, Family.SM90_L2GEN) if self.sm >= 90 else (Family.SM80,)

    def gencode(self, family: Family) -> str:
        """The nvcc -gencode flag for a family on this GPU."""
        if family is not Family.SM80:
            return "-gencode=arch=compute_90a,code=sm_90a"
        return f"-gencode=arch=compute_{self.sm},code=sm_{self.sm}"

    def floor_us(self, m: int, n: int, k: int) -> float:
        """Lower bound on a GEMM's time: max(compute, one pass over the bytes)."""
        compute = 2.0 * m * n * k / (self.peak_tflops_fp16 * 1e12)
        memory = 2.0 * (m * k + k * n + m * n) / (self.bandwidth_tbs * 1e12)
        return 1e6 * max(compute, memory)


GPUS: dict[str, Gpu] = {
    # H200 SXM: 132 SMs, 227 KB opt-in shared memory per block, 50 MB L2. The peak and
    # bandwidth were measured on the device machine (bench/results/ holds the runs).
    # Clusters held: measured on an H100 (66 of 2, 30 of 4, 15 of 8: 120 CTAs in clusters of
    # 4 or 8, bench/results/2026-12-06-h100-clusters-092bbcd.txt); the H200 is the same die
    # with the same 132 SMs, its own figure not yet measured.
    "h200": Gpu("h200", 90, 132, 232448, 233472, 65536, 1024, 50 * 2**20, 750.0, 4.3, 8, (66, 30, 15)),
    "h100": Gpu("h100", 90, 132, 232448, 233472, 65536, 1024, 50 * 2**20, 750.0, 3.35, 8, (66, 30, 15)),
    # A100 SXM: 108 SMs, 163 KB opt-in shared memory per block, 40 MB L2.
    "a100": Gpu("a100", 80, 108, 166912, 167936, 65536, 1024, 40 * 2**20, 312.0, 2.0, 0),
}

DEFAULT_GPU = "h200"


def is_card(gpu: Gpu | str, device: str) -> bool:
    """Whether a CUDA device of that name ("NVIDIA H200", "NVIDIA H100 80GB HBM3") is the
    card of the target ``gpu`` (a record or its name): the target's name is in the device's.
    The dispatcher finds its target by it and the database keeps rows of other cards apart
    by it (its SQL, :func:`l2gen.db._env_rows`, applies the same rule)."""
    name = gpu.name if isinstance(gpu, Gpu) else str(gpu)
    return name.lower() in device.lower()


def gpu_of_card(device: str) -> Gpu | None:
    """The target record of a CUDA device of that name (:func:`is_card`), or None for a card
    l2gen has no record of."""
    return next((gpu for gpu in GPUS.values() if is_card(gpu, device)), None)


def get_gpu(name: str) -> Gpu:
    try:
        return GPUS[name.lower()]
    except KeyError:
        known = ", ".join(sorted(GPUS))
        raise DiagnosticError(
            [Diagnostic("E-GPU", f"unknown target GPU '{name}' (known: {known})")]
        ) from None
