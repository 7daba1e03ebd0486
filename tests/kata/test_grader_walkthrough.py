"""A learner walked end to end on a copy of the kata: report, hint, solve, solution, reset."""
import os
import shutil
import subprocess
import sys
import time

from grader_repo import grader, make_repo, snapshot

from kata.exercises import EXERCISES

FILE_01 = "exercises/01_safe_softmax.py"


def solve_01(root):
    shutil.copy2(root / "solutions" / "01_safe_softmax.py", root / FILE_01)


def test_a_learner_from_stubs_to_a_solution(tmp_path):
    """Stubs -> hint -> solve 01 -> report 1 passed pointing at 02 -> solution unlocked -> reset keeps a backup."""
    root = make_repo(tmp_path, real=("01",), fake={"02": None})
    first = grader(root)
    assert first.returncode == 1 and f"0 of {len(EXERCISES)} exercises passed" in first.stdout
    assert f"Next: 01 safe_softmax, softmax without overflow (not started)\n  open {FILE_01}" in first.stdout

    hint1, hint2 = grader(root, "hint", "01"), grader(root, "hint", "1")
    assert hint1.stdout.startswith("Hint 1 of 4 for 01") and "np.exp(1000.0)" in hint1.stdout
    assert hint2.stdout.startswith("Hint 2 of 4 for 01"), hint2.stdout
    locked = grader(root, "solution", "01")
    assert locked.returncode == 1 and "opens once" in locked.stdout and "BEGIN SOLUTION" not in locked.stdout
    forced = grader(root, "solution", "01", "--force")
    assert forced.returncode == 0 and "BEGIN SOLUTION" in forced.stdout and "warning" in forced.stderr

    solve_01(root)
    solved = grader(root)
    assert f"1 of {len(EXERCISES)} exercises passed" in solved.stdout, solved.stdout
    assert "(not started)\n  open exercises/02_online_softmax.py" in solved.stdout
    assert "python grader.py hint 02" in solved.stdout

    unlocked = grader(root, "solution", "safe_softmax")
    assert unlocked.returncode == 0 and "BEGIN SOLUTION" in unlocked.stdout

    solution = (root / FILE_01).read_text()
    reset = grader(root, "reset", "01", "--yes")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    backups = list((root / ".kata" / "backups").glob("01_safe_softmax.*.py"))
    assert len(backups) == 1 and backups[0].read_text() == solution
    assert str(backups[0].relative_to(root)) in reset.stdout
    assert "raise NotImplementedError" in (root / FILE_01).read_text()
    assert grader(root, "solution", "01").returncode == 0  # a pass once made is remembered


def test_hints_one_more_each_call_then_say_when_none_are_left(tmp_path):
    root = make_repo(tmp_path, real=(), fake={"03": None})
    outs = [grader(root, "hint", "03").stdout for _ in range(3)]
    assert outs[0].startswith("Hint 1 of 2") and "Another hint" in outs[0]
    assert outs[1].startswith("Hint 2 of 2") and "last hint" in outs[1]
    assert outs[2].startswith("No more hints for 03")
    every = grader(root, "hint", "03", "--all").stdout
    assert "Hint 1 of 2" in every and "Hint 2 of 2" in every


def test_reset_asks_and_no_answer_means_no(tmp_path):
    """No terminal to ask: nothing is reset, and the learner is told how to force it."""
    root = make_repo(tmp_path, real=("01",))
    solve_01(root)
    before = snapshot(root / "exercises")
    silent = grader(root, "reset", "01")
    assert silent.returncode == 1 and "--yes" in silent.stdout
    refused = grader(root, "reset", "01", stdin="n\n")
    assert refused.returncode == 1 and "Nothing reset" in refused.stdout
    assert snapshot(root / "exercises") == before
    assert grader(root, "reset", "01", stdin="y\n").returncode == 0
    assert "raise NotImplementedError" in (root / FILE_01).read_text()


def test_two_resets_in_the_same_second_keep_both_versions(tmp_path):
    root = make_repo(tmp_path, real=(), fake={"02": "first = 1\n"})
    assert grader(root, "reset", "--all", "--yes").returncode == 0
    (root / "exercises" / "02_online_softmax.py").write_text("second = 2\n")
    assert grader(root, "reset", "02", "--yes").returncode == 0
    kept = sorted(p.read_text() for p in (root / ".kata" / "backups").iterdir())
    assert kept == ["first = 1\n", "second = 2\n"]
    again = grader(root, "reset", "02", "--yes")
    assert again.returncode == 0 and "Nothing to reset" in again.stdout


def test_corrupt_progress_file_warns_once_and_carries_on(tmp_path):
    root = make_repo(tmp_path, real=(), fake={"02": None})
    (root / ".kata").mkdir()
    (root / ".kata" / "progress.json").write_text("{not json")
    first = grader(root, "hint", "02")
    assert first.returncode == 0 and first.stdout.startswith("Hint 1 of 2")
    assert "could not be read" in first.stderr and "Traceback" not in first.stderr
    second = grader(root, "hint", "02")
    assert second.stdout.startswith("Hint 2 of 2") and second.stderr == ""
    assert (root / ".kata" / "progress.json.unreadable").read_text() == "{not json"


def test_watch_reruns_on_save_and_moves_on_when_it_passes(tmp_path):
    root = make_repo(tmp_path, real=("01",), fake={"02": None})
    env = {k: v for k, v in os.environ.items() if k != "KATA_TARGET"}
    proc = subprocess.Popen([sys.executable, "grader.py", "--watch", "--max-runs", "2", "--poll", "0.2"], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # the first run ends by saying what it watches
        lines.append(line)
        if line.startswith("Watching"):
            break
    time.sleep(0.05)
    solve_01(root)
    os.utime(root / FILE_01)  # a save within the same mtime tick still counts
    rest, _ = proc.communicate(timeout=30)
    out = "".join(lines) + rest
    assert "01 safe_softmax: not started" in out
    assert "01 safe_softmax: passed; moving on" in out
    assert "02 online_softmax: not started" in out
    assert proc.returncode == 1  # stopped by --max-runs with 02 still to do
