"""``nn.Linear`` through l2gen: a drop-in layer, and :func:`patch` for a whole model.

:class:`Linear` is ``torch.nn.Linear`` with its forward through ``l2gen::mm``
(:func:`l2gen.torch_ops.linear`): the same parameters, state dict and repr, its weight
read as stored (N x K). :func:`patch` turns a model's fp16 ``nn.Linear`` layers into it in
place, by class, and gives back a handle that undoes exactly that: the modules stay the
same objects with the same parameters, so hooks, optimizers and tied weights are
untouched, and ``state_dict()`` is identical throughout.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .torch_ops import linear

__all__ = ["Linear", "Patch", "patch"]


class Linear(nn.Linear):
    """``torch.nn.Linear`` served by l2gen: ``x @ weight.T + bias`` by the tuned kernel for
    the shape where one serves it, else by torch (which then computes exactly what
    ``nn.Linear`` does); differentiable, and traceable by ``torch.compile``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias)


class Patch:
    """The layers :func:`patch` routed through l2gen. :meth:`undo` (or leaving a ``with``
    block) turns them back into ``torch.nn.Linear``; a second undo does nothing."""

    def __init__(self, model: nn.Module, layers: dict[str, nn.Linear]):
        self.model = model
        self.layers = layers  # qualified name -> module, as model.named_modules() names it

    def undo(self) -> None:
        for module in self.layers.values():
            if type(module) is Linear:  # a layer someone else changed since is left alone
                module.__class__ = nn.Linear
        self.layers = {}

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"<l2gen.Patch of {type(self.model).__name__}: {len(self.layers)} layers>"


def patch(model: nn.Module) -> Patch:
    """Route ``model``'s fp16 ``torch.nn.Linear`` layers through l2gen, in place; returns a
    :class:`Patch` to undo it with, also usable as a context manager::

        with l2gen.patch(model):
            logits = model(tokens)

    Only modules whose type is ``nn.Linear`` itself and whose weight is fp16 change (a
    subclass of it may compute something else; other dtypes are not served); each module
    shared under several names changes once. A model with none: a warning, and the model
    is left as it was.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"l2gen.patch takes a torch.nn.Module, not {type(model).__name__}")
    layers = {name: m for name, m in model.named_modules() if type(m) is nn.Linear and isinstance(m.weight, torch.Tensor) and m.weight.dtype is torch.float16}
    if not layers:
        warnings.warn(f"l2gen.patch: {type(model).__name__} has no fp16 nn.Linear layers; the model is unchanged", stacklevel=2)
    for module in layers.values():
        module.__class__ = Linear
    return Patch(model, layers)
