"""Prove the tests bite: every deliberately broken solution (mutant) must fail its exercise's tests.

A mutant is a solution with one bug, written as text replacements in mutants/NN_name.toml:

    [[mutant]]
    name = "no_max_subtraction"
    bug = "exp of raw scores overflows to inf/inf = NaN for scores near 1000"
    replace = [["np.exp(x - m)", "np.exp(x)"]]

Each `old` text must occur exactly once in the solution, so a mutant cannot silently go stale.
A bug seen only through a helper the stub defines, hidden by not using that helper, is marked
`not_checked = true`: the tests pass it, as they pass correct code of that structure, and must
report the rule not checked.

    python -m kata.dev.mutants                  # every exercise
    python -m kata.dev.mutants 02 03            # some
    python -m kata.dev.mutants --fresh-seeds    # on new random inputs
    python -m kata.dev.mutants --both-seeds     # the fixed inputs a learner meets, then new ones

--both-seeds runs each mutant on the fixed inputs, then the test that killed it on new ones, and
the whole file on new ones only where that test passes on them: a kill that holds on fresh inputs,
at the cost of one test.
"""
from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass

from kata.exercises import ROOT, SOLUTIONS_DIR, Exercise
from kata.dev.trial import parse_args, run_tests, trials

MUTANTS_DIR = ROOT / "mutants"
TIMEOUT_S = 300


@dataclass(frozen=True)
class Mutant:
    exercise: Exercise
    name: str
    bug: str
    replace: tuple[tuple[str, str], ...]
    not_checked: bool = False  # hidden from the check of its rule: passes, and must be reported not checked

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
    return [Mutant(exercise, e["name"], e["bug"], tuple(map(tuple, e["replace"])), e.get("not_checked", False))
            for e in entries]


def run_one(mutant: Mutant, fresh_seeds: bool = False, both_seeds: bool = False) -> tuple[Mutant, str, float]:
    """Run the exercise's tests against the mutant; 'killed' when a test fails, 'not checked' when a
    mutant marked so passes with its rule reported not checked. both_seeds: on the fixed inputs,
    then, where that holds, on fresh ones (see the module's docstring)."""
    source = mutant.source()
    outcome = run_tests(mutant.exercise, source, TIMEOUT_S, first_failure=True, fresh_seeds=fresh_seeds and not both_seeds)
    verdict, seconds = _verdict(mutant, outcome), outcome.seconds
    if both_seeds and verdict in ("killed", "not checked"):
        again = run_tests(mutant.exercise, source, TIMEOUT_S, first_failure=True, fresh_seeds=True,
                          only=outcome.failed_test)
        seconds += again.seconds
        if outcome.failed_test and again.verdict != "failed":  # that test kills it on the fixed inputs alone
            again = run_tests(mutant.exercise, source, TIMEOUT_S, first_failure=True, fresh_seeds=True)
            seconds += again.seconds
        verdict = _verdict(mutant, again)
    return mutant, verdict, seconds


def _verdict(mutant: Mutant, outcome) -> str:
    if mutant.not_checked and outcome.verdict == "passed" and outcome.not_checked:
        return "not checked"
    # A timeout proves nothing: a mutant that only runs slowly would count as killed.
    return {"passed": "SURVIVED", "failed": "killed", "timeout": f"TIMEOUT ({TIMEOUT_S} s)"}.get(
        outcome.verdict, outcome.verdict)


def main(argv: list[str]) -> int:
    both = "--both-seeds" in argv
    exercises, fresh = parse_args([a for a in argv if a != "--both-seeds"], __doc__)
    mutants = [m for ex in exercises for m in load_mutants(ex)]
    for m in mutants:
        m.source()  # a stale mutant is an error before anything runs
    verdicts = []
    with trials() as pool:
        for mutant, verdict, seconds in pool.map(lambda m: run_one(m, fresh, both), mutants):
            verdicts.append(verdict)
            print(f"{mutant.exercise.number} {mutant.name:<32} {verdict:<18} {seconds:5.1f}s  {mutant.bug}",
                  flush=True)
    killed, reported = verdicts.count("killed"), verdicts.count("not checked")
    survivors = len(mutants) - killed - reported
    print(f"mutants: {killed} of {len(mutants)} killed" + (f", {reported} reported not checked" if reported else "")
          + (f", {survivors} not killed" if survivors else "")
          + (" (fixed seeds, then fresh)" if both else " (fresh seeds)" if fresh else ""))
    return 1 if survivors or not mutants else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
