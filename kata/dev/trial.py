"""Run one exercise's tests against another version of its file (a mutant, an alternative)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kata.exercises import EXERCISES, ROOT, Exercise, find


@dataclass(frozen=True)
class Outcome:
    verdict: str  # "passed", "failed" (a test failed), "timeout", or "error (pytest exit N)"
    seconds: float
    summary: str  # pytest's last line, or what went wrong


def run_tests(exercise: Exercise, source: str, timeout: float, first_failure: bool = False,
              fresh_seeds: bool = False) -> Outcome:
    """Write `source` as the exercise's file in a folder of its own and run the exercise's tests on it."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("KATA_SEED", None)
    env.pop("KATA_TARGET", None)
    if fresh_seeds:
        env["KATA_FRESH_SEEDS"] = "1"
    else:
        env.pop("KATA_FRESH_SEEDS", None)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kata-trial-") as tmp:
        # Each exercise file is self-contained and its tests load it alone.
        Path(tmp, exercise.filename).write_text(source, encoding="utf-8")
        cmd = [sys.executable, "-m", "pytest", str(exercise.test_file), "--target", tmp, "-q",
               "-p", "no:cacheprovider"] + (["-x"] if first_failure else [])
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Outcome("timeout", time.perf_counter() - start, f"still running after {timeout:.0f} s")
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else done.stderr.strip()[-300:]
    # pytest exits 1 for failed tests and for errors alike; only a failed test counts as "failed".
    if done.returncode == 0:
        verdict = "passed"
    elif done.returncode == 1 and " failed" in summary:
        verdict = "failed"
        summary += _first_failure(lines)
    else:
        verdict = f"error (pytest exit {done.returncode})"
    return Outcome(verdict, time.perf_counter() - start, summary)


FAILURE_HEADER = re.compile(r"_{3,} (\S.*\S) _{3,}")  # pytest's "____ test_name ____" over each failure


def _first_failure(lines: list[str]) -> str:
    """The first failed test and the seed that replays it, from pytest's report: on fresh seeds a
    failure is otherwise lost with the run."""
    headers = [(i, found.group(1)) for i, line in enumerate(lines) if (found := FAILURE_HEADER.fullmatch(line))]
    if not headers:
        return ""
    (first, name), after = headers[0], headers[1:]
    section = lines[first:after[0][0] if after else None]
    seed = next((line.strip() for line in section if "rerun with KATA_SEED=" in line), None)
    return f"; first failure: {name}" + (f" ({seed})" if seed else "")


def parse_args(argv: list[str], usage: str) -> tuple[list[Exercise], bool]:
    """The exercises named (every one when none is) and whether --fresh-seeds was given; -h or --help
    prints `usage` (the command's docstring) and exits, as do any other option and an exercise that
    does not exist, naming them."""
    if "-h" in argv or "--help" in argv:
        print(usage)
        raise SystemExit(0)
    if unknown := [a for a in argv if a.startswith("-") and a != "--fresh-seeds"]:
        raise SystemExit(f"unknown option {unknown[0]}: give exercise numbers and --fresh-seeds (--help says more)")
    try:
        exercises = [find(a) for a in argv if a != "--fresh-seeds"] or list(EXERCISES)
    except LookupError as err:
        raise SystemExit(str(err)) from None
    return exercises, "--fresh-seeds" in argv
