"""``python -m <module> <args>`` for the harness tests, started from a fork server instead of a fresh interpreter.

Most of the suite's end-to-end tests run pytest or the ``cheapinfer`` commands in another process and read
their exit code and output. A fresh interpreter spends seconds importing torch, transformers and pytest
before it reaches the code under test; over some sixty such runs that was most of ``tests/``. The server
here has imported them once (nothing of the suite: a module that reads the environment at import time
reads the run's own), and each run is a fork of it with the run's environment, working directory,
``sys.argv`` and output files. What a run does is unchanged: ``runpy`` runs the module as ``__main__``,
its ``SystemExit`` is the exit code, an exception is a traceback on stderr and exit 1.

Runs that test signals, process groups or the interpreter itself keep :func:`subprocess.run`.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cheapinfer.audits.launch import child_environment

#: Imported once by the server. Nothing of cheapinfer: its modules read environment variables at import.
PRELOAD = ["torch", "transformers", "numpy", "scipy.stats", "pytest", "hypothesis", "pytest_benchmark.plugin", "matplotlib.pyplot"]
_ctx = None


def _context():
    global _ctx
    if _ctx is None:
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return None
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload(PRELOAD)
    return _ctx


def _child(module: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str, stdin: str | None) -> None:
    import runpy
    import traceback

    code = 1
    try:
        for fd, path in ((1, out), (2, err)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        f = os.open(stdin or os.devnull, os.O_RDONLY)
        os.dup2(f, 0)
        os.close(f)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = [module, *args]
        # as `python -m` puts the working directory first, then PYTHONPATH's entries
        sys.path[0:0] = [cwd, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        import threading

        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())  # a multiprocessing lock would outlive this process (os._exit)
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else (print(e.code, file=sys.stderr) or 1))
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def python_m(module: str, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None, timeout: float | None = 300,
             input: str | None = None) -> subprocess.CompletedProcess:
    """Like ``subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)``, from the fork server."""
    ctx = _context()
    argv = [sys.executable, "-m", module, *args]
    env = child_environment(env)  # a session of its own, under pytest -n too
    if ctx is None:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)
    with tempfile.TemporaryDirectory(prefix="harness-") as tmp:
        out, err, stdin = Path(tmp, "out"), Path(tmp, "err"), None
        if input is not None:
            stdin = Path(tmp, "in")
            stdin.write_text(input)
        p = ctx.Process(target=_child, args=(module, list(args), str(Path(cwd or os.getcwd()).resolve()), env,
                                             str(out), str(err), None if stdin is None else str(stdin)))
        p.start()
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(errors="replace"), err.read_text(errors="replace"))
        return subprocess.CompletedProcess(argv, p.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace"))
