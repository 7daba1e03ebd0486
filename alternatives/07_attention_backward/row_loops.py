"""Alternative: Python loops over rows (softmax_backward, dense pass); D per tile as in Algorithm 4.

The tiled pass computes D_i = rowsum(dO_i ∘ O_i) inside its inner loop, once per tile, as
FlashAttention's Algorithm 4 (line 19) does, instead of once for every row up front.
"""
import math
import numpy as np


def softmax_backward(p, dp):
    ds = np.empty_like(p)
    for index in np.ndindex(p.shape[:-1]):
        d = sum(float(a) * float(b) for a, b in zip(p[index], dp[index]))
        ds[index] = p[index] * (dp[index] - d)
    return ds


def attention_backward(q, k, v, o, lse, do, causal=False, mask=None, scale=None):
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for i in range(n_q):
        if np.isneginf(lse[i]):
            continue  # a fully masked row weighs nothing
        allowed = tile_allowed(slice(i, i + 1), slice(0, n_k), causal, mask)[0]
        s = scale * (k @ q[i])
        p = np.zeros(n_k, dtype=q.dtype)
        p[allowed] = np.exp(s[allowed] - lse[i])
        dv += np.outer(p, do[i])
        ds = p * (v @ do[i] - do[i] @ o[i])
        dq[i] = scale * (ds @ k)
        dk += scale * np.outer(ds, q[i])
    return dq, dk, dv


def tiled_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal=False, mask=None, scale=None):
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    schedule = tile_schedule(n_q, n_k, block_q, block_k, causal, mask)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for j in sorted({j for _, j, _ in schedule}):
        cols = block_slice(j, block_k, n_k)
        dk_j, dv_j = np.zeros_like(k[cols]), np.zeros_like(v[cols])
        for i, _, needs_mask in [tile for tile in schedule if tile[1] == j]:
            rows = block_slice(i, block_q, n_q)
            s = scale * (q[rows] @ k[cols].T)
            if needs_mask:
                s = np.where(tile_allowed(rows, cols, causal, mask), s, -np.inf)
            shift = np.where(np.isneginf(lse[rows]), 0, lse[rows])
            p = np.exp(s - shift[:, None])
            d_i = (do[rows] * o[rows]).sum(axis=1)
            ds = p * (do[rows] @ v[cols].T - d_i[:, None])
            dv_j += p.T @ do[rows]
            dq[rows] += scale * (ds @ k[cols])
            dk_j += scale * (ds.T @ q[rows])
        dk[cols], dv[cols] = dk_j, dv_j
    return dq, dk, dv
