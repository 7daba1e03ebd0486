"""tests/bounds_check.py, as triton_helpers.call runs it: an interpreted kernel's access outside the
tensors it was given fails with the kernel, its line and the tensor named; nothing else does."""
import pytest

torch = pytest.importorskip("torch", reason="skipped: the interpreter's checks need PyTorch")
import bounds_check  # noqa: E402
from triton_helpers import INTERPRETED, call  # noqa: E402  sets TRITON_INTERPRET before Triton loads

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="checks Triton's interpreter: kernels here run compiled")


def test_this_interpreter_can_be_watched():
    """The interpreter's load, store and launch functions that watch wraps: without them every
    interpreted test would run unwatched, and say nothing of it."""
    assert bounds_check.available(), "this Triton's interpreter lacks the functions tests/bounds_check.py wraps"


@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if MASKED:
        tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)
    else:
        tl.store(Y + offs, tl.load(X + offs))


def copy(x, y, masked, n=None):
    _copy[(1,)](x, y, x.numel() if n is None else n, BLOCK=8, MASKED=masked)


def test_a_read_past_the_end_names_the_kernel_its_line_the_tensor_and_the_lanes():
    x, y = torch.arange(5.0), torch.zeros(8)
    with pytest.raises(AssertionError) as failed:
        call(copy, x, y, False)
    message = str(failed.value)
    for words in ("_copy, program 0 of 1, read X (5,) float32 1 element past its end (at [5:8] of its 8 addresses)",
                  "in _copy: tl.store(Y + offs, tl.load(X + offs))", f"convention: {bounds_check.OUTSIDE}"):
        assert words in message, message


def test_masked_lanes_and_views_of_one_buffer_are_not_failed():
    """Lanes the mask turns off are never touched; a view lying inside another tensor given to the
    launch (q, k and v slices of one buffer) leaves the other's elements readable past its own end."""
    buffer = torch.arange(16.0)
    call(copy, buffer[:5], torch.zeros(8), True)
    call(copy, buffer, buffer[2:4], False, n=8)  # Y's extent is 2 elements; X's covers Y's stores and more


def test_a_watch_inside_another_reports_through_the_outer_with_its_forbidden_ranges():
    """13's tests forbid block-list entries past their counts around a run whose `call` watches too."""
    x, y = torch.arange(8.0), torch.zeros(8)
    start = x.data_ptr() + 6 * x.element_size()
    forbidden = [(start, start + 2 * x.element_size(), lambda address: "x[6:8], past its count")]
    with pytest.raises(AssertionError) as failed, bounds_check.watch(forbidden, "copy(x)", "counts bound every walk"):
        call(copy, x, y, False)
    assert str(failed.value).startswith("copy(x): _copy, program 0 of 1, read x[6:8], past its count"), failed.value
    assert str(failed.value).endswith("convention: counts bound every walk"), failed.value
