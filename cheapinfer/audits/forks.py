"""The processes of a fault run: each runs ``pytest`` with one fault active, forked from a server that has torch,
transformers and the suite loaded; :func:`halt` stops them all (SIGTERM, Ctrl-C of ``python -m cheapinfer faults``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

#: Modules a pytest of a fault run imports anyway: loaded once into the fork server its runs start from.
_PRELOAD = ["torch", "transformers", "scipy.stats", "numpy", "pytest", "hypothesis", "pytest_benchmark.plugin", "cheapinfer.faults.catalogue"]
_forks = None


def _fork_context():
    """A ``forkserver`` context whose server has imported :data:`_PRELOAD` (None where there is no fork).

    A fault run then starts from a process that has torch, transformers and the suite loaded, instead
    of importing them again (about 3 s of each run). The server itself never runs a tensor operation,
    so nothing of a thread pool is inherited: each run sets its own torch threads.
    """
    global _forks
    import multiprocessing

    if _forks is None and "forkserver" in multiprocessing.get_all_start_methods():
        _socket_directory()
        _forks = multiprocessing.get_context("forkserver")
        _forks.set_forkserver_preload(_PRELOAD)
    return _forks


#: The longest path a Unix socket binds to (its sun_path holds 104 bytes on macOS and the BSDs, 108 on Linux, with the
#: final NUL), and what multiprocessing appends to its temporary directory for the fork server's socket.
_SOCKET_PATH_MAX, _SOCKET_SUFFIX = 103, len("/pymp-xxxxxxxx/listener-xxxxxxxx")


def _socket_directory() -> None:
    """Make multiprocessing's temporary directory, which holds the fork server's socket, where the socket's path fits.

    multiprocessing makes it under ``TMPDIR``; under a long one (a test's temporary directory, a deep home) the
    server's bind fails ("AF_UNIX path too long") and every fault run with it (Python 3.11 to 3.13.0 have no
    fallback of their own). There it is made under /tmp instead, and removed at exit as multiprocessing removes its own; the fault runs'
    own files stay under ``TMPDIR``."""
    import os
    import tempfile
    from multiprocessing import util

    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_SUFFIX <= _SOCKET_PATH_MAX or not os.access("/tmp", os.W_OK | os.X_OK):
        return
    saved, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        util.get_temp_dir()  # made now, under /tmp, and kept for the process by multiprocessing
    finally:
        tempfile.tempdir = saved


#: What an xdist worker puts in its environment: a pytest started from it (a child run of the suite) would
#: take itself for a worker too, and pytest-benchmark would then time nothing.
_XDIST_PREFIX = "PYTEST_XDIST_"


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` (default: this process's) for a child pytest run, a session of its own: without the
    variables of the xdist worker this process may be (the suite's own checks run under ``pytest -n 2 tests``)."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith(_XDIST_PREFIX)}


def _pytest_child(args: list[str], root: str, threads: int | None, log: str, env: dict[str, str] | None = None) -> None:
    """Run ``pytest args`` in this (forked) process, output to ``log``, with ``env`` (default: the server's own); its exit
    status is the process's."""
    import os
    import sys

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 3
    try:
        kept = child_environment(env)  # a session of its own, whoever forked the server
        os.environ.clear()
        os.environ.update(kept)
        if threads:
            import torch

            os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
            torch.set_num_threads(threads)  # the OpenMP runtime read its variable when the server loaded torch
        os.chdir(root)
        # tqdm (transformers' loading bars) would make a multiprocessing lock, which this child, ending with
        # os._exit, could never release: the fork server's resource tracker would warn of it at the end.
        import threading

        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
        import pytest

        code = int(pytest.main(args))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Halted(Exception):
    """The runner was stopped (:func:`halt`): no fault run starts, the running ones were killed."""


#: The pytest processes of the fault runs now running, and whether the runner was stopped.
_live: set = set()
_live_lock = threading.Lock()
_halted = threading.Event()


def clear_halt() -> None:
    """Let fault runs start again (a new ``run`` after a halted one)."""
    _halted.clear()


def halt() -> None:
    """Stop the runner: no fault run starts any more, and every running one is killed (SIGKILL)."""
    with _live_lock:
        _halted.set()
        for child in list(_live):
            child.kill()


def _started(start: Callable[[], Any]) -> Any:
    """``start()`` a fault run's process and track it, unless the runner was stopped (then :class:`Halted`)."""
    with _live_lock:
        if _halted.is_set():
            raise Halted()
        child = start()
        _live.add(child)
        return child


def _ended(child: Any) -> None:
    with _live_lock:
        _live.discard(child)
    if _halted.is_set():  # killed by halt(): what it left is no result
        raise Halted()


def pytest_run(args: list[str], root: Path, threads: int | None, timeout: float, log: Path,
               env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """``python -m pytest args`` in ``root``: (exit status, or None on timeout; the output's last line).

    The process is tracked while it runs: :func:`halt` kills it. On any exception here (SIGTERM in the
    thread that waits for it) it is killed before the exception goes on.
    """
    import subprocess
    import sys

    ctx = _fork_context()
    if ctx is None:  # no fork here: a fresh interpreter per run
        env = {**child_environment(env), **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})}
        proc = _started(lambda: subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=root, stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True, env=env))
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None, ""
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            _ended(proc)
        return proc.returncode, ((out + err).strip().splitlines() or ["no output"])[-1]

    def start():
        child = ctx.Process(target=_pytest_child, args=(args, str(root), threads, str(log), env), daemon=True)
        child.start()
        return child

    child = _started(start)
    try:
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            return None, ""
    except BaseException:
        child.kill()
        child.join()
        raise
    finally:
        _ended(child)
    try:
        tail = (log.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["no output"])[-1]
    except OSError:
        tail = "no output"
    return child.exitcode, tail
