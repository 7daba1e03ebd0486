"""The kata's code passes pyflakes' checks (through ruff): no undefined name, no unused import.

A name the code uses but never defines (a dropped `import math`) raises only when that line runs,
which for a benchmark column may be never on the machine that tests it.
"""
import subprocess
import sys

import pytest

from kata.dev.alternatives import load_alternatives
from kata.exercises import EXERCISES, ROOT

RUFF = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]


def test_no_undefined_names_or_unused_imports():
    # exercises/ is the learner's, half-written on purpose; CI lints its stubs with `ruff check .`
    done = subprocess.run([*RUFF, "--exclude", "exercises", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff found problems (fix them, or run `ruff check --fix .`):\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.stem)
def test_every_alternative_spliced_into_its_solution_lints_clean(ex):
    """An alternative calling a helper its solution no longer has, or importing what it never uses."""
    for alt in load_alternatives(ex):
        done = subprocess.run([*RUFF, "--stdin-filename", f"solutions/{ex.filename}", "-"], cwd=ROOT,
                              input=alt.source(), capture_output=True, text=True)
        assert done.returncode == 0, f"{alt.path.relative_to(ROOT)} spliced into its solution:\n{done.stdout}"
