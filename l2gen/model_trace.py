"""The GEMM shapes of a model's ``nn.Linear`` layers from one traced forward pass.

:func:`trace_shapes` runs a module once per token count with a forward pre-hook on
every ``nn.Linear`` (l2gen's own :class:`l2gen.nn.Linear` included) and records each
call's M (the input's leading dimensions flattened), N and K; :func:`trace_import` first
builds the module from a ``pkg.module:factory`` path, on the meta device by default, so
no weights are allocated however large the model. The input of a forward at ``tokens``
tokens is ``module.example_inputs(tokens)`` (a tuple of positional arguments) if the
module defines it, else token ids of shape (1, tokens): a language model's forward.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Sequence

from .diagnostics import Diagnostic, DiagnosticError
from .model_shapes import ModelShape, merge

__all__ = ["layer_pattern", "trace_import", "trace_shapes"]


def _error(message: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E-MODEL", message)])


def layer_pattern(name: str) -> str:
    """A module's qualified name with its layer indices as ``*`` (``layers.3.mlp`` ->
    ``layers.*.mlp``): the layers of a stack share their shapes."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", name)


def _inputs(module, tokens: int, device):
    import torch

    make = getattr(module, "example_inputs", None)
    if callable(make):
        args = make(tokens)
        return tuple(args) if isinstance(args, (tuple, list)) else (args,)
    return (torch.zeros(1, tokens, dtype=torch.long, device=device),)


def trace_shapes(module, tokens: Sequence[int], *, device=None, where: str = "the model") -> list[ModelShape]:
    """Each Linear call's shape in one forward of ``module`` per token count, merged per
    (M, N, K) (layer names as :func:`layer_pattern` writes them; ``count``: calls per
    forward). ``device``: where the default token ids are made (default: the module's
    first parameter's). A forward that fails raises DiagnosticError (E-MODEL) naming
    ``where`` and the token count."""
    import torch
    from torch import nn

    if not isinstance(module, nn.Module):
        raise _error(f"{where} is a {type(module).__name__}, not a torch.nn.Module")
    if device is None:
        first = next(module.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    names = {}
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear):
            names.setdefault(m, layer_pattern(name) or type(module).__name__)
    if not names:
        raise _error(f"{where} has no nn.Linear layers: no GEMM shapes to list")
    calls: list[ModelShape] = []
    current = [0]

    def hook(layer, args):
        x = args[0]
        m = 1
        for d in x.shape[:-1]:
            m *= int(d)
        if m > 0:
            calls.append(ModelShape(m, layer.out_features, layer.in_features, (names[layer],), 1, current[0]))

    handles = [m.register_forward_pre_hook(hook) for m in names]
    was_training = module.training
    module.eval()
    try:
        for t in tokens:
            current[0] = t
            try:
                with torch.no_grad(), torch.device(device):  # tensors the inputs or the forward make land there too
                    module(*_inputs(module, t, device))
            except Exception as exc:
                raise _error(f"{where}: the forward at {t} tokens failed: {type(exc).__name__}: {str(exc)[:300]}") from None
    finally:
        for h in handles:
            h.remove()
        module.train(was_training)
    return merge(calls)


def trace_import(spec: str, tokens: Sequence[int], *, device: str = "meta") -> list[ModelShape]:
    """:func:`trace_shapes` of the module that ``spec`` (``pkg.module:factory``, a
    callable of no arguments returning an ``nn.Module``, importable from the working
    directory too) builds under ``device`` (meta: no memory for weights; cpu). Errors
    name the path (E-MODEL)."""
    try:
        import torch
    except ImportError:
        raise _error(f"{spec}: tracing a model needs torch (pip install 'l2gen[torch]')") from None
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _error(f"{spec}: a model to trace is given as pkg.module:factory")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: a module beside the caller is found
    try:
        mod = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module's own error on import
        raise _error(f"{spec}: cannot import {module_name}: {type(exc).__name__}: {str(exc)[:300]}") from None
    factory = mod
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise _error(f"{spec}: {module_name} has no attribute {attr}")
    if not callable(factory):
        raise _error(f"{spec}: {attr} is not callable (it must build the nn.Module)")
    try:
        with torch.device(device):
            model = factory()
    except Exception as exc:
        raise _error(f"{spec}: {attr}() failed on the {device} device: {type(exc).__name__}: {str(exc)[:300]}") from None
    return trace_shapes(model, tokens, device=torch.device(device), where=spec)
