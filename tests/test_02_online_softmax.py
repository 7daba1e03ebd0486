"""Tests for exercise 02: online_softmax_stats and online_softmax against float64 oracles.

Each test checks one function at a time (parametrized over the two), so each passes on its own.
Each test's name says the bug it catches; mutants/02_online_softmax.toml holds those bugs.
"""
import numpy as np
import pytest

import oracles
from checks import assert_close, assert_unmodified, describe
from oracles import DTYPES, TOL, dims_id, scores_with_masked_keys
from spies import reads_observed, watch

MASKED_ROW = "a fully masked row (all -inf) gives m = -inf, l = 0 and weights of all 0, never NaN"
RESCALE = "when a block raises the max from m to m_new, l is multiplied by exp(m - m_new)"
ONE_PASS = "one pass, left to right, in blocks of at most block_size columns"
FUNCTIONS = pytest.mark.parametrize("function", ["online_softmax_stats", "online_softmax"])
CONVENTIONS = {  # what each output is, by definition
    "m": "m is the max of the whole row (over the last axis), found block by block",
    "l": "l = sum(exp(x - m)) over the whole row with the final m: " + RESCALE,
    "p": "p = exp(x - m) / l with the final m and l; each row of p sums to 1",
}


def oracle_stats(x):
    """m = row max; l = sum(exp(x - m)) = exp(lse - m), with lse by pairwise logaddexp (no max trick)."""
    m = np.asarray(x, np.float64).max(axis=-1)
    with np.errstate(invalid="ignore"):
        l = np.exp(oracles.logsumexp(x) - m)
    return {"m": m, "l": np.where(np.isneginf(m), 0.0, l)}  # a fully masked row sums nothing


def expected(function, x):
    """{output name: float64 oracle} of `function` on `x`."""
    return oracle_stats(x) if function == "online_softmax_stats" else {"p": oracles.softmax(x)}


def outputs(function, got):
    """The outputs of `function` by name: (m, l) for the stats, p for the softmax."""
    return dict(zip(["m", "l"], got)) if function == "online_softmax_stats" else {"p": got}


def check(ex, function, x, block_size, label, convention=None):
    """Run `function` on `x` and compare its outputs with their oracles; `x` must come back unmodified.

    `convention` is the rule each output's check enforces: one text for all outputs, or
    {output name: text}; by default the definition of that output (CONVENTIONS).
    """
    __tracebackhide__ = True
    before = x.copy()
    got = outputs(function, getattr(ex, function)(x, block_size))
    call = f"{function}({describe('x', before)}, block_size={block_size}, {label})"
    assert_unmodified(before, x, "x", call)  # first: an oracle of a modified x would show a false expected value
    rules = CONVENTIONS | (convention if isinstance(convention, dict) else
                           dict.fromkeys(CONVENTIONS, convention) if convention else {})
    for name, want in expected(function, before).items():
        assert_close(got.get(name), want, what=f"{call}: {name}", convention=rules[name], dtype=x.dtype,
                     **TOL[x.dtype.type])


SHAPES = [(9,), (1, 1), (3, 10), (2, 3, 7), (2, 2, 2, 9)]


@FUNCTIONS
@DTYPES
@pytest.mark.parametrize("block_size", [1, 3, 4, 64], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape", SHAPES, ids=dims_id)
def test_matches_oracle_for_every_block_size(ex, rng, function, shape, block_size, dtype):
    """Blocks of 1, ragged last blocks, a block wider than the row, a 1-D x, leading axes, dtype kept.

    Catches a dropped ragged chunk, stats from the last block only, l not rescaled, a normalising
    pass shifted by each block's own max, l summed without the max subtracted, an upcast, a 1-D x
    turned into a 2-D result.
    """
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    check(ex, function, x, block_size, "random scores")


@FUNCTIONS
@pytest.mark.parametrize("block_size", [1, 2, 5], ids=lambda b: f"b{b}")
def test_later_block_raises_the_max_by_1e4(ex, rng, function, block_size):
    """l not rescaled when m grows: the old terms, taken against a max 1e4 lower, stay ~exp(1e4) = inf."""
    x = rng.standard_normal((3, 10))
    x[:, 5:] += 1e4
    check(ex, function, x, block_size, "columns 5-9 are 1e4 above columns 0-4",
          {"l": RESCALE, "p": "p = exp(x - m) / l with the final m and l: " + RESCALE})


@FUNCTIONS
@pytest.mark.parametrize("block_size", [1, 3], ids=lambda b: f"b{b}")
def test_huge_range_within_a_row(ex, rng, function, block_size):
    """Scores 1e4 apart in a row and in one block, the max first: without the max subtracted exp overflows."""
    x = rng.standard_normal((2, 9))
    x[:, 1::2] -= 1e4
    x[:, 0] += 1e4
    check(ex, function, x, block_size, "scores from about -1e4 to +1e4 in every row")


@FUNCTIONS
@pytest.mark.parametrize("offset", [0.0, 1000.0], ids=["near0", "near1000"])
def test_minus_inf_entries_get_zero_weight(ex, rng, function, offset):
    """Masked keys (-inf) must weigh exactly 0 and leave the other statistics exact. Near +1000 this
    catches a shift of 0 for any row holding a -inf (not only a fully masked one): exp(1000) = inf."""
    x = scores_with_masked_keys(rng, 4, 11, offset, live_col=7)
    check(ex, function, x, 3, f"some scores -inf, the others near {offset:g}",
          "a -inf score is a masked key: weight exactly 0")


@FUNCTIONS
@DTYPES
@pytest.mark.parametrize("block_size", [1, 4, 16], ids=lambda b: f"b{b}")
def test_fully_masked_row_gives_m_minus_inf_l_zero(ex, rng, function, block_size, dtype):
    """-inf - (-inf) = NaN: a fully masked row needs its own care, and must not spoil the others."""
    x = rng.standard_normal((4, 10)).astype(dtype)
    x[1] = -np.inf
    x[3] = -np.inf
    check(ex, function, x, block_size, "rows 1 and 3 fully masked", MASKED_ROW)


@FUNCTIONS
@pytest.mark.parametrize("block_size", [1, 2, 3], ids=lambda b: f"b{b}")
def test_first_block_fully_masked_then_live(ex, rng, function, block_size):
    """A running max started at 0, or a masked block's max taken as 0, or NaN from -inf - (-inf).

    The live scores are all negative (some near -1e4), so a max of 0 is wrong and exp(x - 0) underflows.
    """
    x = -5 + rng.standard_normal((3, 9))
    x[:, :3] = -np.inf
    x[2, 3:] -= 1e4
    check(ex, function, x, block_size, "columns 0-2 all -inf, then negative scores",
          "while a row has seen only -inf its max is -inf, not 0; the first live block sets it")


@FUNCTIONS
def test_nan_stays_in_its_row(ex, rng, function):
    """A NaN input may spoil its own row only: a max or sum over the wrong axis lets it leak."""
    x = rng.standard_normal((3, 8))
    x[0, 2] = np.nan
    got = outputs(function, getattr(ex, function)(x, 3))
    call = f"{function}({describe('x', x)}, block_size=3, NaN in row 0), rows 1-2"
    for name, want in expected(function, x[1:]).items():
        assert_close(got[name][1:], want, what=f"{call}: {name}", convention="rows are independent",
                     **TOL[np.float64])


@FUNCTIONS
@pytest.mark.parametrize("block_size", [0, -2], ids=lambda b: f"b{b}")
def test_block_size_below_one_is_a_value_error(ex, function, block_size):
    """A block of 0 columns never advances (or range() fails with an unhelpful message); -2 walks
    nowhere; a ValueError that does not say which argument is wrong."""
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


def check_block_reads(log, shape, block_size, what, convention, in_order):
    """Each logged read of the watched x covers at most block_size columns of a row; with
    `in_order`, the blocks of a row also come left to right, never back to an earlier column."""
    __tracebackhide__ = True
    n = shape[-1]
    last_start = {}
    for index in log:
        rows, cols = np.divmod(index.ravel(), n)
        for row in np.unique(rows):
            row_cols = cols[rows == row]
            lo, hi = int(row_cols.min()), int(row_cols.max())
            where = f"row {tuple(int(i) for i in np.unravel_index(row, shape[:-1]))}"
            if hi - lo + 1 > block_size:
                raise AssertionError(f"{what}: one operation read columns {lo}-{hi} of {where} at once "
                                     f"(block_size = {block_size})\n  convention: {convention}")
            if in_order and lo < last_start.get(row, 0):
                raise AssertionError(f"{what}: went back to column {lo} of {where} after column "
                                     f"{last_start[row]}\n  convention: {convention}, each block folded in once")
            last_start[row] = lo


@pytest.mark.parametrize("block_size", [2, 5], ids=lambda b: f"b{b}")
def test_stats_are_one_pass_in_blocks(ex, rng, block_size):
    """A two-pass solution in disguise: the row max over all columns first (x.max, np.max, argmax,
    np.sort, take_along_axis, a chunked loop for the max), then the sum.

    x arrives watched (tests/spies.py, `watch`): every NumPy operation on x, a view of it, or a
    copy made by astype or copy records the cells it read. Each must read at most block_size
    columns of a row, and the blocks of a row must come left to right, never back to an earlier
    column. This proves the order of the reads, not the arithmetic (the other tests check that).
    Its limit: np.asarray(x) or np.array(x) hands back a plain array whose reads cannot be seen,
    so code that converts x passes with this rule reported not checked.
    """
    x = rng.standard_normal((2, 3, 13))
    watched = watch(x)
    ex.online_softmax_stats(watched, block_size)
    check_block_reads(watched.log, x.shape, block_size,
                      f"online_softmax_stats({describe('x', x)}, block_size={block_size})", ONE_PASS, in_order=True)
    reads_observed("02's stats pass (one pass over x, in blocks, left to right)", x=watched)


@pytest.mark.parametrize("block_size", [2, 5], ids=lambda b: f"b{b}")
def test_normalising_pass_is_in_blocks(ex, rng, block_size):
    """p computed with one whole-row operation (np.exp(x - m) / l) instead of block by block: the
    row of scores never exists whole in FlashAttention, so neither pass may look at all of it.

    x arrives watched, as in test_stats_are_one_pass_in_blocks: every read, in the stats pass and
    in the normalising pass, must cover at most block_size columns of a row.
    """
    x = rng.standard_normal((2, 3, 13))
    watched = watch(x)
    ex.online_softmax(watched, block_size)
    check_block_reads(watched.log, x.shape, block_size, f"online_softmax({describe('x', x)}, block_size={block_size})",
                      "both passes walk the row in blocks of at most block_size columns: fill p block by block",
                      in_order=False)
    reads_observed("02's normalising pass (x read in blocks)", x=watched)
