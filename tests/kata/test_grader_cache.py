"""What the grader answers without running tests: an untouched stub, and a file tested before unchanged."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

from grader_repo import SOLUTION, TEST, grader, make_repo, write_fake

from kata.grader.stub import make_stub

# The made-up test, counting its runs in runs.txt at the top of the kata copy.
COUNTING_TEST = TEST.replace('''    """A wrong answer."""
''', '''    """A wrong answer."""
    with open(__import__("pathlib").Path(__file__).parents[1] / "runs.txt", "a") as runs:
        runs.write("run\\n")
''')
DYING_TEST = "import os\nos._exit(9)\n"  # a test file no run survives


def touch(path) -> None:
    """A change that changes nothing but the bytes."""
    path.write_text(path.read_text() + "\n")


def runs(root) -> int:
    path = root / "runs.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_an_untouched_stub_is_not_started_without_a_run(tmp_path):
    """A stub's tests are never run: its test file could not even be imported, and the verdict holds."""
    root = make_repo(tmp_path, real=())
    write_fake(root, "01", None, test=DYING_TEST)
    row = json.loads(grader(root, "01", "--json").stdout)["exercises"][0]
    line = make_stub(SOLUTION).splitlines().index('    raise NotImplementedError("answer: replace this line with '
                                                  'your code")') + 1
    assert row["status"] == "not started" and row["total"] == 0
    assert row["first_failure"] == {"test": None, "message": "not started: answer: replace this line with your code",
                                    "location": f"exercises/01_safe_softmax.py:{line}"}
    report = grader(root).stdout
    assert re.search(r"01 +safe_softmax +not started +- +-", report)
    assert (f"  open exercises/01_safe_softmax.py\n  not started: answer: replace this line with your code\n"
            f"  at exercises/01_safe_softmax.py:{line} in answer\n") in report


def test_an_unchanged_file_is_not_run_again(tmp_path):
    """Each thing a verdict depends on, changed, runs the tests again; nothing else does."""
    root = make_repo(tmp_path, real=())
    write_fake(root, "02", SOLUTION, test=COUNTING_TEST)
    learner = root / "exercises" / "02_online_softmax.py"
    first = grader(root, "02")
    assert "passed, 2 of 2 tests pass, " in first.stdout and runs(root) == 1
    again = grader(root, "02").stdout  # the same verdict, said to be the first run's, not timed again
    assert again.startswith("02 online_softmax: passed, 2 of 2 tests pass, cached from "), again
    assert grader(root).returncode == 1 and runs(root) == 1
    changes = [
        lambda: learner.write_text(SOLUTION.replace("42", "41")),
        lambda: learner.write_text(SOLUTION),
        lambda: touch(root / "tests" / "test_02_online_softmax.py"),
        lambda: touch(root / "tests" / "oracles.py"),
        lambda: touch(root / "kata" / "given" / "hbm.py"),
    ]
    for expected, change in enumerate(changes, start=2):
        change()
        grader(root, "02")
        assert runs(root) == expected, f"change {expected - 2} did not run the tests again"
    for flags, env in [(["--timeout", "20"], None), ([], {"KATA_SEED": "7"}), ([], {"TRITON_INTERPRET": "1"})]:
        grader(root, "02", *flags, env=env)
        grader(root, "02", *flags, env=env)
        assert runs(root) == expected + 1, f"{flags or env}: not run once"
        expected += 1
    assert "passed" in grader(root, "02", "--solutions").stdout and runs(root) == expected + 1  # another folder


def test_fresh_seeds_other_folders_and_timeouts_always_run(tmp_path):
    """New random inputs must meet the code; a folder other than the kata's may hold anything next time."""
    (tmp_path / "kata").mkdir()
    root = make_repo(tmp_path / "kata", real=())
    write_fake(root, "02", SOLUTION, test=COUNTING_TEST)
    other = tmp_path / "mine"
    shutil.copytree(root / "exercises", other)
    grader(root, "02")
    for _ in range(2):
        grader(root, "02", env={"KATA_FRESH_SEEDS": "1"})
        grader(root, "02", "--target", str(other))
    assert runs(root) == 5
    (root / "exercises" / "02_online_softmax.py").write_text(SOLUTION.replace("return 42", "while True:\n        pass"))
    for _ in range(2):
        assert "timed out" in grader(root, "02", "--timeout", "2").stdout  # a busy machine's verdict: not kept
    assert runs(root) == 7


def test_watch_checks_every_save_with_the_cache(tmp_path):
    """Wrong, right, wrong again: each save is graded as it is, whatever was kept from before."""
    root = make_repo(tmp_path, real=())
    wrong = SOLUTION.replace("42", "41")
    write_fake(root, "01", wrong)
    learner = root / "exercises" / "01_safe_softmax.py"
    grader(root, "01")  # the wrong answer's result is kept
    env = {k: v for k, v in os.environ.items() if k != "KATA_TARGET"}
    proc = subprocess.Popen([sys.executable, "grader.py", "--watch", "--max-runs", "3", "--poll", "0.2"], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    for text in (SOLUTION, wrong):
        out += until_watching(proc.stdout)
        time.sleep(0.3)  # past the watcher's look at the files after its run
        learner.write_text(text)
        os.utime(learner)
    rest, _ = proc.communicate(timeout=30)
    out = "".join(out) + rest
    assert out.count("01 safe_softmax: failing") == 2 and "01 safe_softmax: passed; moving on" in out, out
    assert out.index("passed; moving on") < out.rindex("01 safe_softmax: failing")


def until_watching(stream) -> list[str]:
    """The lines of one round of --watch: up to the one saying what it watches."""
    lines = []
    for line in stream:
        lines.append(line)
        if line.startswith("Watching"):
            break
    return lines
