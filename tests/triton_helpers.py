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
