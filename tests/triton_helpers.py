"""What the tests of the Triton exercises (06, 09, 10) share.

Import it after `pytest.importorskip("torch")` and before Triton: without a CUDA device it sets
TRITON_INTERPRET=1, which Triton reads when it loads, so the kernels run in its interpreter.
"""
from __future__ import annotations

import math
import os
import re

import pytest
import torch

from kata.gpu import bf16_missing, gpu_skip_reason

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # read when an exercise's @triton.jit runs: set it first

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=gpu_skip_reason(torch))
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}

# Inputs every kernel wrapper refuses with a ValueError before launching anything, given q (2, H, 5, 16)
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
    while err is not None:
        if isinstance(err, NotImplementedError):
            return str(err)
        found = re.search(r'NotImplementedError\("([^"]*)"\)', str(err))
        if found:
            return found.group(1)
        err = err.__cause__ or err.__context__
    return None


def call(fn, *args, **kwargs):
    """fn(*args, **kwargs); a stubbed kernel body surfaces as NotImplementedError ("not started")."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        message = stub_message(err)
        if message is None:
            raise
        raise NotImplementedError(message) from None


def randn(rng, *shape, dtype=torch.float32):
    """Standard normal values from the test's seeded generator, on the device the tests run on."""
    return torch.from_numpy(rng.standard_normal(shape)).to(device=DEVICE, dtype=dtype)


def skip_unless_supported(dtype: str) -> torch.dtype:
    """The torch dtype; bfloat16 skipped, with the reason, on a GPU without bfloat16 tensor cores."""
    if DTYPES[dtype] == torch.bfloat16 and (why := bf16_missing(torch)):
        pytest.skip(why)
    return DTYPES[dtype]


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """New float buffers start as NaN, so an output element a kernel never writes shows up."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))
