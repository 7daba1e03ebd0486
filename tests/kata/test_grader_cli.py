"""The grader's flags and commands, each run as a learner runs it, on a copy of the kata."""
import json
import re
import shutil

import pytest
from grader_repo import SOLUTION, grader, make_repo, snapshot, write_fake

from kata.exercises import format_numbers, numbers_where
from kata.gpu import triton_missing


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A copy with the real 01 (untouched stub) and a solved made-up 05; shared by read-only tests."""
    root = make_repo(tmp_path_factory.mktemp("kata"), real=("01",), fake={"05": SOLUTION})
    (root / "kata" / "tools" / "io_report.py").write_text("def table(module):\n    return f'IO TABLE of {module.answer()}'\n")
    (root / "kata" / "bench" / "main.py").write_text(
        "def main(target_dir, argv, passes):\n    print('BENCH', target_dir.name, argv)\n    return 0\n")
    (root / "kata" / "tools" / "schedule_view.py").write_text("def show(module, **sizes):\n    return f'SCHEDULE {sizes}', True\n")
    return root


@pytest.mark.parametrize("args, words", [
    (["99"], "no exercise '99'"), (["hint", "42"], "no exercise '42'"), (["reset"], "reset which exercise"),
    (["solution"], "needs one exercise"), (["01", "02"], "one exercise at a time"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"), (["--timeout", "soon"], "invalid float"),
    (["--show", "04", "six"], "not 'six'"), (["--show", "05"], "--show draws"),
    (["--target", "no/such/folder"], "does not exist"), (["--watch", "03"], "take no exercise"),
    (["--json", "hint", "01"], "--json is for the report"), (["doctor", "03"], "doctor takes no exercise"),
    (["reset", "01", "--all"], "not both"),
], ids=["unknown-number", "unknown-hint", "reset-nothing", "solution-nothing", "two-exercises", "bad-flag",
        "bad-timeout", "bad-show-size", "show-not-04", "missing-target", "watch-with-exercise", "json-hint",
        "doctor-with-exercise", "reset-both"])
def test_mistakes_exit_2_with_a_clear_message(repo, args, words):
    done = grader(repo, *args)
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_one_exercise_by_number_or_name(repo):
    """`01`, `1` and `safe_softmax` name the same exercise; its untouched stub points at the first function."""
    outs = [grader(repo, key) for key in ("01", "1", "safe_softmax")]
    assert all(o.returncode == 1 for o in outs)
    assert outs[0].stdout.startswith("01 safe_softmax: not started, no test run: the file is untouched")
    assert "The first function to write:" in outs[0].stdout
    assert "at exercises/01_safe_softmax.py:37 in safe_softmax" in outs[0].stdout
    assert outs[1].stdout == outs[2].stdout == outs[0].stdout


def test_a_started_file_whose_functions_all_raise_is_run(tmp_path):
    """One character changed is no longer the stub: the tests run, and say how many there are."""
    root = make_repo(tmp_path, real=("01",))
    learner = root / "exercises" / "01_safe_softmax.py"
    learner.write_text(learner.read_text() + "# my notes\n")
    done = grader(root, "01")
    assert done.stdout.startswith("01 safe_softmax: not started, 0 of 54 tests pass"), done.stdout
    assert "54 tests not started, the first:" in done.stdout


def test_targets_solutions_dir_and_env(repo, tmp_path):
    """--solutions, --target DIR and KATA_TARGET choose the files graded; exercises/ is not touched."""
    before = snapshot(repo / "exercises")
    assert grader(repo, "01", "--solutions").returncode == 0
    shutil.copy2(repo / "solutions" / "01_safe_softmax.py", tmp_path / "01_safe_softmax.py")
    assert grader(repo, "01", "--target", str(tmp_path)).returncode == 0
    done = grader(repo, "01", env={"KATA_TARGET": str(tmp_path)})
    assert done.returncode == 0 and "passed, 54 of 54" in done.stdout
    assert snapshot(repo / "exercises") == before


def test_json_report(repo):
    done = grader(repo, "--json", "--solutions")
    data = json.loads(done.stdout)
    rows = {e["number"]: e for e in data["exercises"]}
    assert rows["01"]["status"] == "passed" and rows["01"]["passed"] == rows["01"]["total"] == 54
    assert rows["02"]["status"] == "missing" and data["ok"] is False and done.returncode == 1
    assert set(rows["01"]) >= {"status", "passed", "total", "seconds", "first_failure"}
    stub = json.loads(grader(repo, "01", "--json").stdout)["exercises"][0]
    assert stub["status"] == "not started"
    assert stub["first_failure"]["message"].startswith("not started: safe_softmax")
    assert stub["first_failure"]["location"].startswith("exercises/01_safe_softmax.py:")


def test_io_table_follows_a_pass_of_05(repo):
    assert "IO TABLE of 42" in grader(repo, "05").stdout


def test_show_draws_the_learners_schedule(repo):
    write_fake(repo, "04", SOLUTION)
    done = grader(repo, "--show", "04", "5", "7", "--no-causal")
    assert done.returncode == 0
    assert "SCHEDULE {'n_q': 5, 'n_k': 7, 'causal': False}" in done.stdout


def test_bench_is_handed_the_target_and_its_flags(repo):
    done = grader(repo, "--bench", "--solutions", "--sizes", "128")
    assert done.returncode == 0 and "BENCH solutions ['--sizes', '128']" in done.stdout


def test_doctor_names_versions_and_runs_a_kernel(repo):
    """With TRITON_INTERPRET=1 exported, as Triton's tutorials say: doctor says how the kernels run and
    what became of the variable (honoured on the CPU, overridden on a GPU), and runs a kernel so.
    Without Triton: no kernel, and the Triton exercises named as skipped."""
    done = grader(repo, "doctor", timeout=200, env={"TRITON_INTERPRET": "1"})
    for word in ("Python", "numpy", "torch", "triton", "platform", "GPU"):
        assert word in done.stdout, done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    if triton_missing():
        skipped = f"{format_numbers(numbers_where('needs_gpu'))} are skipped"
        assert skipped in done.stdout and "Triton kernel" not in done.stdout, done.stdout
        return
    mode = next(line for line in done.stdout.splitlines() if line.startswith("Triton mode"))
    assert re.search(r"(on the CPU: .* is honoured|compiled on the GPU: .* is overridden)", mode), mode
    assert re.search(r"Triton kernel +a tiny kernel, (in Triton's interpreter on the CPU|compiled on the GPU): works",
                     done.stdout), done.stdout
