"""Launches whose constant arguments are bound once: the served call's host path.

A generated library's entry takes 17 arguments (entry ABI 2, ``templates/common.cuh.j2``)
and ctypes converts and checks each of them on every call: on a fast host that alone is
about a microsecond, as much as the rest of a served call's Python. For one shape on one
stream only the three operand addresses change. :func:`caller` loads a small C helper
(``templates/bound_call.c``, built once with the toolchain's host compiler and cached like
the cuBLAS shim) whose ``l2gen_bound_call(record, A, B, C)`` makes the entry's call from a
:class:`Bound` record filled once: four arguments through ctypes instead of 17.

Where the helper cannot be built (no nvcc, no host compiler), :func:`caller` returns None
and the dispatcher calls the entry itself, as before: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import logging
import threading

from .lower import TEMPLATE_DIR
from .runtime import ABI_VERSION

log = logging.getLogger(__name__)

SOURCE = TEMPLATE_DIR / "bound_call.c"
FLAGS = ("-O2", "-Xcompiler=-fPIC", "-shared")
VERSION = f"1/abi{ABI_VERSION}"  # bump when the build command or the record changes

# The entry's arguments from M to the knobs, as Bound.args holds them (ABI 2).
BOUND_INTS = 11


class Bound(ctypes.Structure):
    """``l2gen_bound`` of ``templates/bound_call.c``: an entry and its arguments but A, B, C."""

    _fields_ = [
        ("entry", ctypes.c_void_p),
        ("args", ctypes.c_int * BOUND_INTS),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("stream", ctypes.c_void_p),
    ]


def bind(entry, ints, workspace: int | None, workspace_bytes: int, stream: int) -> tuple[Bound, ctypes.c_void_p]:
    """A record for ``entry`` (the ctypes function of ``E`` or ``E_pdl``) and a pointer to
    it to pass to the helper; the caller keeps the record alive as long as it calls with
    the pointer. ``ints``: M, N, K, lda, ldb, ldc and the knobs' values, in ABI order, as
    integers or ctypes ints (``Library.constant_args``)."""
    if len(ints) != BOUND_INTS:
        raise ValueError(f"a bound call takes {BOUND_INTS} integer arguments (entry ABI {ABI_VERSION}), got {len(ints)}")
    record = Bound(ctypes.cast(entry, ctypes.c_void_p).value, (ctypes.c_int * BOUND_INTS)(*ints),
                   workspace or None, workspace_bytes, stream or None)
    return record, ctypes.c_void_p(ctypes.addressof(record))


_LOCK = threading.Lock()
_CALLER: list = []  # [the helper's function, or None where it could not be made]


def caller():
    """``l2gen_bound_call`` as a ctypes function (record pointer, A, B, C) -> status, or
    None where the helper cannot be built or loaded here (said once, in the log)."""
    if _CALLER:
        return _CALLER[0]
    with _LOCK:
        if not _CALLER:
            _CALLER.append(_load())
    return _CALLER[0]


def _load():
    from .build import HelperBuildError, build_helper
    from .toolchain import ToolchainError, find_nvcc

    try:
        nvcc = find_nvcc()
        path = build_helper("the bound-call helper", "bound", "bound_call", SOURCE,
                            lambda out: [str(nvcc), *FLAGS, str(SOURCE), "-o", str(out)], version=VERSION)
        lib = ctypes.CDLL(str(path))
    except (ToolchainError, HelperBuildError, OSError) as e:
        log.info("l2gen: served calls pass every entry argument through ctypes (%s)", e)
        return None
    lib.l2gen_bound_size.argtypes, lib.l2gen_bound_size.restype = [], ctypes.c_size_t
    size = lib.l2gen_bound_size()
    if size != ctypes.sizeof(Bound):
        log.warning("l2gen: %s's record is %d bytes, l2gen.bound.Bound %d: not used", path, size, ctypes.sizeof(Bound))
        return None
    call = lib.l2gen_bound_call
    call.argtypes = [ctypes.c_void_p] * 4
    call.restype = ctypes.c_int
    return call
