"""Tests for exercise 14: dropout inside the kernels, its mask regenerated in the backward, against
float64 autograd of dense attention under the mask dropout_mask gives.

dropout_mask itself is checked against Philox computed here in NumPy (Random123's Philox4x32-10,
the generator behind tl.rand), at the counter the lesson gives each (batch·head, query, key) pair.
Without a CUDA device the kernels run in Triton's interpreter (float32 and float16, small ragged
shapes); with one, the same tests run compiled, and the tests marked gpu add float16, bfloat16 and
float32 at up to 4096 tokens. Each test's docstring names the bugs it catches;
mutants/14_attention_dropout.toml holds them.
"""
import math
from functools import partial

import numpy as np
import pytest

from checks import assert_close, assert_unmodified
from spies import observed

torch = pytest.importorskip("torch", reason="skipped: exercise 14 needs PyTorch")
from oracles_torch import attention_grads  # noqa: E402 - only once torch is known to import
# Before Triton loads: without CUDA, triton_helpers sets TRITON_INTERPRET=1, which Triton reads then.
from triton_helpers import (BACKWARD_TOL, DEVICE, DTYPES, FLOAT32, GYM_SHAPE, WRAPPER_BAD_INPUTS, as_numpy, call,  # noqa: E402
                            check_compiles_for_gpus, check_outputs, check_precision, forward_backward, gpu,
                            interpreted_only, backward_bounds, poison_unattended_keys, qkv_do, record_stages,
                            shape_id, skip_unless_supported, small_qk, tolerance,
                            poisoned_buffers, torch_default_float32)  # noqa: F401 (fixtures)

import triton  # noqa: E402  (where Triton is missing, triton_helpers has skipped this file)
import triton.language as tl  # noqa: E402

from kata.given import dropout_launch  # noqa: E402
from kata.given.solved import solved  # noqa: E402
from requires_grad import FROZEN, check_frozen  # noqa: E402
from rounding_inputs import cancelling_dv_inputs, dv_summed  # noqa: E402

# P is computed before the causal mask zeroes it: a pair above the diagonal may overflow exp2 to inf, unused.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
COUNTER = ("pair (i, j) of batch·head bh = b·H + h is kept iff tl.rand(seed, counter) >= dropout_p, "
           "counter = (bh·n_q + i)·n_k + j in int64")
FORWARD = "o = (P ∘ Z) V with P = softmax(scale·QKᵀ) (m and l from every score) and Z = keep / (1 − p)"
BACKWARD = ("the backward regenerates the forward's mask: dV = (P ∘ Z)ᵀ dO, dP = (dO Vᵀ) ∘ Z, dS = P ∘ (dP − D), "
            "D = rowsum(dO ∘ O)")
P_ZERO = "p = 0 is 09 exactly: the kernels take DROPOUT = p > 0 as a constexpr and draw nothing without it"
CAUSAL = "causal is top-left aligned: query i attends key j iff j <= i, also when n_q != n_k; dropout ANDs in"


# ---------------------------------------------------------------- Philox, the oracle of the mask ----

ROUND = (0xD2511F53, 0xCD9E8D57)  # Random123's Philox4x32 multipliers, and its key increments
BUMP = (0x9E3779B9, 0xBB67AE85)
TO_UNIFORM = np.float32(4.6566127342e-10)  # tl.rand's scale from 31 random bits to [0, 1)


def philox(seed: int, c0, c1, c2, c3, rounds: int = 10):
    """Philox4x32 (Salmon et al., 2011) of the counter words c0..c3 (uint32 arrays) under the 64-bit key
    `seed` (low word first): four uint32 arrays."""
    low = np.uint64(0xFFFFFFFF)
    c0, c1, c2, c3 = (np.asarray(c, np.uint32) for c in (c0, c1, c2, c3))
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(rounds):
        p0 = c0.astype(np.uint64) * np.uint64(ROUND[0])
        p2 = c2.astype(np.uint64) * np.uint64(ROUND[1])
        c0, c1, c2, c3 = ((p2 >> np.uint64(32)).astype(np.uint32) ^ c1 ^ np.uint32(k0), (p2 & low).astype(np.uint32),
                          (p0 >> np.uint64(32)).astype(np.uint32) ^ c3 ^ np.uint32(k1), (p0 & low).astype(np.uint32))
        k0, k1 = (k0 + BUMP[0]) & 0xFFFFFFFF, (k1 + BUMP[1]) & 0xFFFFFFFF
    return c0, c1, c2, c3


def philox_keep(seed: int, dropout_p: float, counters) -> np.ndarray:
    """tl.rand(seed, counters) >= dropout_p, computed in NumPy: Philox of (counter's low word, its high
    word, 0, 0), the first output word read as int32, negatives flipped, times TO_UNIFORM in float32."""
    counters = np.asarray(counters, np.uint64)
    zero = np.zeros(counters.shape, np.uint32)
    word = philox(seed, (counters & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                  (counters >> np.uint64(32)).astype(np.uint32), zero, zero)[0].view(np.int32)
    uniform = np.where(word < 0, ~word, word).astype(np.float32) * TO_UNIFORM
    return uniform >= np.float32(dropout_p)


def expected_mask(seed: int, dropout_p: float, B: int, H: int, n_q: int, n_k: int) -> np.ndarray:
    """The lesson's mask, (B, H, n_q, n_k): each entry's counter is its index in that array."""
    return philox_keep(seed, dropout_p, np.arange(B * H * n_q * n_k, dtype=np.uint64)).reshape(B, H, n_q, n_k)


# ---------------------------------------------------------------- running and checking ------------

def draw_seed(rng) -> int:
    """A seed from the test's generator: every test, and every fresh-seed run, draws another mask."""
    return int(rng.integers(2**40))


def name(q, k, causal=False, dropout_p=0.0, seed=0) -> str:
    extra = ", causal" if causal else ""
    return (f"flash_attention(q {tuple(q.shape)} {str(q.dtype)[6:]}, k/v {tuple(k.shape)}{extra}, "
            f"dropout_p={dropout_p}, seed={seed})")


def run(ex, q, k, v, do, **kw):
    """o and (dq, dk, dv) from the kernels; a stubbed kernel body surfaces as NotImplementedError."""
    return forward_backward(lambda *t: ex.flash_attention(*t, **kw), q, k, v, do)


def sizes(q, k) -> tuple:
    """(B, H, n_q, n_k) of attention over these inputs."""
    return (*q.shape[:3], k.shape[2])


def mask_of(ex, seed, dropout_p, B, H, n_q, n_k):
    """dropout_mask(seed, dropout_p, B, H, n_q, n_k) on the device the tests run on, its type checked."""
    mask = call(ex.dropout_mask, seed, dropout_p, B, H, n_q, n_k, device=DEVICE)
    assert mask.dtype == torch.bool and tuple(mask.shape) == (B, H, n_q, n_k), \
        f"dropout_mask must be bool (B, H, n_q, n_k) = {(B, H, n_q, n_k)}, got {mask.dtype} {tuple(mask.shape)}"
    return mask


def check(ex, q, k, v, do, dropout_p, seed, causal=False, convention="", nan_convention=""):
    """Forward and backward through the kernels; the inputs unmodified, then o, dq, dk, dv against
    float64 autograd of dense attention whose weights are multiplied by dropout_mask(seed, ...) / (1 − p)."""
    __tracebackhide__ = True
    before = [t.clone() for t in (q, k, v, do)]
    o, grads = run(ex, q, k, v, do, causal=causal, dropout_p=dropout_p, seed=seed)
    for t, t0, label in zip((q, k, v, do), before, ("q", "k", "v", "do")):
        assert_unmodified(as_numpy(t0), as_numpy(t), label)
    z = mask_of(ex, seed, dropout_p, *sizes(q, k)).double() / (1 - dropout_p)
    what = name(q, k, causal, dropout_p, seed)
    o_ref, grads_ref = attention_grads(q, k, v, do, causal=causal, z=z)
    tol = tolerance(q.dtype, BACKWARD_TOL)
    bounds = backward_bounds(q, k, v, do, o, o_ref, causal=causal, z=z)  # compiled float16, bfloat16
    forward = f"{FORWARD}; {convention}" if convention else FORWARD
    if bounds:
        check_precision(o, o_ref, bounds[0][0], f"{what}: o", forward, nan_convention)
    else:
        size = max(1.0, o_ref.abs().max().item())
        assert_close(as_numpy(o), as_numpy(o_ref), what=f"{what}: o (row = b, h, query)", rtol=tol, atol=tol * size,
                     convention=forward, nan_convention=nan_convention)
    grad_bounds = bounds[1:] if bounds else (None,) * 3
    check_outputs(what, zip(("dq", "dk", "dv"), "qkv", (q, k, v), grads, grads_ref, grad_bounds), tol,
                  f"{BACKWARD}; {convention}" if convention else BACKWARD, nan_convention)


def first_difference(got: np.ndarray, expected: np.ndarray) -> str:
    """Where two masks first differ, and how many entries do."""
    where = tuple(int(i) for i in np.argwhere(got != expected)[0])
    return (f"{int((got != expected).sum())} of {got.size} entries differ, the first at (b, h, query, key) = "
            f"{where}: got {'kept' if got[where] else 'dropped'}, expected {'kept' if expected[where] else 'dropped'}")


# ---------------------------------------------------------------- the mask ------------------------

MASK_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 70), (1, 2, 70, 33)]


@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=lambda s: "b{}-h{}-nq{}-nk{}".format(*s))
def test_mask_is_philox_of_the_absolute_position(ex, rng, shape, dropout_p):
    """The counter of a pair missing the batch·head (every head draws one mask) or counted per tile,
    rows strided by n_q instead of n_k (pairs share counters), the seed ignored, kept where the draw
    is under p instead of at or over it."""
    seed = draw_seed(rng)
    got = as_numpy(mask_of(ex, seed, dropout_p, *shape))
    expected = expected_mask(seed, dropout_p, *shape)
    if not np.array_equal(got != 0, expected):
        raise AssertionError(f"dropout_mask({seed}, {dropout_p}, {', '.join(map(str, shape))}): "
                             f"{first_difference(got != 0, expected)}\n  convention: {COUNTER}")


@triton.jit
def _keep_tile(OUT, seed, dropout_p, bh, first_row, first_key, n_q, n_k, KEEP: tl.constexpr, ROWS: tl.constexpr,
               KEYS: tl.constexpr):
    """KEEP (the exercise's keep_mask) of ROWS x KEYS pairs of batch·head bh from (first_row, first_key) on."""
    rows = first_row + tl.arange(0, ROWS)
    keys = first_key + tl.arange(0, KEYS)
    keep = KEEP(seed, dropout_p, bh, rows[:, None], keys[None, :], n_q, n_k)
    tl.store(OUT + tl.arange(0, ROWS)[:, None] * KEYS + tl.arange(0, KEYS)[None, :], keep.to(tl.int8))


def test_counter_past_2_31_is_int64(ex, rng):
    """The counter computed in int32: past 2**31 pairs it wraps (one head at a 64k context has 2**32),
    and pairs far apart draw one bit. keep_mask runs here on one tile of batch·head 17 at
    queries from 60000 and keys from 1000 of 65536 x 65536 (counters near 7.7e10)."""
    seed, dropout_p, bh, n, rows, keys = draw_seed(rng), 0.5, 17, 65536, 60000, 1000
    out = torch.empty((16, 16), dtype=torch.int8, device=DEVICE)
    call(lambda: _keep_tile[(1,)](out, seed, dropout_p, bh, rows, keys, n, n, ex.keep_mask, 16, 16))
    counters = (np.uint64(bh * n) + np.arange(rows, rows + 16, dtype=np.uint64)[:, None]) * np.uint64(n) \
        + np.arange(keys, keys + 16, dtype=np.uint64)[None, :]
    expected = philox_keep(seed, dropout_p, counters)
    got = as_numpy(out) != 0
    if not np.array_equal(got, expected):
        raise AssertionError(f"keep_mask(seed={seed}, dropout_p=0.5, bh=17, queries 60000-60015, keys 1000-1015, "
                             f"n_q = n_k = 65536): {int((got != expected).sum())} of 256 pairs differ from "
                             f"Philox at their counter\n  convention: {COUNTER}")


@pytest.mark.parametrize("dropout_p", [0.1, 0.7])
def test_keep_rate_within_a_binomial_bound_of_one_minus_p(ex, rng, dropout_p):
    """Kept where the draw is under p (the rate is p, not 1 − p), the comparison against 1 − p, or a
    counter shared by many pairs (rows or heads that repeat one another make the count swing far
    past a binomial's spread). n = 98304 draws; the bound is 5 standard deviations."""
    B, H, n_q, n_k = 2, 4, 128, 96
    seed = draw_seed(rng)
    mask = mask_of(ex, seed, dropout_p, B, H, n_q, n_k)
    n, kept = mask.numel(), int(mask.sum())
    spread = 5 * math.sqrt(n * dropout_p * (1 - dropout_p))
    assert abs(kept - n * (1 - dropout_p)) <= spread, (
        f"dropout_mask({seed}, {dropout_p}, {B}, {H}, {n_q}, {n_k}) keeps {kept} of {n} pairs ({kept / n:.4f}); "
        f"dropout keeps each with probability 1 − p = {1 - dropout_p}: {n * (1 - dropout_p):.0f} ± {spread:.0f}"
        f"\n  convention: {COUNTER}")
    independent = dropout_p ** 2 + (1 - dropout_p) ** 2  # the share of pairs two independent masks agree on
    for b, h in ((0, 1), (1, 0)):
        same = (mask[0, 0] == mask[b, h]).double().mean().item()
        assert abs(same - independent) < 0.05, (
            f"dropout_mask({seed}, {dropout_p}, {B}, {H}, {n_q}, {n_k}): the masks of (b, h) = (0, 0) and ({b}, {h}) "
            f"agree on {same:.3f} of their pairs, where independent draws agree on {independent:.3f}"
            f"\n  convention: {COUNTER}")


# ---------------------------------------------------------------- the kernels ---------------------

# (B, H, n_q, n_k, D); the interpreter runs 32 x 16 forward tiles and 16- and 32-row backward tiles
SHAPES = [(1, 1, 1, 1, 16), (1, 2, 5, 7, 16), (2, 1, 33, 33, 16), (1, 1, 17, 70, 32), (1, 1, 70, 17, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_ragged_shapes_match_dense_dropout(ex, rng, shape):
    """Dropped weights left in l (the row renormalised over the kept keys), the factor 1/(1 − p) missing
    or applied twice, dV from the undropped P, dP not multiplied by Z (or by the mask without 1/(1 − p)),
    dS from the dropped P, the mask left out of a ragged last tile."""
    q, k, v, do = qkv_do(rng, *shape)
    check(ex, q, k, v, do, dropout_p=0.3, seed=draw_seed(rng))


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_causal_matches_dense_dropout(ex, rng, shape):
    """Dropout in place of the causal mask (where one tl.where overwrites the other), the causal mask
    lost on the dropout path, a key block no query attends left unwritten (NaN)."""
    q, k, v, do = qkv_do(rng, *shape)
    check(ex, q, k, v, do, dropout_p=0.4, seed=draw_seed(rng), causal=True, convention=CAUSAL)


def test_backward_mask_is_the_forwards(ex, rng):
    """The dK, dV kernel's tile holds keys on its rows: the mask drawn there with queries and keys
    swapped, or from another counter than the forward's. With V = I the forward's output is P ∘ Z, and
    with dO = I the backward's dV is (P ∘ Z)ᵀ: both masks are read off and compared with dropout_mask."""
    B, H, n, dropout_p, seed = 1, 2, 40, 0.5, draw_seed(rng)
    q, k, _, _ = qkv_do(rng, B, H, n, n, n)
    eye = torch.eye(n, device=DEVICE).expand(B, H, n, n).contiguous()
    o, (_, _, dv) = run(ex, q, k, eye, eye, dropout_p=dropout_p, seed=seed)
    expected = as_numpy(mask_of(ex, seed, dropout_p, B, H, n, n)) != 0
    what = f"{name(q, k, False, dropout_p, seed)} with v = identity and do = identity"
    for label, got in (("the forward's mask, o != 0", as_numpy(o) != 0),
                       ("the backward's mask, dvᵀ != 0", as_numpy(dv.transpose(-1, -2)) != 0)):
        if not np.array_equal(got, expected):
            raise AssertionError(f"{what}: {label}, is not dropout_mask's: {first_difference(got, expected)}"
                                 f"\n  convention: {BACKWARD}; {COUNTER}")


def test_mask_independent_of_tiles_and_grid(ex, rng, monkeypatch):
    """A mask keyed on the tile or the program rather than the pair (the stage's first key for the
    tile's, a program's own numbering), which the usual tiles may hide: every kernel, dropout_mask's
    too, runs here with other tile sizes, so other grids; the mask and the results must not change."""
    q, k, v, do = qkv_do(rng, 2, 1, 45, 37, 16)
    seed = draw_seed(rng)
    before = as_numpy(mask_of(ex, seed, 0.3, 2, 1, 45, 37))
    # One query block of 64 rows walks three key tiles of 16 in one stage, and a key block of 64 three query tiles.
    others = dict(fwd=dict(BLOCK_M=64, BLOCK_N=16), dkdv=dict(BLOCK_M=16, BLOCK_N=64), dq=dict(BLOCK_M=64, BLOCK_N=16),
                  mask=dict(BLOCK_M=16, BLOCK_N=32))
    monkeypatch.setattr(dropout_launch, "kernel_tiles", lambda width: others)
    after = as_numpy(mask_of(ex, seed, 0.3, 2, 1, 45, 37))
    if not np.array_equal(after, before):
        raise AssertionError(f"dropout_mask({seed}, 0.3, 2, 1, 45, 37) with tiles of 16 x 32, not 64 x 64: "
                             f"{first_difference(after != 0, before != 0)}\n  convention: {COUNTER}")
    check(ex, q, k, v, do, dropout_p=0.3, seed=seed, causal=True,
          convention=f"the mask depends on the pair alone, not on the kernels' tiles ({others}); {COUNTER}")


def test_rows_whose_every_key_is_dropped(ex, rng):
    """o divided by the kept weights' sum (0 for a row whose every attended key is dropped: NaN), or
    such a row's dS not 0. Causal at p = 0.9: query 0 attends key 0 alone, and loses it to dropout 9
    times in 10; the seed is the first from the test's whose mask drops every key of some row."""
    q, k, v, do = qkv_do(rng, 2, 2, 20, 20, 16)
    seed = draw_seed(rng)
    causal_pairs = torch.ones(20, 20, dtype=torch.bool, device=DEVICE).tril()
    while not ((mask_of(ex, seed, 0.9, 2, 2, 20, 20) & causal_pairs).sum(-1) == 0).any():
        seed += 1
    check(ex, q, k, v, do, dropout_p=0.9, seed=seed, causal=True,
          convention="a row whose every attended key is dropped has o = 0 (l counts every weight, dropped "
                     "or kept) and dS = 0", nan_convention="o = acc / l with l from every weight: never 0/0")


def test_causal_skips_tiles_above_the_diagonal(ex, rng):
    """Tiles above the diagonal walked instead of skipped: keys no query of 40 attends hold NaN."""
    q, k, v, do = qkv_do(rng, 1, 2, 40, 300, 16)
    poison_unattended_keys(40, k, v)
    check(ex, q, k, v, do, dropout_p=0.2, seed=draw_seed(rng), causal=True,
          convention=f"{CAUSAL}; a key no query attends has dk = dv = 0",
          nan_convention="keys that no query may attend hold NaN here: a NaN means such a key was loaded")


@interpreted_only
def test_p_zero_is_09_and_draws_nothing(ex, rng, monkeypatch):
    """The dropout branch taken at p = 0 (every pair kept, but a Philox hash paid for each): keep_mask
    is wrapped while the interpreter runs the kernels as Python and must not be called at p = 0; the
    results must be 09's, solved. Kernels that draw their mask without keep_mask (seen at p > 0) pass
    with the rule reported not checked."""
    q, k, v, do = qkv_do(rng, 1, 2, 37, 29, 16)
    seed = draw_seed(rng)
    calls = record_stages(monkeypatch, ex, "keep_mask")
    o, grads = run(ex, q, k, v, do, causal=True, dropout_p=0.0, seed=seed)
    assert not calls, (f"{name(q, k, True)}: keep_mask was called {len(calls)} times at dropout_p = 0"
                       f"\n  convention: {P_ZERO}")
    o_09, grads_09 = forward_backward(lambda *t: solved("09").flash_attention(*t, causal=True), q, k, v, do)
    for label, got, expected in zip(("o", "dq", "dk", "dv"), (o, *grads), (o_09, *grads_09)):
        assert_close(as_numpy(got), as_numpy(expected), what=f"{name(q, k, True)}: {label} against 09's",
                     rtol=1e-6, atol=1e-6, convention="p = 0 is 09 exactly")
    run(ex, *qkv_do(rng, 1, 1, 5, 7, 16), dropout_p=0.5, seed=seed)
    observed(P_ZERO, {"keep_mask": calls})


@pytest.mark.parametrize("frozen", FROZEN)
def test_gradients_of_frozen_and_trained_inputs(ex, rng, frozen):
    """The backward deciding whether a gradient is wanted from the wrong input (dV from k's
    requires_grad, say): frozen keys with trained values (or another mix) lose a gradient, or get one
    they did not ask for."""
    q, k, v, do = qkv_do(rng, 1, 2, 30, 41, 16)
    seed = draw_seed(rng)
    z = mask_of(ex, seed, 0.3, *sizes(q, k)).double() / 0.7
    _, expected = attention_grads(q, k, v, do, causal=True, z=z)
    check_frozen(partial(ex.flash_attention, causal=True, dropout_p=0.3, seed=seed), q, k, v, do, frozen, expected,
                 name(q, k, True, 0.3, seed), tolerance(q.dtype, BACKWARD_TOL), BACKWARD)


def test_dv_summed_in_float32_across_query_tiles(ex, rng):
    """Each query tile's (Pᵀ ∘ Zᵀ) dO rounded to the inputs' dtype before it joins dV: here
    (cancelling_dv_inputs, as 09's test) key 0's tile products, near ±1024, cancel to a dV near 10, and
    each rounding to float16 is off by up to 0.5. p = 0.5 makes Z = 2, exact in float16 (so O and D
    carry no rounding of their own), and the seed is the first from the test's whose mask keeps key 0
    for 8 rows of every 16 (found with the NumPy Philox), so that the tiles' products cancel."""
    n_q, n_k, tile = 64, 40, 16
    seed = draw_seed(rng)
    key_0 = np.arange(n_q, dtype=np.uint64) * np.uint64(n_k)  # the counters of (query i, key 0)
    while not (philox_keep(seed, 0.5, key_0).reshape(-1, tile).sum(1) == tile // 2).all():
        seed += 1
    check(ex, *cancelling_dv_inputs(rng, 1, 1, n_q, n_k, 16, tile), dropout_p=0.5, seed=seed, causal=True,
          convention=dv_summed("(Pᵀ ∘ Zᵀ) dO"))


@interpreted_only
@pytest.mark.parametrize("n_q, causal", [(33, False), (33, True), (1, True)], ids=["full", "causal", "one-query"])
def test_float16_in_the_interpreter(ex, rng, causal, n_q):
    """P ∘ Z or dS left in float32 for tl.dot with float16 operands, a gradient stored in the wrong dtype.
    One query, causal, attends key 0 alone: its dS is exactly 0, but D reads o = v / (1 − p) as stored,
    rounded to float16 (KATA_PRECISION_RULE=gpu judges it as a GPU does, from the O it stored)."""
    check(ex, *qkv_do(rng, 1, 2, n_q, 40, 16, dtype=torch.float16), dropout_p=0.3, seed=draw_seed(rng),
          causal=causal, convention="cast P ∘ Z and dS to the input dtype for tl.dot; sums stay float32")


@interpreted_only
def test_every_kernel_compiles_for_ampere_and_hopper(ex, rng):
    """A module global read inside @triton.jit, tl.dot of float32 P ∘ Z by float16 dO, a float64 factor:
    the interpreter runs them, a GPU refuses. Forward and backward, causal and not, p > 0 and p = 0, and
    dropout_mask's kernel (which runs keep_mask)."""
    inputs = tuple(qkv_do(rng, 2, 2, 33, 40, 40, dtype=torch.float16))
    seed = draw_seed(rng)
    runs = [partial(run, ex, *inputs, causal=causal, dropout_p=p, seed=seed) for causal, p in
            ((False, 0.3), (True, 0.3), (True, 0.0))]
    check_compiles_for_gpus(*runs, partial(ex.dropout_mask, seed, 0.3, 2, 2, 33, 40))


# ---------------------------------------------------------------- the given wrapper ---------------

BAD_DROPOUT = {"p-negative": dict(dropout_p=-0.1), "p-one": dict(dropout_p=1.0), "p-over-one": dict(dropout_p=1.5),
               "p-nan": dict(dropout_p=math.nan), "p-text": dict(dropout_p="0.1"), "seed-negative": dict(seed=-1),
               "seed-2-63": dict(seed=2**63), "seed-float": dict(seed=1.5)}


@pytest.mark.given
@pytest.mark.parametrize("case", BAD_DROPOUT)
def test_dropout_p_outside_0_1_raises_value_error(ex, rng, case):
    """p = 1 accepted (1/(1 − p) = inf: NaN everywhere), a negative p, a seed Triton cannot pass: the
    wrapper and dropout_mask refuse them, naming the argument, before any launch."""
    bad = BAD_DROPOUT[case]
    q, k = small_qk(rng)
    word = "dropout_p" if "dropout_p" in bad else "seed"
    with pytest.raises(ValueError, match=word):
        ex.flash_attention(q, k, k, **bad)
    with pytest.raises(ValueError, match=word):
        ex.dropout_mask(**{"seed": 0, "dropout_p": 0.1, **bad}, B=1, H=1, n_q=4, n_k=4)


@pytest.mark.given
@interpreted_only
def test_interpreter_refuses_bfloat16(ex, rng):
    """Triton's interpreter multiplies the raw bits of bfloat16 in tl.dot (errors of 1e8): refused."""
    q, k = small_qk(rng)
    with pytest.raises(ValueError, match="bfloat16"):
        ex.flash_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(), dropout_p=0.1)


@pytest.mark.given
@pytest.mark.parametrize("case", WRAPPER_BAD_INPUTS)
def test_bad_inputs_raise_value_error_before_launch(ex, rng, case):
    """The wrapper names the problem (shape, dtype, device, head dim, scale) before any launch."""
    build, words = WRAPPER_BAD_INPUTS[case]
    with pytest.raises(ValueError, match=words):
        ex.flash_attention(**build(*small_qk(rng)), dropout_p=0.1)


# ---------------------------------------------------------------- the GPU stage -------------------

GPU_SHAPES = [(2, 3, 1000, 1000, 64), (1, 2, 1, 2049, 64), (2, 2, 777, 1531, 128), (1, 2, 513, 513, 256)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
def test_gpu_compiled_matches_dense_dropout(ex, rng, shape, dtype, causal):
    """Compiled-only bugs: half-precision casts of P ∘ Z and dS, the mask at real tile sizes, head dims
    64 to 256."""
    q, k, v, do = qkv_do(rng, *shape, dtype=skip_unless_supported(dtype))
    check(ex, q, k, v, do, dropout_p=0.1, seed=draw_seed(rng), causal=causal, convention=CAUSAL if causal else "")


@gpu
@pytest.mark.gpu
def test_gpu_mask_is_philox_of_the_absolute_position(ex, rng):
    """The compiled Philox, at a size where many programs draw: the interpreter's mask, bit for bit."""
    seed, shape = draw_seed(rng), (2, 3, 300, 517)
    got = as_numpy(ex.dropout_mask(seed, 0.25, *shape)) != 0
    expected = expected_mask(seed, 0.25, *shape)
    if not np.array_equal(got, expected):
        raise AssertionError(f"dropout_mask({seed}, 0.25, {shape}) compiled: {first_difference(got, expected)}"
                             f"\n  convention: {COUNTER}")


@gpu
@pytest.mark.gpu
@pytest.mark.usefixtures("torch_default_float32")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_float32_in_full_at_attention_gym_sizes(ex, rng, causal):
    """float32 multiplied in TF32 (tl.dot's own default) where torch computes it in full, at the sizes
    of attention-gym's float32 test, as 09's."""
    B, H, n, D = GYM_SHAPE
    check(ex, *qkv_do(rng, B, H, n, n, D), dropout_p=0.1, seed=draw_seed(rng), causal=causal, convention=FLOAT32)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_autotuned_4096_tokens(ex, rng, causal):
    """The tuned configs at the benchmark's sizes, bfloat16, dropout 0.1 (GPT-2's)."""
    q, k, v, do = qkv_do(rng, 1, 16, 4096, 4096, 64, dtype=skip_unless_supported("bf16"))
    check(ex, q, k, v, do, dropout_p=0.1, seed=draw_seed(rng), causal=causal, convention=CAUSAL if causal else "")
