"""Start one exercise's pytest process: plain, or forked from a server that has imported torch once.

Importing torch takes one to two seconds, and each exercise that tests with torch paid it again in
its own process. multiprocessing's fork server imports torch (never Triton: the tests set
TRITON_INTERPRET before they import it, and triton.language's own @triton.jit functions, tl.cdiv
among them, read it as they are defined) and forks each test process from itself: a process of its
own as before, with its own session, output and exit code, started with torch already in memory.
Torch is imported but not used there, so no thread or GPU context is forked. Once the server is
up, the exercises whose tests need no torch are forked from it too: numpy and pytest are imported
there, a third of such a process's time.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from kata.exercises import ROOT

# What the test processes import, torch the slowest; a missing one is skipped. Autograd imports
# symbolic_shapes (and with it SymPy, 0.3 s) at the first backward given an output gradient.
PRELOAD = ["numpy", "pytest", "torch", "torch.fx.experimental.symbolic_shapes"]
# A test's tensors are small: a second thread in a test process buys nothing, and with a process per
# core each idle thread of torch's pool spins, taking a core from another test process (a tenth of a
# --solutions run's CPU time on 2 cores). A thread count the user set is kept.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
LOST = 255  # multiprocessing's exit code for a forked process whose status the fork server did not send
_START = threading.Lock()  # the runner's threads start processes one at a time
_UP = threading.Event()  # set once the fork server has forked its first process: its imports are done


def can_fork() -> bool:
    """A fork server needs fork: not on Windows."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def server_up() -> bool:
    """Whether the fork server has done its imports: from then on a process that needs no torch starts
    faster forked too (numpy and pytest are imported there), not only one that needs it."""
    return _UP.is_set()


def start(args: list[str], env: dict[str, str], out: int, forked: bool):
    """Start `python -m pytest ARGS` in ROOT with `env` (and ONE_THREAD where `env` sets no thread
    count), its output into the file descriptor `out`.
    Returns what the runner waits on and kills: a subprocess.Popen, or a Forked of the same shape."""
    env = {**ONE_THREAD, **env}
    if not forked:
        return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, start_new_session=hasattr(os, "killpg"))
    context = multiprocessing.get_context("forkserver")
    writer = Connection(os.dup(out), readable=False)  # sent to the forked process with the call
    status, status_writer = context.Pipe(duplex=False)
    process = context.Process(target=_pytest_main, args=(args, env, writer, status_writer), name="kata-pytest")
    try:
        with _START:
            # torch sizes its thread pool as it loads, in the server, which starts with this process's
            # environment: the thread count goes there, and stays (other threads copy os.environ
            # meanwhile; one that saw a name vanish between its keys and their values would fail).
            for name in ONE_THREAD:
                os.environ.setdefault(name, env[name])
            context.set_forkserver_preload(PRELOAD)  # read when the first start starts the server
            process.start()
    except (EOFError, OSError):  # the server died importing (a broken install): the test process says how
        status.close()
        return start(args, env, out, forked=False)
    finally:
        writer.close()
        status_writer.close()  # the forked process holds the only writer: its end is the status's end
    _UP.set()
    return Forked(process, status)


class Forked:
    """A forked test process, with the part of subprocess.Popen's interface the runner uses.

    multiprocessing reads a forked process's exit status from the fork server, and where it cannot
    (the server gone meanwhile) it says LOST at once, the process maybe still running: a correct
    solution's trial was rejected so ("error (pytest exit 255): 56 passed"). Then the code is the one
    the process sent through `status` as its last act, waited for within the same timeout; a process
    that ends without sending one (killed, os._exit in a test) keeps LOST."""

    def __init__(self, process: multiprocessing.Process, status: Connection):
        self.process, self.pid, self.status = process, process.pid, status
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        self.process.join(timeout)
        code = self.process.exitcode  # negative for a signal, as Popen's
        if code is None:
            raise subprocess.TimeoutExpired("pytest", timeout)
        if code == LOST:
            if not self.status.poll(None if deadline is None else max(0.0, deadline - time.monotonic())):
                raise subprocess.TimeoutExpired("pytest", timeout)
            with contextlib.suppress(EOFError):
                code = self.status.recv()
        self.status.close()
        self.returncode = code
        return code

    def kill(self) -> None:
        self.process.kill()


def _pytest_main(args: list[str], env: dict[str, str], writer: Connection, status: Connection) -> None:
    """In the forked process: become what `python -m pytest ARGS` started by Popen would be."""
    gc.freeze()  # what the server imported is never garbage: pytest's collections at exit skip it
    os.setsid()  # a session of its own: a timeout ends pytest and whatever it started, as with Popen
    os.set_inheritable(status.fileno(), False)  # what the tests start by exec must not hold it open
    for fd in (1, 2):
        os.dup2(writer.fileno(), fd)
    writer.close()
    # New streams on the new descriptors, as Python makes them at start-up with PYTHONIOENCODING=utf-8.
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = env.get("PYTHONDONTWRITEBYTECODE") == "1"  # read only at start, too
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))  # as `python -m` puts the working folder first
    import pytest
    try:
        code = int(pytest.main(args))
    finally:
        atexit._run_exitfuncs()  # a forked process ends with os._exit: run what a normal exit runs
    # The code goes last, once what an exit waits for is done: the threads a test left, the output.
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    sys.stdout.flush()
    sys.stderr.flush()
    status.send(code)
    sys.exit(code)
