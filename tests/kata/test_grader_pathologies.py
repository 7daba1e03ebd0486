"""The grader survives whatever a learner's file does, and still reports every other exercise."""
import json

import pytest
from grader_repo import SOLUTION, grader, make_repo, snapshot, stub_plus, write_fake

from kata.exercises import EXERCISES

SKIPPING_TEST = '''import pytest


def test_answer(ex):
    assert ex.answer() == 42


@pytest.mark.skip(reason="no CUDA GPU")
def test_on_the_gpu(ex):
    assert False
'''


@pytest.fixture(scope="module")
def broken_at_import(tmp_path_factory):
    """Six learner files that each break at import in their own way, graded in one run."""
    root = make_repo(tmp_path_factory.mktemp("kata"), real=(), fake={
        "01": stub_plus("def (:"),
        "02": stub_plus("while True:\n    pass"),
        "03": stub_plus("import sys\nsys.exit(3)"),
        "04": stub_plus("import os\nos._exit(7)"),
        "05": stub_plus("print('x' * 5_000_000)"),
        "07": stub_plus("import no_such_module"),
    })
    before = snapshot(root / "exercises")
    done = grader(root, "--json", "--timeout", "3")
    return root, before, done


def by_number(done):
    return {e["number"]: e for e in json.loads(done.stdout)["exercises"]}


def test_each_import_pathology_is_named_and_located(broken_at_import):
    """A learner's crash must not take the grader down, nor hide the other exercises' rows."""
    _, _, done = broken_at_import
    assert done.returncode == 1, done.stderr
    rows = by_number(done)
    assert [rows[n]["status"] for n in ("01", "02", "03", "04", "05", "07")] == [
        "crashed", "timed out", "crashed", "crashed", "not started", "crashed"]
    assert rows["01"]["first_failure"]["message"].startswith("SyntaxError")
    last_line = stub_plus("x").count("\n")
    assert rows["01"]["first_failure"]["location"] == f"exercises/01_safe_softmax.py:{last_line}"
    assert rows["02"]["first_failure"]["message"].startswith("too slow: ")
    assert rows["02"]["first_failure"]["location"].startswith("exercises/02_online_softmax.py:")
    assert "sys.exit(3)" in rows["03"]["first_failure"]["message"]
    assert "died (exit code 7)" in rows["04"]["first_failure"]["message"]
    assert "No module named 'no_such_module'" in rows["07"]["first_failure"]["message"]


def test_megabytes_of_printing_are_cut(broken_at_import):
    """5 MB printed by the learner: the grader's output stays small, with a note of the cut."""
    root, _, done = broken_at_import
    assert len(done.stdout) < 20_000
    detail = grader(root, "05")
    assert "more characters cut" in detail.stdout and len(detail.stdout) < 5_000


def test_grading_writes_nothing_into_exercises(broken_at_import):
    """Not even __pycache__: only `reset` writes there."""
    root, before, _ = broken_at_import
    assert snapshot(root / "exercises") == before


def test_failures_at_run_time_are_reported_in_one_screen(tmp_path):
    """An exception at import, an endless loop in a function, a wrong answer, a stub, a pass, GPU skips;
    with two exercises whose tests import torch, the test processes are forked from the fork server,
    those of the others too once it is up."""
    root = make_repo(tmp_path, real=(), fake={
        "01": stub_plus("raise RuntimeError('boom at import')"),
        "02": SOLUTION.replace("return 42", "while True:\n        pass"),
        "03": SOLUTION,
        "04": SOLUTION.replace("return 42", "return 41"),
        "05": None,
        "07": SOLUTION,
    })
    write_fake(root, "11", SOLUTION, test=SKIPPING_TEST)
    done = grader(root, "--timeout", "3")
    out = done.stdout
    assert done.returncode == 1 and "Traceback" not in out + done.stderr, out + done.stderr
    rows = {line[:2]: " ".join(line.split()[2:]) for line in out.splitlines() if line[:2].isdigit()}
    for number, words in {"01": "crashed -", "02": "timed out -", "03": "passed 2/2", "04": "failing 1/2",
                          "05": "not started -", "07": "passed 2/2", "11": "passed 1/1"}.items():
        assert rows[number].startswith(words), out
    assert "1 skipped: no CUDA GPU" in rows["11"]
    assert f"]  3 of {len(EXERCISES)} exercises passed" in out
    assert "Next: 01 safe_softmax, softmax without overflow (crashed)\n  open exercises/01_safe_softmax.py" in out
    assert "RuntimeError: boom at import" in out
    assert "python grader.py hint 01" in out
    assert max(map(len, out.splitlines())) <= 80 and len(out.splitlines()) <= 30, out
    detail = grader(root, "04")
    assert "answer() returned 41, expected 42" in detail.stdout
    assert "at exercises/04_tiled_attention.py:" not in detail.stdout  # the test asserted, not the learner


ONE_THREAD_TEST = '''import os

import torch


def test_answer(ex):
    assert ex.answer() == 42
    assert (os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()) == ("1", 1)
'''


def test_test_processes_run_one_thread_each(tmp_path):
    """torch sizes its thread pool when it loads, in the fork server: a server started without the
    test processes' OMP_NUM_THREADS gives each forked test a thread per core, spinning against the
    other test processes."""
    root = make_repo(tmp_path, real=(), fake={})
    for number in ("07", "11"):  # two whose tests import torch: both forked from the server
        write_fake(root, number, SOLUTION, test=ONE_THREAD_TEST)
    done = grader(root, "--json", "--timeout", "20")
    statuses = {number: by_number(done)[number]["status"] for number in ("07", "11")}
    assert statuses == {"07": "passed", "11": "passed"}, done.stdout + done.stderr
