"""l2gen inside PyTorch: the ``l2gen::mm`` custom op, its autograd, and its Python entries.

Importing this module registers two operators with ``torch.library``:

- ``l2gen::mm(Tensor a, Tensor b, bool b_nk, Tensor? bias) -> Tensor``: ``a @ B + bias``,
  where B is ``b`` stored K x N, or (``b_nk``) ``b.T`` for ``b`` stored N x K, the layout
  of an ``nn.Linear`` weight, read in place. ``a`` is (..., K); the result (..., N).
- ``l2gen::mm_out(Tensor a, Tensor b, bool b_nk, Tensor? bias, Tensor(a!) out) -> ()``:
  the same, written into ``out``.

Both have fake implementations, so ``torch.compile(fullgraph=True)`` traces a call as one
node with no graph break; neither synchronizes, so CUDA graphs capture them (call each
shape once before the capture: the first call of a shape builds or loads its kernel).
``l2gen::mm`` has a backward through torch (cuBLAS on the GPU). :func:`mm` and
:func:`linear` are the entries to call. In eager mode with no gradient to record (inference:
``torch.no_grad``, ``torch.inference_mode``, or no operand requiring grad) they run the op's
implementation without dispatching the op, which would add tens of microseconds of host time
to every call; traced by torch.compile, or with autograd, they call the op. Before any of
that, an eager call without a bias looks its operand shapes up in what the dispatcher learnt
from earlier calls (:meth:`l2gen.dispatch.Dispatcher.hot`): shapes torch computes go to
torch at once, served ones launch after a few checks of the operands.

A call is served by the default dispatcher of B's layout (:func:`l2gen.dispatch.dispatcher`,
:func:`l2gen.dispatch.use_db`) when its operands are fp16 CUDA tensors, B contiguous as
stored, A contiguous where it has more than two dimensions (its leading dimensions are
flattened into M, as a view) and the bias, if any, N values of A's dtype. Everything else,
and every shape no program serves, is computed by torch as torch computes it:
``torch.matmul(a, b)`` for B stored K x N, ``F.linear(a, b, bias)`` for B stored N x K
and wherever a bias is given. A served result gets its bias added right after the GEMM
(no program fuses one yet). Under autocast the entries cast their operands as autocast
casts ``F.linear``'s, before the op: fp32 activations under CUDA fp16 autocast are served.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import dispatch

__all__ = ["linear", "mm"]

# The devices whose tensors a dispatcher is asked to serve (l2gen's kernels run on CUDA
# GPUs); any other tensor goes to torch without a lookup.
SERVED_DEVICES = frozenset({"cuda"})

_MM = "(Tensor a, Tensor b, bool b_nk, Tensor? bias) -> Tensor"
_MM_OUT = "(Tensor a, Tensor b, bool b_nk, Tensor? bias, Tensor(a!) out) -> ()"


def _reference(a, b, b_nk: bool, bias):
    """What torch computes for a call: the result wherever no program serves it."""
    if b_nk:
        return F.linear(a, b, bias)
    if bias is None:
        return torch.matmul(a, b)
    if b.dim() == 2:
        return F.linear(a, b.t(), bias)  # one fused call, as for an nn.Linear
    return torch.matmul(a, b) + bias


def _reference_out(a, b, b_nk: bool, bias, out, view=None) -> None:
    # view: B as the product reads it (b.mT for b stored N x K), where the caller has it
    torch.matmul(a, (b.mT if view is None else view) if b_nk else b, out=out)
    if bias is not None:
        out.add_(bias)


def _device_type(t) -> str:
    """``t.device.type``, read through ``is_cuda`` first (a sixth of the host time)."""
    return "cuda" if t.is_cuda else t.device.type


def _served(a, b, b_nk: bool, bias, out):
    """The call's result from an l2gen kernel (written into ``out`` if given), or None
    where torch computes it."""
    if _device_type(a) not in SERVED_DEVICES or a.dim() < 1 or b.dim() != 2:
        return None
    k = a.shape[-1]
    n, k_b = b.shape if b_nk else (b.shape[1], b.shape[0])
    if k_b != k or k == 0:  # torch's error, or its empty result
        return None
    if bias is not None and (bias.shape != (n,) or bias.dtype != a.dtype or bias.device != a.device):
        return None
    # A of 2 or more dimensions goes to the dispatcher as it is (its leading dimensions are
    # the rows, C comes back shaped like them: no views to make, a microsecond each on the
    # host); a vector is a one-row matrix.
    vector = a.dim() == 1
    if vector:
        a = a.view(1, k)
        if out is not None:
            if out.shape != (n,) or not out.is_contiguous():
                return None
            out = out.view(1, n)
    elif out is not None and (out.shape != a.shape[:-1] + (n,) or not out.is_contiguous()):
        return None
    c = dispatch.default_dispatcher(b_nk).serve(a, b, out)
    if c is None:
        return None
    if bias is not None:
        c.add_(bias)
    return c.view(n) if vector else c


def _mm_impl(a, b, b_nk, bias):
    """What ``l2gen::mm`` computes: an l2gen kernel's result where one serves, else torch's."""
    c = _served(a, b, b_nk, bias, None)
    return _reference(a, b, b_nk, bias) if c is None else c


def _mm_out_impl(a, b, b_nk, bias, out) -> None:
    """What ``l2gen::mm_out`` computes, into ``out``."""
    if _served(a, b, b_nk, bias, out) is None:
        _reference_out(a, b, b_nk, bias, out)


@torch.library.custom_op("l2gen::mm", mutates_args=(), schema=_MM)
def _mm(a, b, b_nk, bias):
    return _mm_impl(a, b, b_nk, bias)


@_mm.register_fake
def _mm_fake(a, b, b_nk, bias):
    # torch's own computation on fake tensors: its shapes, dtypes, strides and errors,
    # which a served result shares (a fresh contiguous tensor).
    return _reference(a, b, b_nk, bias)


@torch.library.custom_op("l2gen::mm_out", mutates_args=("out",), schema=_MM_OUT)
def _mm_out(a, b, b_nk, bias, out):
    _mm_out_impl(a, b, b_nk, bias, out)


@_mm_out.register_fake
def _mm_out_fake(a, b, b_nk, bias, out):
    return None


def _setup_context(ctx, inputs, output) -> None:
    a, b, b_nk, _bias = inputs
    ctx.b_nk = b_nk
    need_a, need_b = ctx.needs_input_grad[:2]
    ctx.save_for_backward(a if need_b else None, b if need_a else None)
    ctx.a_shape = a.shape


def _backward(ctx, grad):
    """Gradients through torch, in the layouts the inputs are stored in: with B = b
    (stored K x N) or b.T (stored N x K), grad_a = grad @ B.T, grad_b = a.T @ grad (its
    transpose for N x K), grad_bias = grad summed over M; A's leading dimensions flattened."""
    a, b = ctx.saved_tensors
    need_a, need_b, _, need_bias = ctx.needs_input_grad[:4]
    g = grad.reshape(-1, grad.shape[-1])
    grad_a = grad_b = grad_bias = None
    if need_a:
        grad_a = (g @ b if ctx.b_nk else g @ b.t()).reshape(ctx.a_shape)
    if need_b:
        a2 = a.reshape(-1, a.shape[-1])
        grad_b = g.t() @ a2 if ctx.b_nk else a2.t() @ g
    if need_bias:
        grad_bias = g.sum(0)
    return grad_a, grad_b, None, grad_bias


torch.library.register_autograd("l2gen::mm", _backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------
# The entries.


def _fits(a, b, bias) -> bool:
    """Whether the op takes these operands (the rest go to torch as they are): tensors,
    A of at least one dimension, a 2-D B, a 1-D bias (its gradient is a sum over M)."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() >= 1 and b.dim() == 2
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.dim() == 1)))


_AUTOCAST_DEVICES = ("cuda", "cpu")


def _autocasting(a, device: str | None = None) -> torch.dtype | None:
    """The dtype autocast gives ``F.linear`` and ``torch.matmul`` on A's device (its type:
    ``device``, where the caller has it), or None."""
    device = device or _device_type(a)
    if device in _AUTOCAST_DEVICES and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


def _cast(t, dtype: torch.dtype):
    # As autocast casts an op's inputs: floating tensors but fp64 ones.
    return t.to(dtype) if t is not None and t.is_floating_point() and t.dtype is not torch.float64 else t


def _records_grad(a, b, bias) -> bool:
    """Whether autograd would record a call on these operands."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a, b, bias))


# Plain tensors: what the hot path takes (torch.compile's fake and functional tensors, and
# other subclasses, take the op's full path).
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
_F16 = torch.float16
_NONE = object()


def _hot(a, b, b_nk: bool, out, view):
    """The eager call without a bias, by what the dispatcher learnt of these operand shapes
    (:meth:`l2gen.dispatch.Dispatcher.hot`): torch's result where the shapes alone send it
    to torch, the kernel's where a verified program serves them and the operands are what
    it takes, else NotImplemented (the full path decides, and teaches the dispatcher).

    A call of a few microseconds is bound by the host, so this path reads as few tensor
    attributes as it can (each is a call into torch). What it leaves out, the kernel's entry
    checks: a misaligned operand gets an error code back, before any launch, and the full
    path then hands the call to torch."""
    d = dispatch.default_dispatcher(b_nk)
    shape_a = a.shape
    state = d.hot(shape_a, b.shape)
    if state is None:
        return NotImplemented
    if state is dispatch.FALLBACK:  # torch computes these shapes (autograd and autocast as usual)
        if out is None:
            return _reference(a, b, b_nk, None)
        _reference_out(a, b, b_nk, None, out, view)
        return out
    device_type = _device_type(a)
    if device_type not in SERVED_DEVICES or a.dtype is not _F16 or b.dtype is not _F16:
        return NotImplemented
    if _autocasting(a, device_type) is not None or (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        return NotImplemented
    device = a.get_device()
    if b.get_device() != device or not (a.is_contiguous() and b.is_contiguous()):
        return NotImplemented
    launcher = d.launcher
    n = state.n
    if out is None:
        c = launcher.empty(a, state.m, n)  # as a served call through the dispatcher makes C
    elif (out.dtype is not _F16 or out.get_device() != device or not out.is_contiguous()
          or out.shape != ((state.m, n) if len(shape_a) == 2 else (*shape_a[:-1], n))):
        return NotImplemented
    else:
        c = out
    stream = launcher.stream(a)
    workspace = state.workspaces.get(stream, _NONE)
    if workspace is _NONE:  # a stream's first call (or a graph capture): the full path makes one
        return NotImplemented
    if state.run(a, b, c, workspace, stream) != 0:  # refused before launching (alignment, say)
        return NotImplemented
    return c


def _may_take_hot_path(a, b, bias) -> bool:
    """Whether a call may go by :func:`_hot`: eager (not traced), plain tensors, no bias."""
    return bias is None and type(a) in _PLAIN and type(b) in _PLAIN and not torch.compiler.is_compiling()


def _call(a, b, b_nk: bool, bias, out, view=None):
    """``view``: for b stored N x K, the K x N view of it the caller was given, if any (a
    view costs a microsecond of host time to make again)."""
    if _may_take_hot_path(a, b, bias):
        c = _hot(a, b, b_nk, out, view)
        if c is not NotImplemented:
            return c
    if not _fits(a, b, bias):
        if out is None:
            return _reference(a, b, b_nk, bias)
        _reference_out(a, b, b_nk, bias, out)
        return out
    dtype = _autocasting(a)
    if out is None:
        if dtype is not None:  # cast before the op, so that its backward sees what its forward saw
            a, b, bias = _cast(a, dtype), _cast(b, dtype), _cast(bias, dtype)
        # In eager mode with no gradient to record, the op's implementation runs without
        # dispatching the op: a Python custom op's dispatch costs tens of microseconds of
        # host time per call, more than a decode step's GEMM takes on the GPU. torch.compile
        # traces the op.
        if not torch.compiler.is_compiling() and not _records_grad(a, b, bias):
            return _mm_impl(a, b, b_nk, bias)
        return torch.ops.l2gen.mm(a, b, b_nk, bias)
    if dtype is not None or _records_grad(a, b, bias):
        _reference_out(a, b, b_nk, bias, out, view)  # torch's own call (and refusal: out= has no autograd)
        return out
    if not torch.compiler.is_compiling():  # as above; out= records no gradient
        _mm_out_impl(a, b, b_nk, bias, out)
    else:
        torch.ops.l2gen.mm_out(a, b, b_nk, bias, out)
    return out


def mm(a, b, *, bias=None, out=None):
    """``a @ b`` (``+ bias``) by l2gen's kernel for the shape where one serves it, else by
    torch (see the module docstring); differentiable, and traceable by torch.compile.

    ``b`` is K x N: a row-major tensor, or the transpose of a row-major N x K one
    (``w.t()``, an ``nn.Linear`` weight), which is served as it is stored, without a copy.
    ``a`` is (..., K). ``bias``: N values added to every row. ``out``: written and returned
    (as with ``torch.matmul(out=)``, not differentiable).
    """
    if isinstance(b, torch.Tensor) and b.dim() == 2 and not b.is_contiguous():
        shape, stride = b.shape, b.stride()
        if (stride[0] == 1 and stride[1] == shape[0] and _may_take_hot_path(a, b, bias)
                and dispatch.default_dispatcher(True).hot(a.shape, (shape[1], shape[0])) is dispatch.FALLBACK):
            # the transpose of a row-major weight, of shapes torch computes: torch's call as
            # written, before making the stored view (a microsecond or more of host time)
            return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
        stored = b.t()
        if stored.is_contiguous():
            return _call(a, stored, True, bias, out, b)
    return _call(a, b, False, bias, out)


def linear(x, weight, bias=None, *, out=None):
    """``F.linear(x, weight, bias)`` (``x @ weight.T + bias``, ``weight`` N x K) by l2gen's
    kernel for the shape where one serves it, else by torch; as :func:`mm` otherwise."""
    return _call(x, weight, True, bias, out)
