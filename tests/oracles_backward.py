"""Float64 oracles for the backward pass: torch's autograd through dense attention and softmax.

The gradients come from the definition (scores, -inf where a pair may not attend, softmax, P V),
differentiated by torch in float64: no lse, no D, no recomputation, no tiles.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch


@contextlib.contextmanager
def one_thread():
    """Run torch on one thread: on arrays this small, waking its thread pool costs ~10x the work
    (far more on a busy machine); the previous setting comes back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _leaf(a):
    return torch.tensor(np.asarray(a, np.float64), requires_grad=True)


def _backward(out, grad):
    """Gradients of sum(out ∘ grad): out.backward(grad) gives the same but costs ~0.3 s on first use."""
    (out * torch.from_numpy(np.asarray(grad, np.float64))).sum().backward()


@one_thread()
def softmax_grad(x, dp):
    """ds = the gradient through p = softmax(x) (last axis) for an upstream gradient dp, by autograd.

    A row of x that is all -inf has p = 0 whatever x does, so its ds is 0.
    """
    x = np.asarray(x, np.float64)
    live = ~np.all(np.isneginf(x), axis=-1, keepdims=True)
    x_t = _leaf(np.where(live, x, 0.0))  # softmax of an all -inf row is NaN, and so is its gradient
    p = torch.softmax(x_t, dim=-1) * torch.from_numpy(live)
    _backward(p, dp)
    return x_t.grad.numpy()


@one_thread()
def attention_grads(q, k, v, do, allowed=None, scale=None):
    """(dq, dk, dv): the gradients of sum(attention(q, k, v) ∘ do) by autograd in float64.

    `allowed` (n_q, n_k) is True where a query may attend a key. A row with no allowed key has
    output 0 whatever q, k, v are: its weights are multiplied by 0 (its scores set to 0 first, as
    the softmax of an all -inf row is NaN), so it gives no gradient.
    """
    q_t, k_t, v_t = map(_leaf, (q, k, v))
    n_q, n_k = q_t.shape[0], k_t.shape[0]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool) if allowed is None else torch.from_numpy(np.array(allowed, bool))
    live = allowed.any(dim=1, keepdim=True)
    scale = 1 / math.sqrt(q_t.shape[1]) if scale is None else scale
    s = (scale * q_t @ k_t.T).masked_fill(~allowed, -math.inf).masked_fill(~live, 0.0)
    o = (torch.softmax(s, dim=-1) * live) @ v_t
    _backward(o, do)
    return q_t.grad.numpy(), k_t.grad.numpy(), v_t.grad.numpy()
