"""Tests for exercise 06: the fused Triton kernel against float64 oracles.

Without a CUDA device the kernel runs in Triton's interpreter on the CPU (float32, small ragged
shapes); with one, the same tests run compiled, and the tests marked gpu add float16, bfloat16 and
float32 at up to 4096 tokens. Each test's name says the bug it catches; mutants/06_triton_kernel.toml
holds those bugs.
"""
import math

import pytest

from checks import assert_close, assert_unmodified

torch = pytest.importorskip("torch", reason="skipped: exercise 06 needs PyTorch")
# Before Triton loads: without CUDA, triton_helpers sets TRITON_INTERPRET=1, which Triton reads then.
from triton_helpers import (DEVICE, DTYPES, KV_LENS_BAD_INPUTS, WRAPPER_BAD_INPUTS, call, gpu,  # noqa: E402
                            poisoned_buffers, randn, skip_unless_supported)  # noqa: F401 (a fixture)

pytest.importorskip("triton", reason="skipped: Triton needs Linux")

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # log2(0) = -inf, wanted
MASKED_ROW = "a fully masked row (kv_lens[b] = 0) gives o = 0 and lse = -inf, never NaN"
CAUSAL = "causal is top-left aligned: query i attends key j iff j <= i, also when n_q != n_k"
PADDING = "keys at or past kv_lens[b] are padding: never read, never weighted"
LSE = "lse is the natural log: (m + log2(l)) · ln(2) when m is kept in base 2"
NOT_READ = "keys that no query may attend hold NaN here: a NaN in o means such a key (a tile) was loaded"
TOL = {  # (rtol = atol) per dtype: exact float32 in the interpreter, tf32 products when compiled
    "interpreted": 2e-5, torch.float32: 1e-2, torch.float16: 5e-3, torch.bfloat16: 3e-2,
}


def oracle(q, k, v, causal=False, scale=None, kv_lens=None):
    """softmax(scale q k^T + mask) v and its log-sum-exp in float64, straight from the definition.

    The tests put NaN only in keys that no query may attend; the oracle reads them as 0.
    """
    q, k, v = q.double(), k.double().nan_to_num(), v.double().nan_to_num()
    n_q, n_k = q.shape[2], k.shape[2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    keep = torch.ones(q.shape[0], 1, n_q, n_k, dtype=torch.bool, device=q.device)
    if causal:
        keep &= torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
    if kv_lens is not None:
        live = torch.arange(n_k, device=q.device) < kv_lens[:, None].to(q.device)  # (B, n_k)
        keep &= live[:, None, None, :]
    s = torch.where(keep, (q @ k.transpose(-1, -2)) * scale, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(keep, torch.exp(s - lse[..., None]), 0.0)  # a fully masked row weighs nothing
    return p @ v, lse


def name(q, k, causal=False, kv_lens=None, scale=None) -> str:
    extra = (", causal" if causal else "") + (f", kv_lens={kv_lens.tolist()}" if kv_lens is not None else "")
    extra += f", scale={scale}" if scale is not None else ""
    return f"flash_attention(q {tuple(q.shape)} {str(q.dtype)[6:]}, k/v {tuple(k.shape)}{extra})"


def check(ex, q, k, v, causal=False, scale=None, kv_lens=None, convention="", lse_convention=LSE,
          nan_convention=""):
    """Run the kernel, check the inputs are unmodified, then compare o and lse with the oracle."""
    __tracebackhide__ = True
    before = [t.clone() for t in (q, k, v)]
    o, lse = call(ex.flash_attention, q, k, v, causal=causal, scale=scale, kv_lens=kv_lens)
    for t, t0, label in zip((q, k, v), before, "qkv"):
        assert_unmodified(t0.cpu().float().numpy(), t.cpu().float().numpy(), label)
    what = name(q, k, causal, kv_lens, scale)
    assert o.dtype == q.dtype and tuple(o.shape) == tuple(q.shape), \
        f"{what}: o must have q's dtype and shape {tuple(q.shape)}, got {o.dtype} {tuple(o.shape)}"
    assert lse.dtype == torch.float32 and tuple(lse.shape) == tuple(q.shape[:3]), \
        f"{what}: lse must be float32 of shape {tuple(q.shape[:3])}, got {lse.dtype} {tuple(lse.shape)}"
    o_ref, lse_ref = oracle(q, k, v, causal, scale, kv_lens)
    tol = TOL["interpreted" if DEVICE == "cpu" else q.dtype]
    assert_close(o.double().cpu().numpy(), o_ref.cpu().numpy(), what=f"{what}: o (row = b, h, query)",
                 rtol=tol, atol=tol, convention=convention, nan_convention=nan_convention)
    assert_close(lse.double().cpu().numpy(), lse_ref.cpu().numpy(), what=f"{what}: lse (row = b, h)",
                 rtol=tol, atol=tol, convention=lse_convention)


def shape_id(s):
    return "b{}-h{}-nq{}-nk{}-d{}".format(*s)


# (B, H, n_q, n_k, D); the interpreter runs 32-row query blocks and 16-key tiles
SHAPES = [(1, 1, 1, 1, 16), (1, 2, 5, 7, 16), (2, 1, 33, 33, 16), (1, 1, 17, 70, 32), (1, 1, 70, 17, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_ragged_shapes_match_oracle(ex, rng, shape):
    """Tiles past the end read or weighted, a missing rescale of acc and l, a wrong tile bound."""
    B, H, n_q, n_k, D = shape
    check(ex, randn(rng, B, H, n_q, D), randn(rng, B, H, n_k, D), randn(rng, B, H, n_k, D),
          convention="rescale acc and l by exp2(m - m_new) whenever m grows; "
                     "mask keys past n_k in the ragged last tile")


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
    pad = (torch.arange(n_k, device=DEVICE) >= kv_lens[:, None])[:, None, :, None]
    k, v = k.masked_fill(pad, math.nan), v.masked_fill(pad, math.nan)  # padding holds NaN
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


# Keys at or past a multiple of 256 lie in no tile a causal kernel visits for queries below it, at
# any power-of-two tile size up to 256: such keys may hold NaN.
UNREAD_FROM = 256


def unattended_keys_poisoned(rng, B, H, n_q, n_k, D, dtype=torch.float32):
    """q, k, v with NaN in every key from the first multiple of UNREAD_FROM past the last query."""
    q, k, v = (randn(rng, B, H, n, D, dtype=dtype) for n in (n_q, n_k, n_k))
    start = math.ceil(n_q / UNREAD_FROM) * UNREAD_FROM
    k[:, :, start:] = math.nan
    v[:, :, start:] = math.nan
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
    # Multiples of 1/8 below 256 are exact in tf32 too, so the large scores carry no rounding error.
    q, k = ((randn(rng, 1, 2, n, 16) * 12 * 8).round().clamp(-2040, 2040) / 8 for n in (30, 45))
    check(ex, q, k, randn(rng, 1, 2, 45, 16), causal=True, convention="subtract the running max before exp2")


def test_matches_torch_sdpa(ex, rng):
    """The same answer as torch's scaled_dot_product_attention, an oracle no exercise wrote."""
    q, k, v = randn(rng, 2, 2, 26, 16), randn(rng, 2, 2, 50, 16), randn(rng, 2, 2, 50, 16)
    o, _ = call(ex.flash_attention, q, k, v, causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    tol = TOL["interpreted" if DEVICE == "cpu" else q.dtype]
    assert_close(o.double().cpu().numpy(), expected.cpu().numpy(), what=f"{name(q, k, True)}: o vs torch SDPA",
                 rtol=tol, atol=tol, convention=CAUSAL)


def _qk(rng, n_q=5, n_k=7, D=16):
    return randn(rng, 2, 1, n_q, D), randn(rng, 2, 1, n_k, D)


@pytest.mark.given
@pytest.mark.skipif(DEVICE != "cpu", reason="tests the interpreter: compiled, bfloat16 works")
def test_interpreter_refuses_bfloat16(ex, rng):
    """Triton's interpreter multiplies the raw bits of bfloat16 in tl.dot (errors of 1e8): refused."""
    q, k = _qk(rng)
    with pytest.raises(ValueError, match="bfloat16"):
        ex.flash_attention(q.bfloat16(), k.bfloat16(), k.bfloat16())


BAD_INPUTS = {  # id: (build(q, k) -> kwargs for flash_attention, words the ValueError must contain)
    **WRAPPER_BAD_INPUTS, **KV_LENS_BAD_INPUTS,
    "head-dim-257": (lambda q, k: dict(q=q.new_zeros(2, 1, 5, 257), k=k.new_zeros(2, 1, 7, 257),
                                       v=k.new_zeros(2, 1, 7, 257)), "head dimension"),
}


@pytest.mark.given
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_value_error_before_launch(ex, rng, case):
    """The wrapper names the problem (shape, dtype, device, head dim, kv_lens, scale) before any launch."""
    build, words = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=words):
        ex.flash_attention(**build(*_qk(rng)))


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
    pad = (torch.arange(n_k, device=DEVICE) >= kv_lens[:, None])[:, None, :, None]
    check(ex, q, k.masked_fill(pad, math.nan), v.masked_fill(pad, math.nan), causal=causal, kv_lens=kv_lens,
          convention=PADDING, nan_convention=PADDING)


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
