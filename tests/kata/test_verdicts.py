"""Verdicts as a learner reads them: the failed check comes first, and the same code gets the same counts."""
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hbm_helpers import check_closed_forms
from kata.exercises import EXERCISES, EXERCISES_DIR, ROOT, SOLUTIONS_DIR, find
from kata.dev import mutants
from kata.dev.mutants import load_mutants, run_one
from kata.dev.trial import Outcome, parse_args, run_tests
from kata.gpu import triton_missing
from kata.grader import cache
from kata.grader.report import as_json, details, table
from kata.grader.results import classify


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
    with pytest.raises(SystemExit, match=f"no exercise '99': choose one of 01, .*{EXERCISES[-1].number}"):
        parse_args(["99"], "usage")
    assert parse_args(["3", "--fresh-seeds"], "usage") == ([find("03")], True)


def test_the_compile_check_runs_as_a_script_where_it_cannot_fork():
    """Without fork the compile check runs `python tests/gpu_compile.py`, whose path starts at tests/:
    its imports of the kata failed there, and every verdict with them."""
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu_compile.py")], input="[]", capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "[]", done.stderr[-2000:]


@pytest.mark.skipif(bool(triton_missing()), reason=f"{triton_missing()}: 09's tests skip")
def test_a_helper_the_code_does_without_leaves_its_rule_not_checked_not_failed(tmp_path):
    """A 09 whose kernels walk their tiles without _dkdv_tiles (here: under another name) failed with
    an AttributeError from the spy: it passes, with the stage rule reported not checked and why."""
    exercise = find("09")
    source = (SOLUTIONS_DIR / exercise.filename).read_text(encoding="utf-8").replace("_dkdv_tiles", "_dkdv_walk")
    (tmp_path / exercise.filename).write_text(source, encoding="utf-8")
    results = tmp_path / "results.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", str(exercise.test_file), "--target", str(tmp_path), "-q",
                           "-k", "only_tiles", "-p", "kata.grader.pytest_plugin", "--kata-results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stdout, done.stdout[-3000:]
    assert "1 rule not checked (their tests pass)" in done.stdout, done.stdout[-3000:]
    events = [json.loads(line) for line in results.read_text().splitlines()]
    tests = [e for e in events if e["event"] == "test"]
    assert tests and all(t["outcome"] == "passed" for t in tests), tests
    result = classify(exercise, tmp_path / exercise.filename, events, returncode=0, killed_after=None, seconds=1.0,
                      output="")
    assert result.ok and result.note == "1 rule not checked", result.note
    assert "your file has no _dkdv_tiles" in details(result), details(result)
    assert "_dkdv_tiles" in json.loads(as_json([result], "x"))["exercises"][0]["not_checked"][0]


def test_a_mutant_hidden_from_its_rule_must_pass_with_the_rule_reported():
    """A two-pass 02 behind np.asarray passes, as correct code behind np.asarray does: the mutants
    check asks that its rule be reported not checked, where it would have asked for a failure."""
    mutant = next(m for m in load_mutants(find("02")) if m.name == "two_passes_after_asarray")
    assert mutant.not_checked
    assert run_one(mutant)[1] == "not checked"


@pytest.mark.parametrize("fresh, verdict", [
    (["failed"], "killed"),  # the test that killed it on the fixed inputs kills it on fresh ones
    (["passed", "failed"], "killed"),  # that test no longer does, another in the file does
    (["passed", "passed"], "SURVIVED"),  # killed on the fixed inputs alone: a kill by luck
], ids=["same-test", "another-test", "luck"])
def test_both_seeds_holds_a_kill_to_fresh_inputs(monkeypatch, fresh, verdict):
    """--both-seeds runs the test that killed a mutant on the fixed inputs again on fresh ones, then the
    whole file only if that test passes there; a mutant no fresh run kills has survived."""
    calls = []

    def scripted(exercise, source, timeout, first_failure=False, fresh_seeds=False, only=None):
        calls.append((fresh_seeds, only))
        result = "failed" if not fresh_seeds else fresh[len(calls) - 2]
        return Outcome(result, 1.0, "", failed_test="test_rows[n1]" if result == "failed" else None)

    monkeypatch.setattr(mutants, "run_tests", scripted)
    mutant = load_mutants(find("01"))[0]
    assert mutants.run_one(mutant, both_seeds=True)[1:] == (verdict, float(len(calls)))
    assert calls[:2] == [(False, None), (True, "test_rows[n1]")] and calls[2:] in ([], [(True, None)])


def test_numbers_in_messages_print_as_a_learner_writes_them():
    """A closed form returning NumPy ints printed as (np.int64(3), np.int64(4)) in its message."""
    ex = SimpleNamespace(flash_io=lambda *args, causal: (np.int64(3), np.int64(4)))
    with pytest.raises(AssertionError) as failure:
        check_closed_forms(ex, {"flash_io": (3, 5)}, 8, 2, 4, 4, False)
    assert "expected (reads, writes) = (3, 5), got (3, 4)" in str(failure.value), str(failure.value)


def test_a_cached_result_says_when_it_ran_not_how_long_it_took(tmp_path, monkeypatch):
    """A verdict read from the cache showed the first run's seconds as if this run had measured them,
    also when this same grader had stored it (--watch, a file saved back to bytes it had before)."""
    monkeypatch.setattr(cache, "CACHE_DIR", tmp_path)
    exercise = find("01")
    events = [{"event": "test", "nodeid": "t.py::a", "outcome": "passed"}, {"event": "finish", "exitstatus": 0}]
    fresh = classify(exercise, Path("exercises") / exercise.filename, events, returncode=0, killed_after=None,
                     seconds=12.5, output="")
    assert not fresh.cached and "12.5 s" in details(fresh) and "12.5s" in table([fresh])
    cache.store(fresh, EXERCISES_DIR, "key")
    cached = cache.load(exercise, EXERCISES_DIR, "key")
    assert cached.cached and "12.5" not in details(cached) + table([cached])
    assert re.search(r"passed, 1 of 1 tests pass, cached from \d{4}-\d\d-\d\d \d\d:\d\d", details(cached))


@pytest.mark.skipif(bool(triton_missing()), reason=f"{triton_missing()}: 10's tests skip")
def test_the_grader_counts_the_tests_pytest_counts(tmp_path):
    """The grader left out the tests of given code (they pass on a stub): "31 of 31" where pytest said
    "45 passed" for the same file. Skipped tests are named apart by both."""
    exercise = find("10")
    (tmp_path / exercise.filename).write_bytes((SOLUTIONS_DIR / exercise.filename).read_bytes())
    ran = subprocess.run([sys.executable, "-m", "pytest", str(exercise.test_file), "--target", str(tmp_path), "-q"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    passed = re.search(r"(\d+) passed", ran.stdout.strip().splitlines()[-1])
    graded = json.loads(subprocess.run([sys.executable, "grader.py", "10", "--target", str(tmp_path), "--json"],
                                       cwd=ROOT, capture_output=True, text=True, timeout=300).stdout)
    row = graded["exercises"][0]
    assert passed and row["passed"] == row["total"] == int(passed.group(1)), (ran.stdout[-500:], row)


OOM = ("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 3.00 GiB "
       "is free. Process 3700 has 28.32 GiB memory in use. Of the allocated memory 8.40 GiB is allocated by PyTorch")


def test_a_gpu_out_of_memory_is_one_line_that_says_the_card_is_shared(tmp_path):
    """pytest -n 8 on one 80 GB card: one worker's tensors ran another's test out of memory, and the
    learner read a 40-line traceback ending in torch's allocator advice as a bug in their kernel."""
    pytest.importorskip("torch")
    exercise = find("01")
    source = (SOLUTIONS_DIR / exercise.filename).read_text(encoding="utf-8")
    (tmp_path / exercise.filename).write_text(
        source + f"\n\ndef safe_softmax(x):\n    import torch\n    raise torch.cuda.OutOfMemoryError({OOM!r})\n",
        encoding="utf-8")
    ran = subprocess.run([sys.executable, "-m", "pytest", str(exercise.test_file), "--target", str(tmp_path), "-q",
                          "-x", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    report = subprocess.run([sys.executable, "grader.py", "01", "--target", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120).stdout
    line = ("the GPU ran out of memory (CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity "
            "of 79.18 GiB of which 3.00 GiB is free). Other processes on the card hold memory too")
    for out in (ran.stdout, report):
        assert line in " ".join(out.split()) and "Traceback" not in out and "Process 3700" not in out, out[-3000:]


def test_a_skip_that_mentions_memory_stays_a_skip(tmp_path):
    """The out-of-memory line replaced every report's text where the error said so, a skip's too: pytest
    -rs then stopped with an INTERNALERROR, as its summary reads a skip's text as a tuple."""
    exercise = find("01")
    source = (SOLUTIONS_DIR / exercise.filename).read_text(encoding="utf-8")
    (tmp_path / exercise.filename).write_text(
        source + "\n\ndef safe_softmax(x):\n    import pytest\n    pytest.skip('the GPU is out of memory')\n",
        encoding="utf-8")
    ran = subprocess.run([sys.executable, "-m", "pytest", str(exercise.test_file), "--target", str(tmp_path), "-q",
                          "-rs", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "INTERNALERROR" not in ran.stdout + ran.stderr and " skipped" in ran.stdout, ran.stdout[-3000:]
