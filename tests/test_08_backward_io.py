"""Tests for exercise 08: the backward pass of standard attention and FlashAttention on the HBM simulator.

Every run happens in an HBM whose SRAM holds what the lesson keeps live at once: for FlashAttention
one key block's K, V, dK, dV beside one query block's tiles; for standard attention one block of
full rows of P, dP and dS (kernel 3) or one tile. Counts are checked array by array against
numbers this file derives by hand (blocks counted, a causal tile kept iff its first key comes
no later than its last query, the one pair that decides whether any may attend); gradients against the dense float64 formulas below. mutants/08_backward_io.toml holds
the bugs.
"""
import math

import numpy as np
import pytest

from hbm_helpers import call_counted, check_closed_forms, check_counts, check_outputs, check_times, totals
from kata.given.hbm import HBM
from oracles import allowed_pairs, case_id, weights

STANDARD_MOVES = ("kernel 1 reads P tiles and dO rows per key block; kernel 2 reads dO once per query block "
                  "and V per key block, writing dP; kernel 3 reads full rows of P and dP, writing dS; kernel 4 "
                  "reads dS tiles and K per query block; kernel 5 dS tiles and Q per key block")
FLASH_MOVES = ("D's pass reads dO and O once and writes D; then per key block K and V once, and per scheduled "
               "query block its Q, dO, L, D and dQ (a tile read whole), dQ written back; dK, dV written once")
CAUSAL = "causal: query i attends key j iff j <= i"
GRADIENTS = ("P = exp(scale·QKᵀ - L), dV = PᵀdO, dP = dO Vᵀ, dS = P ∘ (dP - D) with D = rowsum(dO ∘ O), "
             "dQ = scale·dS K, dK = scale·dSᵀQ")

SHAPES = [(1, 4, 1, 1), (4, 2, 2, 2), (5, 3, 2, 3), (5, 4, 8, 8), (7, 3, 2, 3), (8, 4, 4, 4), (13, 5, 4, 3),
          (16, 8, 4, 8), (23, 4, 8, 5), (32, 4, 8, 8), (37, 6, 8, 5), (50, 8, 7, 12)]  # (n, d, block_q, block_k)
CASES = [pytest.param(*shape, causal, id=case_id(causal, n=shape[0], d=shape[1], bq=shape[2], bk=shape[3]))
         for shape in SHAPES for causal in (False, True)]
ALGORITHMS = pytest.mark.parametrize("algorithm", ["standard_attention_backward", "flash_attention_backward"],
                                     ids=["standard", "flash"])
EITHER = pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])


def oracle(q, k, v, do, causal, scale=None):
    """The forward's O, L, P and the backward's dP, dS, D, dQ, dK, dV of dense attention, in float64."""
    scale = 1 / math.sqrt(q.shape[1]) if scale is None else scale
    p, lse = weights(q, k, allowed_pairs(len(q), len(k), causal), scale)
    o = p @ v
    dp = do @ v.T
    delta = (do * o).sum(axis=1)
    ds = p * (dp - delta[:, None])
    return {"O": o, "L": lse, "P": p, "dP": dp, "dS": ds, "D": delta,
            "dQ": scale * ds @ k, "dK": scale * ds.T @ q, "dV": p.T @ do}


# ---- the hand count -----------------------------------------------------------------------------

def blocks(n, size):
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def scheduled_rows(n, block_q, block_k, causal):
    """Query rows read per key block: a tile counts iff some (query, key) pair in it may attend, that
    is iff its first key j is at most its last query i (j <= i). Ranges and ints only: exact at any n."""
    return [sum(len(rows) for rows in blocks(n, block_q) if not causal or keys[0] <= rows[-1])
            for keys in blocks(n, block_k)]


def standard_moves(n, d, block_q, block_k):
    """{array: (reads, writes)} for the five kernels of Algorithm 3."""
    per_key_block, per_query_block = len(blocks(n, block_k)) * n * d, len(blocks(n, block_q)) * n * d
    return {"Q": (per_key_block, 0), "K": (per_query_block, 0), "V": (per_query_block, 0), "O": (0, 0),
            "dO": (per_key_block + n * d, 0), "L": (0, 0), "P": (2 * n * n, 0), "dP": (n * n, n * n),
            "dS": (2 * n * n, n * n), "dQ": (0, n * d), "dK": (0, n * d), "dV": (0, n * d)}


def flash_moves(n, d, block_q, block_k, causal):
    """{array: (reads, writes)} for FlashAttention's backward, tile by tile."""
    rows = sum(scheduled_rows(n, block_q, block_k, causal))
    return {"Q": (rows * d, 0), "K": (n * d, 0), "V": (n * d, 0), "O": (n * d, 0), "dO": (n * d + rows * d, 0),
            "L": (rows, 0), "D": (rows, n), "dQ": (rows * d, rows * d), "dK": (0, n * d), "dV": (0, n * d)}


# ---- running the learner's code -----------------------------------------------------------------

def call(name, n, d, block_q, block_k, causal, scale=None):
    extra = ", causal=True" if causal else ""
    extra += f", scale={scale}" if scale is not None else ""
    return f"{name}(hbm with Q, K, V, dO ({n}, {d}), block_q={block_q}, block_k={block_k}{extra})"


def offset_scores(rng, n, d, row_offset):
    """Q, K (n, d) whose scores at the default scale 1/sqrt(d) = 1/2 (d = 4) are row_offset_i plus a
    few sixteenths: multiples of 1/16 and integers, so every score is exact in float64 whatever the
    order of the sums, and a tile's P equals the oracle's bit for bit even at offsets of -1e10."""
    q, k = rng.integers(-4, 5, (2, n, d)) / 4
    q[:, 0], k[:, 0] = 2 * np.asarray(row_offset, float), 1.0
    return q, k


def run(function, rng, n, d, block_q, block_k, causal, scale=None, q_times=1.0, row_offset=None):
    """Run the learner's function on random Q, K, V, dO (Q scaled by `q_times`; with `row_offset`,
    Q and K from offset_scores) and the forward's O, L (and P for standard), in an SRAM that fits
    one key block and one query block's tiles. Outputs start as NaN, except flash's dQ, which
    starts at 0 as the lesson says."""
    __tracebackhide__ = True
    q, k, v, do = rng.standard_normal((4, n, d))
    q = q_times * q
    if row_offset is not None:
        q, k = offset_scores(rng, n, d, row_offset)
    expected = oracle(q, k, v, do, causal, scale)
    standard = function.__name__ == "standard_attention_backward"
    if standard:  # kernel 3's full rows of P, dP and dS, or a tile with its K, V, Q or dO rows
        capacity = 3 * block_q * n + block_q * d + block_k * d
        outputs = {"dP": (n, n), "dS": (n, n), "dQ": (n, d), "dK": (n, d), "dV": (n, d)}
    else:  # K, V, dK, dV of a key block; Q, dO, dQ in and out, L and D of a query block
        capacity = 4 * block_k * d + 4 * block_q * d + 2 * block_q
        outputs = {"D": (n,), "dK": (n, d), "dV": (n, d)}
    hbm = HBM(capacity)
    for name, value in {"Q": q, "K": k, "V": v, "O": expected["O"], "dO": do, "L": expected["L"]}.items():
        hbm.put(name, value)
    if standard:
        hbm.put("P", expected["P"])
    else:
        hbm.zeros("dQ", (n, d))
    for name, shape in outputs.items():
        hbm.put(name, np.full(shape, np.nan))  # poisoned: an element never written stays NaN
    what = call(function.__name__, n, d, block_q, block_k, causal, scale)
    call_counted(function, hbm, what, block_q, block_k, causal=causal, scale=scale)
    return hbm, expected, what


# ---- standard attention backward ----------------------------------------------------------------

@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_standard_gradients_are_exact(ex, rng, n, d, block_q, block_k, causal):
    """dS without the rowsum term, P not transposed in kernel 1, the scale forgotten in dQ or dK,
    an output never written (left NaN)."""
    hbm, expected, what = run(ex.standard_attention_backward, rng, n, d, block_q, block_k, causal)
    rule = f"{GRADIENTS}; P is 0 where masked ({CAUSAL})" if causal else GRADIENTS
    check_outputs(hbm, {name: (expected[name], rule) for name in ("dV", "dP", "dS", "dQ", "dK")}, what)


@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_standard_moves_what_the_closed_form_says(ex, rng, n, d, block_q, block_k, causal):
    """A kernel that reads dO or Q once instead of per key block, reads P once, skips writing dP,
    or counts T_c with block_q."""
    hbm, _, what = run(ex.standard_attention_backward, rng, n, d, block_q, block_k, causal)
    check_counts(hbm, ex.standard_backward_io, standard_moves(n, d, block_q, block_k), what, STANDARD_MOVES,
                 (n, d, block_q, block_k), causal)


@EITHER
def test_standard_writes_each_output_once(ex, rng, causal):
    """A tile of dP or dS written twice, or dQ, dK, dV written per tile instead of once summed."""
    n, d, block_q, block_k = 23, 4, 8, 5
    hbm, _, what = run(ex.standard_attention_backward, rng, n, d, block_q, block_k, causal)
    for name in ("dP", "dS", "dQ", "dK", "dV"):
        check_times(hbm, "write", name, 1, what, "each kernel keeps its sum on chip and writes it once")
    check_times(hbm, "read", "P", 2, what, "P is read by kernel 1 (dV) and kernel 3 (dS)")


# ---- FlashAttention backward --------------------------------------------------------------------

@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_flash_gradients_are_exact(ex, rng, n, d, block_q, block_k, causal):
    """D taken from one tile instead of the whole row, dQ overwritten instead of added to, the mask
    forgotten, P rebuilt with the wrong scale, dK or dV never written (left NaN)."""
    hbm, expected, what = run(ex.flash_attention_backward, rng, n, d, block_q, block_k, causal)
    rule = f"{GRADIENTS}; masked pairs have P = 0 ({CAUSAL})" if causal else GRADIENTS
    check_outputs(hbm, {name: (expected[name], rule) for name in ("D", "dQ", "dK", "dV")}, what)


@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_flash_moves_what_the_closed_form_says(ex, rng, n, d, block_q, block_k, causal):
    """Skipped causal tiles read, Q or dO read once per query block instead of per tile, L or D
    forgotten, dK or dV written per tile."""
    hbm, _, what = run(ex.flash_attention_backward, rng, n, d, block_q, block_k, causal)
    check_counts(hbm, ex.flash_backward_io, flash_moves(n, d, block_q, block_k, causal), what, FLASH_MOVES,
                 (n, d, block_q, block_k), causal)


@EITHER
def test_flash_moves_dq_once_per_scheduled_tile(ex, rng, causal):
    """dK or dV written per query block, K and V re-read, dQ read or written once per row instead of
    once per tile its row's query block meets, D written twice."""
    n, d, block_q, block_k = 37, 6, 8, 5
    hbm, _, what = run(ex.flash_attention_backward, rng, n, d, block_q, block_k, causal)
    for op, name in (("read", "K"), ("read", "V"), ("write", "dK"), ("write", "dV"), ("write", "D")):
        check_times(hbm, op, name, 1, what, FLASH_MOVES)
    tiles = np.zeros(n, int)  # key blocks scheduled with each row's query block
    for keys in blocks(n, block_k):
        for rows in blocks(n, block_q):
            if not causal or any(j <= i for i in rows for j in keys):
                tiles[list(rows)] += 1
    for op in ("read", "write"):
        check_times(hbm, op, "dQ", tiles, what, "dQ_i is read, added to and written back once per scheduled tile")


def test_flash_survives_huge_scores(ex, rng):
    """P rebuilt as exp(s) / exp(L) or exp(s) · exp(-L): with scores in the thousands both overflow."""
    n, d, block_q, block_k = 24, 4, 4, 6
    hbm, expected, what = run(ex.flash_attention_backward, rng, n, d, block_q, block_k, False, q_times=300.0)
    rule = "P = exp(s - L) in one exp: s - L <= 0, so it never overflows"
    check_outputs(hbm, {name: (expected[name], rule) for name in ("dQ", "dK", "dV")}, what + " with Q times 300")


def test_flash_rows_whose_live_scores_are_all_far_below_zero(ex, rng):
    """Masked scores filled with a finite number (-1e4, -1e9, -50) instead of -inf: harmless while a
    row keeps a live score above it, but rows whose live scores all lie near -3e4 or -1e10 (scores may
    hold any finite value) give their masked pairs exp(fill - L) = exp(+huge) = inf, and NaN."""
    n, d, block_q, block_k = 24, 4, 4, 6
    row_offset = np.resize([-1e10, 0.0, -3e4, -1e6, -60.0, -1e10], n)
    hbm, expected, what = run(ex.flash_attention_backward, rng, n, d, block_q, block_k, True, row_offset=row_offset)
    rule = "a pair that may not attend has the score -inf, so P = 0 whatever L is; a finite fill is not below every live score"
    check_outputs(hbm, {name: (expected[name], rule) for name in ("dQ", "dK", "dV")},
                  what + ", rows' scores offset by -1e10, 0, -3e4, -1e6, -60, -1e10 in turn")


# ---- both ---------------------------------------------------------------------------------------

@ALGORITHMS
@EITHER
def test_reads_are_tiles(ex, rng, algorithm, causal):
    """All of K, V or Q read at once and sliced on chip, P read a column block (all n rows) at a time,
    or kernel 3 reading dP tile by tile: the counts come out the same, not the kernels described."""
    n, d, block_q, block_k = 23, 4, 8, 5
    hbm, _, what = run(getattr(ex, algorithm), rng, n, d, block_q, block_k, causal)
    most = {"K": (block_k, None), "V": (block_k, None), "Q": (block_q, None), "L": (block_q, None),
            "dQ": (block_q, None), "P": (block_q, None), "dS": (block_q, block_k), "dP": (block_q, n)}
    if algorithm == "standard_attention_backward":
        most["dO"] = (block_q, None)
    for t in hbm.log:
        if t.op != "read" or t.name not in most:
            continue
        rows, cols = t.rows[1] - t.rows[0], None if t.cols is None else t.cols[1] - t.cols[0]
        max_rows, want_cols = most[t.name]
        if rows > max_rows or (t.name == "dS" and cols > want_cols) or (t.name == "dP" and cols != n):
            shape = f"{rows} rows" + ("" if cols is None else f" x {cols} columns")
            raise AssertionError(f"{what}: read {t.name}[{t.rows[0]}:{t.rows[1]}"
                                 f"{'' if t.cols is None else f', {t.cols[0]}:{t.cols[1]}'}], {shape}\n"
                                 f"  convention: K and V are read at most block_k rows at a time; Q, dO, L, "
                                 f"dQ, P at most block_q rows; dS in tiles; dP a block of full rows (kernel 3)")


@ALGORITHMS
@pytest.mark.parametrize("scale", [0.37, 0.0], ids=["scale0.37", "scale0"])
@EITHER
def test_scale_argument_is_used(ex, rng, algorithm, scale, causal):
    """An explicit scale ignored in favour of 1/sqrt(d), or scale=0.0 taken for a missing scale
    (`scale or default`)."""
    n, d, block_q, block_k = 13, 5, 4, 3
    hbm, expected, what = run(getattr(ex, algorithm), rng, n, d, block_q, block_k, causal, scale=scale)
    rule = "scale multiplies QKᵀ, dQ and dK; 1/sqrt(d) only when scale is None (0.0 is a scale)"
    check_outputs(hbm, {name: (expected[name], rule) for name in ("dQ", "dK", "dV")}, what)


# ---- the closed forms ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_closed_forms_match_the_hand_count(ex, n, d, block_q, block_k, causal):
    """T_r or T_c rounded down, T_r and T_c swapped, causal tiles cut at the diagonal instead of read
    whole, or D's n writes forgotten."""
    check_closed_forms(ex, {"standard_backward_io": totals(standard_moves(n, d, block_q, block_k)),
                            "flash_backward_io": totals(flash_moves(n, d, block_q, block_k, causal))},
                       n, d, block_q, block_k, causal)


HUGE = [(2**60 + 3, 64, 2**56, 2**57), (2**60 + 3, 64, 2**56 + 1, 2**57)]  # (n, d, block_q, block_k)


@EITHER
@pytest.mark.parametrize("n, d, block_q, block_k", HUGE, ids=["bq2^56-bk2^57", "bq2^56+1-bk2^57"])
def test_closed_forms_are_exact_ints_at_any_size(ex, n, d, block_q, block_k, causal):
    """`/` anywhere (a float, exact only below 2^53: n² here is 2^120 + ...), math.ceil(n / block_q)
    (the quotient rounds: (2^60 + 3) / 2^56 is 16.0, not 16 + 3/2^56), floor(start / block_q) (2^57
    over 2^56 + 1 rounds up to 2.0) or a NumPy integer (wraps at 2^63). Counts are Python ints."""
    check_closed_forms(ex, {"standard_backward_io": totals(standard_moves(n, d, block_q, block_k)),
                            "flash_backward_io": totals(flash_moves(n, d, block_q, block_k, causal))},
                       n, d, block_q, block_k, causal)
    for name in ("standard_backward_io", "flash_backward_io"):
        got = getattr(ex, name)(n, d, block_q, block_k, causal=causal)
        kinds = [type(count).__name__ for count in got]
        assert kinds == ["int", "int"], (f"{name}(2**60 + 3, {d}, {block_q}, {block_k}, causal={causal}): expected "
                                         f"(reads, writes) as Python ints, got types {kinds}\n  convention: counts "
                                         f"are Python ints, exact for any size: // and -(-a // b), never /")


HAND = [  # (n, d, block_q, block_k, causal, standard (reads, writes), flash (reads, writes))
    (4, 2, 2, 2, False, (152, 56), (96, 36)),  # the lesson's worked example
    (4, 2, 2, 2, True, (152, 56), (80, 32)),  # R = 4 + 2 query rows
    (5, 3, 2, 3, False, (290, 95), (170, 65)),  # T_r = 3, T_c = 2: both blocks ragged
    (5, 3, 2, 3, True, (290, 95), (148, 59)),  # key block 3:5 skips query block 0:2, R = 5 + 3
    (8, 4, 4, 4, True, (608, 224), (296, 120)),  # R = 8 + 4
]


@pytest.mark.parametrize("n, d, block_q, block_k, causal, standard, flash", HAND,
                         ids=[case_id(h[4], n=h[0], d=h[1], bq=h[2], bk=h[3]) for h in HAND])
def test_closed_forms_on_numbers_worked_by_hand(ex, n, d, block_q, block_k, causal, standard, flash):
    """The closed forms on small cases whose every term was added up on paper."""
    check_closed_forms(ex, {"standard_backward_io": standard, "flash_backward_io": flash}, n, d, block_q, block_k, causal)


def extra_traffic(n, d, block_q, block_k):
    """What standard moves beyond flash, non-causal: 7n² of P, dP and dS, the re-reads' difference
    2·(T_r - T_c)·nd, less flash's extra 2nd and the 2·T_c·n reads of L and D, less D's n writes."""
    t_r, t_c = -(-n // block_q), -(-n // block_k)
    return 7 * n * n - 2 * n * d + 2 * (t_r - t_c) * n * d - (2 * t_c + 1) * n


@pytest.mark.parametrize("n, d, block_q, block_k", [
    (1, 64, 128, 128), (7, 8, 3, 5), (100, 8, 3, 5), (1000, 8, 3, 5), (1024, 64, 128, 128),
    (1024, 64, 64, 128), (4096, 64, 128, 64), (16384, 64, 128, 128), (16384, 128, 64, 256)],
    ids=lambda v: str(v))
def test_standard_moves_7n2_more_than_flash(ex, n, d, block_q, block_k):
    """The closed forms against each other: the n x n traffic of Algorithm 3 is 7n² (P read twice,
    dP written and read, dS written and read twice); the rest is an exact difference of re-reads."""
    std, flash = (f(n, d, block_q, block_k) for f in (ex.standard_backward_io, ex.flash_backward_io))
    extra, expected = sum(std) - sum(flash), extra_traffic(n, d, block_q, block_k)
    assert extra == expected, (f"n={n}, d={d}, block_q={block_q}, block_k={block_k}: standard moves "
                               f"{sum(std)}, flash {sum(flash)}, {extra} more; expected 7n² - 2nd + "
                               f"2·(T_r - T_c)·nd - (2·T_c + 1)·n = {expected}")


@EITHER
@pytest.mark.parametrize("n, d, block_q, block_k", [(5, 4, 2, 3), (16, 4, 4, 4), (33, 8, 8, 6)],
                         ids=["n5-d4-bq2-bk3", "n16-d4-bq4-bk4", "n33-d8-bq8-bk6"])
def test_simulated_extra_traffic_is_exact(ex, rng, n, d, block_q, block_k, causal):
    """Measured, not computed: the two simulations differ by 7n² - 2nd + 2·(T_r + T_c)·nd - n
    - (4d + 2)·R, R the query rows of flash's scheduled tiles (T_c·n when not causal)."""
    std, _, _ = run(ex.standard_attention_backward, rng, n, d, block_q, block_k, causal)
    flash, _, _ = run(ex.flash_attention_backward, rng, n, d, block_q, block_k, causal)
    t_r, t_c, rows = -(-n // block_q), -(-n // block_k), sum(scheduled_rows(n, block_q, block_k, causal))
    expected = 7 * n * n - 2 * n * d + 2 * (t_r + t_c) * n * d - n - (4 * d + 2) * rows
    extra = (std.reads + std.writes) - (flash.reads + flash.writes)
    assert extra == expected, (f"n={n}, d={d}, block_q={block_q}, block_k={block_k}, causal={causal}: standard "
                               f"moved {std.reads + std.writes}, flash {flash.reads + flash.writes}; expected a "
                               f"difference of {expected} (R = {rows}), got {extra}")
