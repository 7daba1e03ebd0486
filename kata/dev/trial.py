"""Run one exercise's tests against another version of its file (a mutant, an alternative)."""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kata.exercises import EXERCISES, Exercise, find
from kata.grader import launch
from kata.grader.pytest_plugin import NOT_CHECKED_HEADING
from kata.grader.runner import end_all, process_environment, run_pytest


@dataclass(frozen=True)
class Outcome:
    verdict: str  # "passed", "failed" (a test failed), "timeout", or "error (pytest exit N)"
    seconds: float
    summary: str  # pytest's last line, or what went wrong
    not_checked: int = 0  # rules the passing tests could not observe (the code did without their helpers)
    failed_test: str | None = None  # the first test that failed, as pytest names it: test_rows[n1]


def run_tests(exercise: Exercise, source: str, timeout: float, first_failure: bool = False,
              fresh_seeds: bool = False, only: str | None = None) -> Outcome:
    """Write `source` as the exercise's file in a folder of its own and run the exercise's tests on it
    (`only`: that one test, test_rows[n1]), forked from the grader's fork server where the system can
    fork: torch and pytest are imported once for all the trials. Its seconds are counted as the
    grader counts a forked run's, from the fork."""
    env = process_environment()
    env.pop("KATA_SEED", None)
    if fresh_seeds:
        env["KATA_FRESH_SEEDS"] = "1"
    else:
        env.pop("KATA_FRESH_SEEDS", None)
    with tempfile.TemporaryDirectory(prefix="kata-trial-") as tmp:
        # Each exercise file is self-contained and its tests load it alone.
        Path(tmp, exercise.filename).write_text(source, encoding="utf-8")
        tests = f"{exercise.test_file}::{only}" if only else str(exercise.test_file)
        args = [tests, "--target", tmp, "-q", "-p", "no:cacheprovider",
                *(["-x"] if first_failure else [])]
        returncode, output, killed, seconds = run_pytest(args, timeout, launch.can_fork(), env, cap=None)
    if killed:
        return Outcome("timeout", seconds, f"still running after {timeout:.0f} s")
    lines = output.strip().splitlines()
    # pytest's summary is its last line, or the last such: stderr shares the pipe, and a warning
    # printed at exit comes after it
    summary = next((line for line in reversed(lines) if SUMMARY.search(line)), output.strip()[-300:])
    # pytest exits 1 for failed tests and for errors alike; only a failed test counts as "failed".
    failed_test = None
    if returncode == 0:
        verdict = "passed"
    elif returncode == 1 and " failed" in summary:
        verdict = "failed"
        failed_test, seed = _first_failure(lines)
        summary += f"; first failure: {failed_test}" + (f" ({seed})" if seed else "") if failed_test else ""
    else:
        verdict = f"error (pytest exit {returncode})"
    unseen = NOT_CHECKED_HEADING.search(output)
    return Outcome(verdict, seconds, summary, int(unseen.group(1)) if unseen else 0, failed_test)


@contextlib.contextmanager
def trials():
    """A pool that runs trials one per core; on Ctrl-C the trials it has not started are dropped and
    those running are ended."""
    pool = ThreadPoolExecutor(os.cpu_count() or 2)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        end_all()
        raise
    pool.shutdown()


SUMMARY = re.compile(r" in \d+\.\d+s\b")  # pytest's "1 failed, 3 passed in 2.01s"
FAILURE_HEADER = re.compile(r"_{3,} (\S.*\S) _{3,}")  # pytest's "____ test_name ____" over each failure


def _first_failure(lines: list[str]) -> tuple[str | None, str | None]:
    """The first failed test and the line naming the seed that replays it, from pytest's report: on
    fresh seeds a failure is otherwise lost with the run."""
    headers = [(i, found.group(1)) for i, line in enumerate(lines) if (found := FAILURE_HEADER.fullmatch(line))]
    if not headers:
        return None, None
    (first, name), after = headers[0], headers[1:]
    section = lines[first:after[0][0] if after else None]
    return name, next((line.strip() for line in section if "rerun with KATA_SEED=" in line), None)


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
