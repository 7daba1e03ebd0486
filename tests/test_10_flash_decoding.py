"""Tests for exercise 10: split-KV decoding with grouped-query attention against float64 oracles.

Without a CUDA device both kernels run in Triton's interpreter on the CPU (float32, small ragged
shapes, 16-key tiles); with one, the same tests run compiled, and the tests marked gpu add float16,
bfloat16 and float32 at thousands of keys. Each test's name says the bug it catches;
mutants/10_flash_decoding.toml holds those bugs.
"""
import math
from functools import partial

import pytest

from checks import assert_close
from spies import observed

torch = pytest.importorskip("torch", reason="skipped: exercise 10 needs PyTorch")
from oracles_torch import attention  # noqa: E402 - only once torch is known to import
# Before Triton loads: without CUDA, triton_helpers sets TRITON_INTERPRET=1, which Triton reads then.
from triton_helpers import (DEVICE, DTYPES, KV_LAYOUTS, KV_LENS_BAD_INPUTS, LOG_OF_ZERO_WANTED, LSE, PADDING,  # noqa: E402
                            WRAPPER_BAD_INPUTS, call, check_compiles_for_gpus, kv_in_layouts, check_forward, gpu, interpreted_only, masked_tiles,
                            poison_padding, poisoned_buffers, randn, record_stages,  # noqa: F401 (a fixture)
                            skip_unless_supported, tolerance, visible)
from triton_helpers import FLOAT32, GYM_SHAPE, torch_default_float32  # noqa: E402, F401 (a fixture)

pytestmark = LOG_OF_ZERO_WANTED
GQA = "query head h reads kv head h // (H_q / H_kv); tile row r is query r % n_q of head kv·G + r // n_q"
MASKED_ROW = "kv_lens[b] = 0 gives o = 0 and lse = -inf for every row of batch b, never NaN"
SPLIT = ("split s covers keys [s·c, (s+1)·c) below kv_lens[b], c = keys_per_split(n_k, S); "
         "an empty chunk gives o = 0, lse = -inf")
STAGES = "a chunk's whole tiles are folded unmasked, then only its ragged end MASKED"
MERGE = ("03's rule: lse = M + log Σ exp(lse_s - M), o = Σ exp(lse_s - lse) · o_s; "
         "a split with lse_s = -inf adds nothing, whatever its o holds")


def qkv(rng, B, H_q, H_kv, n_q, n_k, D, dtype=torch.float32):
    return randn(rng, B, H_q, n_q, D, dtype=dtype), randn(rng, B, H_kv, n_k, D, dtype=dtype), \
        randn(rng, B, H_kv, n_k, D, dtype=dtype)


def name(q, k, kv_lens=None, num_splits=None, scale=None, fn="flash_decode") -> str:
    extra = f", kv_lens={kv_lens.tolist()}" if kv_lens is not None else ""
    extra += f", num_splits={num_splits}" + (f", scale={scale}" if scale is not None else "")
    return f"{fn}(q {tuple(q.shape)} {str(q.dtype)[6:]}, k/v {tuple(k.shape)}{extra})"


def check(ex, q, k, v, kv_lens=None, num_splits=None, scale=None, convention="", lse_convention=LSE,
          nan_convention=""):
    """Run flash_decode, check the inputs are unmodified, then compare o and lse with the oracle."""
    __tracebackhide__ = True
    check_forward(partial(ex.flash_decode, kv_lens=kv_lens, num_splits=num_splits, scale=scale), q, k, v,
                  name(q, k, kv_lens, num_splits, scale), keep=visible(kv_lens, q.shape[0], k.shape[2]),
                  scale=scale, convention=convention, lse_convention=lse_convention, nan_convention=nan_convention)


def case_id(c):
    return "b{}-hq{}-hkv{}-nq{}-nk{}-d{}".format(*c)


# (B, H_q, H_kv, n_q, n_k, D): GQA ratios 1, 4 and 8; the interpreter's tiles hold 16 keys and at most
# 512 / D rows, so G·n_q = 40 and 128 rows are cut in row blocks.
CASES = [(1, 1, 1, 1, 1, 16), (2, 2, 2, 3, 37, 16), (1, 8, 2, 1, 70, 16), (2, 8, 1, 5, 33, 16),
         (1, 8, 1, 16, 20, 16), (1, 4, 4, 16, 17, 32)]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_grouped_query_heads_match_oracle(ex, rng, case):
    """Query heads mapped to the wrong kv head (h % H_kv, or h // H_kv), rows of the group stacked in
    the wrong order, a group taller than one tile not cut in row blocks, tiles past n_k weighted."""
    B, H_q, H_kv, n_q, n_k, D = case
    check(ex, *qkv(rng, B, H_q, H_kv, n_q, n_k, D), convention=GQA)


SPLITS = [1, 3, None, 8]  # 8 splits of at least one 16-key tile: more than 40 keys fill


@pytest.mark.parametrize("num_splits", SPLITS, ids=[f"splits{s}" for s in SPLITS])
def test_ragged_kv_lens_with_empty_splits(ex, rng, num_splits):
    """Padding keys read (their NaN leaks), kv_lens ignored, an empty chunk or batch stored as NaN
    (0 / 0, -inf - -inf) or not stored at all, the merge fooled by an empty split's partial."""
    B, n_k = 5, 40
    kv_lens = torch.tensor([n_k, 0, 1, 17, 33], device=DEVICE)
    q, k, v = qkv(rng, B, 4, 2, 2, n_k, 16)
    k, v = poison_padding(k, v, kv_lens)
    check(ex, q, k, v, kv_lens=kv_lens, num_splits=num_splits, convention=PADDING + "; " + SPLIT,
          lse_convention=MASKED_ROW, nan_convention=PADDING + "; " + MASKED_ROW)


@pytest.mark.parametrize("num_splits", [2, 5], ids=["splits2", "splits5"])
def test_each_split_holds_exactly_its_chunk(ex, rng, num_splits):
    """The work not split at all (split 0 doing every key), chunks overlapping or leaving gaps, a
    partial stored in another split's slot, an empty split not written as (0, -inf)."""
    B, H_q, H_kv, n_q, n_k, D = 3, 4, 2, 3, 70, 16
    kv_lens = torch.tensor([n_k, 20, 0], device=DEVICE)
    q, k, v = qkv(rng, B, H_q, H_kv, n_q, n_k, D)
    k, v = poison_padding(k, v, kv_lens)
    o_part, lse_part = call(ex.decode_partials, q, k, v, kv_lens=kv_lens, num_splits=num_splits)
    what = name(q, k, kv_lens, num_splits, fn="decode_partials")
    assert tuple(o_part.shape) == (B, H_q, n_q, num_splits, D) and tuple(lse_part.shape) == (B, H_q, n_q, num_splits), \
        f"{what}: partials must be (B, H_q, n_q, S, D) and (B, H_q, n_q, S), got {tuple(o_part.shape)}, {tuple(lse_part.shape)}"
    c = ex.keys_per_split(n_k, num_splits)
    for s in range(num_splits):
        o_ref, lse_ref = attention(q, k, v, keep=visible(kv_lens, B, n_k, s * c, (s + 1) * c))
        here = f"{what}: split {s} (keys [{s * c}, {(s + 1) * c}) below kv_lens[b])"
        assert_close(o_part[..., s, :].double().cpu().numpy(), o_ref.cpu().numpy(), what=f"{here}, o_part (row = b, h, query)",
                     rtol=tolerance(q.dtype), atol=tolerance(q.dtype), convention=SPLIT, nan_convention=SPLIT)
        assert_close(lse_part[..., s].double().cpu().numpy(), lse_ref.cpu().numpy(), what=f"{here}, lse_part (row = b, h)",
                     rtol=tolerance(q.dtype), atol=tolerance(q.dtype), convention=SPLIT)


def merge_oracle(o_part, lse_part):
    """Exercise 03's merge over the split axis, in float64, from torch's logsumexp."""
    lse_part = lse_part.double()
    lse = torch.logsumexp(lse_part, dim=-1)
    w = torch.exp(lse_part - lse[..., None]).nan_to_num(0.0)  # all -inf: -inf - -inf, no weight
    o = torch.where(w[..., None] == 0, 0.0, w[..., None] * o_part.double()).sum(dim=-2)
    return o, lse


@pytest.mark.parametrize("num_splits", [1, 3, 40], ids=["splits1", "splits3", "splits40"])
def test_merge_kernel_applies_03_rule(ex, rng, num_splits):
    """The merge weighting by exp(lse_s) unshifted (overflow at lse 300), an empty split's NaN o let
    in (0 · NaN), all-empty rows giving NaN, lse left in base 2, splits past the first block of
    splits dropped."""
    B, H, n_q, D = 2, 3, 2, 16
    o_part = randn(rng, B, H, n_q, num_splits, D)
    # Rows lie hundreds apart (exp(300) overflows float32); splits of a row a few units apart, so each weighs.
    lse_part = randn(rng, B, H, n_q, num_splits) * 3 + randn(rng, B, H, n_q, 1) * 300
    empty = torch.from_numpy(rng.random((B, H, n_q, num_splits)) < 0.3).to(DEVICE)
    empty[0, 0, 0] = True  # one row with every split empty
    lse_part = lse_part.masked_fill(empty, -math.inf)
    o_part = o_part.masked_fill(empty[..., None], math.nan)  # an empty split's o must not matter
    check_merge(ex, o_part, lse_part, "~30% of splits empty")


# Splits the merge kernel takes a block at a time (BLOCK_S is at most 32): 40 and 70 need 2 and 3 blocks.
@pytest.mark.parametrize("num_splits", [40, 70], ids=["splits40", "splits70"])
def test_merge_max_spans_every_block_of_splits(ex, rng, num_splits):
    """The max pass over the first block of splits only: a split past it, 200 above the others,
    then weighs exp(200) = inf in float32, and o = inf / inf."""
    B, H, n_q, D = 1, 2, 2, 16
    o_part = randn(rng, B, H, n_q, num_splits, D)
    lse_part = randn(rng, B, H, n_q, num_splits) * 3
    hot = torch.from_numpy(rng.integers(32, num_splits, size=(B, H, n_q, 1))).to(DEVICE)
    lse_part = lse_part.scatter_add(-1, hot, torch.full(hot.shape, 200.0, device=DEVICE))
    check_merge(ex, o_part, lse_part, f"one split per row at {hot.flatten().tolist()} 200 above the rest")


def check_merge(ex, o_part, lse_part, note):
    """merge_splits(o_part, lse_part) against exercise 03's merge in float64."""
    __tracebackhide__ = True
    o, lse = call(ex.merge_splits, o_part, lse_part)
    o_ref, lse_ref = merge_oracle(o_part, lse_part)
    what = f"merge_splits(o_part {tuple(o_part.shape)}, lse_part {tuple(lse_part.shape)}, {note})"
    tol = tolerance(torch.float32)
    assert_close(lse.double().cpu().numpy(), lse_ref.cpu().numpy(), what=f"{what}: lse (row = b, h)",
                 rtol=tol, atol=tol, convention=MERGE)
    assert_close(o.double().cpu().numpy(), o_ref.cpu().numpy(), what=f"{what}: o (row = b, h, query)",
                 rtol=tol, atol=tol, convention=MERGE, nan_convention=MERGE)


def test_strided_cache_and_transposed_queries(ex, rng):
    """Addresses computed as if tensors were contiguous: k and v are the first n_k rows of a longer
    cache, q a (B, n_q, H_q, D) tensor seen as (B, H_q, n_q, D)."""
    B, H_q, H_kv, n_q, n_k, D = 2, 4, 2, 3, 29, 16
    q = randn(rng, B, n_q, H_q, D).transpose(1, 2)
    k, v = (randn(rng, B, H_kv, 48, D)[:, :, :n_k] for _ in range(2))
    check(ex, q, k, v, num_splits=2, convention="index q, k and v with their strides")


@pytest.mark.parametrize("cached", KV_LAYOUTS.values(), ids=KV_LAYOUTS)
def test_k_and_v_in_different_layouts(ex, rng, cached):
    """V read with K's strides (or K with V's), or rows stepped by HEAD_DIM as if each head's cache
    were dense: one of k, v is a (B, n, H_kv, D) cache seen as (B, H_kv, n, D), the other contiguous."""
    q = randn(rng, 2, 4, 3, 16)
    k, v = kv_in_layouts(rng, 2, 2, 45, 16, cached)
    check(ex, q, k, v, num_splits=2, convention="index k and v each with its own strides")


@pytest.mark.parametrize("D", [8, 24])
def test_head_dim_not_a_power_of_two(ex, rng, D):
    """Head dims padded wrongly, or the default scale taken from the padded width, not 1/sqrt(D)."""
    check(ex, *qkv(rng, 1, 4, 2, 2, 23, D), num_splits=2, convention="scale defaults to 1/sqrt(D) for the caller's D")


@pytest.mark.parametrize("scale", [0.05, 2.0])
def test_explicit_scale(ex, rng, scale):
    """scale ignored or applied twice, or exp2 used without the log2(e) factor."""
    check(ex, *qkv(rng, 1, 2, 1, 2, 35, 16), num_splits=3, scale=scale,
          convention="s = scale · q k^T; exp(x) = exp2(x · log2(e))")


def test_large_scores_do_not_overflow(ex, rng):
    """No max subtraction in a split, or in the merge: exp of scores in the hundreds overflows."""
    # Multiples of 1/8 below 256 are exact in tf32 too, so the large scores carry no rounding error.
    q, k = ((randn(rng, *shape) * 12 * 8).round().clamp(-2040, 2040) / 8 for shape in ((1, 4, 3, 16), (1, 2, 45, 16)))
    check(ex, q, k, randn(rng, 1, 2, 45, 16), num_splits=3, convention="subtract the running max before exp2")


def test_matches_torch_sdpa_with_gqa(ex, rng):
    """The same answer as torch's scaled_dot_product_attention(enable_gqa=True), an oracle no
    exercise wrote."""
    q, k, v = qkv(rng, 2, 8, 2, 4, 50, 16)
    o, _ = call(ex.flash_decode, q, k, v, num_splits=3)
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    tol = tolerance(q.dtype)
    assert_close(o.double().cpu().numpy(), expected.cpu().numpy(), what=f"{name(q, k, None, 3)}: o vs torch SDPA",
                 rtol=tol, atol=tol, convention=GQA)


@interpreted_only
@pytest.mark.parametrize("num_splits", [1, 3], ids=["splits1", "splits3"])
def test_float16_in_the_interpreter(ex, rng, num_splits):
    """P left in float32 for tl.dot with float16 V, the merged o stored in the wrong dtype."""
    check(ex, *qkv(rng, 2, 4, 2, 3, 37, 16, dtype=torch.float16), kv_lens=torch.tensor([37, 20]),
          num_splits=num_splits, convention="cast P to V's dtype for tl.dot; partials stay float32")


@interpreted_only
@pytest.mark.parametrize("num_splits", [1, 3], ids=["splits1", "splits3"])
def test_only_the_ragged_end_of_a_chunk_is_folded_masked(ex, rng, monkeypatch, num_splits):
    """The whole chunk folded MASKED: the output comes out right, but every tile pays for the bounds
    checks that only the chunk's ragged last tile needs.

    attn_tiles (06's loop, given) is wrapped (tests/triton_helpers.py, record_stages) while the
    interpreter runs the split kernel as Python: each tile a call folds with MASKED set must reach
    past the call's bound on keys (n_keys: the chunk's end). A split kernel that folds its chunk in
    a loop of its own passes with the rule reported not checked.
    """
    walks = record_stages(monkeypatch, ex, "attn_tiles", reads=("lo", "hi", "n_keys", "MASKED", "BLOCK_N"))
    q, k, v = qkv(rng, 2, 4, 2, 3, 70, 16)
    call(ex.flash_decode, q, k, v, kv_lens=torch.tensor([70, 37]), num_splits=num_splits)
    for walk, start in masked_tiles(walks, "BLOCK_N"):
        if start + walk["BLOCK_N"] <= walk["n_keys"]:
            raise AssertionError(f"{name(q, k, torch.tensor([70, 37]), num_splits)}: attn_tiles folded keys "
                                 f"{start}-{start + walk['BLOCK_N'] - 1} MASKED, a whole tile below the chunk's end "
                                 f"{walk['n_keys']}\n  convention: {STAGES}")
    observed("10's stages (only the ragged end of a chunk folded MASKED)", {"attn_tiles (06's loop, given)": walks})


@interpreted_only
def test_every_kernel_compiles_for_ampere_and_hopper(ex, rng):
    """A module global read inside @triton.jit (LN2), tl.dot of mixed dtypes: the interpreter runs
    them, a GPU refuses; float32 multiplied in TF32 where torch computes it in full (a float32 launch
    too, for a wrapper that passes TF32 for float32 alone)."""
    q, k, v = qkv(rng, 2, 4, 2, 3, 37, 40, dtype=torch.float16)
    check_compiles_for_gpus(*(partial(ex.flash_decode, q, k, v, kv_lens=kv_lens, num_splits=3)
                              for kv_lens in (None, torch.tensor([37, 20]))),
                            partial(ex.flash_decode, q.float(), k.float(), v.float(), num_splits=3))


@pytest.mark.given
@interpreted_only
def test_interpreter_refuses_bfloat16(ex, rng):
    """Triton's interpreter multiplies the raw bits of bfloat16 in tl.dot (errors of 1e8): refused."""
    q, k, v = qkv(rng, 1, 2, 1, 1, 7, 16)
    with pytest.raises(ValueError, match="bfloat16"):
        ex.flash_decode(q.bfloat16(), k.bfloat16(), v.bfloat16())


def _tensor(*values):
    return torch.tensor(values, device=DEVICE)


BAD_INPUTS = {  # id: (build(q, k) -> kwargs for flash_decode, words the ValueError must contain)
    **WRAPPER_BAD_INPUTS, **KV_LENS_BAD_INPUTS,
    "nq-17": (lambda q, k: dict(q=q.new_zeros(2, 4, 17, 16), k=k, v=k), "n_q"),
    "hq-not-multiple": (lambda q, k: dict(q=q[:, :3], k=k, v=k), "multiple"),
    "splits-0": (lambda q, k: dict(q=q, k=k, v=k, num_splits=0), "num_splits"),
    "splits-float": (lambda q, k: dict(q=q, k=k, v=k, num_splits=2.0), "num_splits"),
}


@pytest.mark.given
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_value_error_before_launch(ex, rng, case):
    """The wrapper names the problem (shape, dtype, device, n_q, heads, num_splits, kv_lens, scale)
    before any launch."""
    build, words = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=words):
        ex.flash_decode(**build(randn(rng, 2, 4, 3, 16), randn(rng, 2, 2, 7, 16)))



# (B, H_q, H_kv, n_q, n_k, D) at real sizes: the benchmark's heads, ragged lengths, D 64 to 256
GPU_CASES = [(2, 32, 8, 1, 4099, 128), (3, 32, 8, 16, 2000, 128), (2, 8, 8, 4, 3001, 64),
             (1, 16, 2, 7, 1500, 256), (2, 32, 1, 16, 777, 128), (4, 12, 4, 2, 1000, 80)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 7, None], ids=["splits1", "splits7", "splitsNone"])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_gpu_compiled_matches_oracle(ex, rng, case, dtype, num_splits):
    """Compiled-only bugs: half-precision casts, tile bounds at real sizes, groups of 8 with 16 rows
    (128-row tiles) and of 32 with 16 rows (row blocks), head dims 64 to 256."""
    B, H_q, H_kv, n_q, n_k, D = case
    check(ex, *qkv(rng, B, H_q, H_kv, n_q, n_k, D, dtype=skip_unless_supported(dtype)), num_splits=num_splits,
          convention=GQA + "; " + SPLIT)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [5, None, 300], ids=["splits5", "splitsNone", "splits300"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_gpu_ragged_kv_lens(ex, rng, dtype, num_splits):
    """Padding keys read or weighted at real sizes; empty splits and zero-length batches give 0 and -inf."""
    n_k = 5000
    kv_lens = _tensor(0, 1, 63, 64, 2500, n_k)
    q, k, v = qkv(rng, 6, 32, 8, 2, n_k, 128, dtype=skip_unless_supported(dtype))
    k, v = poison_padding(k, v, kv_lens)
    check(ex, q, k, v, kv_lens=kv_lens, num_splits=num_splits, convention=PADDING + "; " + SPLIT,
          lse_convention=MASKED_ROW, nan_convention=PADDING + "; " + MASKED_ROW)


@gpu
@pytest.mark.gpu
def test_gpu_partials_at_real_tile_sizes(ex, rng):
    """Chunk bounds at the compiled kernel's tile size: each split's partial against its chunk."""
    B, H_q, H_kv, n_q, n_k, D, num_splits = 2, 8, 2, 2, 1000, 64, 3
    kv_lens = _tensor(n_k, 400)
    q, k, v = qkv(rng, B, H_q, H_kv, n_q, n_k, D, dtype=torch.float16)
    o_part, lse_part = call(ex.decode_partials, q, k, v, kv_lens=kv_lens, num_splits=num_splits)
    c = ex.keys_per_split(n_k, num_splits)
    for s in range(num_splits):
        o_ref, lse_ref = attention(q, k, v, keep=visible(kv_lens, B, n_k, s * c, (s + 1) * c))
        what = f"{name(q, k, kv_lens, num_splits, fn='decode_partials')}: split {s}"
        assert_close(o_part[..., s, :].double().cpu().numpy(), o_ref.cpu().numpy(), what=f"{what}, o_part",
                     rtol=5e-3, atol=5e-3, convention=SPLIT)
        assert_close(lse_part[..., s].double().cpu().numpy(), lse_ref.cpu().numpy(), what=f"{what}, lse_part",
                     rtol=5e-3, atol=5e-3, convention=SPLIT)


@gpu
@pytest.mark.gpu
def test_gpu_more_than_65535_programs(ex, rng):
    """A grid with (batch·kv head, split) on two axes: CUDA's second axis stops at 65535 programs."""
    q, k, v = qkv(rng, 3000, 8, 8, 1, 64, 64, dtype=torch.float16)  # 3000 · 8 · 3 = 72000 programs
    check(ex, q, k, v, num_splits=3, convention="any B·H_kv·splits works: one grid axis")


# ---- float32 on a GPU: in full unless torch was asked for TF32 ------------------------------------


@gpu
@pytest.mark.gpu
@pytest.mark.usefixtures("torch_default_float32")
@pytest.mark.parametrize("n_q", [1, 16])
def test_gpu_float32_in_full_at_attention_gym_sizes(ex, rng, n_q):
    """float32 multiplied in TF32 (tl.dot's own default) where torch computes it in full: n_q new rows
    over a cache of attention-gym's float32 test sizes, o off by about 3e-4 in TF32, 6e-7 in IEEE."""
    B, H, n, D = GYM_SHAPE
    check(ex, *qkv(rng, B, H, H, n_q, n, D), convention=FLOAT32)
