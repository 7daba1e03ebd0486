"""Verdicts as a learner reads them: the failed check comes first, and the same code gets the same counts."""
import json
import re
import subprocess
import sys

import pytest

from kata.exercises import ROOT, find
from kata.dev.mutants import load_mutants
from kata.dev.trial import parse_args, run_tests


def graded(tmp_path, number: str, mutant: str, *args: str) -> subprocess.CompletedProcess:
    """`python grader.py NN --target DIR` on the named mutant of exercise NN."""
    exercise = find(number)
    source = next(m for m in load_mutants(exercise) if m.name == mutant).source()
    (tmp_path / exercise.filename).write_text(source, encoding="utf-8")
    return subprocess.run([sys.executable, "grader.py", number, "--target", str(tmp_path), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_modified_input_is_named_before_any_expected_value(tmp_path):
    """`x -= m` in safe_softmax: an oracle computed from the modified x would show a false expected value."""
    out = graded(tmp_path, "01", "shift_in_place").stdout
    first = out.split("FAILED ", 1)[1]
    assert first.splitlines()[1].endswith("x was modified in place"), out
    assert "expected:" not in first.split("\n\n")[0], out


def test_the_same_wrong_solution_gets_the_same_counts_every_run(tmp_path):
    """Inputs drawn from a seed fixed per test: a wrong 02 passes the same tests on every run."""
    counts = {json.loads(graded(tmp_path, "02", "l_not_rescaled", "--json").stdout)["exercises"][0]["passed"]
              for _ in range(3)}
    assert len(counts) == 1, f"passed counts differ between runs: {sorted(counts)}"


def test_a_failed_trial_names_its_failing_tests_and_their_seeds():
    """A correct alternative rejected on fresh seeds: pytest's last line alone named neither the test nor the seed."""
    exercise = find("02")
    source = next(m for m in load_mutants(exercise) if m.name == "l_not_rescaled").source()
    outcome = run_tests(exercise, source, timeout=120, fresh_seeds=True)
    assert outcome.verdict == "failed", outcome
    assert re.search(r"; first failure: test_\w+\[?.*\(seed \d+: rerun with KATA_SEED=\d+\)$", outcome.summary), \
        outcome.summary


def test_the_dev_commands_name_an_exercise_that_does_not_exist():
    """`python -m kata.dev.mutants 99` said LookupError in a traceback: it should say what to choose."""
    with pytest.raises(SystemExit, match="no exercise '99': choose one of 01, .*13"):
        parse_args(["99"], "usage")
    assert parse_args(["3", "--fresh-seeds"], "usage") == ([find("03")], True)


def test_the_compile_check_runs_as_a_script_where_it_cannot_fork():
    """Without fork the compile check runs `python tests/gpu_compile.py`, whose path starts at tests/:
    its imports of the kata failed there, and every verdict with them."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_compile.py")], input="[]", capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "[]", done.stderr[-2000:]
