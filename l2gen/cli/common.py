"""What every ``l2gen`` command module shares: exit codes, error constructors, stderr, and
reading a kernel database's best programs. Below the package's command modules
(:mod:`l2gen.cli`, :mod:`l2gen.cli.run`, :mod:`l2gen.cli.tune`, :mod:`l2gen.cli.model`), so
that none of them imports another to reach these."""

from __future__ import annotations

import sys

from ..diagnostics import Diagnostic, DiagnosticError, UsageError

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def eprint(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def fail(code: str, message: str) -> DiagnosticError:
    """A diagnostic with no source location, for errors in a command's arguments."""
    return DiagnosticError([Diagnostic(code, message)])


def usage(code: str, message: str) -> UsageError:
    """A :class:`UsageError` with one diagnostic and no source location."""
    return UsageError([Diagnostic(code, message)])


def card_name(device_info=None) -> str | None:
    """The name of the card this process would time on (device 0), or None where there is
    none to ask."""
    if device_info is None:
        from ..runtime import device_info
    try:
        return device_info(0).name
    except Exception:
        return None


def off_target_card(gpu, device_info=None) -> str | None:
    """The name of the card this process would time on, where it is not ``gpu`` (the target
    whose limits the checker applies and under whose name results are filed); None where it
    is, or where there is no card to ask."""
    from ..targets import is_card

    name = card_name(device_info)
    return None if name is None or is_card(gpu, name) else name


def target_of(card: str) -> str | None:
    """The ``--gpu`` name of a card (an H100's: h100), or None for a card l2gen has no record of."""
    from ..targets import gpu_of_card

    gpu = gpu_of_card(card)
    return gpu.name if gpu is not None else None


def recorded_best(args, l2: str | None = None) -> dict:
    """``--db``'s best (program, speedup, time_us) per shape on ``--gpu``, among the
    measurements made under the L2 protocol ``l2`` (None: the database's own); a database
    measured under another protocol is refused (exit 2)."""
    from ..db import DatabaseError, KernelDB, ProtocolMismatchError

    try:
        with KernelDB(args.db, readonly=True) as db:
            db.check_gpu(args.gpu)
            if l2 is not None:
                db.check_l2(l2)
            return db.best_all(args.gpu)
    except ProtocolMismatchError as exc:
        raise usage("E-PROTOCOL", str(exc)) from None
    except DatabaseError as exc:
        raise fail("E-DB", str(exc)) from None
