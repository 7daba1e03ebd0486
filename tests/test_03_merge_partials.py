"""Tests for exercise 03: attention_partial, merge_partials and split_kv_attention against float64 oracles.

Each test's name says the bug it catches; mutants/03_merge_partials.toml holds those bugs.
"""
import numpy as np
import pytest

from checks import assert_close, assert_unmodified, describe
from oracles import DTYPES, TOL, attention, case_id, random_qkv, with_offsets
from spies import observed, record_calls

NO_KEY = "a row that attends no key (no keys, or all masked) gives o = 0 and lse = -inf, never NaN"
EMPTY_SIDE = "(anything, -inf) is the merge's identity: a side with lse = -inf adds nothing, whatever its o"
SPLIT = ("keys cut in num_splits contiguous chunks (empty ones when num_splits > n_k), then merged: "
         "equal to full attention")
SCALE = "scores are scale * q . k; scale defaults to 1/sqrt(d) only when it is None (0.0 is a scale)"


def check_call(ex, function, q, k, v, mask=None, scale=None, label="", convention="", **extra):
    """Call `function(q, k, v, **extra, mask=, scale=)`, compare (o, lse) with the oracle, check inputs kept."""
    __tracebackhide__ = True
    inputs = {"q": q, "k": k, "v": v} | ({} if mask is None else {"mask": mask})
    before = {name: a.copy() for name, a in inputs.items()}
    o, lse = getattr(ex, function)(q, k, v, **extra, mask=mask, scale=scale)
    for name, a in inputs.items():  # first: an oracle of modified inputs would show false expected values
        assert_unmodified(before[name], a, name)
    shown = ", ".join([describe(n, a) for n, a in inputs.items()] + [f"{n}={a}" for n, a in extra.items()])
    call = f"{function}({shown}, scale={scale}, {label})"
    o_exp, lse_exp = attention(q, k, v, mask, scale)
    tol = TOL[q.dtype.type]
    assert_close(o, o_exp, what=f"{call}: o", convention=convention, dtype=q.dtype, **tol)
    assert_close(lse, lse_exp, what=f"{call}: lse", convention=convention, dtype=q.dtype, **tol)


def check_merge(ex, a, b, expected, label, convention="", tol=TOL[np.float64]):
    """merge_partials(*a, *b) against the (o, lse) expected over the union; the inputs are kept."""
    __tracebackhide__ = True
    before = [x.copy() for x in (*a, *b)]
    o, lse = ex.merge_partials(*a, *b)
    for name, x, y in zip(["o_a", "lse_a", "o_b", "lse_b"], before, (*a, *b)):
        assert_unmodified(x, y, name)
    dtype = a[1].dtype
    call = (f"merge_partials({describe('o_a', a[0])}, {describe('lse_a', a[1])}, "
            f"{describe('o_b', b[0])}, {describe('lse_b', b[1])}, {label})")
    assert_close(o, expected[0], what=f"{call}: o", convention=convention, dtype=dtype, **tol)
    assert_close(lse, expected[1], what=f"{call}: lse", convention=convention, dtype=dtype, **tol)


def shape_id(s):
    return case_id(nq=s[0], nk=s[1], d=s[2], dv=s[3])


def offset_keys(rng, offsets, row_offsets=(0.0, 0.0, 0.0)):
    """q, k, v whose scores (scale 1) are row_offsets[i] + offsets[j] plus a small random part."""
    q, k, v = random_qkv(rng, len(row_offsets), len(offsets), 4, 3)
    q, k = with_offsets(q, k, row_offsets, offsets, 1.0)
    return q, k, v


SHAPES = [(1, 1, 1, 1), (5, 7, 4, 3), (8, 3, 16, 5), (3, 12, 2, 6)]


# attention_partial


@DTYPES
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_attention_partial_matches_oracle(ex, rng, shape, dtype):
    """o not normalised, lse without its max, scale not 1/sqrt(d), n_q/n_k or d/d_v mixed up, dtype changed."""
    q, k, v = random_qkv(rng, *shape, dtype)
    check_call(ex, "attention_partial", q, k, v, label="random inputs")


SCALES = pytest.mark.parametrize("scale", [None, 0.3, 0.0], ids=["default", "scale0.3", "scale0"])


@SCALES
def test_attention_partial_scale(ex, rng, scale):
    """The default scale is 1/sqrt(d) (not 1/d); an explicit scale replaces it (and is applied once).
    scale=0.0 is a scale, not a missing one (`scale or default` drops it): every key weighs the same."""
    q, k, v = random_qkv(rng, 4, 6, 16, 3)
    check_call(ex, "attention_partial", q, k, v, scale=scale, label="d = 16", convention=SCALE)


@DTYPES
def test_attention_partial_no_keys(ex, rng, dtype):
    """n_k = 0: a max over no keys fails or is NaN, and 0 / 0 = NaN; the answer is o = 0, lse = -inf."""
    q, k, v = random_qkv(rng, 4, 0, 3, 5, dtype)
    check_call(ex, "attention_partial", q, k, v, label="no keys", convention=NO_KEY)


def test_attention_partial_mask(ex, rng):
    """Mask ignored or inverted; a row fully masked by the mask gives NaN instead of (0, -inf)."""
    q, k, v = random_qkv(rng, 6, 9, 4, 5)
    mask = rng.random((6, 9)) < 0.5
    mask[:, 4] = True
    mask[1] = False
    check_call(ex, "attention_partial", q, k, v, mask=mask, label="random mask, row 1 fully masked",
               convention="mask is True where a query may attend a key; " + NO_KEY)


def test_attention_partial_huge_score_range(ex, rng):
    """Scores 1e4 apart in a row: exp without the max subtracted overflows to inf / inf = NaN."""
    q, k, v = offset_keys(rng, [0.0, 1e4, -1e4, 0.0, 1e4, 5.0])
    check_call(ex, "attention_partial", q, k, v, scale=1.0, label="scores from -1e4 to +1e4")


@pytest.mark.parametrize("function, extra", [("attention_partial", {}), ("split_kv_attention", {"num_splits": 2})],
                         ids=["partial", "split2"])
def test_mask_hides_the_largest_scores(ex, rng, function, extra):
    """The mask applied after exp (the max still taken over masked keys 1e4 above the live ones, so
    every live weight underflows to 0), or a shift of 0 for any row with a masked key (exp(800) = inf).

    Keys 0, 2 and 5 score 1e4 and are masked out; the live scores of row 0 lie near 800, of row 1
    near -1e4, of row 2 near 0.
    """
    q, k, v = offset_keys(rng, [1e4, 0.0, 1e4, 3.0, -2.0, 1e4, 1.0], row_offsets=[800.0, -1e4, 0.0])
    mask = np.ones((3, 7), bool)
    mask[:, [0, 2, 5]] = False
    check_call(ex, function, q, k, v, mask=mask, scale=1.0, label="masked keys score 1e4", **extra,
               convention="masked scores are -inf before the max and the exp; only a row with no live "
                          "key shifts by 0")


# merge_partials


def disjoint_partials(q, k, v, key_sets, mask=None, dtype=np.float64, scale=None):
    """Oracle (o, lse) on each key set, in `dtype`: the merge is tested apart from attention_partial."""
    parts = [attention(q, k[keys], v[keys], None if mask is None else mask[:, keys], scale)
             for keys in key_sets]
    return [(o.astype(dtype), lse.astype(dtype)) for o, lse in parts]


@DTYPES
def test_merge_of_disjoint_partials_equals_full(ex, rng, dtype):
    """lse merged as a max instead of logaddexp, weights not exp(lse_side - lse), a side dropped.

    Row 0 attends nothing of side A, row 1 nothing of side B, row 2 nothing at all.
    """
    q, k, v = random_qkv(rng, 6, 10, 4, 3)
    side_a, side_b = np.split(rng.permutation(10), [4])
    mask = rng.random((6, 10)) < 0.7
    mask[0, side_a], mask[1, side_b], mask[2] = False, False, False
    mask[3:, side_a[0]] = mask[3:, side_b[0]] = True
    a, b = disjoint_partials(q, k, v, [side_a, side_b], mask, dtype)
    check_merge(ex, a, b, attention(q, k, v, mask), "row 0 empty on side a, row 1 on b, row 2 on both",
                "lse = logaddexp(lse_a, lse_b), o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b", TOL[dtype])


@pytest.mark.parametrize("gap", [1e4, -1e4], ids=["b_above", "b_below"])
def test_merge_huge_lse_gap(ex, rng, gap):
    """Weights as exp(lse_a) / (exp(lse_a) + exp(lse_b)): exp(1e4) = inf and inf / inf = NaN."""
    q, k, v = offset_keys(rng, [0.0] * 4 + [gap] * 3)
    a, b = disjoint_partials(q, k, v, [np.arange(4), np.arange(4, 7)], scale=1.0)
    check_merge(ex, a, b, attention(q, k, v, scale=1.0), "lse_b - lse_a about 1e4" if gap > 0
                else "lse_a - lse_b about 1e4", "the weights exp(lse_side - lse) are at most 1: no overflow")


def test_merge_empty_side_is_identity_whatever_its_o(ex, rng):
    """Merging by multiplication: weight 0 times an o of NaN is NaN. A -inf side must add exactly nothing."""
    q, k, v = random_qkv(rng, 5, 6, 4, 3)
    mask = np.ones((5, 6), bool)
    mask[2] = False  # row 2 is empty on the live side too: the result there is (0, -inf)
    live = disjoint_partials(q, k, v, [np.arange(6)], mask)[0]
    empty = (np.full_like(live[0], np.nan), np.full_like(live[1], -np.inf))
    check_merge(ex, live, empty, live, "o_b all NaN, lse_b all -inf", EMPTY_SIDE)
    check_merge(ex, empty, live, live, "o_a all NaN, lse_a all -inf", EMPTY_SIDE)


@DTYPES
def test_merge_two_empty_sides_give_zero_and_minus_inf(ex, rng, dtype):
    """Weights exp(lse_side - lse) with lse = -inf: -inf - (-inf) = NaN. Two empty sides give (0, -inf)."""
    empty_a = (rng.standard_normal((4, 3)).astype(dtype), np.full(4, -np.inf, dtype))
    empty_b = (np.zeros((4, 3), dtype), np.full(4, -np.inf, dtype))
    expected = (np.zeros((4, 3)), np.full(4, -np.inf))
    check_merge(ex, empty_a, empty_b, expected, "lse_a = lse_b = -inf, o_a random, o_b zeros",
                "two -inf sides give (0, -inf), never NaN", TOL[dtype])


def test_merge_is_commutative(ex, rng):
    """A merge that favours one side (its lse, or its o unweighted) gives different answers in each order."""
    q, k, v = random_qkv(rng, 5, 8, 4, 3)
    mask = rng.random((5, 8)) < 0.6
    mask[0, :3] = False  # row 0: side a empty
    mask[1, 3:] = False  # row 1: side b empty
    a, b = disjoint_partials(q, k, v, [np.arange(3), np.arange(3, 8)], mask)
    ab = ex.merge_partials(*a, *b)
    check_merge(ex, b, a, ab, "merge(b, a) against merge(a, b)", "the merge is commutative")
    check_merge(ex, a, b, attention(q, k, v, mask), "merge(a, b) against the union",
                "rows 0 and 1 are empty on one side")


def test_merge_is_associative(ex, rng):
    """Merged results must be reusable as partials: ((a, b), c) = (a, (b, c)) = attention over a, b, c."""
    q, k, v = random_qkv(rng, 5, 9, 4, 3)
    mask = rng.random((5, 9)) < 0.6
    mask[0, 3:6] = False  # row 0: side b empty
    mask[1, :6] = False  # row 1: only side c is live
    a, b, c = disjoint_partials(q, k, v, np.split(rng.permutation(9), [3, 6]), mask)
    left = ex.merge_partials(*ex.merge_partials(*a, *b), *c)
    right = ex.merge_partials(*a, *ex.merge_partials(*b, *c))
    full = attention(q, k, v, mask)
    for order, (o, lse) in [("merge(merge(a, b), c)", left), ("merge(a, merge(b, c))", right)]:
        what = f"merge_partials on key sets a, b, c of 3 ({describe('o_a', a[0])}), {order}"
        assert_close(o, full[0], what=f"{what}: o", convention="the merge is associative", rtol=1e-10)
        assert_close(lse, full[1], what=f"{what}: lse", convention="the merge is associative", rtol=1e-10)


# split_kv_attention


@DTYPES
@pytest.mark.parametrize("num_splits", [1, 3, 7, 10], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("shape", [(5, 7, 4, 3), (2, 7, 3, 6)], ids=shape_id)
def test_split_kv_equals_full_attention(ex, rng, shape, num_splits, dtype):
    """One split, ragged chunks, one key per chunk, more splits than keys (empty chunks must not spoil it)."""
    q, k, v = random_qkv(rng, *shape, dtype)
    check_call(ex, "split_kv_attention", q, k, v, num_splits=num_splits, label="random inputs",
               convention=SPLIT)


@pytest.mark.parametrize("num_splits", [1, 3], ids=lambda s: f"splits{s}")
def test_split_kv_no_keys(ex, rng, num_splits):
    """n_k = 0: every chunk is empty; the result is o = 0, lse = -inf, shapes (n_q, d_v) and (n_q,)."""
    q, k, v = random_qkv(rng, 4, 0, 3, 5)
    check_call(ex, "split_kv_attention", q, k, v, num_splits=num_splits, label="no keys", convention=NO_KEY)


@pytest.mark.parametrize("num_splits", [1, 3, 4], ids=lambda s: f"splits{s}")
def test_split_kv_mask_with_masked_first_chunks(ex, rng, num_splits):
    """Mask not passed to the chunks; rows whose first chunks are fully masked, or every chunk.

    Row 0 fully masked; row 1 sees only keys 6-9; row 2 only key 9.
    """
    q, k, v = random_qkv(rng, 5, 10, 4, 3)
    mask = rng.random((5, 10)) < 0.6
    mask[3:, 0] = True
    mask[0] = False
    mask[1] = np.arange(10) >= 6
    mask[2] = np.arange(10) == 9
    check_call(ex, "split_kv_attention", q, k, v, num_splits=num_splits, mask=mask,
               label="rows 0-2 masked first",
               convention="rows whose first chunks are fully masked come out exact; " + NO_KEY)


@pytest.mark.parametrize("order", ["later_above", "earlier_above"])
def test_split_kv_chunk_maxima_1e4_apart(ex, rng, order):
    """A later chunk whose scores are 1e4 above the first (and the reverse): unshifted weights overflow."""
    offsets = [0.0] * 4 + [1e4] * 5 if order == "later_above" else [1e4] * 4 + [0.0] * 5
    q, k, v = offset_keys(rng, offsets)
    check_call(ex, "split_kv_attention", q, k, v, num_splits=3, scale=1.0,
               label=f"chunks of 3 keys, {order} by 1e4", convention=SPLIT)


@SCALES
def test_split_kv_scale(ex, rng, scale):
    """The scale not passed to the chunks, or defaulting to 1/d: d = 16 tells 1/4 from 1/16; and
    scale=0.0 replaced by the default."""
    q, k, v = random_qkv(rng, 3, 8, 16, 2)
    check_call(ex, "split_kv_attention", q, k, v, num_splits=3, scale=scale, label="d = 16", convention=SCALE)


CHUNKS = [(10, 3), (7, 4), (3, 5), (9, 9)]
CONTIGUOUS = ("num_splits contiguous chunks, in order, each key in exactly one; none longer than "
              "ceil(n_k / num_splits) keys (np.array_split's sizes are one choice); empty ones may be skipped")


@pytest.mark.parametrize("n_k, num_splits", CHUNKS, ids=[f"nk{n}-splits{s}" for n, s in CHUNKS])
def test_split_kv_chunks_are_contiguous(ex, rng, monkeypatch, n_k, num_splits):
    """Chunks taken with a stride (k[s::num_splits]), out of order, overlapping, or fewer and longer
    than num_splits asks: the merge makes the answer right either way, so only the chunks
    themselves show it. Split-KV decoding gives each split one contiguous slice of the cache.

    attention_partial is wrapped to record the keys of each call (however its arguments are passed);
    code that attends its chunks without it passes with this rule reported not checked.
    """
    q, k, v = random_qkv(rng, 3, n_k, 4, 2)
    calls = record_calls(monkeypatch, ex, "attention_partial", lambda args: np.array(args["k"], copy=True), reads=("k",))
    ex.split_kv_attention(q, k, v, num_splits)
    observed("03's chunks (contiguous, in order, at most ceil(n_k / num_splits) keys)", {"attention_partial": calls})
    what = f"split_kv_attention(q (3, 4), k ({n_k}, 4), v ({n_k}, 2), num_splits={num_splits})"
    got = []
    for keys in calls:
        matches = [np.flatnonzero((k == row).all(axis=1)) for row in keys.reshape(-1, k.shape[1])]
        if any(m.size == 0 for m in matches):
            raise AssertionError(f"{what}: attention_partial was given keys that are not rows of k\n"
                                 f"  convention: each chunk is k[start:stop], its rows as they are")
        if matches:
            got.append([int(m[0]) for m in matches])
    longest = -(-n_k // num_splits)
    contiguous = all(chunk == list(range(chunk[0], chunk[0] + len(chunk))) for chunk in got)
    if not contiguous or sum(got, []) != list(range(n_k)) or len(got) > num_splits \
            or max(map(len, got)) > longest:
        raise AssertionError(f"{what}: the chunks attended held keys {got}\n  convention: {CONTIGUOUS}")
