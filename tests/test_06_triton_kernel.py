"""Tests for exercise 06: the fused Triton kernel against float64 oracles.

Without a CUDA device the kernel runs in Triton's interpreter on the CPU (float32, small ragged
shapes); with one, the same tests run compiled, and the tests marked gpu add float16, bfloat16 and
float32 at up to 4096 tokens. Each test's name says the bug it catches; mutants/06_triton_kernel.toml
holds those bugs.
"""
from functools import partial

import pytest

from checks import assert_close
from spies import observed

torch = pytest.importorskip("torch", reason="skipped: exercise 06 needs PyTorch")
# Before Triton loads: without CUDA, triton_helpers sets TRITON_INTERPRET=1, which Triton reads then.
from triton_helpers import (DEVICE, DTYPES, KV_LAYOUTS, KV_LENS_BAD_INPUTS, LOG_OF_ZERO_WANTED, LSE, PADDING,  # noqa: E402
                            WRAPPER_BAD_INPUTS, call, kv_in_layouts, check_compiles_for_gpus, check_forward, gpu, interpreted_only, poison_padding, poison_unattended_keys,
                            poisoned_buffers, randn, shape_id, skip_unless_supported, small_qk,  # noqa: F401 (a fixture)
                            tolerance, visible, masked_tiles, record_stages)
from triton_helpers import FLOAT32, GYM_SHAPE, torch_default_float32  # noqa: E402, F401 (a fixture)

pytestmark = LOG_OF_ZERO_WANTED
MASKED_ROW = "a fully masked row (kv_lens[b] = 0) gives o = 0 and lse = -inf, never NaN"
CAUSAL = "causal is top-left aligned: query i attends key j iff j <= i, also when n_q != n_k"
NOT_READ = "keys that no query may attend hold NaN here: a NaN in o means such a key (a tile) was loaded"


def name(q, k, causal=False, kv_lens=None, scale=None) -> str:
    extra = (", causal" if causal else "") + (f", kv_lens={kv_lens.tolist()}" if kv_lens is not None else "")
    extra += f", scale={scale}" if scale is not None else ""
    return f"flash_attention(q {tuple(q.shape)} {str(q.dtype)[6:]}, k/v {tuple(k.shape)}{extra})"


def check(ex, q, k, v, causal=False, scale=None, kv_lens=None, convention="", lse_convention=LSE,
          nan_convention="", tol=None):
    """Run the kernel, check the inputs are unmodified, then compare o and lse with the oracle."""
    __tracebackhide__ = True
    check_forward(partial(ex.flash_attention, causal=causal, scale=scale, kv_lens=kv_lens), q, k, v,
                  name(q, k, causal, kv_lens, scale), keep=visible(kv_lens, q.shape[0], k.shape[2]),
                  causal=causal, scale=scale, convention=convention, lse_convention=lse_convention,
                  nan_convention=nan_convention, tol=tol)


# (B, H, n_q, n_k, D); the interpreter runs 32-row query blocks and 16-key tiles
SHAPES = [(1, 1, 1, 1, 16), (1, 2, 5, 7, 16), (2, 1, 33, 33, 16), (1, 1, 17, 70, 32), (1, 1, 70, 17, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_ragged_shapes_match_oracle(ex, rng, shape):
    """Tiles past the end read or weighted, a missing rescale of acc and l, a wrong tile bound."""
    B, H, n_q, n_k, D = shape
    check(ex, randn(rng, B, H, n_q, D), randn(rng, B, H, n_k, D), randn(rng, B, H, n_k, D),
          convention="rescale acc and l by exp2(m - m_new) whenever m grows; "
                     "mask keys past n_k in the ragged last tile")


@pytest.mark.parametrize("cached", KV_LAYOUTS.values(), ids=KV_LAYOUTS)
def test_k_and_v_in_different_layouts(ex, rng, cached):
    """V read with K's strides (or K with V's), or rows stepped by HEAD_DIM as if each head's rows
    were dense: one of k, v is a (B, n, H, D) cache seen as (B, H, n, D), the other contiguous."""
    q = randn(rng, 2, 3, 20, 16)
    k, v = kv_in_layouts(rng, 2, 3, 29, 16, cached)
    check(ex, q, k, v, convention="read k and v each with its own strides")


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_causal_diagonal_is_top_left_aligned(ex, rng, shape):
    """j < i instead of j <= i, bottom-right alignment when n_q != n_k, a diagonal tile run unmasked."""
    B, H, n_q, n_k, D = shape
    check(ex, randn(rng, B, H, n_q, D), randn(rng, B, H, n_k, D), randn(rng, B, H, n_k, D), causal=True,
          convention=CAUSAL)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padding_keys_are_never_read(ex, rng, causal):
    """kv_lens ignored, or padding keys loaded: their NaN leaks into o, or they get weight."""
    B, n_k = 4, 40
    q, k, v = randn(rng, B, 2, 37, 16), randn(rng, B, 2, n_k, 16), randn(rng, B, 2, n_k, 16)
    kv_lens = torch.tensor([n_k, 1, 17, 33], device=DEVICE)
    k, v = poison_padding(k, v, kv_lens)
    check(ex, q, k, v, causal=causal, kv_lens=kv_lens, convention=PADDING, nan_convention=PADDING)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_zero_kv_len_gives_zero_rows_and_minus_inf_lse(ex, rng, causal):
    """Dividing by l = 0 on a fully masked row gives 0 / 0 = NaN; lse must be -inf."""
    q, k, v = randn(rng, 3, 1, 20, 16), randn(rng, 3, 1, 9, 16), randn(rng, 3, 1, 9, 16)
    check(ex, q, k, v, causal=causal, kv_lens=torch.tensor([0, 9, 0], device=DEVICE), convention=MASKED_ROW,
          lse_convention=MASKED_ROW)


@pytest.mark.parametrize("D", [8, 24, 40])
def test_head_dim_not_a_power_of_two(ex, rng, D):
    """Head dims padded wrongly, or the default scale taken from the padded width, not 1/sqrt(D)."""
    check(ex, randn(rng, 1, 2, 19, D), randn(rng, 1, 2, 23, D), randn(rng, 1, 2, 23, D), causal=True,
          convention="scale defaults to 1/sqrt(D) for the caller's D")


@pytest.mark.parametrize("scale", [0.05, 2.0])
def test_explicit_scale(ex, rng, scale):
    """scale ignored or applied twice, or exp2 used without the log2(e) factor."""
    check(ex, randn(rng, 1, 1, 21, 16), randn(rng, 1, 1, 35, 16), randn(rng, 1, 1, 35, 16), scale=scale,
          convention="s = scale * q k^T; exp(x) = exp2(x * log2(e))")


def unattended_keys_poisoned(rng, B, H, n_q, n_k, D, dtype=torch.float32):
    """q, k, v with NaN in every key from the first multiple of UNREAD_FROM past the last query."""
    q, k, v = (randn(rng, B, H, n, D, dtype=dtype) for n in (n_q, n_k, n_k))
    poison_unattended_keys(n_q, k, v)
    return q, k, v


@pytest.mark.parametrize("n_q, n_k", [(40, 300), (1, 290)], ids=["nq40-nk300", "nq1-nk290"])
def test_causal_skips_tiles_above_the_diagonal(ex, rng, n_q, n_k):
    """Causal tiles above the diagonal walked (loaded and masked to zero) instead of skipped: the
    numbers would come out the same, so keys no query may attend hold NaN. Top-left causal with
    n_q < n_k leaves every key past the last query unattended."""
    q, k, v = unattended_keys_poisoned(rng, 1, 2, n_q, n_k, 16)
    check(ex, q, k, v, causal=True, convention=CAUSAL,
          nan_convention=NOT_READ + "; causal tiles wholly above the diagonal are skipped, never loaded")


def test_large_scores_do_not_overflow(ex, rng):
    """No max subtraction: exp2 of scores in the hundreds overflows to inf, and inf / inf = NaN."""
    # Multiples of 1/8 below 256 are exact in tf32 too, so the large scores carry no rounding error. A
    # kernel that scales q's rows before the product (correct, as Triton's tutorial once did) rounds
    # each q·scale instead: with terms of a score near 1000 that moves a weight by up to about 5e-5,
    # beyond the interpreter's 2e-5, while the overflow this test is for gives inf and NaN.
    q, k = ((randn(rng, 1, 2, n, 16) * 12 * 8).round().clamp(-2040, 2040) / 8 for n in (30, 45))
    check(ex, q, k, randn(rng, 1, 2, 45, 16), causal=True, convention="subtract the running max before exp2",
          tol=max(1e-4, tolerance(q.dtype)))


def test_matches_torch_sdpa(ex, rng):
    """The same answer as torch's scaled_dot_product_attention, an oracle no exercise wrote."""
    q, k, v = randn(rng, 2, 2, 26, 16), randn(rng, 2, 2, 50, 16), randn(rng, 2, 2, 50, 16)
    o, _ = call(ex.flash_attention, q, k, v, causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    tol = tolerance(q.dtype)
    assert_close(o.double().cpu().numpy(), expected.cpu().numpy(), what=f"{name(q, k, True)}: o vs torch SDPA",
                 rtol=tol, atol=tol, convention=CAUSAL)


@interpreted_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float16_in_the_interpreter(ex, rng, causal):
    """P left in float32 for tl.dot with float16 V, o stored in the wrong dtype, float16 rounding twice."""
    q, k, v = (randn(rng, 1, 2, n, 16, dtype=torch.float16) for n in (33, 40, 40))
    check(ex, q, k, v, causal=causal, convention="cast P to V's dtype for tl.dot; sums stay float32")


STAGES = ("stage 1 folds the key tiles every row of the block may attend with no mask and no bounds checks; "
          "only the tiles the causal diagonal or the keys' end (n_keys) cuts run MASKED, in stage 2")


@interpreted_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_only_tiles_the_diagonal_or_the_end_cuts_run_masked(ex, rng, monkeypatch, causal):
    """One masked stage over every tile: o and lse come out right, but each tile pays for bounds checks
    and a mask that it does not need.

    attn_tiles is wrapped (tests/triton_helpers.py, record_stages) while the interpreter runs the
    kernel as Python; each tile a call folds with MASKED set must reach past n_keys or (causal) hold a
    key after the block's first row. n_q = 100 and n_k = 80 (and kv_lens 37 for the second batch)
    leave every block whole tiles. A kernel that folds its tiles without attn_tiles passes with the
    rule reported not checked.
    """
    walks = record_stages(monkeypatch, ex, "attn_tiles", reads=("rows", "lo", "hi", "n_keys", "MASKED", "BLOCK_N"))
    q, k, v = (randn(rng, 2, 1, n, 16) for n in (100, 80, 80))
    kv_lens = torch.tensor([80, 37], device=DEVICE)
    call(ex.flash_attention, q, k, v, causal=causal, kv_lens=kv_lens)
    for walk, start in masked_tiles(walks, "BLOCK_N"):
        first = int(walk["rows"].min())
        if not (start + walk["BLOCK_N"] > walk["n_keys"] or causal and start + walk["BLOCK_N"] - 1 > first):
            raise AssertionError(f"{name(q, k, causal, kv_lens)}: attn_tiles folded keys {start}-"
                                 f"{start + walk['BLOCK_N'] - 1} MASKED for query rows {first}-"
                                 f"{min(int(walk['rows'].max()), q.shape[2] - 1)}, though no pair of that tile is "
                                 f"masked or past n_keys = {walk['n_keys']}\n"
                                 f"  convention: {STAGES}")
    observed("06's stages (only tiles the diagonal or the keys' end cuts run MASKED)", {"attn_tiles": walks})


@interpreted_only
def test_every_kernel_compiles_for_ampere_and_hopper(ex, rng):
    """A module global read inside @triton.jit, tl.dot of mixed dtypes: the interpreter runs them, a GPU
    refuses; float32 multiplied in TF32 where torch computes it in full (a float32 launch too, for a
    wrapper that passes TF32 for float32 alone)."""
    q, k, v = (randn(rng, 2, 2, n, 40, dtype=torch.float16) for n in (33, 40, 40))  # D = 40: padded to 64
    check_compiles_for_gpus(*(partial(ex.flash_attention, q, k, v, causal=causal, kv_lens=kv_lens)
                              for causal in (False, True) for kv_lens in (None, torch.tensor([40, 3]))),
                            partial(ex.flash_attention, q.float(), k.float(), v.float(), causal=True))


@pytest.mark.given
@interpreted_only
def test_interpreter_refuses_bfloat16(ex, rng):
    """Triton's interpreter multiplies the raw bits of bfloat16 in tl.dot (errors of 1e8): refused."""
    q, k = small_qk(rng)
    with pytest.raises(ValueError, match="bfloat16"):
        ex.flash_attention(q.bfloat16(), k.bfloat16(), k.bfloat16())


BAD_INPUTS = {**WRAPPER_BAD_INPUTS, **KV_LENS_BAD_INPUTS}  # id: (build(q, k) -> kwargs, words the ValueError must hold)


@pytest.mark.given
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_value_error_before_launch(ex, rng, case):
    """The wrapper names the problem (shape, dtype, device, head dim, kv_lens, scale) before any launch."""
    build, words = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=words):
        ex.flash_attention(**build(*small_qk(rng)))


GPU_SHAPES = [(2, 3, 1000, 1000, 64), (1, 2, 1, 2049, 64), (2, 2, 777, 1531, 128), (1, 2, 300, 200, 40),
              (1, 2, 513, 513, 256)]

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
def test_gpu_compiled_matches_oracle(ex, rng, shape, dtype, causal):
    """Compiled-only bugs: half-precision casts, tile bounds at real block sizes, head dims 40 to 256."""
    B, H, n_q, n_k, D = shape
    dt = skip_unless_supported(dtype)
    check(ex, randn(rng, B, H, n_q, D, dtype=dt), randn(rng, B, H, n_k, D, dtype=dt),
          randn(rng, B, H, n_k, D, dtype=dt), causal=causal, convention=CAUSAL if causal else "")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_autotuned_4096_tokens(ex, rng, D, causal):
    """The tuned configs (pipelined loads, 64 or 128 query rows) at the benchmark's sizes, bfloat16."""
    dt = skip_unless_supported("bf16")
    q, k, v = (randn(rng, 1, 2048 // D, 4096, D, dtype=dt) for _ in range(3))
    check(ex, q, k, v, causal=causal, convention=CAUSAL if causal else "")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_gpu_kv_lens(ex, rng, dtype, causal):
    """Padding keys read or weighted at real sizes; zero-length batches give 0 and -inf."""
    dt, n_k = skip_unless_supported(dtype), 3000
    q, k, v = randn(rng, 4, 2, 2500, 64, dtype=dt), randn(rng, 4, 2, n_k, 64, dtype=dt), randn(rng, 4, 2, n_k, 64, dtype=dt)
    kv_lens = torch.tensor([0, 1, 1500, n_k], device=DEVICE)
    check(ex, q, *poison_padding(k, v, kv_lens), causal=causal, kv_lens=kv_lens, convention=PADDING,
          nan_convention=PADDING)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_gpu_causal_skips_tiles_above_the_diagonal(ex, rng, dtype):
    """Tiles above the diagonal loaded at the compiled kernel's real tile sizes: keys 1024 and past
    are attended by no query of 1000 and hold NaN."""
    q, k, v = unattended_keys_poisoned(rng, 2, 3, 1000, 3000, 64, dtype=skip_unless_supported(dtype))
    check(ex, q, k, v, causal=True, convention=CAUSAL,
          nan_convention=NOT_READ + "; causal tiles wholly above the diagonal are skipped, never loaded")


@gpu
@pytest.mark.gpu
def test_gpu_more_than_65535_batch_heads(ex, rng):
    """A grid of (query blocks, B·H): CUDA's second grid axis stops at 65535 programs, and decoding
    many sequences passes it ("invalid argument" at launch)."""
    q, k, v = (randn(rng, 7000, 10, 16, 16, dtype=torch.float16) for _ in range(3))
    check(ex, q, k, v, causal=True, convention="any B·H works: one program per (query block, batch·head)")


# ---- float32 on a GPU: in full unless torch was asked for TF32 ------------------------------------


@gpu
@pytest.mark.gpu
@pytest.mark.usefixtures("torch_default_float32")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_float32_in_full_at_attention_gym_sizes(ex, rng, causal):
    """float32 multiplied in TF32 (tl.dot's own default) where torch computes it in full: o off by 3e-4
    to 9e-4 at the sizes of attention-gym's float32 test (allclose 1e-5 / 1e-4 against FlexAttention),
    IEEE products by 6e-7."""
    B, H, n, D = GYM_SHAPE
    check(ex, *(randn(rng, B, H, n, D) for _ in range(3)), causal=causal, convention=FLOAT32)
