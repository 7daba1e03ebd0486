"""Tests for exercise 04: tile_schedule against a brute-force dense mask, tiled_attention against
a dense float64 oracle.

Each test's name says the bug it catches; mutants/04_tiled_attention.toml holds those bugs.
Keys and values that no scheduled tile covers hold NaN in every attention test: reading them is a bug.
"""
import numpy as np
import pytest

from checks import assert_close, assert_unmodified, describe
from memory import SQUARE_N, check_no_square
from oracles import (DTYPES, TOL, allowed_pairs, attention, case_id, oracle_schedule, poison_unscheduled, random_qkv,
                     with_offsets)
from spies import asked_outside, observed, reads_observed, record_calls, watch

MASKED_ROW = "a fully masked row gives an output row of 0 and lse = -inf, never NaN"
FIRST_TILES = "a row whose first tiles are fully masked keeps m = -inf (shift by 0) and stays exact"
RESCALE = "when m grows, l and acc are both multiplied by exp(m_old - m_new)"
LISTED = "a tile is listed iff at least one (query, key) pair in it may attend"
NEEDS_MASK = "needs_mask is True iff at least one pair in the tile may not attend"
CAUSAL = "causal is top-left aligned: query i may attend key j iff j <= i"
TILE_READS = ("each scheduled tile reads its keys and values once, as one slice of at most block_k rows, "
              "in the schedule's order; tiles not scheduled are never read")
SCALE = "scores are scale · q kᵀ; scale defaults to 1/sqrt(d) only when it is None (0.0 is a scale)"
NO_SQUARE = ("no array of n_q × n_k elements: S and P exist one tile at a time (Theorem 1: O(n) extra "
             "memory beyond inputs and outputs)")


# ---- oracle: the schedule from the dense mask, pair by pair (attention: tests/oracles.py) ---------

# ---- checks -------------------------------------------------------------------------------------

def tile_text(tile, n_q, n_k, block_q, block_k):
    """`tile (1, 2): queries 3-5, key 4` — where a tile sits, cut to the bounds."""
    def span(names, start, block, n):
        last = min(start + block, n) - 1
        return f"{names[0]} {start}" if start == last else f"{names[1]} {start}-{last}"
    i, j = tile[:2]
    return (f"tile ({i}, {j}): {span(('query', 'queries'), i * block_q, block_q, n_q)}, "
            f"{span(('key', 'keys'), j * block_k, block_k, n_k)}")


def assert_schedule(got, expected, n_q, n_k, block_q, block_k, label):
    """The learner's schedule equals the brute-force one; the first difference is named."""
    __tracebackhide__ = True
    what = f"tile_schedule(n_q={n_q}, n_k={n_k}, block_q={block_q}, block_k={block_k}, {label})"
    assert isinstance(got, list), f"{what}: expected a list of (i, j, needs_mask), got {type(got).__name__}"
    for tile in got:
        ok = (isinstance(tile, tuple) and len(tile) == 3 and type(tile[0]) is int
              and type(tile[1]) is int and type(tile[2]) is bool)
        assert ok, (f"{what}: {tile!r} is not a tuple (i, j, needs_mask) of Python int, int, bool "
                    f"(NumPy ints and bools print alike but are other types: use int(...) and bool(...))")
    place = lambda t: tile_text(t, n_q, n_k, block_q, block_k)  # noqa: E731
    flags = dict(((i, j), f) for i, j, f in expected)
    for i, j, f in got:
        assert (i, j) in flags, f"{what}: {place((i, j))} is listed, but no pair in it may attend\n  convention: {LISTED}"
        assert f == flags[(i, j)], (f"{what}: {place((i, j))} has needs_mask={f}, expected {flags[(i, j)]}"
                                    f"\n  convention: {NEEDS_MASK}; {CAUSAL}")
    listed = [(i, j) for i, j, _ in got]
    for i, j, _ in expected:
        assert (i, j) in listed, f"{what}: {place((i, j))} is missing, but some pair in it may attend\n  convention: {LISTED}"
    assert len(set(listed)) == len(listed), f"{what}: a tile is listed twice: {listed}"
    assert got == expected, (f"{what}: tiles out of order\n  expected: {[t[:2] for t in expected]}\n"
                             f"  got:      {listed}\n  convention: query block i ascending, then key block j ascending")


def check_schedule(ex, n_q, n_k, block_q, block_k, causal=False, mask=None, label=""):
    __tracebackhide__ = True
    before = None if mask is None else mask.copy()
    got = ex.tile_schedule(n_q, n_k, block_q, block_k, causal=causal, mask=mask)
    label = ", ".join(filter(None, [f"causal={causal}", "mask" if mask is not None else "", label]))
    assert_schedule(got, oracle_schedule(n_q, n_k, block_q, block_k, causal, mask), n_q, n_k, block_q, block_k, label)
    if mask is not None:
        assert_unmodified(before, mask, "mask")


def check_attention(ex, q, k, v, block_q, block_k, causal=False, mask=None, scale=None, label="",
                    convention=""):
    """Run tiled_attention with the unread keys poisoned and compare with the dense oracle."""
    __tracebackhide__ = True
    n_q, n_k = q.shape[0], k.shape[0]
    o_exp, lse_exp = attention(q, k, v, allowed_pairs(n_q, n_k, causal, mask), scale)
    k, v, dead = poison_unscheduled(k, v, oracle_schedule(n_q, n_k, block_q, block_k, causal, mask), block_k)
    inputs = {"q": q, "k": k, "v": v} | ({} if mask is None else {"mask": mask})
    before = {name: a.copy() for name, a in inputs.items()}
    kwargs = ({} if mask is None else {"mask": mask}) | ({} if scale is None else {"scale": scale})
    o, lse = ex.tiled_attention(q, k, v, block_q, block_k, causal=causal, **kwargs)
    for name, a in inputs.items():  # first: a modified input would make the comparison below misleading
        assert_unmodified(before[name], a, name)
    notes = [f"causal={causal}", "mask" if mask is not None else "",
             "" if scale is None else f"scale={scale}", label,
             f"keys {dead.tolist()} are in no scheduled tile and hold NaN" if dead.size else ""]
    what = (f"tiled_attention({describe('q', q)}, {describe('k', k)}, {describe('v', v)}, "
            f"block_q={block_q}, block_k={block_k}, {', '.join(filter(None, notes))})")
    tol = TOL[q.dtype.type]
    nan = (f"keys {dead.tolist()} lie in no scheduled tile and hold NaN: a NaN here means a tile that is "
           f"not scheduled was read" if dead.size else "") or MASKED_ROW + "; " + FIRST_TILES
    for name, got, want in (("o", o, o_exp), ("lse", lse, lse_exp)):
        assert_close(got, want, what=f"{what} -> {name}", convention=convention, nan_convention=nan,
                     dtype=q.dtype, **tol)


def shape_id(n_q, n_k, block_q, block_k, causal=False):
    return case_id(causal, nq=n_q, nk=n_k, bq=block_q, bk=block_k)


# ---- tile_schedule ------------------------------------------------------------------------------

SHAPES = [(6, 6, 2, 2), (7, 5, 3, 2), (5, 9, 2, 4), (9, 4, 4, 3), (8, 8, 3, 3), (1, 1, 1, 1),
          (6, 6, 8, 8), (10, 3, 1, 2), (4, 11, 3, 1)]


def test_worked_example(ex):
    """The lesson's example, written out: 4 x 4 causal in 2 x 2 tiles skips tile (0, 1)."""
    expected = [(0, 0, True), (1, 0, False), (1, 1, True)]
    assert_schedule(ex.tile_schedule(4, 4, 2, 2, causal=True), expected, 4, 4, 2, 2, "causal=True")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: shape_id(*s))
def test_schedule_matches_brute_force(ex, shape, causal):
    """Off-by-one on the diagonal, wrong needs_mask, a ragged last block dropped, tiles out of order."""
    check_schedule(ex, *shape, causal=causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(6, 6, 2, 2), (7, 10, 3, 2), (11, 5, 2, 3)], ids=lambda s: shape_id(*s))
def test_schedule_with_explicit_mask(ex, rng, shape, causal):
    """The mask ignored, or the mask and causal rule combined with OR instead of AND."""
    n_q, n_k, block_q, block_k = shape
    mask = rng.random((n_q, n_k)) < 0.3
    mask[:, :block_k] = rng.random((n_q, 1)) < 0.5  # whole rows of the first key block alike
    check_schedule(ex, *shape, causal=causal, mask=mask)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fully_masked_blocks_are_never_scheduled(ex, rng, causal):
    """A tile no pair may attend still listed: a whole query block or key block masked out."""
    n_q, n_k, block_q, block_k = 9, 10, 3, 4
    mask = rng.random((n_q, n_k)) < 0.7
    mask[3:6] = False  # query block 1
    mask[:, 4:8] = False  # key block 1
    check_schedule(ex, n_q, n_k, block_q, block_k, causal=causal, mask=mask,
                   label="query block 1 and key block 1 fully masked")


@pytest.mark.parametrize("shape", [(4, 10, 2, 3), (10, 4, 2, 3), (7, 7, 2, 3)], ids=lambda s: shape_id(*s, True))
def test_causal_is_top_left_aligned(ex, shape):
    """Bottom-right alignment (key j <= i + n_k - n_q) or a diagonal shifted by one."""
    check_schedule(ex, *shape, causal=True, label=CAUSAL)


@pytest.mark.parametrize("block", [1, 2, 3], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("blocks", [1, 2, 3, 5, 8], ids=lambda t: f"T{t}")
def test_causal_square_counts(ex, blocks, block):
    """Causal, T blocks a side: T(T+1)/2 tiles, the T on the diagonal masked (none when a block is one
    query wide: j <= i holds on its diagonal). Catches computing the upper triangle, or masking
    every tile (needs_mask True where all pairs may attend)."""
    n = blocks * block
    schedule = ex.tile_schedule(n, n, block, block, causal=True)
    what = f"tile_schedule(n_q={n}, n_k={n}, block_q={block}, block_k={block}, causal=True), T = {blocks}"
    assert len(schedule) == blocks * (blocks + 1) // 2, (
        f"{what}: expected T(T+1)/2 = {blocks * (blocks + 1) // 2} tiles, got {len(schedule)}\n  convention: {LISTED}")
    masked = [tuple(t[:2]) for t in schedule if t[2]]
    diagonal = [(i, i) for i in range(blocks)] if block > 1 else []
    assert masked == diagonal, f"{what}: expected masked tiles {diagonal}, got {masked}\n  convention: {NEEDS_MASK}"


# ---- tiled_attention ----------------------------------------------------------------------------

ATTENTION_SHAPES = [(8, 8, 4, 4), (7, 5, 3, 2), (5, 13, 2, 4), (12, 6, 5, 3), (1, 1, 1, 1), (9, 9, 16, 2),
                    (6, 10, 2, 3)]


@DTYPES
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: shape_id(*s))
def test_matches_oracle(ex, rng, shape, causal, dtype):
    """Rescaling of l or acc forgotten, normalising inside the loop, ragged tiles dropped, skipped
    tiles read (their keys hold NaN), dtype changed, inputs modified."""
    n_q, n_k = shape[:2]
    q, k, v = random_qkv(rng, n_q, n_k, 8, 5, dtype)
    check_attention(ex, 2 * q, k, v, *shape[2:], causal=causal, convention=RESCALE)


def test_keys_past_the_last_query_are_never_read(ex, rng):
    """Causal with n_k > n_q: keys 6-9 are in no scheduled tile; computing every tile reads their NaN."""
    q, k, v = random_qkv(rng, 4, 10, 8, 5)
    check_attention(ex, q, k, v, 2, 3, causal=True, convention="tiles not scheduled are never read")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", [(8, 9, 3, 2), (10, 7, 4, 4), (6, 12, 2, 5)], ids=lambda s: shape_id(*s))
def test_explicit_mask(ex, rng, shape, causal):
    """The mask ignored, applied to the wrong tile, or a masked score given a finite value."""
    n_q, n_k, block_q, block_k = shape
    q, k, v = random_qkv(rng, n_q, n_k, 8, 5)
    mask = rng.random((n_q, n_k)) < 0.5
    mask[:, block_k:2 * block_k] = False  # key block 1 is never scheduled: its keys hold NaN
    check_attention(ex, q, k, v, block_q, block_k, causal=causal, mask=mask)


@DTYPES
def test_fully_masked_rows_give_zero_and_minus_inf(ex, rng, dtype):
    """-inf - (-inf) = NaN on a masked row, 0 / 0 at the end, or a masked query block left unset."""
    q, k, v = random_qkv(rng, 10, 7, 8, 5, dtype)
    mask = rng.random((10, 7)) < 0.6
    mask[[1, 2, 8]] = False  # rows in blocks that also hold live rows
    mask[4:8] = False  # query block 1: no tile at all
    mask[0, 0] = mask[3, 6] = mask[9, 3] = True
    check_attention(ex, q, k, v, 4, 3, mask=mask, label="rows 1, 2, 4-7 (query block 1) and 8 fully masked", convention=MASKED_ROW)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_rows_whose_first_tiles_are_masked(ex, rng, causal):
    """The first tile's max taken as -inf - (-inf) = NaN, or m started at 0 instead of -inf: rows
    that see only masked keys in their first tiles must come out exact."""
    n_q, n_k, block_q, block_k = 12, 9, 4, 3
    q, k, v = random_qkv(rng, n_q, n_k, 8, 5)
    mask = np.ones((n_q, n_k), bool)
    mask[4:6, :3] = False  # rows 4-5 see nothing in key block 0 (rows 6-7 do): a partly masked tile
    mask[8:12, :6] = False  # query block 2: its first two tiles are not scheduled at all
    q[[4, 5, 9]] *= 30  # large maxima later on, so a wrong start value for m shows
    check_attention(ex, q, k, v, block_q, block_k, causal=causal, mask=mask,
                    label="rows 4-5 masked on keys 0-2, rows 8-11 on keys 0-5", convention=FIRST_TILES)


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_huge_score_ranges(ex, rng, causal, masked):
    """Scores 1e4 apart: no rescaling when m grows (alpha = exp(-1e4) = 0 must wipe the old sums),
    m started at 0 (rows near -1e4 underflow to 0 / 0), or exp without the max shift; with a random
    mask too, so a max clamped at 0 (or a shift of 0) on masked tiles shows."""
    n_q, n_k, scale = 9, 10, 0.5
    q, k, v = random_qkv(rng, n_q, n_k, 8, 5)
    row_offset = np.array([0, -1e4, 1e4, -5e4, 0, 3e4, -1e4, 0, 1e4])  # row 3 lies far below 0
    key_offset = np.array([-1e4, 0, 1e4, -2e4, 2e4, 0, 3e4, -1e4, 1e4, 0])  # m jumps from tile to tile
    q, k = with_offsets(q, k, row_offset, key_offset, scale)
    mask = None
    if masked:
        mask = rng.random((n_q, n_k)) < 0.6
        mask[:, 0] = True  # every row keeps a live key in its first tile
    check_attention(ex, q, k, v, 3, 2, causal=causal, mask=mask, scale=scale, label="scores 1e4 apart",
                    convention=RESCALE)


@pytest.mark.parametrize("scale", [None, 0.1, 3.0, 0.0], ids=["default", "0.1", "3.0", "0.0"])
def test_scale(ex, rng, scale):
    """The scale ignored, applied twice, or defaulting to 1/d instead of 1/sqrt(d); scale=0.0 taken
    for a missing scale (`scale or default`): with 0.0 every live key weighs the same."""
    q, k, v = random_qkv(rng, 7, 9, 16, 5)
    check_attention(ex, q, k, v, 3, 4, causal=True, scale=scale, convention=SCALE)


def keys_text(rows):
    """`keys 3-5` for a run of key rows, else the rows listed."""
    rows = [int(r) for r in rows]
    if rows == list(range(rows[0], rows[-1] + 1)):
        return f"key {rows[0]}" if len(rows) == 1 else f"keys {rows[0]}-{rows[-1]}"
    return f"keys {rows}"


def check_tile_reads(log, width, schedule, n_q, n_k, block_q, block_k, what, name):
    """Each logged read of k or v is the rows of one key block, and they follow the schedule's tiles."""
    __tracebackhide__ = True
    blocks = []
    for index in log:
        rows = np.unique(index.ravel() // width)
        j = int(rows[0]) // block_k
        if not np.array_equal(rows, np.arange(j * block_k, min((j + 1) * block_k, n_k))):
            raise AssertionError(f"{what}: one operation read {keys_text(rows)} of {name}, not the rows of one "
                                 f"key block (block_k = {block_k})\n  convention: {TILE_READS}")
        blocks.append(j)
    for t, tile in enumerate(schedule):
        if t == len(blocks) or blocks[t] != tile[1]:
            got = "nothing" if t == len(blocks) else f"key block {blocks[t]}"
            raise AssertionError(f"{what}: read {t} of {name} covered {got}, but the schedule's tile {t} is "
                                 f"{tile_text(tile, n_q, n_k, block_q, block_k)}\n  convention: {TILE_READS}")
    if len(blocks) > len(schedule):
        raise AssertionError(f"{what}: {name} was read {len(blocks)} times for {len(schedule)} scheduled tiles; "
                             f"the reads past the last tile covered key blocks {blocks[len(schedule):]}\n"
                             f"  convention: {TILE_READS}")


READ_CASES = [(7, 9, 3, 2, True, False), (6, 10, 2, 3, False, False), (9, 10, 3, 4, False, True),
              (10, 8, 4, 3, True, True)]


@pytest.mark.parametrize("n_q, n_k, block_q, block_k, causal, masked", READ_CASES,
                         ids=[shape_id(*c[:5]) + ("-mask" if c[5] else "") for c in READ_CASES])
def test_reads_each_scheduled_tile_once(ex, rng, n_q, n_k, block_q, block_k, causal, masked):
    """Keys and values of a tile not in the schedule read and then thrown away (the numbers come out
    right), or attention computed densely per query block over all its keys at once, ignoring the
    tile loop.

    k and v arrive watched (tests/spies.py, `watch`): every NumPy operation on them, a view
    (k[start:stop], k[cols]) or a copy of them records the rows it read. Each read must be the rows
    of one key block, and the blocks read must be the scheduled tiles' key blocks, in order.
    np.asarray, np.array and np.ascontiguousarray hand back plain arrays whose reads cannot be
    seen: code that converts an input passes with this rule reported not checked for it (the
    NaN-poisoned tests still show that no unscheduled tile is read).
    """
    q, k, v = random_qkv(rng, n_q, n_k, 8, 5)
    mask = None
    if masked:
        mask = rng.random((n_q, n_k)) < 0.5
        mask[:, block_k:2 * block_k] = False  # key block 1 is never scheduled
        mask[block_q:2 * block_q] = False  # nor is any tile of query block 1
    schedule = oracle_schedule(n_q, n_k, block_q, block_k, causal, mask)
    k_seen, v_seen = watch(k), watch(v)
    ex.tiled_attention(q, k_seen, v_seen, block_q, block_k, causal=causal, mask=mask)
    what = (f"tiled_attention({describe('q', q)}, {describe('k', k)}, {describe('v', v)}, block_q={block_q}, "
            f"block_k={block_k}, causal={causal}{', mask' if masked else ''})")
    for name, seen in (("k", k_seen), ("v", v_seen)):
        if seen.log:
            check_tile_reads(seen.log, seen.shape[1], schedule, n_q, n_k, block_q, block_k, what, name)
    reads_observed("04's reads (k and v read a scheduled tile at a time, in order)", k=k_seen, v=v_seen)


MASK_CASES = [(7, 9, 3, 2, True, False), (8, 8, 4, 4, True, True), (9, 10, 3, 4, False, True)]


@pytest.mark.parametrize("n_q, n_k, block_q, block_k, causal, masked", MASK_CASES,
                         ids=[shape_id(*c[:5]) + ("-mask" if c[5] else "") for c in MASK_CASES])
def test_mask_is_applied_only_on_needs_mask_tiles(ex, rng, monkeypatch, n_q, n_k, block_q, block_k, causal, masked):
    """The mask applied on every tile, not only those flagged needs_mask: the numbers come out the
    same, but only the tiles the diagonal (or the mask) crosses should pay for it.

    tile_schedule is replaced by the oracle's schedule, and tile_allowed wrapped to record what it
    is asked about: inside tiled_attention, a question about one tile may concern only a tile with
    needs_mask. (A question about a larger region, such as the whole grid at once, is not judged.)
    """
    q, k, v = random_qkv(rng, n_q, n_k, 8, 5)
    mask = None
    if masked:
        mask = rng.random((n_q, n_k)) < 0.7
        mask[:block_q] = True  # query block 0 is fully allowed: no tile of it needs the mask unless causal
    schedule = oracle_schedule(n_q, n_k, block_q, block_k, causal, mask)
    monkeypatch.setattr(ex, "tile_schedule", lambda *args, **kwargs: list(schedule))
    asked = record_calls(monkeypatch, ex, "tile_allowed", lambda args: (args["rows"], args["cols"]), reads=("rows", "cols"))
    ex.tiled_attention(q, k, v, block_q, block_k, causal=causal, mask=mask)
    flagged = {(i, j) for i, j, needs_mask in schedule if needs_mask}
    if found := asked_outside(asked, flagged, block_q, block_k):
        rows, cols, (i, j) = found
        what = (f"tiled_attention(q ({n_q}, 8), k ({n_k}, 8), block_q={block_q}, block_k={block_k}, "
                f"causal={causal}{', mask' if masked else ''})")
        raise AssertionError(f"{what}: tile_allowed was asked about queries {rows.start}-{rows.stop - 1}, keys "
                             f"{cols.start}-{cols.stop - 1}, in {tile_text((i, j, False), n_q, n_k, block_q, block_k)}, "
                             f"where every pair may attend\n  convention: {NEEDS_MASK}; apply the mask "
                             f"only on needs_mask tiles")
    if flagged:  # a tile needs the mask: code that masks without tile_allowed is not seen doing it
        observed("04's masks (tile_allowed asked only about needs_mask tiles)", {"tile_allowed": asked})


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "causal-mask"])
def test_no_n_by_n_array(ex, rng, masked):
    """S or P built for all pairs at once (q @ k.T, dense attention over a query block's keys) and cut
    into tiles, or the allowed pairs of the whole grid built once (tile_allowed over every pair,
    np.where(mask, 0, -inf), a copy of the mask). The mask itself is an input, and not counted.

    n_q = n_k = 2048, d = 8, blocks of 64, causal: one float64 2048 × 2048 array is 32 MiB (a bool one
    4 MiB); o, lse and a few 64 × 64 tiles take under 1 MiB, and the peak must stay under 2 MiB.
    """
    n, block = SQUARE_N, 64
    q, k, v = random_qkv(rng, n, n, 8, 8)
    mask = rng.random((n, n)) < 0.9 if masked else None
    what = (f"tiled_attention({describe('q', q)}, {describe('k', k)}, {describe('v', v)}, block_q={block}, "
            f"block_k={block}, causal=True{f', mask ({n}, {n}) bool' if masked else ''})")
    check_no_square(lambda: ex.tiled_attention(q, k, v, block, block, causal=True, mask=mask), what, NO_SQUARE)
