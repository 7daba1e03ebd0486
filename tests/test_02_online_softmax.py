"""Tests for exercise 02: online_softmax_stats and online_softmax against float64 oracles.

Each test's name says the bug it catches; mutants/02_online_softmax.toml holds those bugs.
"""
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from kata.checks import assert_close, assert_unmodified, describe

MASKED_ROW = "a fully masked row (all -inf) gives m = -inf, l = 0 and weights of all 0, never NaN"
RESCALE = "when a block raises the max from m to m_new, l is multiplied by exp(m - m_new)"
DTYPE = {np.float32: dict(rtol=5e-5, atol=1e-7), np.float64: dict(rtol=1e-10, atol=1e-15)}


def oracle_stats(x):
    """m = row max; l = sum(exp(x - m)) = exp(lse - m), with lse by pairwise logaddexp (no max trick)."""
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1)
    lse = np.logaddexp.reduce(x, axis=-1)
    with np.errstate(invalid="ignore"):
        l = np.exp(lse - m)
    return m, np.where(np.isneginf(m), 0.0, l)  # a fully masked row sums nothing


def oracle_softmax(x):
    lse = np.logaddexp.reduce(np.asarray(x, np.float64), axis=-1)
    with np.errstate(invalid="ignore"):
        p = np.exp(np.asarray(x, np.float64) - lse[..., None])
    return np.where(np.isneginf(lse)[..., None], 0.0, p)


def check_all(ex, x, block_size, label, convention=""):
    """Run both functions on `x` and compare m, l and p with their oracles."""
    __tracebackhide__ = True
    before = x.copy()
    tol = DTYPE[x.dtype.type]
    call = f"({describe('x', x)}, block_size={block_size}, {label})"
    m, l = ex.online_softmax_stats(x, block_size)
    m_exp, l_exp = oracle_stats(x)
    assert_close(m, m_exp, what=f"online_softmax_stats{call}: m", convention=convention, dtype=x.dtype, **tol)
    assert_close(l, l_exp, what=f"online_softmax_stats{call}: l", convention=convention, dtype=x.dtype, **tol)
    assert_unmodified(before, x, "x")
    p = ex.online_softmax(x, block_size)
    assert_close(p, oracle_softmax(x), what=f"online_softmax{call}", convention=convention, dtype=x.dtype,
                 **tol)
    assert_unmodified(before, x, "x")


SHAPES = [(1, 1), (3, 10), (2, 3, 7), (2, 2, 2, 9)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("block_size", [1, 3, 4, 64], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_oracle_for_every_block_size(ex, rng, shape, block_size, dtype):
    """Blocks of 1, ragged last blocks, a block wider than the row, leading axes, dtype kept.

    Catches a dropped ragged chunk, stats from the last block only, l not rescaled, a normalising
    pass shifted by each block's own max, l summed without the max subtracted, an upcast.
    """
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    check_all(ex, x, block_size, "random scores")


@pytest.mark.parametrize("block_size", [1, 2, 5], ids=lambda b: f"b{b}")
def test_later_block_raises_the_max_by_1e4(ex, rng, block_size):
    """l not rescaled when m grows: the old terms, taken against a max 1e4 lower, stay ~exp(1e4) = inf."""
    x = rng.standard_normal((3, 10))
    x[:, 5:] += 1e4
    check_all(ex, x, block_size, "columns 5-9 are 1e4 above columns 0-4", RESCALE)


@pytest.mark.parametrize("block_size", [1, 3], ids=lambda b: f"b{b}")
def test_huge_range_within_a_row(ex, rng, block_size):
    """Scores 1e4 apart in a row and in one block, the max first: without the max subtracted exp overflows."""
    x = rng.standard_normal((2, 9))
    x[:, 1::2] -= 1e4
    x[:, 0] += 1e4
    check_all(ex, x, block_size, "scores from about -1e4 to +1e4 in every row")


def test_minus_inf_entries_get_zero_weight(ex, rng):
    """Masked keys (-inf) must weigh exactly 0 and leave the other statistics exact."""
    x = rng.standard_normal((4, 11))
    x[rng.random((4, 11)) < 0.4] = -np.inf
    x[:, 7] = rng.standard_normal(4)  # every row keeps a live score
    check_all(ex, x, 3, "some scores -inf", "a -inf score is a masked key: weight exactly 0")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("block_size", [1, 4, 16], ids=lambda b: f"b{b}")
def test_fully_masked_row_gives_m_minus_inf_l_zero(ex, rng, block_size, dtype):
    """-inf - (-inf) = NaN: a fully masked row needs its own care, and must not spoil the others."""
    x = rng.standard_normal((4, 10)).astype(dtype)
    x[1] = -np.inf
    x[3] = -np.inf
    check_all(ex, x, block_size, "rows 1 and 3 fully masked", MASKED_ROW)


@pytest.mark.parametrize("block_size", [1, 2, 3], ids=lambda b: f"b{b}")
def test_first_block_fully_masked_then_live(ex, rng, block_size):
    """A running max started at 0, or a masked block's max taken as 0, or NaN from -inf - (-inf).

    The live scores are all negative (some near -1e4), so a max of 0 is wrong and exp(x - 0) underflows.
    """
    x = -5 + rng.standard_normal((3, 9))
    x[:, :3] = -np.inf
    x[2, 3:] -= 1e4
    check_all(ex, x, block_size, "columns 0-2 all -inf, then negative scores",
              "while a row has seen only -inf its max is -inf, not 0; the first live block sets it")


def test_nan_stays_in_its_row(ex, rng):
    """A NaN input may spoil its own row only: a max or sum over the wrong axis lets it leak."""
    x = rng.standard_normal((3, 8))
    x[0, 2] = np.nan
    m, l = ex.online_softmax_stats(x, 3)
    p = ex.online_softmax(x, 3)
    call = f"({describe('x', x)}, block_size=3, NaN in row 0), rows 1-2"
    expected = dict(zip(["online_softmax_stats: m", "online_softmax_stats: l"], oracle_stats(x[1:])))
    expected["online_softmax"] = oracle_softmax(x[1:])
    for (what, want), got in zip(expected.items(), [m, l, p]):
        assert_close(got[1:], want, what=f"{what}{call}", convention="rows are independent", rtol=1e-10)


@pytest.mark.parametrize("block_size", [0, -2], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("function", ["online_softmax_stats", "online_softmax"])
def test_block_size_below_one_is_a_value_error(ex, function, block_size):
    """A block of 0 columns never advances (or range() fails with an unhelpful message); -2 walks nowhere."""
    x = np.zeros((2, 5))
    call = f"{function}({describe('x', x)}, block_size={block_size})"
    convention = "block_size < 1 is a ValueError whose message names block_size"
    try:
        getattr(ex, function)(x, block_size)
    except ValueError as error:
        if "block_size" not in str(error):
            raise AssertionError(f"{call} raised ValueError({str(error)!r})\n"
                                 f"  convention: {convention}") from None
    else:
        raise AssertionError(f"{call} returned instead of raising ValueError\n  convention: {convention}")


class ColumnLog(np.ndarray):
    """`x` as the code under test sees it: every NumPy ufunc (exp, max, sum, -, ...) applied to `x`
    or to a view of it records which (row, column) cells it read. Copies are not followed."""

    def __array_finalize__(self, obj):
        self.log = getattr(obj, "log", None)
        self.origin = getattr(obj, "origin", None)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        for a in inputs:
            if isinstance(a, ColumnLog):
                cells = a.cells()
                if cells is not None:
                    a.log.append(cells)
        inputs = [a.view(np.ndarray) if isinstance(a, ColumnLog) else a for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, ColumnLog) else o for o in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)

    def cells(self):
        """(rows, cols) of x that this view reads, or None for memory that is not x's."""
        address, n, size = self.origin
        offset = self.__array_interface__["data"][0] - address
        if not 0 <= offset < size * self.itemsize:
            return None
        flat = np.arange(size)
        strides = tuple(s // self.itemsize * flat.itemsize for s in self.strides)
        index = as_strided(flat[offset // self.itemsize:], shape=self.shape, strides=strides).ravel()
        return index // n, index % n


def watched(x):
    w = x.view(ColumnLog)
    w.log, w.origin = [], (x.__array_interface__["data"][0], x.shape[-1], x.size)
    return w


@pytest.mark.parametrize("block_size", [2, 5], ids=lambda b: f"b{b}")
def test_stats_are_one_pass_in_blocks(ex, rng, block_size):
    """A two-pass solution in disguise: the row max over all columns first (x.max), then the sum.

    Every NumPy operation on x must read at most block_size columns of a row, and the blocks of a
    row must be visited left to right, once: never back to an earlier column.
    """
    x = watched(rng.standard_normal((2, 3, 13)))
    what = f"online_softmax_stats({describe('x', x)}, block_size={block_size})"
    ex.online_softmax_stats(x, block_size)
    if not x.log:
        pytest.skip("no NumPy operation read x itself (converted with np.asarray?): the pass cannot be watched")
    last_start = {}
    for rows, cols in x.log:
        for row in np.unique(rows):
            row_cols = cols[rows == row]
            lo, hi = int(row_cols.min()), int(row_cols.max())
            where = f"row {tuple(int(i) for i in np.unravel_index(row, x.shape[:-1]))}"
            if hi - lo + 1 > block_size:
                raise AssertionError(f"{what}: one operation read columns {lo}-{hi} of {where} at once\n"
                                     f"  convention: one pass in blocks of at most block_size columns")
            if lo < last_start.get(row, 0):
                raise AssertionError(f"{what}: went back to column {lo} of {where} after column "
                                     f"{last_start[row]}\n  convention: one pass, each block folded in once")
            last_start[row] = lo
