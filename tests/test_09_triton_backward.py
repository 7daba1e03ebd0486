"""Tests for exercise 09: the backward kernels, through torch.autograd, against float64 autograd of
dense attention.

Without a CUDA device the kernels run in Triton's interpreter on the CPU (float32, small ragged
shapes); with one, the same tests run compiled, and the tests marked gpu add float16, bfloat16 and
float32 at up to 4096 tokens and a short training run beside torch's SDPA. Each test's name says
the bug it catches; mutants/09_triton_backward.toml holds those bugs.
"""
from functools import partial

import pytest

from checks import assert_close, assert_unmodified
from spies import observed

torch = pytest.importorskip("torch", reason="skipped: exercise 09 needs PyTorch")
from oracles_torch import attention_grads  # noqa: E402 - only once torch is known to import
# Before Triton loads: without CUDA, triton_helpers sets TRITON_INTERPRET=1, which Triton reads then.
from triton_helpers import (BACKWARD_TOL, DTYPES, KV_LAYOUTS, WRAPPER_BAD_INPUTS, as_numpy,  # noqa: E402
                            backward_bounds, check_compiles_for_gpus, check_outputs, check_precision, forward_backward,
                            gpu, interpreted_only, kv_in_layouts, masked_tiles, poison_unattended_keys,
                            poisoned_buffers,  # noqa: F401 (a fixture)
                            qkv_do, randn, record_stages, shape_id, skip_unless_supported, small_qk, tolerance)
from triton_helpers import FLOAT32, GYM_SHAPE, torch_default_float32  # noqa: E402, F401 (a fixture)
from requires_grad import FROZEN, check_frozen  # noqa: E402
from rounding_inputs import cancelling_dv_inputs, dv_summed, large_d_inputs  # noqa: E402
from training import check_training  # noqa: E402

# P is computed before the causal mask zeroes it: a pair above the diagonal may overflow exp2 to inf, unused.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
FORMULAS = ("P = exp(scale·QKᵀ − lse), dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − D) with D = rowsum(dO ∘ O), "
            "dQ = scale · dS K, dK = scale · dSᵀ Q")
WHOLE = "dK_j, dV_j sum every query tile that attends key block j; dQ_i every key tile query block i attends"
CAUSAL = "causal is top-left aligned: query i attends key j iff j <= i, also when n_q != n_k"
NOT_READ = ("keys that no query may attend hold NaN here: a NaN means such a key (a tile above the diagonal) "
            "was loaded; their dk and dv are 0")


def run(ex, q, k, v, do, **kw):
    """o and (dq, dk, dv) from the kernel; a stubbed kernel body surfaces as NotImplementedError."""
    return forward_backward(lambda *t: ex.flash_attention(*t, **kw), q, k, v, do)


def name(q, k, causal=False, scale=None) -> str:
    extra = (", causal" if causal else "") + (f", scale={scale}" if scale is not None else "")
    return f"flash_attention(q {tuple(q.shape)} {str(q.dtype)[6:]}, k/v {tuple(k.shape)}{extra}).backward(do)"


def check(ex, q, k, v, do, causal=False, scale=None, convention=FORMULAS, nan_convention="", tol=None):
    """Run forward and backward, check the inputs are unmodified, then o, dq, dk, dv against the oracle."""
    __tracebackhide__ = True
    before = [t.clone() for t in (q, k, v, do)]
    o, grads = run(ex, q, k, v, do, causal=causal, scale=scale)
    for t, t0, label in zip((q, k, v, do), before, ("q", "k", "v", "do")):
        assert_unmodified(as_numpy(t0), as_numpy(t), label)
    what = name(q, k, causal, scale)
    o_ref, grads_ref = attention_grads(q, k, v, do, causal=causal, scale=scale)
    tol = tol or tolerance(q.dtype, BACKWARD_TOL)
    bounds = backward_bounds(q, k, v, do, o, o_ref, causal=causal, scale=scale)  # compiled float16, bfloat16
    if bounds:
        check_precision(o, o_ref, bounds[0][0], f"{what}: o (the given forward)")
    else:
        assert_close(as_numpy(o), as_numpy(o_ref), what=f"{what}: o (the given forward)", rtol=tol, atol=tol)
    grad_bounds = bounds[1:] if bounds else (None,) * 3
    check_outputs(what, zip(("dq", "dk", "dv"), "qkv", (q, k, v), grads, grads_ref, grad_bounds), tol, convention,
                  nan_convention)


# (B, H, n_q, n_k, D); the interpreter runs 16- and 32-row tiles in both kernels
SHAPES = [(1, 1, 1, 1, 16), (1, 2, 5, 7, 16), (2, 1, 33, 33, 16), (1, 1, 17, 70, 32), (1, 1, 70, 17, 16)]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_ragged_shapes_match_autograd(ex, rng, shape):
    """A wrong formula (D missing, scale left out), a sum that keeps only its last tile, the ragged
    last tile of either loop never visited, rows past the end stored or left unwritten."""
    q, k, v, do = qkv_do(rng, *shape)
    check(ex, q, k, v, do, convention=f"{FORMULAS}; {WHOLE}")


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_causal_diagonal_is_top_left_aligned(ex, rng, shape):
    """j < i instead of j <= i in either kernel, a diagonal tile run unmasked, bottom-right alignment
    when n_q != n_k."""
    q, k, v, do = qkv_do(rng, *shape)
    check(ex, q, k, v, do, causal=True, convention=CAUSAL)


@pytest.mark.parametrize("D", [8, 24, 40])
def test_head_dim_not_a_power_of_two(ex, rng, D):
    """Gradients of the padded columns returned, or the padded width's 1/sqrt scale used."""
    q, k, v, do = qkv_do(rng, 1, 2, 19, 23, D)
    check(ex, q, k, v, do, causal=True, convention="scale defaults to 1/sqrt(D) for the caller's D")


@pytest.mark.parametrize("scale", [0.05, 2.0])
def test_explicit_scale(ex, rng, scale):
    """dQ or dK without the factor scale (or with it twice), P rebuilt without log2(e)."""
    q, k, v, do = qkv_do(rng, 1, 1, 21, 35, 16)
    check(ex, q, k, v, do, scale=scale, convention="dQ = scale · dS K and dK = scale · dSᵀ Q; "
                                                   "P = exp2(scale·log2(e)·QKᵀ − lse·log2(e))")


def unattended_keys_poisoned(rng, B, H, n_q, n_k, D, dtype=torch.float32):
    """q, k, v, do with NaN in every key and value from the first multiple of UNREAD_FROM past the last query."""
    q, k, v, do = qkv_do(rng, B, H, n_q, n_k, D, dtype)
    poison_unattended_keys(n_q, k, v)
    return q, k, v, do


@pytest.mark.parametrize("n_q, n_k", [(40, 300), (1, 290)], ids=["nq40-nk300", "nq1-nk290"])
def test_causal_skips_tiles_above_the_diagonal(ex, rng, n_q, n_k):
    """Tiles above the diagonal walked (loaded and masked to zero) instead of skipped, in the dK, dV
    kernel (a key block no query attends walks query tiles) or the dQ kernel (a query block walks
    past its last key); dK, dV of keys no query attends left unwritten instead of 0. Top-left
    causal with n_q < n_k leaves every key past the last query unattended."""
    q, k, v, do = unattended_keys_poisoned(rng, 1, 2, n_q, n_k, 16)
    check(ex, q, k, v, do, causal=True, convention=f"{CAUSAL}; a key no query attends has dk = dv = 0",
          nan_convention=NOT_READ)


@pytest.mark.usefixtures("torch_default_float32")  # TF32 products would move P by a percent at these scores
def test_large_scores_do_not_overflow(ex, rng):
    """P rebuilt as exp2 of raw scores, or lse applied in the wrong base: exp2 overflows or P is off."""
    # Multiples of 1/8 are exact in float32 and tf32, so the large scores carry little rounding error;
    # so do dP = dO Vᵀ, whose difference with D is tiny where one key takes all the weight.
    q, k = ((randn(rng, 1, 2, n, 16) * 12 * 8).round().clamp(-2040, 2040) / 8 for n in (30, 45))
    v, do = ((randn(rng, 1, 2, n, 16) * 8).round() / 8 for n in (45, 30))
    # Scores here reach the hundreds, where float32 steps by about 3e-5: rebuilding P from them moves
    # the gradients by up to about 5e-5 of their size (800 seeds), over the interpreter's usual 2e-5.
    check(ex, q, k, v, do, causal=True, tol=1e-4,
          convention="P = exp2(S·scale·log2(e) − lse·log2(e)): lse is the natural log")


def test_non_contiguous_inputs_and_gradient(ex, rng):
    """One tensor's strides used for another (q's for dO, k's for dK): inputs here are (B, n, H, D)
    tensors viewed as (B, H, n, D), as a model's projections give them, and dO is another layout."""
    q, k, v = (randn(rng, 2, n, 3, 16).transpose(1, 2) for n in (37, 29, 29))
    do = randn(rng, 37, 3, 2, 16).permute(2, 1, 0, 3)
    check(ex, q, k, v, do, causal=True, convention="read each tensor with its own strides")


@pytest.mark.parametrize("cached", KV_LAYOUTS.values(), ids=KV_LAYOUTS)
def test_k_and_v_in_different_layouts(ex, rng, cached):
    """V read with K's strides, or dV stored with dK's (autograd's dk and dv are made like k and v,
    so they differ here too): one of k, v is a (B, n, H, D) cache seen as (B, H, n, D), the other contiguous."""
    q, do = randn(rng, 2, 3, 37, 16), randn(rng, 2, 3, 37, 16)
    k, v = kv_in_layouts(rng, 2, 3, 29, 16, cached)
    check(ex, q, k, v, do, convention="read k and v, and write dk and dv, each with its own strides")


def test_matches_torch_sdpa_gradients(ex, rng):
    """The same gradients as torch's scaled_dot_product_attention, an oracle no exercise wrote."""
    q, k, v, do = qkv_do(rng, 2, 2, 26, 50, 16)
    _, grads = run(ex, q, k, v, do, causal=True)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True).backward(do.double())
    tol = tolerance(q.dtype, BACKWARD_TOL)
    for label, got, leaf in zip(("dq", "dk", "dv"), grads, leaves):
        size = max(1.0, leaf.grad.abs().max().item())
        assert_close(as_numpy(got), as_numpy(leaf.grad), what=f"{name(q, k, True)}: {label} vs torch SDPA",
                     rtol=tol, atol=tol * size, convention=CAUSAL)


@interpreted_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float16_in_the_interpreter(ex, rng, causal):
    """P or dS left in float32 for tl.dot with float16 operands, a gradient stored in the wrong dtype."""
    check(ex, *qkv_do(rng, 1, 2, 33, 40, 16, dtype=torch.float16), causal=causal,
          convention="cast P and dS to the input dtype for tl.dot; sums stay float32")


STAGES = ("only the tiles the causal diagonal or the ragged end of the walked array cuts run MASKED; the others "
          "load without bounds checks and skip the causal tl.where")


@pytest.mark.parametrize("causal, n_k", [(True, 40), (False, 512)], ids=["causal", "full-512-keys"])
def test_d_stays_float32_under_float16_inputs(ex, rng, causal, n_k):
    """D = rowsum(dO ∘ O) made in float16 (o * do summed in the inputs' dtype): rows whose dO ∘ O sums
    to about 1000 (large_d_inputs) get D off by up to 0.5, and dS = P ∘ (dP − D), dQ with it. With 512
    keys a row, PyTorch's own float16 error in dQ (dP rounded, differently for each key) averages out,
    while D's error moves every key alike: a GPU's rule, twice PyTorch's error, sees it too."""
    check(ex, *large_d_inputs(rng, 1, 1, 40, n_k, 64), causal=causal, tol=3e-2,
          convention="D = rowsum(dO ∘ O) in float32: O and dO upcast before the product; here every row's D "
                     "is near 1000, where float16 steps by 1")


def test_dv_summed_in_float32_across_query_tiles(ex, rng):
    """Each query tile's Pᵀ dO rounded to the inputs' dtype before it joins dV (dv += tl.dot(...).to(...)):
    here (cancelling_dv_inputs) key 0's tile products, near ±1024, cancel to a dV near 8, and each
    rounding to float16 is off by up to 0.5."""
    check(ex, *cancelling_dv_inputs(rng, 1, 1, 64, 40, 16), causal=True,
          convention=dv_summed())


@pytest.mark.parametrize("frozen", FROZEN)
def test_gradients_of_frozen_and_trained_inputs(ex, rng, frozen):
    """The backward deciding whether a gradient is wanted from the wrong input (dV from k's
    requires_grad, say): frozen keys with trained values (or another mix) lose a gradient, or get one
    they did not ask for."""
    q, k, v, do = qkv_do(rng, 1, 1, 30, 41, 16)
    _, expected = attention_grads(q, k, v, do, causal=True)
    check_frozen(partial(ex.flash_attention, causal=True), q, k, v, do, frozen, expected, name(q, k, causal=True),
                 tolerance(q.dtype, BACKWARD_TOL), FORMULAS)


@interpreted_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_only_tiles_the_diagonal_or_the_end_cuts_run_masked(ex, rng, monkeypatch, causal):
    """Every tile run MASKED (one masked stage over all tiles): the gradients come out right, but each
    tile pays for bounds checks and a mask that it does not need.

    _dkdv_tiles and _dq_tiles are wrapped (tests/triton_helpers.py, record_stages) while the
    interpreter runs the kernels as Python; each tile a call walks with MASKED set must be cut by
    the diagonal or by the ragged end. n_q = 100 and n_k = 80 leave both kernels whole tiles.
    Kernels that walk their tiles without these helpers pass with the rule reported not checked.
    """
    n_q, n_k = 100, 80
    dkdv = record_stages(monkeypatch, ex, "_dkdv_tiles", reads=("keys", "lo", "hi", "n_q", "MASKED", "BLOCK_M"))
    dq = record_stages(monkeypatch, ex, "_dq_tiles", reads=("rows", "lo", "hi", "n_k", "MASKED", "BLOCK_N"))
    run(ex, *qkv_do(rng, 1, 1, n_q, n_k, 16), causal=causal)
    what = f"flash_attention(q (1, 1, {n_q}, 16), k/v (1, 1, {n_k}, 16){', causal' if causal else ''}).backward"
    for walk, start in masked_tiles(dkdv, "BLOCK_M"):
        keys = walk["keys"]
        if not (start + walk["BLOCK_M"] > walk["n_q"] or causal and start < keys.max()):
            raise AssertionError(f"{what}: _dkdv_tiles ran query rows {start}-{start + walk['BLOCK_M'] - 1} against "
                                 f"keys {keys.min()}-{keys.max()} MASKED, though no pair of that tile is masked "
                                 f"or past the end\n  convention: {STAGES}")
    for walk, start in masked_tiles(dq, "BLOCK_N"):
        rows = walk["rows"]
        if not (start + walk["BLOCK_N"] > walk["n_k"] or causal and start + walk["BLOCK_N"] - 1 > rows.min()):
            raise AssertionError(f"{what}: _dq_tiles ran keys {start}-{start + walk['BLOCK_N'] - 1} for query rows "
                                 f"{rows.min()}-{rows.max()} MASKED, though no pair of that tile is masked or past "
                                 f"the end\n  convention: {STAGES}")
    observed("09's stages (only tiles the diagonal or the end cuts run MASKED)", {"_dkdv_tiles": dkdv, "_dq_tiles": dq})


@interpreted_only
def test_every_kernel_compiles_for_ampere_and_hopper(ex, rng):
    """A module global read inside @triton.jit (LOG2E), tl.dot of float32 P by float16 dO: the
    interpreter runs them, a GPU refuses."""
    inputs = tuple(qkv_do(rng, 2, 2, 33, 40, 40, dtype=torch.float16))
    check_compiles_for_gpus(*(partial(run, ex, *inputs, causal=causal) for causal in (False, True)))


@pytest.mark.given
@interpreted_only
def test_interpreter_refuses_bfloat16(ex, rng):
    """Triton's interpreter multiplies the raw bits of bfloat16 in tl.dot (errors of 1e8): refused."""
    q, k = small_qk(rng)
    with pytest.raises(ValueError, match="bfloat16"):
        ex.flash_attention(q.bfloat16(), k.bfloat16(), k.bfloat16())


@pytest.mark.given
@pytest.mark.parametrize("case", WRAPPER_BAD_INPUTS)
def test_bad_inputs_raise_value_error_before_launch(ex, rng, case):
    """The wrapper names the problem (shape, dtype, device, head dim, scale) before any launch."""
    build, words = WRAPPER_BAD_INPUTS[case]
    with pytest.raises(ValueError, match=words):
        ex.flash_attention(**build(*small_qk(rng)))


GPU_SHAPES = [(2, 3, 1000, 1000, 64), (1, 2, 1, 2049, 64), (2, 2, 777, 1531, 128), (1, 2, 300, 200, 40),
              (1, 2, 513, 513, 256)]

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
def test_gpu_compiled_matches_autograd(ex, rng, shape, dtype, causal):
    """Compiled-only bugs: half-precision casts of P and dS, tile bounds at real block sizes, head
    dims 40 to 256."""
    q, k, v, do = qkv_do(rng, *shape, dtype=skip_unless_supported(dtype))
    check(ex, q, k, v, do, causal=causal, convention=CAUSAL if causal else FORMULAS)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_autotuned_4096_tokens(ex, rng, D, causal):
    """The tuned configs (pipelined loads, the three stages of the dK, dV kernel) at the benchmark's
    sizes, bfloat16 (tuning every dtype too would cost minutes of compiling)."""
    q, k, v, do = qkv_do(rng, 1, 2048 // D, 4096, 4096, D, dtype=skip_unless_supported("bf16"))
    check(ex, q, k, v, do, causal=causal, convention=CAUSAL if causal else FORMULAS)


# flash-attn's test_flash_attn_splitkv_backward at d = 96, causal (top-left here), in bfloat16: every query
# of the first shape, and the first three of the second, attend one to three keys
FEW_KEYS_SHAPES = [(1, 12, 3, 1024, 96), (3, 12, 1024, 1024, 96)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", FEW_KEYS_SHAPES, ids=shape_id)
def test_gpu_bfloat16_rows_with_few_keys(ex, rng, shape):
    """dQ of rows that attend one to three keys, in bfloat16, where dQ_i = scale · Σⱼ dSᵢⱼ kⱼ has too few
    terms to average out a rounding (an H200 gave dQ 1.23 times this bound at this shape). Its cause is
    not established: an emulation of the kernel's bfloat16 roundings on the CPU stays at 0.2 to 0.3 of
    the bound, and dS kept in float32 for dS·K lowers it most. A GPU check: the interpreter cannot run
    bfloat16."""
    q, k, v, do = qkv_do(rng, *shape, dtype=skip_unless_supported("bf16"))
    check(ex, q, k, v, do, causal=True, convention=f"{CAUSAL}; dQ's sum in float32, P and dS cast to bfloat16 "
          "only as tl.dot's operands")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_gpu_causal_skips_tiles_above_the_diagonal(ex, rng, dtype):
    """Tiles above the diagonal loaded at the compiled kernels' real tile sizes: keys 1024 and past
    are attended by no query of 1000 and hold NaN; their dk and dv are 0."""
    q, k, v, do = unattended_keys_poisoned(rng, 2, 3, 1000, 3000, 64, dtype=skip_unless_supported(dtype))
    check(ex, q, k, v, do, causal=True, convention=f"{CAUSAL}; a key no query attends has dk = dv = 0",
          nan_convention=NOT_READ)


@gpu
@pytest.mark.gpu
def test_gpu_training_matches_sdpa(ex, rng):
    """Gradients that pass the tests above but go wrong in a real model (a stride, a layout from
    .transpose, many steps of float16): 100 steps of a 2-layer causal model trained with your kernel
    and with torch's SDPA give the same loss at every step."""
    check_training(rng, lambda q, k, v: ex.flash_attention(q, k, v, causal=True),
                   lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                   "causal model", "the gradients of flash_attention are those of softmax(scale q kᵀ) v")


# ---- float32 on a GPU: in full unless torch was asked for TF32 ------------------------------------


@gpu
@pytest.mark.gpu
@pytest.mark.usefixtures("torch_default_float32")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_float32_in_full_at_attention_gym_sizes(ex, rng, causal):
    """float32 gradients multiplied in TF32 (tl.dot's own default) where torch computes them in full:
    off by 3e-4 to 7e-4 of their largest entry at the sizes of attention-gym's float32 test, IEEE
    products by 6e-7."""
    B, H, n, D = GYM_SHAPE
    check(ex, *qkv_do(rng, B, H, n, n, D), causal=causal, convention=f"{FORMULAS}; {FLOAT32}")
