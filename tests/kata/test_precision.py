"""tl.dot's input precision follows torch's float32 matmul setting (kata/given/precision.py)."""
import pytest

torch = pytest.importorskip("torch", reason="skipped: the kernels' precision rule reads torch's settings")
from kata.given.precision import dot_precision  # noqa: E402 - only once torch is known to import
from torch_settings import float32_matmul_precision  # noqa: E402

HALVES = (torch.float16, torch.bfloat16)


def test_float32_is_ieee_by_default():
    """Triton's own default, TF32, where torch computes float32 in full: errors of 1e-3 where torch has 1e-6."""
    assert dot_precision(torch.float32) == "ieee"


@pytest.mark.parametrize("setting", ["high", "medium"])
def test_float32_is_tf32_where_the_matmul_precision_allows_it(setting):
    """torch.set_float32_matmul_precision("high") or "medium" ignored: the user asked for TF32's speed."""
    with float32_matmul_precision(setting):
        assert dot_precision(torch.float32) == "tf32"
        torch.set_float32_matmul_precision("highest")
        assert dot_precision(torch.float32) == "ieee"


def test_float32_is_tf32_where_allow_tf32_is_set():
    """torch.backends.cuda.matmul.allow_tf32 = True ignored (the older switch for the same thing)."""
    with float32_matmul_precision("highest"):  # which puts allow_tf32 back too
        torch.backends.cuda.matmul.allow_tf32 = True
        assert dot_precision(torch.float32) == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        assert dot_precision(torch.float32) == "ieee"


def test_float32_is_tf32_where_fp32_precision_is_tf32():
    """torch.backends.cuda.matmul.fp32_precision = "tf32" ignored (torch 2.9's switch: once it is set,
    reading the older ones raises)."""
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch before 2.9 has no fp32_precision setting")
    saved = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        assert dot_precision(torch.float32) == "tf32"
    finally:  # through the same setting: torch refuses to read a mix of the two
        matmul.fp32_precision = saved


@pytest.mark.parametrize("setting", ["highest", "high", "medium"])
def test_half_dtypes_are_unaffected(setting):
    """float16 and bfloat16 get "ieee" whatever the setting (Triton ignores it for them), so a float16
    launch carries the constexpr a float32 one does under torch's default."""
    with float32_matmul_precision(setting):
        assert [dot_precision(dtype) for dtype in HALVES] == ["ieee", "ieee"]
