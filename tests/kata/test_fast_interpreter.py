"""tests/fast_interpreter.py changes the interpreter's speed, never its answers."""
import subprocess
import sys

from kata.exercises import ROOT

# Run apart: TRITON_INTERPRET is read when Triton loads, and this process may have loaded it already.
OVERFLOWING_KERNEL = """
import sys
sys.path.insert(0, "tests")
import triton_helpers  # noqa: F401  (sets TRITON_INTERPRET=1 and installs the fast interpreter)
import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

options = interpreter.interpreter_builder.options
assert not options.debug and not options.sanitize_overflow, options

@triton.jit
def wrap(X, Y):
    x = tl.load(X + tl.arange(0, 4))
    tl.store(Y + tl.arange(0, 4), x * x + x - 7)

x = torch.tensor([2**20, -2**20, 46341, 3], dtype=torch.int32)
y = torch.empty_like(x)
wrap[(1,)](x, y)
wide = x.numpy().astype(np.int64)
expected = ((wide * wide + wide - 7 + 2**31) % 2**32 - 2**31).astype(np.int32)
assert (y.numpy() == expected).all(), (y, expected)
print("ok")
"""


def test_overflow_checks_are_dropped_only_where_no_assertion_could_fire_and_ints_still_wrap():
    # The interpreter's debug is off, so its 64-bit overflow check of each int32 op asserted
    # nothing; without it, int32 arithmetic must still wrap exactly as before.
    run = subprocess.run([sys.executable, "-c", OVERFLOWING_KERNEL], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
