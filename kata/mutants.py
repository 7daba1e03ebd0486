"""Prove the tests bite: every deliberately broken solution (mutant) must fail its exercise's tests.

A mutant is a solution with one bug, written as text replacements in mutants/NN_name.toml:

    [[mutant]]
    name = "no_max_subtraction"
    bug = "exp of raw scores overflows to inf/inf = NaN for scores near 1000"
    replace = [["np.exp(x - m)", "np.exp(x)"]]

Each `old` text must occur exactly once in the solution, so a mutant cannot silently go stale.

    python -m kata.mutants          # every exercise
    python -m kata.mutants 02 03    # some
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kata.exercises import EXERCISES, ROOT, SOLUTIONS_DIR, Exercise, find

MUTANTS_DIR = ROOT / "mutants"
TIMEOUT_S = 300


@dataclass(frozen=True)
class Mutant:
    exercise: Exercise
    name: str
    bug: str
    replace: tuple[tuple[str, str], ...]

    def source(self) -> str:
        text = (SOLUTIONS_DIR / self.exercise.filename).read_text(encoding="utf-8")
        for old, new in self.replace:
            count = text.count(old)
            if count != 1:
                raise ValueError(f"mutant {self.exercise.number}/{self.name}: {old!r} occurs {count} times "
                                 f"in solutions/{self.exercise.filename}, expected once")
            text = text.replace(old, new)
        compile(text, f"mutant {self.exercise.number}/{self.name}", "exec")  # must fail by behaviour, not syntax
        return text


def load_mutants(exercise: Exercise) -> list[Mutant]:
    path = MUTANTS_DIR / f"{exercise.stem}.toml"
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text(encoding="utf-8"))["mutant"]
    return [Mutant(exercise, e["name"], e["bug"], tuple(map(tuple, e["replace"]))) for e in entries]


def run_one(mutant: Mutant) -> tuple[Mutant, str, float]:
    """Run the exercise's tests against the mutant; 'killed' when a test fails."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kata-mutant-") as tmp:
        # Each exercise file is self-contained and its tests load it alone.
        Path(tmp, mutant.exercise.filename).write_text(mutant.source(), encoding="utf-8")
        cmd = [sys.executable, "-m", "pytest", str(mutant.exercise.test_file), "--target", tmp,
               "-x", "-q", "-p", "no:cacheprovider"]
        try:
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
            summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            # pytest exits 1 for failed tests and for errors alike; only a failed test kills a mutant.
            rc = "failed" if done.returncode == 1 and " failed" in summary else done.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    # A timeout proves nothing: a mutant that only runs slowly would count as killed.
    verdict = {0: "SURVIVED", "failed": "killed", "timeout": f"TIMEOUT ({TIMEOUT_S} s)"}.get(
        rc, f"error (pytest exit {rc})")
    return mutant, verdict, time.perf_counter() - start


def main(argv: list[str]) -> int:
    exercises = [find(a) for a in argv] if argv else EXERCISES
    mutants = [m for ex in exercises for m in load_mutants(ex)]
    for m in mutants:
        m.source()  # a stale mutant is an error before anything runs
    survivors = 0
    workers = os.cpu_count() or 2
    with ThreadPoolExecutor(workers) as pool:
        for mutant, verdict, seconds in pool.map(run_one, mutants):
            survivors += verdict != "killed"
            print(f"{mutant.exercise.number} {mutant.name:<32} {verdict:<18} {seconds:5.1f}s  {mutant.bug}",
                  flush=True)
    killed = len(mutants) - survivors
    print(f"mutants: {killed} of {len(mutants)} killed" + (f", {survivors} not killed" if survivors else ""))
    return 1 if survivors or not mutants else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
