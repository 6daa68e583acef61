"""Isolation: candidates run in a worker process, so a crash or a hang costs one result.

The parent (:class:`Worker`) starts ``python -m l2gen.worker`` and speaks JSON lines with
it: the worker writes ``{"ready": ...}`` once, then for each task line it reads, zero or
more ``{"note": {...}}`` lines (where it is: which candidate it is verifying, ...) and one
``{"result": {...}}``. The worker's own stdout (fd 1) is pointed at stderr, so nothing a
kernel or a library prints can corrupt the protocol.

Faults become data: if the worker dies (a segfault, a sticky CUDA error, an exception in
the executor, after which it reports and exits so that no broken CUDA context is reused)
the task's result has status ``run_error``; if no result comes within the task's timeout
the worker is killed and the status is ``timeout``. Either way the result carries the
worker's last note, and the next task starts a fresh worker. What to do about a fault
(which candidate to blame, what to measure again) is the runner's business
(:func:`l2gen.runner.measure`); the tasks and results are records of
:mod:`l2gen.tasks`, which holds their wire form.

The executor is pluggable (``module:function``, taking ``(task, note)`` and returning a
result dict) so tests can inject fakes; the default, :func:`l2gen.measure.execute`, runs
"measure" and "probe" tasks on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

DEFAULT_EXECUTOR = "l2gen.measure:execute"
DEFAULT_TIMEOUT = 600.0  # seconds per task
STARTUP_TIMEOUT = 300.0  # seconds for a new worker to say it is ready
FIRST_TASK_GRACE = 120.0  # extra seconds for a new worker's first task (CUDA, torch init)
STDERR_LINES = 40  # lines of the worker's stderr kept for error messages
EXIT_AFTER_ERROR = 70  # the worker's exit status after reporting an executor exception

_REPO_ROOT = Path(__file__).resolve().parent.parent

Note = Callable[[dict], None]
Executor = Callable[[dict, Note], dict]


# ---- the worker process ---------------------------------------------------------------


def resolve(spec: str) -> Executor:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name or "execute")


def serve(executor: Executor, inp=None, out=None) -> int:
    """The worker's loop: one task per input line, one result line each. Returns at EOF."""
    inp = inp or sys.stdin
    out = out or sys.stdout

    def send(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    send({"ready": True, "pid": os.getpid()})
    for line in inp:
        if not line.strip():
            continue
        try:
            task = json.loads(line)
            result = executor(task, lambda note: send({"note": note}))
        except BaseException as e:  # report, then exit: the process state may be broken
            send({"result": {"status": "run_error", "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc(limit=20)}})
            return EXIT_AFTER_ERROR
        send({"result": result})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m l2gen.worker")
    parser.add_argument("--executor", default=DEFAULT_EXECUTOR, help="module:function")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a segfault leaves a Python traceback in the stderr tail
    # The protocol gets a private copy of stdout; fd 1 (C printf, print) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        executor = resolve(args.executor)
    except Exception as e:
        protocol.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        protocol.flush()
        return 2
    code = serve(executor, sys.stdin, protocol)
    protocol.flush()
    if code:
        os._exit(code)  # skip interpreter teardown: CUDA may be in a broken state
    return code


# ---- the parent side ------------------------------------------------------------------


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class Worker:
    """A worker process that runs tasks one at a time, restarted after any failure.

    ``executor``: "module:function" run in the worker; ``pythonpath``: extra import paths
    for it (the l2gen checkout is always on the path); ``echo_stderr``: copy the worker's
    stderr to ours as it comes; ``first_task_grace``: seconds added to the timeout of a
    new worker's first task (CUDA context, torch import, cuBLAS shim load).
    """

    def __init__(self, executor: str = DEFAULT_EXECUTOR, *, timeout: float = DEFAULT_TIMEOUT,
                 pythonpath: list[str | Path] = (), echo_stderr: bool = False,
                 env: dict | None = None, first_task_grace: float = FIRST_TASK_GRACE):
        self.executor = executor
        self.timeout = timeout
        self.first_task_grace = first_task_grace
        self.pythonpath = [str(p) for p in pythonpath]
        self.echo_stderr = echo_stderr
        self.env = env
        self.restarts = 0  # workers started after the first
        self.started = 0
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self._stderr: collections.deque = collections.deque(maxlen=STDERR_LINES)
        self._stderr_thread: threading.Thread | None = None
        self._fresh = False

    # -- lifecycle --

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> dict | None:
        """Start a worker; returns None when it is ready, else a failed result."""
        env = dict(os.environ if self.env is None else self.env)
        paths = [str(_REPO_ROOT), *self.pythonpath]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        self._lines = queue.Queue()
        self._stderr = collections.deque(maxlen=STDERR_LINES)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "l2gen.worker", "--executor", self.executor],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, env=env, start_new_session=True,
        )
        if self.started:
            self.restarts += 1
        self.started += 1
        threading.Thread(target=self._read_stdout, args=(self._proc, self._lines),
                         daemon=True).start()
        self._stderr_thread = threading.Thread(
            target=self._read_stderr, args=(self._proc, self._stderr), daemon=True)
        self._stderr_thread.start()
        msg = self._next(STARTUP_TIMEOUT)
        if msg is None or not msg.get("ready"):
            if msg is None:
                why = f"not ready within {STARTUP_TIMEOUT:.0f} s"
            elif "eof" in msg:
                self._settle()
                why = f"it exited ({_describe_exit(self._proc.poll())})"
            else:
                why = msg.get("error") or "unexpected first message"
            return self._fail("run_error", f"worker failed to start: {why}")
        self._fresh = True
        return None

    def close(self) -> None:
        """Ask the worker to stop (EOF), then kill it if it does not."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=10)
        except Exception:
            self._kill(proc)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running tasks --

    def run(self, task: dict, timeout: float | None = None) -> dict:
        """Run one task; always returns a result dict (``status`` says how it went).

        A failed result carries ``last_note`` (the worker's last note, or None) so the
        caller can tell which part of the task was running.
        """
        if not self.alive():
            self._proc = None
            failure = self.start()
            if failure:
                return failure
        timeout = self.timeout if timeout is None else timeout
        if self._fresh:
            timeout += self.first_task_grace
            self._fresh = False
        try:
            self._proc.stdin.write(json.dumps(task) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._fail("run_error", "worker died before taking the task")
        deadline = time.monotonic() + timeout
        last_note = None
        while True:
            msg = self._next(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return self._fail("timeout", f"no result within {timeout:.0f} s; worker "
                                  "killed", last_note)
            if "eof" in msg:
                self._settle()
                return self._fail("run_error", None, last_note)
            if "note" in msg:
                last_note = msg["note"]
            elif "result" in msg:
                result = msg["result"]
                if result.get("status") == "run_error" and "traceback" in result:
                    self._reap()  # the worker exits after reporting an exception
                    result.setdefault("last_note", last_note)
                return result

    def _settle(self) -> None:
        """Give a worker that closed its stdout a moment to exit, so its status is known."""
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def _next(self, timeout: float) -> dict | None:
        """The next protocol message, or None after ``timeout`` seconds."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        return line

    def _fail(self, status: str, error: str | None, last_note: dict | None = None) -> dict:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._kill(proc)
        code = proc.poll() if proc is not None else None
        self._proc = None
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=2)  # let the last words of the worker arrive
        if error is None:
            error = f"worker died ({_describe_exit(code)})"
        tail = "\n".join(self._stderr)
        if tail:
            error += "\n--- worker stderr (tail) ---\n" + tail
        return {"status": status, "error": error, "last_note": last_note, "exit": code}

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill(proc)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own session
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    @staticmethod
    def _read_stdout(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for raw in proc.stdout:
            try:
                msg = json.loads(raw)
            except json.JSONDecodeError:
                continue  # not protocol: cannot happen with fd 1 redirected, but be safe
            if isinstance(msg, dict):
                lines.put(msg)
        lines.put({"eof": True})  # the process closed stdout: it exited (or is exiting)

    def _read_stderr(self, proc: subprocess.Popen, tail: collections.deque) -> None:
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))
            if self.echo_stderr:
                sys.stderr.write(line)


if __name__ == "__main__":
    sys.exit(main())
