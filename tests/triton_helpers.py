"""What the tests of the Triton exercises share: inputs, poisons, tolerances, and the
check of a forward kernel's o and lse against float64 attention (tests/oracles_torch.py).

Import it after `pytest.importorskip("torch")` and before Triton. Without Triton it skips the
importing test file, with the reason. Else it decides, once, how the kernels run (kata.gpu.triton_mode:
compiled where torch can use a CUDA GPU, in Triton's interpreter on the CPU otherwise, whatever the
shell exported) and sets or drops TRITON_INTERPRET to match, which Triton reads when it loads.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re

import pytest
import torch

import bounds_check
import fast_interpreter
from checks import AFTER_CALL, assert_close, assert_unmodified
from gpu_compile import compile_for_gpus, record_launches, start_compiler
from kata.given.precision import dot_precision
from kata.gpu import bf16_missing, gpu_skip_reason, triton_missing, use_triton_mode
from kata.unfinished import error_chain
from oracles_torch import attention, attention_grads, stored_o_grads
from spies import Calls, record_calls
from torch_settings import float32_matmul_precision

if missing := triton_missing():
    pytest.skip(f"skipped: {missing}", allow_module_level=True)
MODE = use_triton_mode(torch)  # before Triton loads, and before an exercise's @triton.jit runs
if MODE.interpreted:
    start_compiler()  # before Triton loads interpreted: the compile check's process runs it compiled
    fast_interpreter.install()

DEVICE = "cpu" if MODE.interpreted else "cuda"
INTERPRETED = MODE.interpreted
gpu = pytest.mark.skipif(INTERPRETED, reason=gpu_skip_reason(torch))
interpreted_only = pytest.mark.skipif(not INTERPRETED, reason="tests the interpreter: compiled, bfloat16 works")
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
# Compiled float32 multiplies in full (IEEE) under torch's default setting: at attention-gym's sizes
# (B 4, H 8, n 256, D 64) float32 products err by about 6e-7 of o and of each gradient's largest
# entry, TF32 products by 3e-4 to 9e-4; 5e-5 lies a hundred times above the one and six below the
# other. "tf32": compiled float32 where the user asked torch for TF32.
FORWARD_TOL = {  # (rtol = atol) per dtype: exact float32 in the interpreter, IEEE or TF32 products when compiled
    "interpreted": 2e-5, torch.float32: 5e-5, "tf32": 1e-2, torch.float16: 5e-3, torch.bfloat16: 3e-2,
}
BACKWARD_TOL = {  # relative to the largest expected entry: as FORWARD_TOL, half products
    "interpreted": 2e-5, torch.float32: 5e-5, "tf32": 1e-2, torch.float16: 1e-2, torch.bfloat16: 5e-2,
}
LSE = "lse is the natural log: (m + log2(l)) · ln(2) when m is kept in base 2"
BASE_2 = "; yours is in base 2, lse / ln(2) row by row: multiply by ln(2)"


def in_base_2(got, lse) -> bool:
    """Whether `got` is the natural `lse` in base 2, lse / ln 2, on every row that attends a key."""
    finite = torch.isfinite(lse)
    return bool(finite.any()) and torch.allclose(got.double()[finite], lse.double()[finite] / math.log(2), rtol=1e-3,
                                                 atol=1e-3)


FLOAT32 = ("float32 is multiplied in full (tl.dot input_precision=\"ieee\") unless the user asked torch for TF32, "
           "as torch's matmuls: every tl.dot takes the wrapper's PRECISION")
GYM_SHAPE = (4, 8, 256, 64)  # (B, H, n, D) of attention-gym's float32 test against FlexAttention
PADDING = "keys at or past kv_lens[b] are padding: never read, never weighted"
# In the interpreter a kernel runs on NumPy, which warns at log2(0) = -inf: the lse of a row, or a split,
# that sees no key, as the conventions want it.
LOG_OF_ZERO_WANTED = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
# Keys at or past a multiple of 256 lie in no tile a causal kernel visits for queries below it, at
# any power-of-two tile size up to 256: such keys may hold NaN.
UNREAD_FROM = 256

# K and V in different layouts, by which of them is a (B, n, H, D) cache seen through .transpose(1, 2)
# (the other contiguous): a kernel that reads one with the other's strides, or steps rows by HEAD_DIM
# as if each head's rows were dense, reads the wrong rows.
KV_LAYOUTS = {"k-cache-v-contiguous": (True, False), "k-contiguous-v-cache": (False, True)}

# Inputs every kernel wrapper refuses with a ValueError before launching anything, given q (2, H, n_q, 16)
# and k (2, H_kv, 7, 16): id -> (build(q, k) -> the call's keyword arguments, words the message must hold).
WRAPPER_BAD_INPUTS = {
    "q-3d": (lambda q, k: dict(q=q[0], k=k, v=k), "4-D"),
    "float64": (lambda q, k: dict(q=q.double(), k=k.double(), v=k.double()), "dtype"),
    "k-dtype": (lambda q, k: dict(q=q, k=k.half(), v=k), "dtype"),
    "k-device": (lambda q, k: dict(q=q, k=k.to("meta"), v=k), "device"),
    "d-mismatch": (lambda q, k: dict(q=q, k=k[..., :8], v=k[..., :8]), "shape"),
    "kv-n-mismatch": (lambda q, k: dict(q=q, k=k, v=k[:, :, :6]), "shape"),
    "b-mismatch": (lambda q, k: dict(q=q, k=k[:1], v=k[:1]), "shape"),
    "nq-0": (lambda q, k: dict(q=q[:, :, :0], k=k, v=k), "empty"),
    "scale-0": (lambda q, k: dict(q=q, k=k, v=k, scale=0.0), "scale"),
    "head-dim-257": (lambda q, k: dict(q=q.new_zeros(*q.shape[:3], 257), k=k.new_zeros(*k.shape[:3], 257),
                                       v=k.new_zeros(*k.shape[:3], 257)), "head dimension"),
}
# The same for wrappers that take kv_lens (B,), the valid lengths of a batch of n_k = 7 keys.
KV_LENS_BAD_INPUTS = {
    "kv-lens-shape": (lambda q, k: dict(q=q, k=k, v=k, kv_lens=torch.tensor([7, 7, 7], device=DEVICE)), "kv_lens"),
    "kv-lens-float": (lambda q, k: dict(q=q, k=k, v=k, kv_lens=torch.tensor([7.0, 7.0], device=DEVICE)), "kv_lens"),
    "kv-lens-over-nk": (lambda q, k: dict(q=q, k=k, v=k, kv_lens=torch.tensor([7, 8], device=DEVICE)), "kv_lens"),
    "kv-lens-negative": (lambda q, k: dict(q=q, k=k, v=k, kv_lens=torch.tensor([-1, 3], device=DEVICE)), "kv_lens"),
}


def stub_message(err: BaseException) -> str | None:
    """The stub's message when `err` comes from a stubbed @triton.jit body, else None.

    The interpreter wraps the stub's NotImplementedError; the compiler rejects its `raise` statement
    with the source line, which holds the message.
    """
    for error in error_chain(err):
        if isinstance(error, NotImplementedError):
            return str(error)
        if found := re.search(r'NotImplementedError\("([^"]*)"\)', str(error)):
            return found.group(1)
    return None


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs); a stubbed kernel body surfaces as NotImplementedError ("not started"). In
    the interpreter every load and store of its launches is checked first (tests/bounds_check.py):
    an address outside the tensors a launch was given fails the test, naming the kernel's line."""
    __tracebackhide__ = True
    try:
        with bounds_check.watch() if INTERPRETED else contextlib.nullcontext():
            return fn(*args, **kwargs)
    except Exception as err:
        message = stub_message(err)
        if message is None:
            raise
        raise NotImplementedError(message) from None


def randn(rng, *shape, dtype=torch.float32):
    """Standard normal values from the test's seeded generator, on the device the tests run on."""
    return torch.from_numpy(rng.standard_normal(shape)).to(device=DEVICE, dtype=dtype)


def qkv_do(rng, B, H, n_q, n_k, D, dtype=torch.float32):
    """q, k, v and an output gradient do, (B, H, n, D) each, n = n_q for q and do, n_k for k and v."""
    return (randn(rng, B, H, n, D, dtype=dtype) for n in (n_q, n_k, n_k, n_q))


def as_numpy(t):
    """A tensor as a float64 NumPy array, for the checks of checks.py."""
    return t.detach().double().cpu().numpy()


def forward_backward(attention_fn, q, k, v, do):
    """o and (dq, dk, dv) of attention_fn(q, k, v) on leaf copies of the inputs, backward from do;
    a stubbed kernel body surfaces as NotImplementedError."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def run():
        o = attention_fn(*leaves)
        o.backward(do)
        return o.detach()

    return call(run), tuple(t.grad for t in leaves)


def kv_in_layouts(rng, B, H, n_k, D, cached):
    """k and v (B, H, n_k, D), each a transposed (B, n_k, H, D) cache where `cached` (a KV_LAYOUTS
    value) says, else contiguous."""
    return [randn(rng, B, n_k, H, D).transpose(1, 2) if c else randn(rng, B, H, n_k, D) for c in cached]


def shape_id(s):
    """`b1-h2-nq5-nk7-d16`: a (B, H, n_q, n_k, D) case as a test id."""
    return "b{}-h{}-nq{}-nk{}-d{}".format(*s)


def small_qk(rng):
    """q (2, 1, 5, 16) and k (2, 1, 7, 16): one head's inputs for WRAPPER_BAD_INPUTS to spoil."""
    return randn(rng, 2, 1, 5, 16), randn(rng, 2, 1, 7, 16)


def low_precision(dtype) -> bool:
    """Compiled float16 and bfloat16: checked by the precision rule (check_precision), not a fixed
    tolerance; in the interpreter too under KATA_PRECISION_RULE=gpu, which CI sets for a run, so that
    a float16 input the GPU's rule would fail is seen on the CPU."""
    judged = not INTERPRETED or os.environ.get("KATA_PRECISION_RULE") == "gpu"
    return judged and dtype in (torch.float16, torch.bfloat16)


def tolerance(dtype, table=FORWARD_TOL) -> float:
    """The table's tolerance for outputs of `dtype`: its "interpreted" one for float32 in the
    interpreter (exact products), "tf32" for compiled float32 where torch was asked for TF32
    (kata/given/precision.py); float16 rounds as on a GPU, interpreted or not."""
    if dtype == torch.float32 and INTERPRETED:
        return table["interpreted"]
    return table["tf32" if dtype == torch.float32 and dot_precision(dtype) == "tf32" else dtype]


@pytest.fixture
def torch_default_float32():
    """torch's default float32 matmul setting, full float32 (no TF32), for the test; the session's after."""
    with float32_matmul_precision("highest"):
        yield


def visible(kv_lens, B, n_k, lo=0, hi=None):
    """keep (B, 1, 1, n_k), for every head and query: keys in [lo, hi) below kv_lens[b] (all n_k when
    kv_lens is None)."""
    j = torch.arange(n_k, device=DEVICE)
    n_keys = torch.full((B,), n_k, device=DEVICE) if kv_lens is None else kv_lens.to(DEVICE)
    return ((j >= lo) & (j < (n_k if hi is None else hi)) & (j < n_keys[:, None]))[:, None, None, :]


def poison_padding(k, v, kv_lens):
    """Padding keys (at or past kv_lens[b]) hold NaN: reading one shows up in o."""
    pad = (torch.arange(k.shape[2], device=DEVICE) >= kv_lens.to(DEVICE)[:, None])[:, None, :, None]
    return k.masked_fill(pad, math.nan), v.masked_fill(pad, math.nan)


def poison_unattended_keys(n_q, k, v):
    """NaN, in place, in every key and value from the first multiple of UNREAD_FROM past the last of n_q
    queries: under causal, keys no query may attend, in tiles a kernel should skip."""
    start = math.ceil(n_q / UNREAD_FROM) * UNREAD_FROM
    k[:, :, start:] = math.nan
    v[:, :, start:] = math.nan


def check_forward(kernel, q, k, v, what, keep=None, causal=False, scale=None, convention="", lse_convention=LSE,
                  nan_convention="", tol=None):
    """o, lse = kernel(q, k, v); the inputs must come back unmodified, o with q's dtype and shape, lse
    float32 (B, H, n_q), both equal to float64 attention over the pairs `keep` (and `causal`) allow,
    within `tol` (the dtype's tolerance when None)."""
    __tracebackhide__ = True
    before = [t.clone() for t in (q, k, v)]
    o, lse = call(kernel, q, k, v)
    for t, t0, label in zip((q, k, v), before, "qkv"):
        assert_unmodified(t0.cpu().float().numpy(), t.cpu().float().numpy(), label)
    assert o.dtype == q.dtype and tuple(o.shape) == tuple(q.shape), \
        f"{what}: o must have q's dtype and shape {tuple(q.shape)}, got {o.dtype} {tuple(o.shape)}"
    assert lse.dtype == torch.float32 and tuple(lse.shape) == tuple(q.shape[:3]), \
        f"{what}: lse must be float32 of shape {tuple(q.shape[:3])}, got {lse.dtype} {tuple(lse.shape)}"
    o_ref, lse_ref = attention(q, k, v, keep=keep, causal=causal, scale=scale)
    tol = tolerance(q.dtype) if tol is None else tol
    if low_precision(q.dtype):
        check_precision(o, o_ref, attention(q, k, v, keep=keep, causal=causal, scale=scale, dtype=q.dtype)[0],
                        f"{what}: o", convention)
    else:
        assert_close(o.double().cpu().numpy(), o_ref.cpu().numpy(), what=f"{what}: o (row = b, h, query)",
                     rtol=tol, atol=tol, convention=convention, nan_convention=nan_convention)
    assert_close(lse.double().cpu().numpy(), lse_ref.cpu().numpy(), what=f"{what}: lse (row = b, h)",
                 rtol=tol, atol=tol, convention=lse_convention + (BASE_2 if in_base_2(lse, lse_ref) else ""))


def backward_bounds(q, k, v, do, o, o_ref, **attention_kw):
    """What the outputs o, dq, dk, dv of a compiled float16 or bfloat16 backward are judged by, as
    (baseline, moved) each: PyTorch's own attention in q's dtype, and for dq and dk the exact move
    (oracles_torch.stored_o_grads) that reading O as the forward stored it, rounded to q's dtype,
    makes through D = rowsum(dO ∘ O); None where a fixed tolerance judges instead. A row attending one
    key has dS = 0 exactly in PyTorch, but dO·(v − o) in a FlashAttention backward once o is rounded
    (dropout's 1/(1 − p) makes it inexact): the algorithm's result, not a kernel's error."""
    if not low_precision(q.dtype):
        return None
    z = attention_kw.pop("z", None)
    baseline_o, baseline = attention_grads(q, k, v, do, dtype=q.dtype, z=z, **attention_kw)
    dq, dk = stored_o_grads(q, k, do, o, o_ref, **attention_kw)
    return (baseline_o, None), (baseline[0], dq), (baseline[1], dk), (baseline[2], None)


def check_outputs(what: str, outputs, tol: float, convention: str = "", nan_convention: str = "") -> None:
    """outputs: (label, input's name, input, got, expected, bound) per output of a backward. got must
    have its input's dtype and shape; then, with a bound (backward_bounds: PyTorch's own attention
    in the inputs' low precision, and the stored O's move), check_precision against it, else within
    tol of the float64 `expected`, relative to its largest entry."""
    __tracebackhide__ = True
    for label, name, t, got, expected, bound in outputs:
        assert got is not None and got.dtype == t.dtype and got.shape == t.shape, \
            f"{what}: {label} must have {name}'s dtype and shape, {t.dtype} {tuple(t.shape)}, got " \
            f"{getattr(got, 'dtype', None)} {tuple(getattr(got, 'shape', ()))}"
        if bound is not None:
            baseline, moved = bound
            check_precision(got, expected, baseline, f"{what}: {label}", convention, nan_convention, moved=moved)
            continue
        size = max(1.0, expected.abs().max().item())
        index = "key" if label in ("dk", "dv") else "query"
        assert_close(as_numpy(got), as_numpy(expected), what=f"{what}: {label} (row = b, h, {index} index)",
                     rtol=tol, atol=tol * size, convention=convention, nan_convention=nan_convention)


def check_precision(got, expected, baseline, what: str, convention: str = "", nan_convention: str = "",
                    moved=None) -> None:
    """flash-attn's rule for a low-precision output: max |got − expected| ≤ 2 · max |baseline −
    expected| + slack, where `expected` is float64 and `baseline` PyTorch's own attention in got's
    dtype: as accurate as PyTorch passes, rounding twice fails. The slack is twice the rounding of
    values near 0.3 in that dtype, flash-attn's too. `moved`, where given, is what the algorithm itself
    moves `expected` by (backward_bounds: O read as stored): got is compared with expected + moved,
    PyTorch's error still measured from `expected`. KATA_PRECISION_LOG=FILE appends err / bound.
    nan_convention: what a NaN in `got` means, said instead of a max error of nan."""
    __tracebackhide__ = True
    assert not (nan_convention and got.isnan().any()), f"{what}: holds NaN\n  convention: {nan_convention}"
    expected = expected.double()
    target = expected if moved is None else expected + moved.double()
    err = (got.double() - target).abs().max().item()
    near = (target.to(got.dtype) + 0.3 - 0.3).double()  # rounded at 0.3 and back, in got's dtype
    bound = 2 * (baseline.double() - expected).abs().max().item() + 2 * (near - target).abs().max().item()
    dtype = str(got.dtype)[6:]
    if os.environ.get("KATA_PRECISION_LOG"):
        with open(os.environ["KATA_PRECISION_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps(dict(test=os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], what=what,
                                      dtype=dtype, err=err, bound=bound)) + "\n")
    against = "float64" if moved is None else f"float64 with D = rowsum(dO ∘ O) read from O as stored in {dtype}"
    assert err <= bound, (f"{what}: max error {err:.3g} against {against}, over the bound {bound:.3g} (twice "
                          f"PyTorch's own error in {dtype}, plus rounding)"
                          + (f"\n  convention: {convention}" if convention else ""))


def record_stages(monkeypatch, module, name: str, reads=()) -> Calls:
    """Wrap the @triton.jit helper module.name so that each call, made while the interpreter runs a
    kernel as Python, appends its arguments by name: integers as ints, index vectors as NumPy
    arrays, constexprs as their values. The helper's own work goes on unchanged. `reads`: the
    parameters the check reads; without one of them (or the helper) nothing is recorded, and why
    (spies.record_calls)."""
    def plain(value):
        value = getattr(value, "value", value)  # a tl.constexpr
        data = getattr(getattr(value, "handle", None), "data", None)  # an interpreted tensor
        return value if data is None else (data.item() if data.size == 1 else data.copy())  # index vectors hold >= 16

    return record_calls(monkeypatch, module, name, lambda args: {key: plain(value) for key, value in args.items()},
                        reads)


def record_by_launch(monkeypatch, module, kernels, helper_module, helper: str, reads=()) -> dict[str, Calls]:
    """record_stages on helper_module.helper, each call filed under the kernel of `kernels` (names of
    module's kernels, as the stub defines them) whose launch ran it: the interpreter runs a launch to
    its end before the next. A kernel the module does not have records nothing, and says so."""
    calls = record_stages(monkeypatch, helper_module, helper, reads)
    by_kernel = {name: Calls() for name in kernels}

    class Named:
        """Stands for a kernel in `kernel[grid](...)`, keeping the calls its launch makes."""
        def __init__(self, name):
            self.name, self.kernel = name, getattr(module, name)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                first = len(calls)
                result = self.kernel[grid](*args, **kwargs)
                by_kernel[self.name].extend(calls[first:])
                return result
            return launch

    for name in kernels:
        by_kernel[name].unseen = calls.unseen or (None if hasattr(module, name) else
                                                  f"your file has no {name} (the stub's kernel the check names)")
        if by_kernel[name].unseen is None:
            monkeypatch.setattr(module, name, Named(name))
    return by_kernel


def masked_tiles(calls: list[dict], block: str) -> list[tuple[dict, int]]:
    """(call, tile start) for every tile the recorded calls walk with MASKED set."""
    return [(c, start) for c in calls if c["MASKED"] for start in range(c["lo"], c["hi"], c[block])]


def check_compiles_for_gpus(*runs) -> None:
    """Run each of `runs` (calls of the exercise) in the interpreter, then compile every kernel they
    launched for Ampere and Hopper, in float16, bfloat16 and float32, as a rented GPU would."""
    __tracebackhide__ = True
    with record_launches() as launches:
        for run in runs:
            call(run)
    refused = compile_for_gpus(launches)
    assert not refused, ("Triton's interpreter runs these kernels, but compiled, as on a GPU, they are refused "
                         "or break a rule:\n" + "\n".join(f"  {why}" for why in refused))


def skip_unless_supported(dtype: str) -> torch.dtype:
    """The torch dtype; bfloat16 skipped, with the reason, on a GPU without bfloat16 tensor cores."""
    if DTYPES[dtype] == torch.bfloat16 and (why := bf16_missing(torch)):
        pytest.skip(why)
    return DTYPES[dtype]


# Elements after each new float buffer: a 128 x 128 tile's worth, as many as a tile stored past an
# array's end writes there. No more: at torch's grain of 32768 elements, filling and checking it
# would run in parallel, and a forked test process (the grader's) pays milliseconds for each
# parallel region.
GUARD = 128 * 128


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch, request):
    """New float buffers start as NaN, so an output element a kernel never writes shows up. Each is
    followed by GUARD elements of NaN that must stay NaN: a store past the buffer's end (a tile's
    rows past n stored without their mask) lands there and is named, where it would have written
    over other memory, crashing the interpreter or, on a GPU, corrupting another tensor."""
    empty, empty_like = torch.empty, torch.empty_like
    guarded = []

    def poison(t):
        if not t.is_floating_point():
            return t
        extent = t.untyped_storage().nbytes() // t.element_size()
        base = empty(extent + GUARD, dtype=t.dtype, device=t.device).fill_(math.nan)
        guarded.append((base[extent:], t.dtype, tuple(t.shape)))
        return base.as_strided(t.shape, t.stride()).requires_grad_(t.requires_grad)

    def guards_untouched():
        __tracebackhide__ = True
        for guard, dtype, shape in guarded:
            written = torch.nonzero(~torch.isnan(guard))
            assert not written.numel(), (
                f"a kernel wrote {written.numel()} elements past the end of a new {str(dtype)[6:]} tensor of shape "
                f"{shape} (an output), the nearest at offset {int(written[0])} past its last element\n  convention: "
                f"a store of a tile whose rows may pass the array's end is masked to the rows that exist")

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))
    request.node.stash.setdefault(AFTER_CALL, []).append(guards_untouched)
