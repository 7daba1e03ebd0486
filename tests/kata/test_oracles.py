"""The float64 oracles in slices (tests/oracles_torch.py): a GPU test at thousands of tokens and
many heads runs the dense oracle a few heads at a time, and must get what one dense pass gets."""
import pytest

torch = pytest.importorskip("torch")
import oracles_torch  # noqa: E402
from oracles_torch import attention, attention_grads, stored_o_grads  # noqa: E402


def inputs():
    """Grouped-query heads (4 query heads, 2 kv heads), a keep mask per batch row, a dropout scale
    per (batch, head) and a row that attends no key: every way an input meets the slicing."""
    g = torch.Generator().manual_seed(0)
    B, H, H_kv, n_q, n_k, D = 3, 4, 2, 6, 9, 8
    q, do, o = (torch.randn(B, H, n_q, D, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = (torch.randn(B, H_kv, n_k, D, generator=g, dtype=torch.float64) for _ in range(2))
    keep = torch.rand(B, 1, n_q, n_k, generator=g) < 0.7
    keep[1, 0, 2] = False
    z = (torch.rand(B, H, n_q, n_k, generator=g) < 0.8) / 0.8
    return q, k, v, do, o, keep, z


# Scores a slice may hold: under one head's 54 (slices of one (batch, head)), and two batch rows' of
# 4 heads (slices of 2 rows, then the last row alone).
LIMITS = pytest.mark.parametrize("limit", [2, 2 * 4 * 6 * 9], ids=["heads", "rows"])


def both_ways(monkeypatch, oracle, limit):
    """oracle() in one pass, then in slices of at most `limit` scores."""
    whole = oracle()
    monkeypatch.setattr(oracles_torch, "SLICE_SCORES", limit)
    return whole, oracle()


def assert_same(whole, sliced):
    for a, b in zip(torch.utils._pytree.tree_leaves(whole), torch.utils._pytree.tree_leaves(sliced), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, equal_nan=True)


@LIMITS
def test_attention_in_slices_is_attention(monkeypatch, limit):
    """Slices put back in the wrong order, a mask or dropout scale not sliced with its heads, or the
    kv head of a grouped query head lost in a slice: o or lse differ from one dense pass."""
    q, k, v, _, _, keep, z = inputs()
    assert_same(*both_ways(monkeypatch, lambda: attention(q, k, v, keep=keep, causal=True, z=z), limit))


@LIMITS
def test_gradients_in_slices_are_the_gradients(monkeypatch, limit):
    """A slice's gradient overwriting another's (a kv head is shared by two query heads, and by slices
    of both), or the graph freed after the first slice: dq, dk or dv differ from one dense pass."""
    q, k, v, do, _, keep, z = inputs()
    assert_same(*both_ways(monkeypatch, lambda: attention_grads(q, k, v, do, keep=keep, z=z), limit))


@LIMITS
def test_stored_o_move_in_slices_is_the_move(monkeypatch, limit):
    """δD (one number a row) sliced other than its rows' queries: the move of dq and dk differs."""
    q, k, v, do, o, keep, _ = inputs()
    o_ref, _ = attention(q, k, v, keep=keep)
    assert_same(*both_ways(monkeypatch, lambda: stored_o_grads(q, k, do, o, o_ref, keep=keep, causal=True), limit))
