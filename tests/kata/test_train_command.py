"""`python grader.py train`: exercise 15's GPT trained on the CPU at a tiny size, as a learner runs it."""
import os
import signal
import subprocess
import sys

import pytest

from kata.exercises import ROOT
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
    assert "the loss of every token" in lines[0], "the CPU's default loss is every token's"
    assert lines[2].split() == ["step", "loss", "tokens/s", "accuracy"]
    for step, line in zip((1, 2), lines[3:5]):
        fields = line.split()
        assert fields[0] == str(step) and float(fields[1]) > 0 and fields[3].endswith("%"), line
    assert lines[5].startswith("Done: 2 steps, loss ") and "(chance 12.5%)" in lines[5], lines[5]


@pytest.mark.parametrize("loss", ["answers", "all"])
def test_the_loss_asked_for_is_the_one_trained_and_named(loss):
    """--loss answers trains on the answers' targets alone (at long contexts every token's drowns them),
    all on every token's, the CPU's default; the header says which."""
    done = train(*TINY, "--pack", "--loss", loss)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    said = "the loss of the answers alone" if loss == "answers" else "the loss of every token"
    assert said in done.stdout.splitlines()[0]


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
