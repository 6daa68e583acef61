"""l2gen: generate, verify and tune fp16 GEMM kernels for NVIDIA GPUs from a small DSL.

Pipeline (one module per stage): parse -> check -> lower -> build -> runtime/verify ->
bench -> search -> db -> dispatch. ``l2gen.matmul`` is the drop-in for ``torch.matmul``.
"""

__version__ = "0.1.0"
__all__ = ["matmul"]


def __getattr__(name: str):
    # ``l2gen.matmul`` is :func:`l2gen.dispatch.matmul` itself, imported on first use (so
    # that ``import l2gen`` stays light) and then bound here: no wrapper on every call.
    if name == "matmul":
        from .dispatch import matmul

        globals()["matmul"] = matmul
        return matmul
    raise AttributeError(f"module 'l2gen' has no attribute {name!r}")
