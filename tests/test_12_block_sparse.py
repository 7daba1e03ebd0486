"""Tests for exercise 12: mask mods against their definitions, block_mask against a brute-force
classification of the dense mask, block-sparse attention against a dense float64 oracle, and its
HBM traffic against a hand count.

Each test's docstring names the bugs it catches; mutants/12_block_sparse.toml holds them. Every
consumer (attention, flash, io) gets a block mask built here from the dense mask, with garbage past
each count, and keys and values of the blocks no query block lists hold NaN.
"""
import numpy as np
import pytest

from checks import assert_close, assert_unmodified, describe
from hbm_helpers import call_counted, check_moves, check_outputs, totals
from kata.given.block_mask import BlockMask
from kata.given.hbm import HBM
from memory import SQUARE_N, check_no_square
from oracles import (DTYPES, TOL, attention, case_id, documents_named_out_of_order, oracle_schedule, poison_unscheduled,
                     random_qkv, tile_kinds, with_offsets)

LISTS = ("per query block, kv_indices[i, :kv_num_blocks[i]] lists its partial key blocks (some pair "
         "masked) and full_kv_indices[i, :full_kv_num_blocks[i]] its full ones, ascending; empty tiles "
         "are in neither; q_… lists are the same per key block")
MASKED_ROW = "a fully masked row gives an output row of 0 and lse = -inf, never NaN"
UNLISTED = ("NaN here, none when the same call runs without NaN keys and with clean lists: keys and values of a "
            "block no query block lists are never read; entries past a count are never read")
ARITHMETIC = ("NaN with every input finite and the lists clean too: made by the arithmetic (-inf - (-inf) on a row "
              "that has seen no key yet, 0 / 0), or an output row never set")
FLASH_MOVES = ("Q read once per query block, the K and V rows of each listed tile, O and L written once; "
               "the last key block may be short")


# ---- oracles: the dense mask, pair by pair, and the block mask it makes --------------------------

def dense(mod, n_q, n_k):
    """The (n_q, n_k) mask, asking mod about every pair at once (a test may; block_mask may not)."""
    return np.broadcast_to(mod(np.arange(n_q)[:, None], np.arange(n_k)[None, :]), (n_q, n_k)).copy()


def lists(listed, garbage):
    """FlexAttention's (counts, indices) for a bool grid; past each count, `garbage` (a callable)."""
    counts = listed.sum(axis=1)
    indices = np.array([garbage(len(row)) for row in listed], np.int64).reshape(listed.shape)
    for r, row in enumerate(listed):
        indices[r, :counts[r]] = np.flatnonzero(row)
    return counts, indices


def oracle_mask(allowed, block_q, block_k, rng=None):
    """The BlockMask of a dense mask; with rng, past each count the indices of blocks no query block
    lists (NaN keys, when there are some), else any block: a consumer that reads them is caught."""
    partial, full = tile_kinds(allowed, block_q, block_k)
    dead_k, dead_q = np.flatnonzero(~(partial | full).any(0)), np.flatnonzero(~(partial | full).any(1))

    def garbage(dead, t):
        pool = dead if dead.size else np.arange(t)
        return (lambda size: np.zeros(size, np.int64)) if rng is None else (lambda size: rng.choice(pool, size))
    t_r, t_c = partial.shape
    return BlockMask(allowed.shape[0], allowed.shape[1], block_q, block_k,
                     *lists(partial, garbage(dead_k, t_c)), *lists(full, garbage(dead_k, t_c)),
                     *lists(partial.T, garbage(dead_q, t_r)), *lists(full.T, garbage(dead_q, t_r)))


def listed_keys(allowed, block_q, block_k):
    """Per query block, the key rows of its listed tiles (a tile is read whole)."""
    partial, full = tile_kinds(allowed, block_q, block_k)
    n_k = allowed.shape[1]
    return [sum(min(block_k, n_k - j * block_k) for j in np.flatnonzero(row)) for row in partial | full]


# ---- the masks the tests use --------------------------------------------------------------------

def doc_ids(rng, n, docs):
    """Document ids for n positions in `docs` documents of random lengths (some of one token),
    named out of order."""
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(docs, n) - 1, replace=False))
    return documents_named_out_of_order(rng, np.searchsorted(cuts, np.arange(n), side="right"))


def masks(ex, rng, n_q, n_k):
    """name -> mask_mod, built from the learner's mods (their definitions are tested on their own)."""
    docs = doc_ids(rng, max(n_q, n_k), 4)
    table = rng.random((n_q, n_k)) < 0.5
    return {"causal": ex.causal, "window3": ex.sliding_window(3), "documents": ex.document_mask(docs),
            "window2_or_key0": ex.or_masks(ex.sliding_window(2), lambda q, kv: kv == 0),
            "random": lambda q, kv: table[q, kv], "dense": lambda q, kv: np.ones(np.broadcast(q, kv).shape, bool),
            "keys_from5": lambda q, kv: (kv <= q) & (kv >= 5)}  # causal, and queries 0-4 see nothing


MASK_NAMES = ["causal", "window3", "documents", "window2_or_key0", "random", "dense"]
# (n_q, n_k, block_q, block_k); 6 x 40 in 2 x 2 tiles has 20 key blocks, where an unstable sort shows
SHAPES = [(8, 8, 2, 2), (7, 7, 3, 2), (9, 13, 4, 3), (13, 6, 2, 5), (1, 1, 1, 1), (10, 10, 16, 4), (6, 40, 2, 2)]


def shape_id(s):
    return case_id(nq=s[0], nk=s[1], bq=s[2], bk=s[3])


# ---- the mask mods ------------------------------------------------------------------------------

def check_mod(got_mod, expected, label):
    __tracebackhide__ = True
    got = dense(got_mod, *expected.shape)
    wrong = np.argwhere(got != expected)
    if wrong.size:
        i, j = wrong[0]
        raise AssertionError(f"{label}: pair (query {i}, key {j}) gives {got[i, j]}, expected {expected[i, j]}\n"
                             f"  convention: True where the query may attend the key; mods take broadcast index arrays")


@pytest.mark.parametrize("window", [1, 2, 3, 7, 40])
def test_sliding_window(ex, window):
    """A window one too wide or narrow (j > i - window), or not causal (a key ahead of the query)."""
    i, j = np.arange(12)[:, None], np.arange(12)[None, :]
    check_mod(ex.sliding_window(window), (i - window < j) & (j <= i), f"sliding_window({window}) on 12 x 12: "
              f"query i sees keys i - window < j <= i")


def test_document_mask(ex, rng):
    """Documents not causal inside, or the document test dropped (a query sees other documents)."""
    ids = doc_ids(rng, 15, 5)
    expected = (ids[:, None] == ids[None, :]) & np.tri(15, dtype=bool)
    check_mod(ex.document_mask(ids), expected, f"document_mask({ids.tolist()}): same document AND causal")


def test_and_or_masks(ex, rng):
    """or_masks as and, and_masks as or, a mod dropped, the empty AND / OR not True / False."""
    a, b = rng.random((2, 9, 11)) < 0.5
    mod_a, mod_b = (lambda q, kv: a[q, kv]), (lambda q, kv: b[q, kv])
    check_mod(ex.and_masks(mod_a, mod_b, ex.causal), a & b & np.tri(9, 11, dtype=bool), "and_masks(a, b, causal)")
    check_mod(ex.or_masks(mod_a, mod_b, ex.causal), a | b | np.tri(9, 11, dtype=bool), "or_masks(a, b, causal)")
    check_mod(ex.and_masks(), np.ones((9, 11), bool), "and_masks() of no mods: every pair may attend")
    check_mod(ex.or_masks(), np.zeros((9, 11), bool), "or_masks() of no mods: no pair may attend")


# ---- block_mask ---------------------------------------------------------------------------------

def check_lists(what, got, want, names, per, convention):
    """One (counts, indices) pair against the oracle's: integer arrays of its shapes, and each row's
    indices up to its count (what lies past a count is not looked at). names: the pair's names; per(b)
    names row b in a message."""
    __tracebackhide__ = True
    (g_counts, g_indices), (w_counts, w_indices) = got, want
    for name, a, w in zip(names, got, want):
        assert a.shape == w.shape and a.dtype.kind in "iu", (
            f"{what}.{name}: expected integers of shape {w.shape}, got {a.dtype} {a.shape}")
    counts, indices = names
    for b in range(len(w_counts)):
        got_list, want_list = g_indices[b, :g_counts[b]].tolist(), w_indices[b, :w_counts[b]].tolist()
        if got_list != want_list:
            raise AssertionError(f"{what}: {per(b)}: {indices}[{b}, :{counts}[{b}]] = {got_list}, expected "
                                 f"{want_list}\n  convention: {convention}")


def check_block_mask(got, allowed, block_q, block_k, label):
    __tracebackhide__ = True
    want = oracle_mask(allowed, block_q, block_k)
    what = f"block_mask({label}, n_q={allowed.shape[0]}, n_k={allowed.shape[1]}, block_q={block_q}, block_k={block_k})"
    assert isinstance(got, BlockMask), f"{what}: expected a BlockMask, got {type(got).__name__}"
    assert (got.n_q, got.n_k, got.block_q, got.block_k) == (want.n_q, want.n_k, block_q, block_k), (
        f"{what}: carries sizes {(got.n_q, got.n_k, got.block_q, got.block_k)}, expected the ones it was built for")
    names = [("kv_num_blocks", "kv_indices", "query"), ("full_kv_num_blocks", "full_kv_indices", "query"),
             ("q_num_blocks", "q_indices", "key"), ("full_q_num_blocks", "full_q_indices", "key")]
    for counts, indices, per in names:
        check_lists(what, (np.asarray(getattr(got, counts)), np.asarray(getattr(got, indices))),
                    (getattr(want, counts), getattr(want, indices)), (counts, indices),
                    lambda b, per=per: f"{per} block {b}", LISTS)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("mask", MASK_NAMES)
def test_block_mask_matches_brute_force(ex, rng, mask, shape):
    """A partial tile classified full (its mask skipped), a full one listed as partial too, indices not
    ascending, the ragged last block dropped, the transposed lists wrong, a window or document bug."""
    mod = masks(ex, rng, *shape[:2])[mask]
    check_block_mask(ex.block_mask(mod, *shape), dense(mod, *shape[:2]), *shape[2:], mask)


def test_block_lists(ex, rng):
    """block_lists written into block_mask and left undone (the grader's 64k table calls it), float
    counts, a row's columns out of order or not at its start (NumPy's default argsort is not stable
    from 17 columns on: the grid has 20), the count of another row. The grid has an empty row and a
    full one."""
    listed = rng.random((5, 20)) < 0.4
    listed[1], listed[3] = False, True
    counts, indices = ex.block_lists(listed)
    for name, a, shape in (("counts", counts, (5,)), ("indices", indices, (5, 20))):
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        assert isinstance(a, np.ndarray) and a.shape == shape and a.dtype.kind in "iu", (
            f"block_lists(a (5, 20) bool grid): {name}: expected a NumPy int array of shape {shape}, got {got}")
    check_lists("block_lists(a (5, 20) bool grid)", (counts, indices), lists(listed, lambda size: np.zeros(size)),
                ("counts", "indices"), lambda row: f"row {row} {listed[row].astype(int).tolist()}",
                "per row, the count of listed columns, and those columns ascending at the start of its row of indices")


def test_worked_example(ex):
    """The lesson's example: causal 4 x 4 in 2 x 2 tiles, its density 3/4 and its IO at d = 2."""
    bm = ex.block_mask(ex.causal, 4, 4, 2, 2)
    check_block_mask(bm, np.tri(4, dtype=bool), 2, 2, "causal")
    assert ex.density(bm) == 0.75, f"density(causal 4 x 4, blocks 2): expected 3/4, got {ex.density(bm)}"
    io = tuple(ex.block_sparse_io(4, 2, 2, 2, bm))
    assert io == (32, 12), f"block_sparse_io(4, 2, 2, 2, causal 4 x 4): expected (32, 12), got {io}\n  convention: {FLASH_MOVES}"


def test_block_mask_asks_one_tile_at_a_time(ex):
    """The whole n_q x n_k mask built at once (or a block row of it), then cut into tiles."""
    sizes = []

    def spy(q_idx, kv_idx):
        sizes.append((np.size(q_idx), np.size(kv_idx), np.broadcast(q_idx, kv_idx).size))
        return kv_idx <= q_idx
    n_q, n_k, block_q, block_k = 40, 36, 4, 6
    ex.block_mask(spy, n_q, n_k, block_q, block_k)
    worst = max(sizes, key=lambda s: s[2], default=(0, 0, 0))
    assert sizes and worst[2] <= block_q * block_k, (
        f"block_mask(causal, n_q={n_q}, n_k={n_k}, block_q={block_q}, block_k={block_k}) asked mask_mod about "
        f"{worst[2]} pairs at once (index arrays of {worst[0]} and {worst[1]}); expected one tile, at most "
        f"{block_q * block_k}\n  convention: built one tile at a time, never an n_q x n_k array")


def test_block_mask_never_holds_the_whole_mask(ex):
    """The mask asked tile by tile but its answers stitched into one n_q x n_k array before the tiles
    are classified: the memory the contract's "no n_q x n_k array" saves."""
    n, block = SQUARE_N, 128  # one tile's arrays take a few hundred KiB at most
    check_no_square(lambda: ex.block_mask(ex.causal, n, n, block, block),
                    f"block_mask(causal, n_q = n_k = {n}, blocks of {block})",
                    "built one tile at a time, never an n_q x n_k array")


@pytest.mark.parametrize("mask", MASK_NAMES)
def test_density(ex, rng, mask):
    """Density counting partial tiles only, full only, reading past the counts (garbage), or
    dividing by T_r² or T_c² (here T_r = 4 query blocks, T_c = 3 key blocks)."""
    n_q, n_k, block_q, block_k = 11, 13, 3, 5
    allowed = dense(masks(ex, rng, n_q, n_k)[mask], n_q, n_k)
    partial, full = tile_kinds(allowed, block_q, block_k)
    got = ex.density(oracle_mask(allowed, block_q, block_k, rng))
    want = (partial | full).mean()
    assert isinstance(got, float) and abs(got - want) < 1e-12, (
        f"density({mask}, n_q={n_q}, n_k={n_k}, blocks {block_q} x {block_k}): expected s = {want!r} "
        f"({(partial | full).sum()} of {partial.size} tiles), got {got!r}\n  convention: s counts partial and full tiles")


# ---- block_sparse_attention ---------------------------------------------------------------------

def poisoned(k, v, allowed, block_q, block_k):
    """NaN in the keys and values of every key block no query block lists."""
    return poison_unscheduled(k, v, oracle_schedule(*allowed.shape, block_q, block_k, mask=allowed), block_k)


def check_attention(ex, rng, q, k, v, mod, block_q, block_k, label, scale=None, convention=""):
    __tracebackhide__ = True
    allowed = dense(mod, q.shape[0], k.shape[0])
    o_exp, lse_exp = attention(q, k, v, allowed, scale)
    kwargs = {} if scale is None else {"scale": scale}
    finite = (k, v)
    k, v, dead = poisoned(k, v, allowed, block_q, block_k)
    bm = oracle_mask(allowed, block_q, block_k, rng)
    before = {"q": q.copy(), "k": k.copy(), "v": v.copy()}
    o, lse = ex.block_sparse_attention(q, k, v, bm, mod, **kwargs)
    for name, a in (("q", q), ("k", k), ("v", v)):
        assert_unmodified(before[name], a, name)
    rows = np.flatnonzero(~allowed.any(1))
    notes = [label, f"block_q={block_q}, block_k={block_k}", "" if scale is None else f"scale={scale}",
             f"keys {dead.tolist()} in no listed block hold NaN" if dead.size else "",
             f"rows {rows.tolist()} fully masked" if rows.size else ""]
    what = f"block_sparse_attention({describe('q', q)}, {describe('k', k)}, {', '.join(filter(None, notes))})"
    nan = ""
    if any(np.isnan(np.asarray(got, float)).any() for got in (o, lse)):  # what made it: run again without NaN inputs
        again = ex.block_sparse_attention(q, *finite, oracle_mask(allowed, block_q, block_k), mod, **kwargs)
        if not any(np.isnan(np.asarray(got, float)).any() for got in again):
            nan = UNLISTED
        else:
            nan = f"{MASKED_ROW}; or {ARITHMETIC}" if rows.size else ARITHMETIC
    for name, got, want in (("o", o, o_exp), ("lse", lse, lse_exp)):
        assert_close(got, want, what=f"{what} -> {name}", convention=convention or LISTS, nan_convention=nan,
                     dtype=q.dtype, **TOL[q.dtype.type])


@DTYPES
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("mask", MASK_NAMES)
def test_attention_matches_oracle(ex, rng, mask, shape, dtype):
    """The mask skipped on partial tiles, unlisted or garbage blocks read (NaN), a ragged block
    dropped, a tile merged twice, dtype changed, inputs modified."""
    n_q, n_k, block_q, block_k = shape
    q, k, v = random_qkv(rng, n_q, n_k, 8, 5, dtype)
    check_attention(ex, rng, 2 * q, k, v, masks(ex, rng, n_q, n_k)[mask], block_q, block_k, mask)


@pytest.mark.parametrize("function", ["block_sparse_attention", "block_sparse_flash"])
def test_mask_only_on_partial_tiles(ex, rng, function):
    """mask_mod applied on full tiles too (or on the whole grid), in the attention or on the
    simulator: the lesson's rule is that only partial tiles pay for the mask."""
    n, block_q, block_k = 17, 4, 3
    asked = []

    def spy(q_idx, kv_idx):
        asked.append((int(np.min(q_idx)) // block_q, int(np.max(q_idx)) // block_q,
                      int(np.min(kv_idx)) // block_k, int(np.max(kv_idx)) // block_k))
        return ex.sliding_window(6)(q_idx, kv_idx)
    allowed = dense(ex.sliding_window(6), n, n)
    partial, full = tile_kinds(allowed, block_q, block_k)
    bm = oracle_mask(allowed, block_q, block_k, rng)
    if function == "block_sparse_attention":
        ex.block_sparse_attention(*random_qkv(rng, n, n, 4, 3), bm, spy)
    else:
        ex.block_sparse_flash(flash_hbm(rng, allowed, n, 3, block_q, block_k)[0], bm, spy)
    what = f"{function}(sliding_window(6), n={n}, blocks {block_q} x {block_k})"
    rule = "the mask is asked about partial tiles only (some pair masked, some not), one tile at a time"
    for i0, i1, j0, j1 in asked:
        if (i0, j0) != (i1, j1):
            raise AssertionError(f"{what} asked mask_mod about query blocks {i0} to {i1} and key blocks {j0} to {j1} "
                                 f"in one call, not one tile\n  convention: {rule}")
        if not partial[i0, j0]:
            kind = "full (every pair may attend: it runs unmasked)" if full[i0, j0] else "empty (no list names it)"
            raise AssertionError(f"{what} asked mask_mod about the tile of query block {i0}, key block {j0}, which "
                                 f"is {kind}\n  convention: {rule}")
    assert asked, f"{what} never called mask_mod, but sliding_window(6) has partial tiles"


@DTYPES
def test_fully_masked_rows(ex, rng, dtype):
    """-inf - (-inf) = NaN on a row no key reaches, a query block with no listed tile left unset, or a
    window past the start: and_masks(causal, keys >= 5) leaves queries 0-4 with nothing."""
    n, block_q, block_k = 13, 3, 4
    q, k, v = random_qkv(rng, n, n, 6, 4, dtype)
    mod = ex.and_masks(ex.causal, lambda q_idx, kv_idx: kv_idx >= 5)
    check_attention(ex, rng, q, k, v, mod, block_q, block_k, "and_masks(causal, keys >= 5)", convention=MASKED_ROW)


def test_disjoint_masks_give_empty_rows(ex, rng):
    """and_masks of two documents masks that never agree: every row fully masked, o = 0, lse = -inf."""
    ids = np.repeat([0, 1], 5)
    q, k, v = random_qkv(rng, 10, 10, 4, 3)
    mod = ex.and_masks(ex.document_mask(ids), ex.document_mask(1 - ids), lambda q_idx, kv_idx: kv_idx > q_idx)
    check_attention(ex, rng, q, k, v, mod, 4, 3, "and_masks of disjoint mods", convention=MASKED_ROW)


def test_rows_whose_first_tiles_are_empty(ex, rng):
    """A wrong start for the running result: queries see only keys 6 and later, scores 1e4 apart."""
    n_q, n_k, scale = 9, 14, 0.5
    q, k, v = random_qkv(rng, n_q, n_k, 6, 4)
    q, k = with_offsets(q, k, np.array([0, -1e4, 1e4, -5e4, 0, 3e4, -1e4, 0, 1e4]),
                        np.linspace(-2e4, 2e4, n_k), scale)
    mod = ex.or_masks(lambda q_idx, kv_idx: (kv_idx >= 6) & (kv_idx - 6 <= q_idx), lambda q_idx, kv_idx: kv_idx == 13)
    check_attention(ex, rng, q, k, v, mod, 3, 4, "keys 0-5 masked, scores 1e4 apart", scale=scale)


@pytest.mark.parametrize("scale", [0.3, 0.0], ids=["0.3", "0.0"])
def test_scale(ex, rng, scale):
    """The scale ignored, or scale=0.0 taken for a missing one."""
    q, k, v = random_qkv(rng, 9, 9, 8, 3)
    check_attention(ex, rng, q, k, v, ex.causal, 3, 2, "causal", scale=scale)


# ---- block_sparse_flash and block_sparse_io -----------------------------------------------------

IO_SHAPES = [(1, 4, 1, 1), (7, 3, 2, 3), (13, 5, 4, 3), (16, 4, 4, 4), (23, 4, 8, 5), (37, 6, 8, 5)]


def flash_hbm(rng, allowed, n, d, block_q, block_k):
    """The simulator's HBM holding Q, K, V (n, d), the unlisted keys and values NaN, and O, L all NaN
    (a row left unwritten shows); with the clean q, k, v."""
    hbm = HBM(2 * block_q * d + 2 * block_k * d + block_q)
    q, k, v = rng.standard_normal((3, n, d))
    for name, value in zip("QKV", (q, *poisoned(k, v, allowed, block_q, block_k)[:2])):
        hbm.put(name, value)
    hbm.put("O", np.full((n, d), np.nan))
    hbm.put("L", np.full(n, np.nan))
    return hbm, (q, k, v)


def run_flash(ex, rng, mod, n, d, block_q, block_k, label, scale=None):
    __tracebackhide__ = True
    allowed = dense(mod, n, n)
    bm = oracle_mask(allowed, block_q, block_k, rng)
    hbm, (q, k, v) = flash_hbm(rng, allowed, n, d, block_q, block_k)
    what = (f"block_sparse_flash(hbm with Q, K, V ({n}, {d}), {label}, block_q={block_q}, block_k={block_k}"
            + ("" if scale is None else f", scale={scale}") + ")")
    call_counted(ex.block_sparse_flash, hbm, what, bm, mod, scale=scale,
                 fits="a query block's Q rows, one key tile's K and V rows, and the O and L rows being written")
    return hbm, allowed, bm, (q, k, v), what


@pytest.mark.parametrize("shape", IO_SHAPES, ids=lambda s: case_id(n=s[0], d=s[1], bq=s[2], bk=s[3]))
@pytest.mark.parametrize("mask", ["causal", "window3", "documents", "random", "keys_from5"])
def test_flash_is_exact_and_moves_the_listed_tiles(ex, rng, mask, shape):
    """Unlisted or garbage tiles read, Q re-read per tile, O or L written per tile, the mask skipped
    on partial tiles, the closed form missing the partial tiles' reads or the short last block, and
    (keys_from5: and_masks(causal, keys >= 5)) a query block that lists no tile left unwritten, or
    its fully masked rows given an lse other than -inf."""
    n, d, block_q, block_k = shape
    mod = masks(ex, rng, n, n)[mask]
    hbm, allowed, bm, (q, k, v), what = run_flash(ex, rng, mod, n, d, block_q, block_k, mask)
    o, lse = attention(q, k, v, allowed)
    check_outputs(hbm, {"O": (o, MASKED_ROW), "L": (lse, MASKED_ROW)}, what)
    keys = sum(listed_keys(allowed, block_q, block_k))
    moves = {"Q": (n * d, 0), "K": (keys * d, 0), "V": (keys * d, 0), "O": (0, n * d), "L": (0, n)}
    check_moves(hbm, moves, what, FLASH_MOVES)
    got = ex.block_sparse_io(n, d, block_q, block_k, bm)
    assert tuple(got) == (hbm.reads, hbm.writes) == totals(moves), (
        f"block_sparse_io({n}, {d}, {block_q}, {block_k}, {mask}) = {tuple(got)}, the simulation moved "
        f"{(hbm.reads, hbm.writes)}, the hand count is {totals(moves)} (reads, writes)\n  convention: {FLASH_MOVES}")


@pytest.mark.parametrize("scale", [0.3, 0.0], ids=["0.3", "0.0"])
def test_flash_scale(ex, rng, scale):
    """block_sparse_flash ignoring its scale (every tile at 1/sqrt(d)), or taking 0.0 for a missing one."""
    n, d, block_q, block_k = 13, 5, 4, 3
    hbm, allowed, _, (q, k, v), what = run_flash(ex, rng, ex.causal, n, d, block_q, block_k, "causal", scale)
    o, lse = attention(q, k, v, allowed, scale)
    check_outputs(hbm, {"O": (o, f"scores are scale · q kᵀ, here scale = {scale}"),
                        "L": (lse, f"lse of scale · q kᵀ, here scale = {scale}")}, what)


SWEEP = [(n, d, bq, bk) for n in (1, 2, 5, 9, 16, 33) for d, bq, bk in ((4, 4, 4), (3, 2, 5), (8, 5, 3))]


@pytest.mark.parametrize("n, d, block_q, block_k", SWEEP, ids=[case_id(n=n, d=d, bq=q, bk=k) for n, d, q, k in SWEEP])
def test_io_closed_form_sweep(ex, rng, n, d, block_q, block_k):
    """Counts off at a ragged edge (the short last key block counted whole), partial or full tiles
    left out, garbage past the counts counted, or floats instead of exact Python ints."""
    for label, mod in masks(ex, rng, n, n).items():
        allowed = dense(mod, n, n)
        keys = sum(listed_keys(allowed, block_q, block_k))
        want = (n * d + 2 * d * keys, n * d + n)
        got = ex.block_sparse_io(n, d, block_q, block_k, oracle_mask(allowed, block_q, block_k, rng))
        assert tuple(got) == want and all(type(c) is int for c in got), (
            f"block_sparse_io({n}, {d}, {block_q}, {block_k}, {label}): expected {want} as Python ints, got "
            f"{tuple(got)!r} ({', '.join(type(c).__name__ for c in got)})\n  convention: {FLASH_MOVES}")
