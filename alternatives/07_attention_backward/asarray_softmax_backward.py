"""Alternative: np.asarray first; the dense pass takes D from softmax_backward (rowsum(P ∘ dP)).

The tiled pass adds each tile's share straight into the slices of dk and dv, cuts its blocks by
hand and builds its masks from index comparisons instead of calling block_slice and tile_allowed.
"""
import math
import numpy as np


def softmax_backward(p, dp):
    p, dp = np.asarray(p), np.asarray(dp)
    return p * (dp - np.sum(p * dp, axis=-1)[..., None])


def attention_backward(q, k, v, o, lse, do, causal=False, mask=None, scale=None):
    q, k, v, o, lse, do = (np.asarray(a) for a in (q, k, v, o, lse, do))
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    s = scale * (q @ k.T)
    allowed = np.ones(s.shape, bool) if mask is None else np.asarray(mask, bool)
    if causal:
        allowed = allowed & (np.arange(k.shape[0])[None, :] <= np.arange(q.shape[0])[:, None])
    s[~allowed] = -np.inf
    live = ~np.isneginf(lse)
    p = np.zeros_like(s)
    p[live] = np.exp(s[live] - lse[live, None])
    ds = softmax_backward(p, do @ v.T)
    return scale * (ds @ k), scale * (ds.T @ q), p.T @ do


def tiled_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal=False, mask=None, scale=None):
    q, k, v, o, lse, do = (np.asarray(a) for a in (q, k, v, o, lse, do))
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    d_rows = np.sum(do * o, axis=-1)
    schedule = tile_schedule(n_q, n_k, block_q, block_k, causal, mask)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for j in range(math.ceil(n_k / block_k)):
        c0, c1 = j * block_k, min((j + 1) * block_k, n_k)
        for i, needs_mask in [(i, m) for i, jj, m in schedule if jj == j]:
            r0, r1 = i * block_q, min((i + 1) * block_q, n_q)
            s = scale * (q[r0:r1] @ k[c0:c1].T)
            if needs_mask:
                allowed = np.ones(s.shape, bool) if mask is None else mask[r0:r1, c0:c1]
                if causal:
                    allowed = allowed & (np.arange(c0, c1)[None, :] <= np.arange(r0, r1)[:, None])
                s = np.where(allowed, s, -np.inf)
            row_lse = lse[r0:r1]
            p = np.exp(s - np.where(np.isneginf(row_lse), 0, row_lse)[:, None])
            ds = p * (do[r0:r1] @ v[c0:c1].T - d_rows[r0:r1, None])
            dv[c0:c1] += p.T @ do[r0:r1]
            dq[r0:r1] += scale * (ds @ k[c0:c1])
            dk[c0:c1] += scale * (ds.T @ q[r0:r1])
    return dq, dk, dv
