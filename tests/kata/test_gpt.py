"""The given GPT's one departure from nanoGPT's: the q, k, v product in float32 under autocast."""
import pytest

torch = pytest.importorskip("torch")
from kata.given.gpt import AttentionParameters, Float32Linear, GPTConfig  # noqa: E402


def linear_and_input():
    torch.manual_seed(0)
    linear = Float32Linear(128, 384)
    return linear, torch.randn(4, 16, 128)


def test_the_product_is_float32_rounded_once_under_autocast():
    """qkv back to nn.Linear (its product in bf16) or its output left in float32 (the kernels would
    then run in float32): under bf16 autocast the output must be the float32 product, rounded once."""
    linear, x = linear_and_input()
    exact = torch.nn.functional.linear(x, linear.weight, linear.bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x)
        in_bf16 = torch.nn.Linear.forward(linear, x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, exact.bfloat16())
    assert not torch.equal(in_bf16, y), "the bf16 product should differ, or this test shows nothing"


def test_off_autocast_it_is_a_linear():
    """Float32Linear casting or rounding outside autocast: a float32 model's qkv would change."""
    linear, x = linear_and_input()
    assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))


def test_every_attention_layer_projects_q_k_v_so():
    """AttentionParameters back to nn.Linear for qkv: the needle task unlearned under bf16 autocast."""
    assert isinstance(AttentionParameters(GPTConfig(vocab_size=16, block_size=8)).qkv, Float32Linear)
