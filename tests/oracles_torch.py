"""Float64 oracles in torch: dense attention from the definition, and its gradients by autograd.

Attention is the dense matrix of scores with the pairs that may not attend set to -inf, a softmax
and P V: no tiles, no running max, no merge, no recomputation. A row with no key to attend gives
o = 0 and lse = -inf. The gradients are torch's autograd through it: no lse, no D, no formula of
the lessons. Inputs may be NumPy arrays or tensors, in any float dtype, on any device.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

SLICE_SCORES = 2**26  # scores a slice of the oracle holds: 512 MiB in float64


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


def _float64(a):
    """A float64 copy, cut from any graph. The tests put NaN only where no output depends on it (keys
    no query may attend, rows in no scheduled tile): read as 0, such entries get gradient 0."""
    return torch.as_tensor(a, dtype=torch.float64).detach().nan_to_num(posinf=math.inf, neginf=-math.inf)


def _attention(q, k, v, keep, causal, scale, z=None):
    """(o, lse) of softmax(scale q kᵀ) v over the pairs that may attend, differentiable; with z,
    (softmax(scale q kᵀ) ∘ z) v (dropout: z = mask / (1 − p)), lse unchanged. k and v have q's heads."""
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device)
    if keep is not None:
        allowed = allowed & keep
    if causal:
        allowed = allowed.tril()  # top-left aligned: query i may attend key j iff j <= i
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (scale * (q @ k.transpose(-1, -2))).masked_fill(~allowed, -math.inf)
    live = allowed.any(dim=-1, keepdim=True)
    # The softmax of an all -inf row is NaN, and so is its gradient: such a row is set to 0, then weighs nothing.
    p = torch.softmax(s.masked_fill(~live, 0.0), dim=-1) * live
    if z is not None:
        p = p * z.to(p.dtype)
    # lse = -inf there, set after the logsumexp so that no gradient reaches an all -inf row (0 · NaN)
    return p @ v, torch.logsumexp(s.masked_fill(~live, 0.0), dim=-1).masked_fill(~live[..., 0], -math.inf)


def _query_heads(q, k):
    """k with q's heads: grouped-query heads (fewer kv heads, 4-D) repeated, query head h reading kv
    head h // G; inside the graph, so that autograd sums each kv head's gradient over its group."""
    if q.dim() == 4 and q.shape[1] != k.shape[1]:
        return k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return k


def _on(device, a):
    """keep or z (NumPy, a tensor or None) as a tensor on the oracle's device."""
    return None if a is None else torch.as_tensor(a, device=device)


def _in_slices(fn, q, *others, dim=0):
    """fn(q, *others) -> tensors with q's leading dims, run on slices of those dims so that no slice
    holds more than SLICE_SCORES scores, and concatenated: a GPU test at 4,096 tokens and 32 heads
    would otherwise hold 4 GiB a float64 score matrix, several of them in a backward. Each of `others`
    (None, or a tensor broadcast against q's leading dims from the right) is sliced where it has the dim.
    One (batch, head) is never cut: its scores are one slice, however many."""
    lead = q.dim() - 2
    per_index = q.shape[-2] * others[0].shape[-2] * math.prod(q.shape[dim + 1:lead])
    if dim >= lead or q.shape[dim] * per_index <= SLICE_SCORES:
        return fn(q, *others)
    step = max(1, SLICE_SCORES // per_index)

    def take(t, start):
        at = None if t is None else dim - (lead - (t.dim() - 2))  # the same dim, counted in t's leading dims
        if at is None or at < 0 or t.shape[at] == 1:
            return t
        return t.narrow(at, start, min(step, t.shape[at] - start))

    parts = [_in_slices(fn, take(q, i), *(take(t, i) for t in others), dim=dim + 1)
             for i in range(0, q.shape[dim], step)]
    return tuple(torch.cat(column, dim=dim) for column in zip(*parts))


def attention(q, k, v, keep=None, causal=False, scale=None, dtype=torch.float64, z=None):
    """(o, lse) of dense attention in float64, on the inputs' device; in `dtype`, PyTorch's own
    attention in a low precision (the baseline of the precision rule).

    q (..., n_q, D), k and v (..., n_k, D); 4-D inputs (B, H, n, D) may have fewer kv heads than
    query heads (grouped-query attention). `keep`, broadcast to (..., n_q, n_k), is True where a
    query may attend a key; `causal` ANDs in j <= i. scale defaults to 1/sqrt(D) only when None.
    `z`, broadcast likewise, multiplies the weights after the softmax (dropout's mask / (1 − p)).
    """
    q, k, v = (_float64(a).to(dtype) for a in (q, k, v))
    with torch.no_grad():
        return _in_slices(lambda q, k, v, keep, z: _attention(q, k, v, keep, causal, scale, z),
                          q, _query_heads(q, k), _query_heads(q, v), _on(q.device, keep), _on(q.device, z))


@one_thread()
def attention_grads(q, k, v, do, keep=None, causal=False, scale=None, dtype=torch.float64, z=None):
    """o and (dq, dk, dv): the gradients of sum(o ∘ do) by autograd in float64 (or `dtype`);
    arguments as in attention."""
    q, k, v = (_float64(a).to(dtype).requires_grad_() for a in (q, k, v))

    def backward(q, k, v, do, keep, z):
        o, _ = _attention(q, k, v, keep, causal, scale, z)
        # sum(o ∘ do) gives what o.backward(do) gives, which costs ~0.3 s on first use
        (o * do).sum().backward()
        return (o.detach(),)

    do = torch.as_tensor(do, device=q.device).to(dtype)
    o, = _in_slices(backward, q, _query_heads(q, k), _query_heads(q, v), do, _on(q.device, keep),
                    _on(q.device, z))
    return o, (q.grad, k.grad, v.grad)


@one_thread()
def stored_o_grads(q, k, do, o, o_ref, keep=None, causal=False, scale=None):
    """(dq, dk): how far a FlashAttention backward's dQ and dK move because it reads O as its forward
    stored it (rounded to the inputs' dtype), not the exact o_ref. D = rowsum(dO ∘ O) moves by
    δD = rowsum(dO ∘ (o − o_ref)), so dS = P ∘ (dP − D) by −P ∘ δD: the gradient of −Σ δD · lse,
    since ∂lse/∂s = P. With dropout, P is the undropped softmax, as lse is. keep, causal and scale as
    in attention; a row that attends no key has δD = 0 and no gradient."""
    q, k = (_float64(a).requires_grad_() for a in (q, k))
    delta = (_float64(do) * (_float64(o) - _float64(o_ref))).sum(-1).nan_to_num()

    def backward(q, k, delta, keep):
        _, lse = _attention(q, k, torch.zeros_like(k[..., :1]), keep, causal, scale)
        (-(delta[..., 0] * lse.nan_to_num(neginf=0.0))).sum().backward()
        return ()

    _in_slices(backward, q, _query_heads(q, k), delta[..., None], _on(q.device, keep))  # a column, as k
    return q.grad, k.grad


@one_thread()
def softmax_grad(x, dp):
    """ds = the gradient through p = softmax(x) (last axis) for an upstream gradient dp, by autograd.

    A row of x that is all -inf has p = 0 whatever x does, so its ds is 0.
    """
    x = np.asarray(x, np.float64)
    live = ~np.all(np.isneginf(x), axis=-1, keepdims=True)
    x_t = torch.tensor(np.where(live, x, 0.0), requires_grad=True)  # softmax of an all -inf row is NaN
    p = torch.softmax(x_t, dim=-1) * torch.from_numpy(live)
    (p * torch.from_numpy(np.asarray(dp, np.float64))).sum().backward()
    return x_t.grad.numpy()
