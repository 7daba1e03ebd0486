"""The kata's code passes pyflakes' checks (through ruff): no undefined name, no unused import.

A name the code uses but never defines (a dropped `import math`) raises only when that line runs,
which for a benchmark column may be never on the machine that tests it.
"""
import subprocess
import sys

from kata.exercises import ROOT


def test_no_undefined_names_or_unused_imports():
    # exercises/ is the learner's, half-written on purpose; CI lints its stubs with `ruff check .`
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "--exclude", "exercises", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff found problems (fix them, or run `ruff check --fix .`):\n{done.stdout}{done.stderr}"
