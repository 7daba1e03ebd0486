"""Tests for exercise 01: safe_softmax and logsumexp against float64 oracles.

Each test checks one function at a time (parametrized over the two), so each passes on its own.
Each test's name says the bug it catches; mutants/01_safe_softmax.toml holds those bugs.
"""
import numpy as np
import pytest

import oracles
from checks import assert_close, assert_unmodified, describe
from oracles import DTYPES, TOL, dims_id, scores_with_masked_keys

MASKED_ROW = "a fully masked row (all -inf) gives weights of all 0 and lse = -inf, never NaN"
SHIFT = "subtract each row's max before exp"
ORACLES = {"safe_softmax": oracles.softmax, "logsumexp": oracles.logsumexp}
FUNCTIONS = pytest.mark.parametrize("function", list(ORACLES))


def check(ex, function, x, label, convention=""):
    """Run `function` on `x` and compare it with its oracle; `x` must come back unmodified."""
    __tracebackhide__ = True
    before = x.copy()
    got = getattr(ex, function)(x)
    what = f"{function}({describe('x', before)}, {label})"
    assert_unmodified(before, x, "x", what)  # first: an oracle of a modified x would show a false expected value
    assert_close(got, ORACLES[function](before), what=what,
                 convention=convention, dtype=x.dtype, **TOL[x.dtype.type])


SHAPES = [(7,), (1, 1), (3, 5), (4, 128), (2, 3, 7), (2, 2, 2, 9)]


@FUNCTIONS
@DTYPES
@pytest.mark.parametrize("shape", SHAPES, ids=dims_id)
def test_matches_oracle_on_random_rows(ex, rng, function, shape, dtype):
    """Wrong axis, wrong normalisation, dtype changed, leading batch axes mishandled, a 1-D x turned
    into a 2-D result (p must be (n,) and lse a 0-d value of x's dtype, not a Python float)."""
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    check(ex, function, x, "random scores", "softmax and lse run over the last axis; each row of p sums to 1")


@FUNCTIONS
@DTYPES
def test_large_scores_do_not_overflow(ex, rng, function, dtype):
    """No max subtraction: exp(1000) = inf and inf / inf = NaN."""
    x = (1000 + rng.standard_normal((3, 6)) * 5).astype(dtype)
    check(ex, function, x, "scores near +1000", SHIFT)


@FUNCTIONS
def test_very_negative_scores_do_not_underflow(ex, rng, function):
    """No max subtraction: exp(-1000) = 0 for every entry and 0 / 0 = NaN."""
    x = -1000 + rng.standard_normal((3, 6)) * 5
    check(ex, function, x, "scores near -1000", SHIFT)


@FUNCTIONS
def test_each_row_uses_its_own_max(ex, rng, function):
    """One max for the whole array: a row 1e4 below the others underflows to 0 / 0."""
    x = rng.standard_normal((3, 5)) + np.array([[0.0], [1e4], [-1e4]])
    check(ex, function, x, "rows 1e4 apart", "the max is taken per row, over the last axis")


@FUNCTIONS
def test_huge_range_within_a_row(ex, rng, function):
    """Scores 1e4 apart in one row: the small ones get weight exactly 0, the rest stay exact."""
    x = rng.standard_normal((2, 6))
    x[:, ::2] -= 1e4
    check(ex, function, x, "scores 1e4 apart in a row")


@FUNCTIONS
@pytest.mark.parametrize("offset", [0.0, 1000.0], ids=["near0", "near1000"])
def test_minus_inf_entries_get_zero_weight(ex, rng, function, offset):
    """Masked keys (-inf) must weigh exactly 0 and leave the other weights exact. Near +1000 this
    catches a shift of 0 for any row holding a -inf (not only a fully masked one): exp(1000) = inf."""
    x = scores_with_masked_keys(rng, 4, 7, offset, live_col=3)
    x[::2, 0] = -np.inf  # rows 0 and 2 start with a masked key
    check(ex, function, x, f"some scores -inf, the others near {offset:g}",
          "a -inf score is a masked key: weight exactly 0; only a fully masked row has no max to subtract")


MASKED = [((4, 5), [(1,), (3,)]), ((2, 3, 5), [(0, 1), (1, 2)]), ((5,), [()])]


@FUNCTIONS
@DTYPES
@pytest.mark.parametrize("shape, rows", MASKED, ids=[dims_id(shape) for shape, _ in MASKED])
def test_fully_masked_row_gives_zeros_not_nan(ex, rng, function, shape, rows, dtype):
    """-inf - (-inf) = NaN: a fully masked row needs its own care, and must not spoil the others.
    Also in a 3-D x (a fix written for 2-D only, or a loop over axis 0) and a 1-D x."""
    x = rng.standard_normal(shape).astype(dtype)
    for row in rows:
        x[row] = -np.inf
    check(ex, function, x, f"rows {', '.join(map(str, rows))} fully masked", MASKED_ROW)


@FUNCTIONS
def test_single_column_rows(ex, rng, function):
    """A row of one score has weight 1 (or 0 if masked) and lse equal to the score."""
    x = rng.standard_normal((5, 1)) * 100
    x[2, 0] = -np.inf
    check(ex, function, x, "one score per row, row 2 masked", MASKED_ROW)


@FUNCTIONS
def test_nan_stays_in_its_row(ex, rng, function):
    """A NaN input may spoil its own row only: a global max or sum lets it leak everywhere."""
    x = rng.standard_normal((3, 4))
    x[0, 2] = np.nan
    got = getattr(ex, function)(x)
    assert_close(got[1:], ORACLES[function](x[1:]), what=f"{function}({describe('x', x)}, NaN in row 0), rows 1-2",
                 convention="rows are independent", **TOL[np.float64])
