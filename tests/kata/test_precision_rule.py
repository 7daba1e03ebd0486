"""How the precision rule takes O stored in the inputs' dtype (tests/triton_helpers.py,
backward_bounds), on the CPU: a FlashAttention backward is written out in float64 from the
lessons' formulas, reading whichever o it is given, as a kernel reads the o its forward stored."""
import math
from functools import partial

import pytest

torch = pytest.importorskip("torch")
from oracles_torch import attention_grads, stored_o_grads  # noqa: E402
import triton_helpers  # noqa: E402
from triton_helpers import check_precision  # noqa: E402


def formula_grads(q, k, v, do, o, keep, scale, z):
    """dq, dk, dv by the formulas of exercise 07 in float64, with D = rowsum(dO ∘ o) from the given o."""
    s = (scale * q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf)
    live = keep.any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~live, 0.0), -1) * live
    dv = (p * z).transpose(-1, -2) @ do
    ds = p * ((do @ v.transpose(-1, -2)) * z - (do * o).sum(-1, keepdim=True))
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, dv


def inputs(n_q, n_k, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, n, d, generator=g, dtype=torch.float64) for n in (n_q, n_k, n_k, n_q))


def test_the_move_is_what_d_from_the_stored_o_changes():
    """stored_o_grads wrong (a sign, P where lse's gradient belongs, dead rows' NaN): the difference
    between the formulas run on O rounded to float16 and on the exact O, with dropout and a row that
    attends no key."""
    q, k, v, do = inputs(5, 7, 16)
    keep = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) < 0.6
    keep[2] = False
    z = (torch.rand(1, 2, 5, 7, generator=torch.Generator().manual_seed(2)) < 0.8) / 0.8
    scale = 0.3
    o, _ = attention_grads(q, k, v, do, keep=keep, scale=scale, z=z)
    stored = o.half().double()
    exact = formula_grads(q, k, v, do, o, keep, scale, z)
    rounded = formula_grads(q, k, v, do, stored, keep, scale, z)
    dq, dk = stored_o_grads(q, k, do, stored, o, keep=keep, scale=scale)
    torch.testing.assert_close(dq, rounded[0] - exact[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(dk, rounded[1] - exact[1], rtol=1e-9, atol=1e-12)
    assert dq.abs().max() > 1e-6  # float16's rounding of o does move them


def test_a_row_attending_one_key_under_dropout_is_judged_from_the_stored_o(monkeypatch):
    """Seen on an H100 (exercise 14, one query attending key 0 alone, p = 0.1): dQ is exactly 0 there,
    and so is PyTorch's, so flash-attn's rule alone allows dQ no error at all; a correct kernel, whose D
    reads o = v / (1 − p) rounded to float16, was failed. Compared with dQ moved by the stored O
    (backward_bounds), it passes; a D that forgets dropout's 1/(1 − p), or three times the move, fails."""
    monkeypatch.setattr(triton_helpers, "low_precision", lambda dtype: True)  # as compiled float16 is judged
    q, k, v, do = (t.half() for t in inputs(1, 64, 64))
    keep = torch.zeros(1, 64, dtype=torch.bool)
    keep[0, 0] = True  # causal, top-left aligned: query 0 attends key 0 alone
    z = torch.full((1, 2, 1, 64), 1 / 0.9, dtype=torch.float64)
    o, grads = attention_grads(q, k, v, do, keep=keep, z=z)
    stored = o.half()
    formulas = partial(formula_grads, *(t.double() for t in (q, k, v, do)))
    dq = formulas(stored.double(), keep, 64 ** -0.5, z)[0].half()
    baseline, moved = triton_helpers.backward_bounds(q, k, v, do, stored, o, keep=keep, z=z)[1]
    assert moved.abs().max() > 0
    with pytest.raises(AssertionError, match="over the bound"):
        check_precision(dq, grads[0], baseline, "dq")
    check_precision(dq, grads[0], baseline, "dq", moved=moved)
    undropped = formulas(stored.double() * 0.9, keep, 64 ** -0.5, z)[0].half()
    for wrong in (undropped, (grads[0] + 3 * moved).half()):
        with pytest.raises(AssertionError, match="read from O as stored in float16"):
            check_precision(wrong, grads[0], baseline, "dq", moved=moved)
