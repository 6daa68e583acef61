"""l2gen: generate, verify and tune fp16 GEMM kernels for NVIDIA GPUs from a small DSL.

Pipeline (one module per stage): parse -> check -> lower -> build -> runtime/verify ->
bench -> search -> db -> dispatch. ``l2gen.matmul`` is the drop-in for ``torch.matmul``.
"""

__version__ = "0.1.0"


def matmul(a, b, out=None, **kwargs):
    """C = A @ B with the best tuned kernel for the shape, else cuBLAS (see l2gen.dispatch)."""
    from .dispatch import matmul as _matmul

    return _matmul(a, b, out=out, **kwargs)
