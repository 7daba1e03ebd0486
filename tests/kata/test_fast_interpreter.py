"""tests/fast_interpreter.py changes the interpreter's speed, never its answers."""
import subprocess
import sys

import pytest

from kata.exercises import ROOT
from kata.gpu import triton_missing

if missing := triton_missing():
    pytest.skip(f"skipped: {missing}", allow_module_level=True)


def run_apart(script: str) -> None:
    """Run `script` in a Python of its own: TRITON_INTERPRET is read when Triton loads, and this
    process may have loaded it already. It prints "ok" when every assertion in it held."""
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


# Triton loaded for the interpreter, the fast interpreter imported but not yet installed: set here,
# not by triton_helpers, which leaves Triton compiled on a machine with a GPU.
INTERPRETER_NOT_INSTALLED = """
import os
import sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "tests")
from triton.language import core
import fast_interpreter
"""

OVERFLOWING_KERNEL = INTERPRETER_NOT_INSTALLED + """
import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

assert interpreter.interpreter_builder.options.sanitize_overflow  # Triton's default: the check to drop
fast_interpreter.install()
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
    run_apart(OVERFLOWING_KERNEL)


# A block type and a tensor of each shape, described by every attribute the interpreter reads,
# made by Triton's own constructors and then by the fast interpreter's; errors are described too.
SHAPES_BOTH_WAYS = INTERPRETER_NOT_INSTALLED + """
import triton.language as tl

SHAPES = [[16], [16, 32], [1, 1, 64, 128], [tl.constexpr(16), 8], core.tuple([4, 4]), [], [3], [2**21, 2**21],
          [16.0]]

def described(shape, dtype):
    try:
        block = core.block_type(dtype, shape)
        t = core.tensor(None, block)
    except Exception as err:
        return (type(err).__name__, str(err))
    return (block.name, block.numel, repr(block.shape), str(block.shape.type), str(block), block.element_ty,
            repr(t.shape), str(t.shape.type), repr(t.numel), t.dtype, t.type is block)

def all_described():
    return [described(s, dtype) for s in SHAPES for dtype in (tl.float32, tl.int1)]

before = all_described()
fast_interpreter.install()
after = all_described()
assert before == after, [(b, a) for b, a in zip(before, after) if b != a]
one, two = (core.tensor(None, core.block_type(tl.float32, [16, 32])) for _ in range(2))
assert one.shape is not two.shape and one.shape.values is not two.shape.values  # nothing shared to mutate
print("ok")
"""


def test_tensors_and_block_types_come_out_as_tritons_own_constructors_make_them():
    # The fast interpreter builds tl.tensor and tl.block_type from a cache per shape; a wrong entry
    # (a name, a numel, a shape's type) would change what a kernel computes or how an error reads.
    run_apart(SHAPES_BOTH_WAYS)


OTHER_CONSTRUCTOR = INTERPRETER_NOT_INSTALLED + """

own = core.block_type.__init__

def other(self, element_ty, shape):  # a later Triton's block_type, with an attribute of its own
    own(self, element_ty, shape)
    self.layout = "blocked"

core.block_type.__init__ = other
fast_interpreter.install()
assert core.block_type.__init__ is other, "replaced a constructor it does not reproduce"
assert core.block_type(core.float32, [16, 32]).layout == "blocked"
print("ok")
"""


def test_a_triton_whose_constructors_differ_keeps_its_own():
    # The cache reproduces the constructors of the Triton versions it was written for; another
    # version's could set what it does not, and its objects would then lack it.
    run_apart(OTHER_CONSTRUCTOR)
