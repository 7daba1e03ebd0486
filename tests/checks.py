"""Assertions whose failures a learner can act on: which input, which row, expected vs got, and why."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

AFTER_CALL = pytest.StashKey[list]()  # checks a fixture leaves for after the test's body (run by conftest)

# A number in a message reads as the learner would write it: 3, not np.int64(3) (NumPy 2's repr of
# its scalars, which f-strings of tuples and lists of them show).
np.set_printoptions(legacy="1.25")


class NotChecked(Exception):
    """A lesson rule this test can observe only through a helper the stub defines, raised when the
    code under test does not use that helper (another split, a loop of its own, an input converted
    out of sight). The test then passes with the rule reported not checked, and why (conftest):
    correct code is never failed for its structure or its names."""

    def __init__(self, rule: str, why: str):
        super().__init__(f"{rule}: not checked, {why}")


def describe(name: str, a) -> str:
    """`x (3, 5) float64` — how an input is named in a failure."""
    a = np.asarray(a)
    return f"{name} {tuple(a.shape)} {a.dtype}"


def _fmt(row) -> str:
    return np.array2string(np.asarray(row), precision=6, threshold=8, edgeitems=3, max_line_width=88)


def _row_of(index: tuple, ndim: int) -> tuple:
    """Rows are everything but the last axis; a 1-D output is one value per row."""
    return index if ndim <= 1 else index[:-1]


def _fail(what: str, where: str, expected, got, convention: str) -> None:
    __tracebackhide__ = True
    lines = [f"{what}: {where}", f"  expected: {_fmt(expected)}", f"  got:      {_fmt(got)}"]
    if convention:
        lines.append(f"  convention: {convention}")
    raise AssertionError("\n".join(lines))


def assert_close(got, expected, *, what: str, rtol: float = 1e-6, atol: float = 1e-9,
                 convention: str = "", nan_convention: str = "", dtype=None) -> None:
    """Compare `got` with the float64 oracle `expected` elementwise; infinities must match exactly.

    `what` names the call and its inputs, e.g. "safe_softmax(x (3, 5) float64, row 0 fully masked)".
    `convention` is the rule the check enforces; `nan_convention`, when given, replaces it where the
    worst element is a NaN the oracle does not have (a NaN has its own causes: -inf - (-inf), 0 / 0,
    a poisoned input read). `dtype`, when given, is the dtype `got` must have.
    """
    __tracebackhide__ = True
    expected = np.asarray(expected, dtype=np.float64)
    if not isinstance(got, np.ndarray) and not np.isscalar(got):
        raise AssertionError(f"{what}: expected a NumPy array, got {type(got).__name__}")
    got_arr = np.asarray(got)
    if got_arr.shape != expected.shape:
        raise AssertionError(f"{what}: expected shape {expected.shape}, got {got_arr.shape}")
    if dtype is not None and got_arr.dtype != np.dtype(dtype):
        raise AssertionError(f"{what}: expected dtype {np.dtype(dtype)}, got {got_arr.dtype} "
                             f"(float64 in gives float64 out, float32 in gives float32 out)")
    g = got_arr.astype(np.float64)
    nan = np.isnan(g) & ~np.isnan(expected)
    same_inf = np.isinf(expected) & (g == expected)
    with np.errstate(invalid="ignore"):  # inf - inf where infinities differ: NaN, counted as a miss
        err = np.where(same_inf, 0.0, np.abs(g - expected))
        excess = err - (atol + rtol * np.abs(np.where(np.isinf(expected), 0, expected)))
    excess = np.where(nan | np.isnan(excess), np.inf, excess)
    if excess.size == 0 or excess.max() <= 0:
        return
    worst = tuple(int(i) for i in np.unravel_index(np.argmax(excess), excess.shape))
    row = _row_of(worst, expected.ndim)
    kind = "NaN" if nan[worst] else f"off by {err[worst]:.3g}"
    where = f"row {row if len(row) != 1 else row[0]} is wrong ({kind} at index {worst})"
    _fail(what, where, expected[row], g[row], nan_convention if nan[worst] and nan_convention else convention)


def assert_unmodified(before, after, name: str, what: str = "") -> None:
    """Inputs are never modified: compare a copy taken before the call with the array after it.

    `what`, when given, names the call, as in assert_close.
    """
    __tracebackhide__ = True
    if not np.array_equal(before, after, equal_nan=True):
        raise AssertionError(f"{what + ': ' if what else ''}{name} was modified in place\n"
                             f"  convention: inputs are never modified (work on a copy, or build new arrays)")


def peak_bytes(call) -> int:
    """The most memory `call()` held at once beyond what was held before it, as tracemalloc sees it
    (NumPy reports its arrays there). A tracer already running is left running, its peak reset."""
    running = tracemalloc.is_tracing()
    if not running:
        tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        call()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not running:
            tracemalloc.stop()
