"""l2gen: generate, verify and tune fp16 GEMM kernels for NVIDIA GPUs from a small DSL.

Pipeline (one module per stage): parse -> check -> lower -> build -> runtime/verify ->
bench -> search -> db -> dispatch. ``l2gen.matmul`` is the drop-in for ``torch.matmul``;
``l2gen.patch(model)`` routes a model's fp16 ``nn.Linear`` layers through the ``l2gen::mm``
op (:mod:`l2gen.torch_ops`, :mod:`l2gen.nn`).
"""

__version__ = "0.1.0"
__all__ = ["matmul", "patch"]


def __getattr__(name: str):
    # Imported on first use (so that ``import l2gen`` stays light, and works without
    # torch) and then bound here: ``l2gen.matmul`` is :func:`l2gen.dispatch.matmul`
    # itself, no wrapper on every call.
    if name == "matmul":
        from .dispatch import matmul

        globals()["matmul"] = matmul
        return matmul
    if name in ("nn", "torch_ops"):
        import importlib

        return importlib.import_module(f".{name}", __name__)  # binds the submodule here
    if name == "patch":
        from .nn import patch

        globals()["patch"] = patch
        return patch
    raise AttributeError(f"module 'l2gen' has no attribute {name!r}")
