"""Run one exercise's tests in a subprocess of its own: a timeout, its output capped, never a hang."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from kata.exercises import ROOT, Exercise
from kata.grader.results import ExerciseResult, classify, missing_result, skipped_result

DEFAULT_TIMEOUT = 30.0  # seconds per exercise (01-05 take about one); 06 gets GPU_FACTOR times as long
GPU_FACTOR = 10  # Triton compiles many kernels on a GPU (about 80 s on an H200) or interprets them
OUTPUT_CAP = 16_000  # characters of pytest's own output kept, for a crash with no other clue
_LIVE: set[subprocess.Popen] = set()  # test processes running now, ended on Ctrl-C


def timeout_for(exercise: Exercise, timeout: float) -> float:
    return timeout * (GPU_FACTOR if exercise.needs_gpu else 1)


def triton_missing() -> str | None:
    """Why Triton cannot run here, or None when it can be imported."""
    if importlib.util.find_spec("triton") is not None:
        return None
    return "Triton needs Linux" if not sys.platform.startswith("linux") else "Triton is not installed"


def run_exercise(exercise: Exercise, target: Path, timeout: float = DEFAULT_TIMEOUT) -> ExerciseResult:
    """Run `exercise`'s test file against `target`'s file and classify what happened."""
    path = target / exercise.filename
    for needed in (exercise.test_file, path):
        if not needed.is_file():
            return missing_result(exercise, path, needed)
    if exercise.needs_gpu and (why := triton_missing()):
        return skipped_result(exercise, path, why)
    limit = timeout_for(exercise, timeout)
    with tempfile.TemporaryDirectory(prefix="kata-") as tmp:
        results = Path(tmp) / "results.jsonl"
        command = [sys.executable, "-m", "pytest", str(exercise.test_file), "--target", str(target),
                   "-p", "kata.grader.pytest_plugin", "--kata-results", str(results),
                   "-q", "--tb=no", "--show-capture=no", "-o", f"timeout={max(1, int(limit / 2))}"]
        start = time.monotonic()
        returncode, output, killed = _run(command, limit)
        seconds = time.monotonic() - start
        events = _read_events(results)
    return classify(exercise, path, events, returncode=returncode, killed_after=limit if killed else None,
                    seconds=seconds, output=output)


def run_many(exercises: list[Exercise], target: Path, timeout: float = DEFAULT_TIMEOUT, workers: int = 2,
             on_result: Callable[[ExerciseResult], None] | None = None) -> list[ExerciseResult]:
    """Run several exercises, `workers` at a time, the slowest started first; results in order."""
    order = sorted(exercises, key=lambda ex: not ex.needs_gpu)
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    futures = {ex.number: pool.submit(run_exercise, ex, target, timeout) for ex in order}
    results = []
    try:
        for ex in exercises:
            results.append(futures[ex.number].result())
            if on_result:
                on_result(results[-1])
    except BaseException:  # Ctrl-C: the test processes run in sessions of their own, so end them here
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(_LIVE):
            _kill(proc)
        raise
    pool.shutdown()
    return results


def _run(command: list[str], limit: float) -> tuple[int | None, str, bool]:
    """Run `command` in ROOT; return its exit code, its capped output, and whether it was killed."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8")
    env.pop("KATA_TARGET", None)  # the runner always names the target itself
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=hasattr(os, "killpg"))
    _LIVE.add(proc)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(proc.stdout, chunks), daemon=True)
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
    reader.join(timeout=5)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace"), killed


def _drain(stream, chunks: list[bytes]) -> None:
    """Read everything the process prints (so it never blocks on a full pipe), keep the first bytes."""
    kept = 0
    for chunk in iter(lambda: stream.read(65536), b""):
        if kept < OUTPUT_CAP:
            chunks.append(chunk[:OUTPUT_CAP - kept])
            kept += len(chunks[-1])
    stream.close()


def _kill(proc: subprocess.Popen) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: pytest and anything it started
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


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
