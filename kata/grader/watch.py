"""`python grader.py --watch`: re-run the current exercise whenever a file in the target is saved."""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from kata.grader.commands import remember
from kata.exercises import EXERCISES
from kata.grader.report import details
from kata.grader.results import SKIPPED, display_path
from kata.grader.runner import run_exercise

POLL_SECONDS = 1.0  # polling mtimes works everywhere: containers, WSL, network drives


def watch(target: Path, timeout: float, max_runs: int | None = None, poll: float = POLL_SECONDS) -> int:
    """Run until every exercise passes, Ctrl-C, or (for tests) `max_runs` rounds of runs."""
    try:
        current, runs = _advance(target, timeout, 0), 1
        stamps = _stamps(target)
        while current is not None and (max_runs is None or runs < max_runs):
            time.sleep(poll)
            if (new := _stamps(target)) == stamps:
                continue
            # An edit to an exercise already passed is checked again from there.
            changed = [i for i, ex in enumerate(EXERCISES) if new.get(ex.filename) != stamps.get(ex.filename)]
            current = min(changed + [current])
            stamps, runs = new, runs + 1
            print(f"\n--- {datetime.now():%H:%M:%S} a file changed: running {EXERCISES[current].number} ---")
            current = _advance(target, timeout, current)
    except KeyboardInterrupt:
        print("\nStopped watching.")
        return 0
    return 0 if current is None else 1


def _advance(target: Path, timeout: float, start: int) -> int | None:
    """Run exercises from `start` until one does not pass; print it and return its index."""
    for index in range(start, len(EXERCISES)):
        result = run_exercise(EXERCISES[index], target, timeout)
        remember([result], target)
        if result.ok or result.status == SKIPPED:
            print(f"{result.exercise.number} {result.exercise.name}: {result.status}"
                  + (f" ({result.note})" if result.note else "") + ("; moving on" if index + 1 < len(EXERCISES) else ""))
            continue
        print(details(result))
        print(f"\nWatching {display_path(target)}/ for changes: save {display_path(result.path)} to run it again "
              f"(Ctrl-C to stop).", flush=True)
        return index
    print("Every exercise that can run here passes. Well done!")
    return None


def _stamps(target: Path) -> dict[str, tuple[int, int]]:
    stamps = {}
    for path in target.glob("*.py"):
        try:
            stat = path.stat()
        except OSError:  # saved by rename, caught between the two steps
            continue
        stamps[path.name] = (stat.st_mtime_ns, stat.st_size)
    return stamps
