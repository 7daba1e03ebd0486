"""Tests for exercise 05: standard attention and FlashAttention on the HBM simulator, and their IO.

Every run happens in an HBM whose SRAM holds one query block and one key tile (plus the rows
being written), never a whole matrix. Counts are checked array by array against numbers this file
derives by hand: the query blocks counted, the causal tiles found by testing every (query, key)
pair. Outputs are checked against a dense float64 oracle. block_sizes is checked against its rule
at every M from 3d to 40d², and measured: the walk at its sizes fits hbm.capacity = M, and its K and
V traffic falls as 1/M (Theorem 2). mutants/05_io_counting.toml holds the bugs.
"""
import numpy as np
import pytest

from hbm_helpers import call_counted, check_closed_forms, check_counts, check_outputs, check_times, totals
from kata.given.hbm import HBM
from oracles import allowed_pairs, case_id, scores, weights

FLASH_MOVES = ("FlashAttention reads Q once per query block, the K and V rows of each scheduled "
               "tile, writes O and L once, and never touches S or P")
STANDARD_MOVES = ("kernel 1 reads each Q block once and all of K per query block, writing S; kernel 2 "
                  "reads S and writes P; kernel 3 reads P and all of V per query block, writing O")
CAUSAL = "causal: query i attends key j iff j <= i"
TILES = ("K and V are read a key block (at most block_k rows) at a time; kernel 2 of standard attention "
         "reads S a query block of full rows (all n columns) at a time")

SHAPES = [(1, 4, 1, 1), (4, 2, 2, 2), (5, 4, 8, 8), (7, 3, 2, 3), (8, 4, 4, 4), (13, 5, 4, 3),
          (16, 8, 4, 8), (23, 4, 8, 5), (32, 8, 8, 8), (37, 6, 8, 5), (48, 4, 16, 4), (50, 8, 7, 12),
          (64, 8, 16, 16)]  # (n, d, block_q, block_k)
CASES = [pytest.param(*shape, causal, id=case_id(causal, n=shape[0], d=shape[1], bq=shape[2], bk=shape[3]))
         for shape in SHAPES for causal in (False, True)]


def query_blocks(n, block_q):
    return [range(start, min(start + block_q, n)) for start in range(0, n, block_q)]


def scheduled_key_rows(n, block_q, block_k, causal):
    """Key rows read per query block: a tile counts iff some (query, key) pair in it may attend."""
    tiles = query_blocks(n, block_k)
    return [sum(len(keys) for keys in tiles
                if not causal or any(j <= i for i in rows for j in keys))
            for rows in query_blocks(n, block_q)]


def flash_moves(n, d, block_q, block_k, causal):
    """{array: (reads, writes)} for FlashAttention, tile by tile."""
    keys = sum(scheduled_key_rows(n, block_q, block_k, causal))
    return {"Q": (n * d, 0), "K": (keys * d, 0), "V": (keys * d, 0), "S": (0, 0), "P": (0, 0),
            "O": (0, n * d), "L": (0, n)}


def standard_moves(n, d, block_q, block_k):
    """{array: (reads, writes)} for the three kernels of standard attention."""
    per_block_kv = len(query_blocks(n, block_q)) * n * d  # all of K (kernel 1) or V (kernel 3) per block
    return {"Q": (n * d, 0), "K": (per_block_kv, 0), "S": (n * n, n * n), "P": (n * n, n * n),
            "V": (per_block_kv, 0), "O": (0, n * d), "L": (0, 0)}


def oracle(q, k, v, causal, scale=None):
    """S, P, O, L of dense attention in float64 (tests/oracles.py: lse by pairwise logaddexp, no max trick)."""
    p, lse = weights(q, k, allowed_pairs(len(q), len(k), causal), scale)
    return scores(q, k, scale), p, p @ v, lse


def call(name, n, d, block_q, block_k, causal, scale=None):
    extra = ", causal=True" if causal else ""
    extra += f", scale={scale}" if scale is not None else ""
    return f"{name}(hbm with Q, K, V ({n}, {d}), block_q={block_q}, block_k={block_k}{extra})"


def run(function, rng, n, d, block_q, block_k, causal, scale=None, qkv=None, capacity=None):
    """Run the learner's function in an HBM whose SRAM fits one query block and one key tile.

    Q, K, V are `qkv` (default: standard normal). During the call hbm.array raises: it reads back
    without counting, so an output computed from it would dodge every count. `capacity` (elements)
    replaces the SRAM's default size: block_sizes' M.
    """
    __tracebackhide__ = True
    if capacity is not None:
        fits = (f"block_sizes(M={capacity}, d={d})'s blocks if they are right: a Q block and one K and one V "
                f"tile, d·(block_q + 2·block_k) = {d * (block_q + 2 * block_k)} elements here")
    elif function.__name__ == "flash_attention":
        capacity = 2 * block_q * d + 2 * block_k * d + block_q  # Q and O rows, K and V tile, L rows
        fits = "a query block's Q rows, one key tile's K and V rows, and the O and L rows being written"
    else:
        capacity = 2 * block_q * n + block_q * d + block_k * d  # S rows and P rows, or a Q, K, S tile
        fits = "a query block of full rows of S and of P, or a Q block, a K tile and an S tile"
    hbm = HBM(capacity)
    q, k, v = rng.standard_normal((3, n, d)) if qkv is None else qkv
    for name, value in (("Q", q), ("K", k), ("V", v)):
        hbm.put(name, value)
    for name, shape in (("O", (n, d)), ("L", (n,)), ("S", (n, n)), ("P", (n, n))):
        hbm.put(name, np.full(shape, np.nan))  # poisoned: an element never written stays NaN
    what = call(function.__name__, n, d, block_q, block_k, causal, scale)
    call_counted(function, hbm, what, block_q, block_k, causal=causal, scale=scale, fits=fits)
    return hbm, (q, k, v), what


@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_standard_outputs_are_exact(ex, rng, n, d, block_q, block_k, causal):
    """Mask applied in kernel 1 instead of 2, softmax over the wrong axis, P or O left NaN."""
    hbm, (q, k, v), what = run(ex.standard_attention, rng, n, d, block_q, block_k, causal)
    s, p, o, _ = oracle(q, k, v, causal)
    rule = CAUSAL if causal else "P = softmax(S) over each row, O = PV"
    check_outputs(hbm, {"S": (s, "kernel 1 writes S = scale·QKᵀ unmasked; kernel 2 applies the mask"),
                        "P": (p, rule), "O": (o, rule)}, what)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_standard_writes_s_and_p_fully_once(ex, rng, causal):
    """Kernel 1 skips masked tiles, kernel 2 writes only part of P, or a tile is written twice."""
    n, d, block_q, block_k = 23, 4, 8, 5
    hbm, _, what = run(ex.standard_attention, rng, n, d, block_q, block_k, causal)
    for op, name in (("write", "S"), ("read", "S"), ("write", "P"), ("read", "P"), ("write", "O")):
        check_times(hbm, op, name, 1, what, "S and P are each written once and read once, element by element; O written once")


@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_standard_moves_what_the_closed_form_says(ex, rng, n, d, block_q, block_k, causal):
    """A kernel that skips writing P or S, reads Q per tile, or reads K and V once instead of per block."""
    hbm, _, what = run(ex.standard_attention, rng, n, d, block_q, block_k, causal)
    check_counts(hbm, ex.standard_attention_io, standard_moves(n, d, block_q, block_k), what, STANDARD_MOVES,
                 (n, d, block_q, block_k), causal)


@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_flash_outputs_are_exact(ex, rng, n, d, block_q, block_k, causal):
    """A wrong rescale of l or acc, a missing mask, O or L never written (left NaN), lse off by m."""
    hbm, (q, k, v), what = run(ex.flash_attention, rng, n, d, block_q, block_k, causal)
    _, _, o, lse = oracle(q, k, v, causal)
    rule = CAUSAL if causal else "O = softmax(scale·QKᵀ)V, L = logsumexp of each row of scores"
    check_outputs(hbm, {"O": (o, rule), "L": (lse, rule)}, what)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_reads_each_q_row_once_and_writes_each_output_once(ex, rng, causal):
    """Q re-read per key tile, O or L written per key tile, S or P materialised after all."""
    n, d, block_q, block_k = 37, 6, 8, 5
    hbm, _, what = run(ex.flash_attention, rng, n, d, block_q, block_k, causal)
    for op, name in (("read", "Q"), ("write", "O"), ("write", "L")):
        check_times(hbm, op, name, 1, what, FLASH_MOVES)
    touched = {t.name for t in hbm.log} & {"S", "P"}
    assert not touched, f"{what} moved {sorted(touched)}: FlashAttention never materialises S or P in HBM"


@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_flash_moves_what_the_closed_form_says(ex, rng, n, d, block_q, block_k, causal):
    """Q re-read per key tile, K and V read whole, skipped causal tiles read, L or O written per tile."""
    hbm, _, what = run(ex.flash_attention, rng, n, d, block_q, block_k, causal)
    check_counts(hbm, ex.flash_attention_io, flash_moves(n, d, block_q, block_k, causal), what, FLASH_MOVES,
                 (n, d, block_q, block_k), causal)


ALGORITHMS = pytest.mark.parametrize("algorithm", ["standard_attention", "flash_attention"],
                                     ids=["standard", "flash"])


@ALGORITHMS
@pytest.mark.parametrize("scale", [0.37, 0.0], ids=["scale0.37", "scale0"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_scale_argument_is_used(ex, rng, algorithm, scale, causal):
    """An explicit scale ignored in favour of 1/sqrt(d), or applied twice; scale=0.0 taken for a
    missing scale (`scale or default`): with 0.0 every key a query may attend weighs the same."""
    n, d, block_q, block_k = 13, 5, 4, 3
    hbm, (q, k, v), what = run(getattr(ex, algorithm), rng, n, d, block_q, block_k, causal, scale=scale)
    _, _, o, _ = oracle(q, k, v, causal, scale)
    check_outputs(hbm, {"O": (o, "scale multiplies QKᵀ; 1/sqrt(d) only when scale is None (0.0 is a scale)")},
                  what)


def test_flash_survives_huge_scores(ex, rng):
    """exp of unshifted scores overflows; a running max never used to rescale gives inf / inf."""
    n, d, block_q, block_k = 24, 4, 4, 6
    q, k, v = rng.standard_normal((3, n, d))
    hbm, (q, k, v), what = run(ex.flash_attention, rng, n, d, block_q, block_k, False, qkv=(300 * q, k, v))
    _, _, o, lse = oracle(q, k, v, False)
    rule = "subtract the running max m before exp; rescale l and acc by exp(m_old - m_new)"
    check_outputs(hbm, {"O": (o, rule), "L": (lse, rule)}, what + " with scores in the thousands")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_all_scores_far_below_zero(ex, rng, causal):
    """A running max started at 0 instead of -inf: every score lies below -1000, so exp(s - 0)
    underflows to 0 and the row comes out 0 / 0 instead of exact."""
    n, d, block_q, block_k = 13, 4, 4, 3
    qkv = (np.full((n, d), -1000.0), np.abs(rng.standard_normal((n, d))) + 0.5, rng.standard_normal((n, d)))
    hbm, (q, k, v), what = run(ex.flash_attention, rng, n, d, block_q, block_k, causal, qkv=qkv)
    _, _, o, lse = oracle(q, k, v, causal)
    rule = "m starts at -inf: the first tile's max sets it, however far below 0 the scores lie"
    check_outputs(hbm, {"O": (o, rule), "L": (lse, rule)}, what + " with every score below -1000")


@ALGORITHMS
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reads_are_tiles(ex, rng, algorithm, causal):
    """All of K (or V) read at once per query block and sliced on chip, or kernel 2 reading S tile by
    tile: the counts come out the same, but not the kernels the lesson describes."""
    n, d, block_q, block_k = 23, 4, 8, 5
    hbm, _, what = run(getattr(ex, algorithm), rng, n, d, block_q, block_k, causal)
    for t in hbm.log:
        rows, cols = t.rows[1] - t.rows[0], t.cols
        wide_kv = t.name in "KV" and rows > block_k
        partial_s = algorithm == "standard_attention" and t.name == "S" and t.op == "read" and cols != (0, n)
        if wide_kv or partial_s:
            raise AssertionError(f"{what}: read {t.name}[{t.rows[0]}:{t.rows[1]}, "
                                 f"{'all columns' if cols is None else f'{cols[0]}:{cols[1]}'}]\n"
                                 f"  convention: {TILES}")


@pytest.mark.parametrize("n, d, block_q, block_k, causal", CASES)
def test_closed_forms_match_the_hand_count(ex, n, d, block_q, block_k, causal):
    """T_r rounded down (floor, not ceil), causal tiles counted as if all were read, L forgotten."""
    check_closed_forms(ex, {"standard_attention_io": totals(standard_moves(n, d, block_q, block_k)),
                            "flash_attention_io": totals(flash_moves(n, d, block_q, block_k, causal))},
                       n, d, block_q, block_k, causal)


HAND = [  # (n, d, block_q, block_k, causal, standard (reads, writes), flash (reads, writes))
    (4, 2, 2, 2, False, (72, 40), (40, 12)),  # the lesson's worked example
    (5, 3, 2, 3, False, (155, 65), (105, 20)),  # T_r = 3: the last query block holds one row
    (5, 3, 2, 3, True, (155, 65), (93, 20)),  # keys per query block 3, 5, 5
    (8, 4, 4, 4, True, (288, 160), (128, 40)),  # keys per query block 4, 8
]


@pytest.mark.parametrize("n, d, block_q, block_k, causal, standard, flash", HAND,
                         ids=[case_id(h[4], n=h[0], d=h[1], bq=h[2], bk=h[3]) for h in HAND])
def test_closed_forms_on_numbers_worked_by_hand(ex, n, d, block_q, block_k, causal, standard, flash):
    """The closed forms on small cases whose every term was added up on paper."""
    check_closed_forms(ex, {"standard_attention_io": standard, "flash_attention_io": flash}, n, d, block_q, block_k, causal)


# Sizes a count written as a loop over every tile (what Σ_i keys_i suggests) still grades in well
# under a second: at most about 10⁵ tiles each.
EXTRA = [(n, 64, 128, 128) for n in (1, 2, 7, 64, 100, 1024, 4096, 16384)] + \
        [(n, 8, 3, 5) for n in (1, 2, 7, 64, 100, 1000)]


@pytest.mark.parametrize("n, d, block_q, block_k", EXTRA, ids=[case_id(n=n, d=d, bq=q, bk=k) for n, d, q, k in EXTRA])
def test_standard_moves_4n2_minus_n_more_than_flash(ex, n, d, block_q, block_k):
    """The S and P traffic: written and read back once each (4n²), less the n values of L."""
    std, flash = (f(n, d, block_q, block_k) for f in (ex.standard_attention_io, ex.flash_attention_io))
    extra = sum(std) - sum(flash)
    assert extra == 4 * n * n - n, (f"n={n}, d={d}, block_q={block_q}, block_k={block_k}: standard "
                                    f"moves {sum(std)}, flash {sum(flash)}, {extra} more; expected "
                                    f"4n² - n = {4 * n * n - n}")


@pytest.mark.parametrize("n, d, block_q, block_k", [(5, 4, 2, 3), (16, 4, 4, 4), (33, 8, 8, 6)],
                         ids=["n5-d4-bq2-bk3", "n16-d4-bq4-bk4", "n33-d8-bq8-bk6"])
def test_simulated_extra_traffic_is_4n2_minus_n(ex, rng, n, d, block_q, block_k):
    """Measured, not computed: the two simulations differ by exactly the S and P traffic less L."""
    std, _, _ = run(ex.standard_attention, rng, n, d, block_q, block_k, False)
    flash, _, _ = run(ex.flash_attention, rng, n, d, block_q, block_k, False)
    extra = (std.reads + std.writes) - (flash.reads + flash.writes)
    assert extra == 4 * n * n - n, (f"n={n}, d={d}, block_q={block_q}, block_k={block_k}: standard moved "
                                    f"{std.reads + std.writes}, flash {flash.reads + flash.writes}; "
                                    f"expected a difference of 4n² - n = {4 * n * n - n}, got {extra}")


BLOCK_RULE = ("block_q = ⌈M/4d⌉ (the paper's B_c, here the outer block); block_k = min(⌈M/4d⌉, d, "
              "⌊(M - d·block_q) / 2d⌋), the largest inner tile up to min(block_q, d) for which a Q block and "
              "one K and one V tile, d·(block_q + 2·block_k) elements, fit in M; M < 3d is a ValueError")


def rule_broken(M, d, block_q, block_k):
    """What (block_q, block_k) breaks of BLOCK_RULE at (M, d), or None."""
    if block_q != -(-M // (4 * d)):
        return f"block_q should be ⌈M/4d⌉ = {-(-M // (4 * d))}"
    if not 1 <= block_k <= min(block_q, d):
        return f"block_k should lie in 1..min(block_q, d) = 1..{min(block_q, d)}"
    if d * (block_q + 2 * block_k) > M:
        return f"a Q block and a K and a V tile hold d·(block_q + 2·block_k) = {d * (block_q + 2 * block_k)} > M"
    if block_k < min(block_q, d) and d * (block_q + 2 * (block_k + 1)) <= M:
        return f"block_k = {block_k + 1} fits too: {d * (block_q + 2 * block_k + 2)} <= M"
    return None


@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 8])
def test_block_sizes_follow_the_rule(ex, d):
    """Every M from 3d to 40d²: floor for ceil (block_q = 0 below 4d), no cap at d, the cut missing or
    rounded up (at M = 5d, (2, 2) holds 6d), a ValueError from 4d instead of 3d, the roles not swapped
    (block_q capped at d, block_k the large one)."""
    for M in range(3 * d, 40 * d * d + 1):
        try:
            block_q, block_k = ex.block_sizes(M, d)
        except ValueError as error:
            raise AssertionError(f"block_sizes(M={M}, d={d}) raised ValueError({error}): M >= 3d holds a row "
                                 f"each of Q, K and V\n  convention: {BLOCK_RULE}") from None
        broken = rule_broken(M, d, block_q, block_k)
        assert broken is None, (f"block_sizes(M={M}, d={d}) = ({block_q}, {block_k}): {broken}\n"
                                f"  convention: {BLOCK_RULE}")


HAND_BLOCKS = [(12, 4, (1, 1)), (20, 4, (2, 1)), (64, 4, (4, 4)), (256, 4, (16, 4)),  # the lesson's
               (3, 1, (1, 1)), (5, 1, (2, 1)), (100, 8, (4, 4)), (1000, 8, (32, 8))]


@pytest.mark.parametrize("M, d, expected", HAND_BLOCKS, ids=[f"M{M}-d{d}" for M, d, _ in HAND_BLOCKS])
def test_block_sizes_on_numbers_worked_by_hand(ex, M, d, expected):
    """The rule on sizes worked on paper, the lesson's worked example among them."""
    got = tuple(ex.block_sizes(M, d))
    assert got == expected, (f"block_sizes(M={M}, d={d}): expected (block_q, block_k) = {expected}, got {got}\n"
                             f"  convention: {BLOCK_RULE}")


@pytest.mark.parametrize("M, d", [(0, 4), (2, 1), (11, 4), (23, 8), (8, 0)])
def test_block_sizes_refuse_an_sram_below_one_row_each(ex, M, d):
    """No check: below 3d the cut gives block_k = 0, a walk that never moves forward; d = 0 divides by 0."""
    with pytest.raises(ValueError):
        ex.block_sizes(M, d)


FIT = [(M, d) for d in (1, 3, 4, 8)
       for M in sorted({3 * d, 4 * d - 1, 4 * d + 1, 5 * d, 6 * d - 1, 7 * d + 1, 4 * d * d + 1, 16 * d * d - 1})]


@pytest.mark.parametrize("M, d", FIT, ids=[f"M{M}-d{d}" for M, d in FIT])
def test_flash_walk_fits_the_sram_block_sizes_plans_for(ex, rng, M, d):
    """Measured on the simulator with hbm.capacity = M: the paper's sizes uncut ((2, 2) at M = 5d
    holds 6d), the cut rounded up, or block_q = 0 (floor) overflow the SRAM or never walk."""
    block_q, block_k = ex.block_sizes(M, d)
    run(ex.flash_attention, rng, 2 * block_q + 1, d, block_q, block_k, False, capacity=M)


def test_flash_io_falls_as_1_over_m(ex, rng):
    """Theorem 2 measured: with block_sizes(M, d), each doubling of M halves the K and V traffic,
    8n²d²/M, until one query block holds all n rows (M = 4nd); then K and V are read once. Roles not
    swapped (block_q capped at d): the traffic stops falling at M = 4d²."""
    n, d = 64, 4
    rows, wrong = [], False
    for M in (4 * d * 2 ** k for k in range(8)):  # block_q = 1, 2, ..., 128
        block_q, block_k = ex.block_sizes(M, d)
        hbm, _, _ = run(ex.flash_attention, rng, n, d, block_q, block_k, False, capacity=M)
        kv, expected = hbm.reads_of("K") + hbm.reads_of("V"), max(8 * n * n * d * d // M, 2 * n * d)
        wrong |= kv != expected
        rows.append(f"  M = {M:5}: blocks ({block_q}, {block_k}), K + V reads {kv:6} (expected {expected:6}), "
                    f"all moves {hbm.reads + hbm.writes}")
    assert not wrong, "\n".join([f"flash_attention on Q, K, V ({n}, {d}) at block_sizes(M, {d}), hbm.capacity = M:",
                                 *rows, "  convention: K and V traffic 2nd·⌈n/block_q⌉ falls as 1/M "
                                 "(Theorem 2's Θ(N²d²/M)): block_q = ⌈M/4d⌉ grows with M"])
