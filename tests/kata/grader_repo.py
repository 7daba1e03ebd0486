"""Temporary copies of the kata for the grader's tests: the real CLI runs there, never in the checkout.

A copy holds the grader (grader.py, kata/, pytest.ini, tests/conftest.py and the tests' oracles) and
only the exercises a test asks for: the real 01, or small made-up exercises whose learner file is
whatever the test needs (a syntax error, an endless loop, ...). The checkout's other exercises are
never copied.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from kata.exercises import EXERCISES, ROOT

IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")

# A made-up exercise: one function to write, one test of it, one `given` test.
SOLUTION = '''"""A made-up exercise for the grader's tests."""


def answer() -> int:
    """The answer."""
    # TODO: return it.
    # BEGIN SOLUTION
    return 42
    # END SOLUTION
'''
TEST = '''import pytest


def test_answer(ex):
    """A wrong answer."""
    assert ex.answer() == 42, "answer() returned {}, expected 42".format(ex.answer())


@pytest.mark.given
def test_supplied_part(ex):
    """Code the kata supplies: passes on the stub, never counts as progress."""
    assert ex.__doc__
'''
HINTS = "## Hint 1\nWhat is six times seven?\n\n## Hint 2\nIt is 42.\n"


def make_repo(root: Path, real: tuple[str, ...] = ("01",), fake: dict[str, str | None] | None = None) -> Path:
    """A kata copy under `root` with the real exercises `real` and made-up ones `fake`.

    `fake` maps a number to the learner file's text (None: the untouched stub). Its solution,
    test file and hint file are the made-up exercise's.
    """
    for name in ("grader.py", "pytest.ini"):
        shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "kata", root / "kata", ignore=IGNORE)
    for folder in ("exercises", "solutions", "tests", "hints"):
        (root / folder).mkdir()
    for helper in (ROOT / "tests").glob("*.py"):  # conftest.py, and the oracles the exercise tests import
        if not helper.name.startswith("test_"):
            shutil.copy2(helper, root / "tests" / helper.name)
    for ex in EXERCISES:
        if ex.number in real:
            for folder, name in [("exercises", ex.filename), ("solutions", ex.filename),
                                 ("tests", f"test_{ex.filename}"), ("hints", f"{ex.stem}.md")]:
                shutil.copy2(ROOT / folder / name, root / folder / name)
        elif fake and ex.number in fake:
            write_fake(root, ex.number, fake[ex.number])
    return root


def write_fake(root: Path, number: str, learner: str | None = None, test: str = TEST) -> None:
    from kata.grader.stub import make_stub
    ex = next(e for e in EXERCISES if e.number == number)
    (root / "solutions" / ex.filename).write_text(SOLUTION)
    (root / "exercises" / ex.filename).write_text(make_stub(SOLUTION) if learner is None else learner)
    (root / "tests" / f"test_{ex.filename}").write_text(test)
    (root / "hints" / f"{ex.stem}.md").write_text(HINTS)


def stub_plus(line: str) -> str:
    """The made-up stub with one more line at the end of the module."""
    from kata.grader.stub import make_stub
    return make_stub(SOLUTION) + textwrap.dedent(line) + "\n"


def grader(root: Path, *args: str, stdin: str | None = None, timeout: float = 60,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python grader.py ARGS` in the copy, as a learner would (`env`: variables to add)."""
    # PYTHONDONTWRITEBYTECODE would hide a grader that leaves __pycache__ in exercises/, OMP_NUM_THREADS
    # one that leaves the test processes' thread count as it was
    unset = ("KATA_TARGET", "KATA_SEED", "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS")
    env = {**{k: v for k, v in os.environ.items() if k not in unset}, **(env or {})}
    return subprocess.run([sys.executable, "grader.py", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout, input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below `folder` with its bytes and mtime: proof that nothing was written."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(folder.rglob("*"))}
