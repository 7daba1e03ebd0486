"""Tests for exercise 01: safe_softmax and logsumexp against float64 oracles.

Each test's name says the bug it catches; mutants/01_safe_softmax.toml holds those bugs.
"""
import numpy as np
import pytest

from kata.checks import assert_close, assert_unmodified, describe

MASKED_ROW = "a fully masked row (all -inf) gives weights of all 0 and lse = -inf, never NaN"
DTYPE = {np.float32: dict(rtol=2e-5, atol=1e-7), np.float64: dict(rtol=1e-10, atol=1e-15)}


def oracle_lse(x):
    """log(sum(exp(x))) in float64 by pairwise logaddexp: no shift, so it shares no code with a max trick."""
    return np.logaddexp.reduce(np.asarray(x, np.float64), axis=-1)


def oracle_softmax(x):
    lse = oracle_lse(x)
    with np.errstate(invalid="ignore"):
        p = np.exp(np.asarray(x, np.float64) - lse[..., None])
    return np.where(np.isneginf(lse)[..., None], 0.0, p)  # a fully masked row weighs nothing


def check_both(ex, x, label, convention=""):
    """Run both functions on `x` and compare each with its oracle."""
    __tracebackhide__ = True
    before = x.copy()
    tol = DTYPE[x.dtype.type]
    p = ex.safe_softmax(x)
    assert_close(p, oracle_softmax(x), what=f"safe_softmax({describe('x', x)}, {label})",
                 convention=convention, dtype=x.dtype, **tol)
    lse = ex.logsumexp(x)
    assert_close(lse, oracle_lse(x), what=f"logsumexp({describe('x', x)}, {label})",
                 convention=convention, dtype=x.dtype, **tol)
    assert_unmodified(before, x, "x")


SHAPES = [(1, 1), (3, 5), (4, 128), (2, 3, 7), (2, 2, 2, 9)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_oracle_on_random_rows(ex, rng, shape, dtype):
    """Wrong axis, wrong normalisation, dtype changed, leading batch axes mishandled."""
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    check_both(ex, x, "random scores")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_large_scores_do_not_overflow(ex, rng, dtype):
    """No max subtraction: exp(1000) = inf and inf / inf = NaN."""
    x = (1000 + rng.standard_normal((3, 6)) * 5).astype(dtype)
    check_both(ex, x, "scores near +1000", "subtract each row's max before exp")


def test_very_negative_scores_do_not_underflow(ex, rng):
    """No max subtraction: exp(-1000) = 0 for every entry and 0 / 0 = NaN."""
    x = -1000 + rng.standard_normal((3, 6)) * 5
    check_both(ex, x, "scores near -1000", "subtract each row's max before exp")


def test_each_row_uses_its_own_max(ex, rng):
    """One max for the whole array: a row 1e4 below the others underflows to 0 / 0."""
    x = rng.standard_normal((3, 5)) + np.array([[0.0], [1e4], [-1e4]])
    check_both(ex, x, "rows 1e4 apart", "the max is taken per row, over the last axis")


def test_huge_range_within_a_row(ex, rng):
    """Scores 1e4 apart in one row: the small ones get weight exactly 0, the rest stay exact."""
    x = rng.standard_normal((2, 6))
    x[:, ::2] -= 1e4
    check_both(ex, x, "scores 1e4 apart in a row")


def test_minus_inf_entries_get_zero_weight(ex, rng):
    """Masked keys (-inf) must weigh exactly 0 and leave the other weights exact."""
    x = rng.standard_normal((4, 7))
    x[rng.random((4, 7)) < 0.4] = -np.inf
    x[:, 3] = rng.standard_normal(4)  # every row keeps a live score
    check_both(ex, x, "some scores -inf", "a -inf score is a masked key: weight exactly 0")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_fully_masked_row_gives_zeros_not_nan(ex, rng, dtype):
    """-inf - (-inf) = NaN: a fully masked row needs its own care, and must not spoil the others."""
    x = rng.standard_normal((4, 5)).astype(dtype)
    x[1] = -np.inf
    x[3] = -np.inf
    check_both(ex, x, "rows 1 and 3 fully masked", MASKED_ROW)


def test_single_column_rows(ex, rng):
    """A row of one score has weight 1 (or 0 if masked) and lse equal to the score."""
    x = rng.standard_normal((5, 1)) * 100
    x[2, 0] = -np.inf
    check_both(ex, x, "one score per row, row 2 masked", MASKED_ROW)


def test_nan_stays_in_its_row(ex, rng):
    """A NaN input may spoil its own row only: a global max or sum lets it leak everywhere."""
    x = rng.standard_normal((3, 4))
    x[0, 2] = np.nan
    p, lse = ex.safe_softmax(x), ex.logsumexp(x)
    assert_close(p[1:], oracle_softmax(x[1:]), what=f"safe_softmax({describe('x', x)}, NaN in row 0), rows 1-2",
                 convention="rows are independent", rtol=1e-10)
    assert_close(lse[1:], oracle_lse(x[1:]), what=f"logsumexp({describe('x', x)}, NaN in row 0), rows 1-2",
                 convention="rows are independent", rtol=1e-10)
