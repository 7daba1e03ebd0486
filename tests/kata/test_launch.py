"""The launch plumbing the Triton exercises share (kata/given/launch.py): what a tuned config is kept for."""
import pytest

pytest.importorskip("torch")
import triton_helpers  # noqa: E402, F401  sets TRITON_INTERPRET before Triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kata.exercises import SOLUTIONS_DIR, find, load  # noqa: E402
from kata.given.launch import TUNING_DQ, autotuned  # noqa: E402


@triton.jit
def _kernel(X, n_q, n_k, HEAD_DIM: tl.constexpr, EVEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pass


def test_a_config_is_tuned_per_value_of_every_constexpr_the_configs_leave():
    """A constexpr argument compiles another kernel for each of its values: a config tuned for one
    (14's forward drawing a mask, DROPOUT true) must not be kept for another (p = 0, a sixth of the
    instructions). The tiles the configs set are what is tuned, not part of the key."""
    assert autotuned(_kernel, TUNING_DQ).keys == ["n_q", "n_k", "HEAD_DIM", "EVEN"]


@pytest.mark.parametrize("number", ["06", "09", "14"])
def test_the_reference_kernels_are_tuned_per_mask_and_precision(number):
    """The autotuned kernels of the solutions: keyed on the shape, causal, the dot's precision and,
    in 14, whether a mask is drawn."""
    ex = load(find(number), SOLUTIONS_DIR)
    tuned = [getattr(ex, name) for name in dir(ex) if name.endswith("_tuned")]
    assert tuned
    dropout = ["DROPOUT"] if number == "14" else []
    for kernel in tuned:
        assert kernel.keys == ["n_q", "n_k", "HEAD_DIM", "CAUSAL", *dropout, "PRECISION"]
