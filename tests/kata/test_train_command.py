"""`python grader.py train`: exercise 15's GPT trained on the CPU at a tiny size, as a learner runs it."""
import os
import shutil
import signal
import subprocess
import sys

import pytest

from kata.exercises import ROOT, SOLUTIONS_DIR, find
from kata.gpu import triton_missing

pytest.importorskip("torch", reason="skipped: training needs PyTorch")
if missing := triton_missing():
    pytest.skip(f"skipped: {missing}", allow_module_level=True)
TINY = ["--context", "16", "--batch", "2", "--embd", "16", "--steps", "2", "--every", "1"]


def train(*args):
    return subprocess.run([sys.executable, "grader.py", "--solutions", "train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("pack", [False, True], ids=["rows", "packed"])
def test_progress_each_step_then_the_final_numbers(pack):
    """A header, one line a step (step, loss, tokens/s, accuracy), then Done with the final numbers."""
    done = train(*TINY, *(["--pack"] if pack else []))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Training a GPT (1 layer, 2 heads, width 16,") and ("packed in one row" in lines[0]) == pack
    assert "the loss of the answers alone" in lines[0], "the default loss is the answers'"
    rows = f"solutions/{find('14').filename}, the reference's"
    kernels = f"packed rows on solutions/{find('13').filename}, the reference's; the accuracy's rows on {rows}"
    assert lines[1] == f"The kernels: {kernels if pack else rows}.", lines[1]
    assert lines[3].split() == ["step", "loss", "tokens/s", "accuracy"]
    for step, line in zip((1, 2), lines[4:6]):
        fields = line.split()
        assert fields[0] == str(step) and float(fields[1]) > 0 and fields[3].endswith("%"), line
    assert lines[6].startswith("Done: 2 steps, loss ") and "(chance 12.5%)" in lines[6], lines[6]


@pytest.mark.parametrize("loss", ["answers", "all"])
def test_the_loss_asked_for_is_the_one_trained_and_named(loss):
    """--loss answers (the default) trains on the answers' targets alone (every token's drowns them), all
    on every token's; the header says which."""
    done = train(*TINY, "--pack", "--loss", loss)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    said = "the loss of the answers alone" if loss == "answers" else "the loss of every token"
    assert said in done.stdout.splitlines()[0]


# Appended to a copy of solutions' 14: its flash_attention says when it runs.
SAYS_WHEN_IT_RUNS = """
import sys as _sys
_counted = flash_attention


def flash_attention(*args, **kwargs):
    print("the copy's flash_attention ran", file=_sys.stderr)
    return _counted(*args, **kwargs)
"""


@pytest.mark.parametrize("passing", [{"14"}, set()], ids=["14 passes", "14 not passing"])
def test_training_runs_on_your_kernels_once_they_pass(tmp_path, passing):
    """The learner's own 14 trains the model once its tests pass, the reference's until then, and the
    header says which (the bug: 15 always ran on the reference's kernels, whatever the learner's did)."""
    for number in ("13", "14", "15"):
        shutil.copy(SOLUTIONS_DIR / find(number).filename, tmp_path)
    with open(tmp_path / find("14").filename, "a", encoding="utf-8") as f:
        f.write(SAYS_WHEN_IT_RUNS)
    code = ("import sys; from pathlib import Path; from kata.tools.train import main; "
            f"sys.exit(main(Path(sys.argv[1]), sys.argv[2:], {passing!r}.__contains__))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), *TINY], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout.splitlines()[1]
    ran = "the copy's flash_attention ran" in done.stderr
    name = find("14").filename
    if passing:
        assert ran and said == f"The kernels: {tmp_path.name}/{name}, yours (its tests pass).", said
    else:
        assert not ran and said == (f"The kernels: solutions/{name}, the reference's: yours does not pass its tests "
                                    "(python grader.py 14)."), said


@pytest.mark.parametrize("command", ["train", "--bench train"])
def test_the_grader_asks_whether_a_kernel_passes_as_it_is_now(monkeypatch, tmp_path, command):
    """grader.py train and --bench train run on the learner's 13 and 14 where their tests pass as the
    files are now: by the grader's cached result, else by running the tests (the bug: a pass cached under
    another --timeout, or in a folder the grader does not cache, was never found); never on a failure or
    an untouched stub."""
    from kata.bench import train as bench
    from kata.grader import commands
    from kata.grader.results import FAILING, NOT_STARTED, PASSED, ExerciseResult
    from kata.tools import train as tool
    known = {"13": None, "14": ExerciseResult(find("14"), tmp_path, PASSED), "12": None}
    ran = {"13": ExerciseResult(find("13"), tmp_path, PASSED), "12": ExerciseResult(find("12"), tmp_path, FAILING)}
    monkeypatch.setattr(commands, "known_result", lambda exercise, target, timeout: known[exercise.number])
    monkeypatch.setattr(commands, "run_tests", lambda exercise, target, timeout: ran.pop(exercise.number))
    answers = {}
    monkeypatch.setattr(tool if command == "train" else bench, "main",
                        lambda target, argv, passes: answers.update((n, passes(n)) for n in ("14", "13", "12")) or 0)

    def run():
        if command == "train":
            return commands.run_train(tmp_path, [], 30.0)
        return commands.run_bench(tmp_path, ["train"], 30.0)

    assert run() == 0
    assert answers == {"14": True, "13": True, "12": False}, "14 passed before; 13 and 12 run now, 12 failing"
    assert not ran, "each test file that had no result is run once"
    known.update({"13": ExerciseResult(find("13"), tmp_path, NOT_STARTED),
                  "14": ExerciseResult(find("14"), tmp_path, FAILING),
                  "12": ExerciseResult(find("12"), tmp_path, FAILING)})
    assert run() == 0
    assert (answers["13"], answers["14"]) == (False, False), "an untouched stub and a failure"


@pytest.mark.parametrize("pack", [False, True], ids=["rows", "packed"])
def test_a_run_asks_only_for_the_kernels_it_uses_and_never_in_solutions(tmp_path, pack):
    """Rows run 14's kernel (13's tests are not run for them); --pack 13's and 14's (the accuracy's
    rows); solutions/ is the reference itself, nothing asked."""
    from kata.tools.train import run_on_your_kernels
    asked = []
    assert run_on_your_kernels(tmp_path, lambda n: asked.append(n) and False, pack) == set()
    assert sorted(asked) == (["13", "14"] if pack else ["14"])
    assert run_on_your_kernels(SOLUTIONS_DIR, lambda n: pytest.fail(f"asked for {n}"), pack) == set()


def test_pack_refuses_dropout():
    done = train(*TINY, "--pack", "--dropout", "0.1")
    assert done.returncode == 2 and "13's kernel has none" in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_stops_cleanly_and_says_where():
    """SIGINT once the first step is reported: the run stops between steps, names the step, no traceback."""
    proc = subprocess.Popen([sys.executable, "grader.py", "--solutions", "train", *TINY[:-4], "--steps", "1000",
                             "--every", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.split()[:1] == ["1"]:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, "".join(seen) + out + err
    assert "Stopped at step " in out and " of 1000" in out, out


def test_without_triton_one_line(monkeypatch, capsys):
    """Where Triton cannot run, train says so in one line and exits 2, before loading anything."""
    import kata.gpu
    from kata.tools import train as command
    monkeypatch.setattr(kata.gpu, "triton_missing", lambda: "Triton is not installed")
    assert command.main(ROOT / "solutions", []) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "Training runs exercise 15's layer on Triton kernels: Triton is not installed.\n"
