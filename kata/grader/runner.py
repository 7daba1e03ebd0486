"""Run one exercise's tests in a process of its own: a timeout, its output capped, never a hang; or
answer without a run when the result is known (an untouched stub, an unchanged file)."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from kata.exercises import Exercise
from kata.gpu import has_nvidia_gpu, triton_missing
from kata.grader import cache, launch
from kata.grader.results import (TIMED_OUT, ExerciseResult, classify, missing_result, skipped_result,
                                 untouched_result)
from kata.grader.stub import stub_of

DEFAULT_TIMEOUT = 30.0  # seconds per exercise (01-05 take about one); a GPU stage's get a factor more
GPU_FACTOR = 10  # a GPU stage's tests interpret many kernels on a CPU (14's take about 10 s on two cores)
# On an NVIDIA GPU they compile every kernel variant instead, the autotuned ones once a config: 14's tests alone, in
# one process, Triton's cache empty, ran over 240 s on an H100. One test's limit stays half the interpreter's.
COMPILED_FACTOR = 30
OUTPUT_CAP = 16_000  # bytes of pytest's own output kept, for a crash with no other clue
_LIVE: set = set()  # test processes running now, ended on Ctrl-C


def default_workers() -> int:
    """The cores this process may use (a container's CPU set, where the system says), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def timeout_for(exercise: Exercise, timeout: float) -> float:
    """The seconds an exercise's tests may take in all, here."""
    if exercise.needs_gpu and has_nvidia_gpu():
        return timeout * COMPILED_FACTOR
    return interpreted_timeout(exercise, timeout)


def interpreted_timeout(exercise: Exercise, timeout: float) -> float:
    """The seconds an exercise's tests may take in all where Triton interprets the kernels (a CPU)."""
    return timeout * (GPU_FACTOR if exercise.needs_gpu else 1)


def per_test_timeout(exercise: Exercise, timeout: float) -> float:
    """The seconds one test may take: half of interpreted_timeout, on a GPU too."""
    return interpreted_timeout(exercise, timeout) / 2


def run_exercise(exercise: Exercise, target: Path, timeout: float = DEFAULT_TIMEOUT) -> ExerciseResult:
    """Run `exercise`'s test file against `target`'s file and classify what happened."""
    return known_result(exercise, target, timeout) or run_tests(exercise, target, timeout)


def run_tests(exercise: Exercise, target: Path, timeout: float = DEFAULT_TIMEOUT) -> ExerciseResult:
    """run_exercise where known_result has been asked already and had no answer."""
    return _run_tests(exercise, target, timeout, forked=False)


def known_result(exercise: Exercise, target: Path, timeout: float) -> ExerciseResult | None:
    """The result that needs no test run: a file missing, Triton missing, an untouched stub, a cached run."""
    path = target / exercise.filename
    for needed in (exercise.test_file, path):
        if not needed.is_file():
            return missing_result(exercise, path, needed)
    if exercise.needs_gpu and (why := triton_missing()):
        return skipped_result(exercise, path, why)
    learner, stub = path.read_bytes(), stub_of(exercise)
    # Without torch a torch exercise's tests skip: run them, so that the verdict says so.
    runnable = not exercise.needs_torch or importlib.util.find_spec("torch") is not None
    if stub and stub.todos and runnable and _text(learner) == stub.text:
        return untouched_result(exercise, path, stub)
    if cache.enabled(target):
        return cache.load(exercise, target, cache.key(exercise, target, timeout_for(exercise, timeout), learner))
    return None


def run_many(exercises: list[Exercise], target: Path, timeout: float = DEFAULT_TIMEOUT, workers: int = 2,
             on_result: Callable[[ExerciseResult], None] | None = None) -> list[ExerciseResult]:
    """Run several exercises, `workers` at a time, the slowest started first; results in order."""
    known = {ex.number: known_result(ex, target, timeout) for ex in exercises}
    to_run = [ex for ex in exercises if known[ex.number] is None]
    # The fork server imports torch once for all: worth it when more than one run would import it.
    forked = launch.can_fork() and sum(ex.tests_import_torch for ex in to_run) > 1
    # The slowest first: by the last run's time, else by a guess (a GPU stage, torch, the longest test file).
    order = sorted(to_run, key=lambda ex: (-cache.last_seconds(ex, target), not ex.needs_gpu, not ex.needs_torch,
                                           -ex.test_file.stat().st_size))
    if forked:  # the first to start starts the fork server: one whose tests import torch
        order.insert(0, order.pop(next(i for i, ex in enumerate(order) if ex.tests_import_torch)))
    futures = {ex.number: Future() for ex in order}
    lock = threading.Lock()

    def take() -> Exercise | None:
        """The slowest left, taken when a worker is free rather than in a fixed order; while the fork
        server imports torch for the first, the slowest that needs no torch. What is left of those
        once the server is up is quick, so it comes last and evens out the workers' ends."""
        with lock:
            if not order:
                return None
            # The first taken starts the fork server: until its imports are done, it waits for them.
            waiting = forked and len(order) < len(futures) and not launch.server_up()
            ex = next((ex for ex in order if not ex.tests_import_torch), order[0]) if waiting else order[0]
            order.remove(ex)
            return ex

    def work() -> None:
        while (ex := take()) is not None:
            try:
                futures[ex.number].set_result(_run_tests(ex, target, timeout, forked))
            except BaseException as error:  # noqa: BLE001 - raised where the result is read
                futures[ex.number].set_exception(error)

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    for _ in range(max(1, workers)):
        pool.submit(work)
    results = []
    try:
        for ex in exercises:
            results.append(known[ex.number] or futures[ex.number].result())
            if on_result:
                on_result(results[-1])
    except BaseException:
        with lock:
            order.clear()
        pool.shutdown(wait=False)
        end_all()
        raise
    pool.shutdown()
    return results


def _run_tests(exercise: Exercise, target: Path, timeout: float, forked: bool) -> ExerciseResult:
    """Run the tests in a process of their own, forked (when `forked`) if they import torch or the
    fork server is already up; keep the result when another run would give the same."""
    forked = forked and (exercise.tests_import_torch or launch.server_up())
    path, limit = target / exercise.filename, timeout_for(exercise, timeout)
    learner = path.read_bytes()
    with tempfile.TemporaryDirectory(prefix="kata-") as tmp:
        results = Path(tmp) / "results.jsonl"
        args = [str(exercise.test_file), "--target", str(target), "-p", "kata.grader.pytest_plugin",
                "--kata-results", str(results), "-q", "--tb=no", "--show-capture=no",
                "-o", f"timeout={max(1, int(per_test_timeout(exercise, timeout)))}"]
        returncode, output, killed, seconds = run_pytest(args, limit, forked, process_environment())
        events = _read_events(results)
    result = classify(exercise, path, events, returncode=returncode, killed_after=limit if killed else None,
                      seconds=seconds, output=output)
    # A timeout depends on how busy the machine was, a signal (the OOM killer, a kill) on more than
    # the code; a file saved during the run may not be the one tested.
    repeatable = result.status != TIMED_OUT and returncode is not None and returncode >= 0
    if cache.enabled(target) and repeatable and path.read_bytes() == learner:
        cache.store(result, target, cache.key(exercise, target, limit, learner))
    return result


def process_environment() -> dict[str, str]:
    """This process's environment as a test process gets it: no bytecode written beside an exercise
    file, no KATA_TARGET (the runner always names the target)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8")
    env.pop("KATA_TARGET", None)
    return env


def run_pytest(args: list[str], limit: float, forked: bool, env: dict[str, str],
               cap: int | None = OUTPUT_CAP) -> tuple[int | None, str, bool, float]:
    """Run `python -m pytest ARGS` in ROOT with `env`, forked from the fork server if `forked`; end it
    after `limit` seconds. Returns its exit code, its output (the first `cap` bytes; None: all),
    whether it was killed, and how many seconds it took."""
    read_fd, write_fd = os.pipe()
    stream = os.fdopen(read_fd, "rb")
    try:
        proc = launch.start(args, env, write_fd, forked)
    except BaseException:
        stream.close()
        raise
    finally:
        os.close(write_fd)  # the test process holds the only writer: its end is the end of the output
    start = time.monotonic()  # the fork server's imports, done once for all, are no exercise's time
    _LIVE.add(proc)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(stream, chunks, cap), daemon=True)
    reader.start()
    killed = False
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        killed = True
        _kill(proc)
    except BaseException:  # Ctrl-C in the grader: leave no test process behind
        _kill(proc)
        raise
    finally:
        _LIVE.discard(proc)
    seconds = time.monotonic() - start
    reader.join(timeout=5)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace"), killed, seconds


def _drain(stream, chunks: list[bytes], cap: int | None) -> None:
    """Read everything the process prints (so it never blocks on a full pipe), keep the first `cap` bytes."""
    kept = 0
    for chunk in iter(lambda: stream.read(65536), b""):
        if cap is None or kept < cap:
            chunks.append(chunk[:None if cap is None else cap - kept])
            kept += len(chunks[-1])
    stream.close()


def end_all() -> None:
    """End every test process still running (on Ctrl-C: each runs in a session of its own, which the
    terminal's interrupt does not reach)."""
    for proc in list(_LIVE):
        _kill(proc)


def _kill(proc) -> None:
    """End a test process (a Popen or a launch.Forked) and everything it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: pytest and anything it started
        except (AttributeError, ProcessLookupError):  # no killpg (Windows), or no group yet: forked a moment ago
            proc.kill()
    proc.wait()


def _text(learner: bytes) -> str:
    """A file's bytes as Path.read_text gives them: a stub checked out with Windows line ends is still the stub."""
    return learner.decode("utf-8", "replace").replace("\r\n", "\n")


def _read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return list(_parse_lines(path.read_text(encoding="utf-8", errors="replace").splitlines()))


def _parse_lines(lines: Iterable[str]):
    for line in lines:
        try:
            yield json.loads(line)
        except json.JSONDecodeError:  # the last line of a process killed mid-write
            continue
