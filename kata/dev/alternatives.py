"""Prove the tests are fair: every correct solution written in another style must pass, in time.

An alternative, alternatives/NN_name/style.py, solves an exercise differently from solutions/ (a
loop where the solution is vectorised, another loop order the lesson allows, a conversion at the
top, ...). It holds only the definitions that differ, spliced by name into the solution
(kata.dev.splice), and its docstring's first line says how it differs.

    python -m kata.dev.alternatives                  # every exercise
    python -m kata.dev.alternatives 02 03            # some
    python -m kata.dev.alternatives --fresh-seeds    # on new random inputs

Each must pass its exercise's tests within a third of the time the grader gives the exercise, so
that a learner's correct solution on a slower machine is never reported as too slow.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from kata.dev.splice import splice
from kata.exercises import ROOT, SOLUTIONS_DIR, Exercise
from kata.grader.runner import DEFAULT_TIMEOUT, interpreted_timeout
from kata.dev.trial import parse_args, run_tests, trials

ALTERNATIVES_DIR = ROOT / "alternatives"


@dataclass(frozen=True)
class Alternative:
    exercise: Exercise
    path: Path

    @property
    def style(self) -> str:
        doc = ast.get_docstring(ast.parse(self.path.read_text(encoding="utf-8"))) or ""
        return doc.splitlines()[0] if doc else "(no docstring)"

    def source(self) -> str:
        """The exercise file this alternative makes: the solution with its definitions spliced in."""
        solution = (SOLUTIONS_DIR / self.exercise.filename).read_text(encoding="utf-8")
        return splice(solution, self.path.read_text(encoding="utf-8"), str(self.path.relative_to(ROOT)))

    @property
    def budget(self) -> float:
        """Seconds it may take: a third of the grader's limit for the exercise in the interpreter, counted
        as the grader counts a forked run's (the fork server's imports are no trial's time)."""
        return interpreted_timeout(self.exercise, DEFAULT_TIMEOUT) / 3


def load_alternatives(exercise: Exercise) -> list[Alternative]:
    folder = ALTERNATIVES_DIR / exercise.stem
    return [Alternative(exercise, path) for path in sorted(folder.glob("*.py"))]


def main(argv: list[str]) -> int:
    exercises, fresh = parse_args(argv, __doc__)
    alternatives = [alt for ex in exercises for alt in load_alternatives(ex)]
    for alt in alternatives:
        alt.source()  # one that no longer splices is an error before anything runs

    def run(alt: Alternative):
        return alt, run_tests(alt.exercise, alt.source(), alt.budget, fresh_seeds=fresh)

    rejected = 0
    with trials() as pool:
        for alt, outcome in pool.map(run, alternatives):
            ok = outcome.verdict == "passed" and outcome.seconds <= alt.budget
            rejected += not ok
            verdict = "accepted" if ok else f"REJECTED ({outcome.verdict}: {outcome.summary})"
            print(f"{alt.exercise.number} {alt.path.stem:<28} {verdict:<10} {outcome.seconds:5.1f}s "
                  f"of {alt.budget:.0f}  {alt.style}", flush=True)
    accepted = len(alternatives) - rejected
    print(f"alternatives: {accepted} of {len(alternatives)} accepted" + (f", {rejected} rejected" if rejected else "")
          + (" (fresh seeds)" if fresh else ""))
    return 1 if rejected or not alternatives else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
