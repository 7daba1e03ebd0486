"""Alternative: schedule sorted by key block and grouped with itertools.groupby; exp2; np.einsum.

P = exp2((S - lse) · log2 e); a fully masked row's lse is taken as +inf rather than shifted by 0;
D and every product are written with np.einsum.
"""
import itertools
import math
import numpy as np


LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e), the form a GPU's exp2 unit wants


def softmax_backward(p, dp):
    d = np.einsum("...j,...j->...", p, dp)[..., None]
    return p * dp - p * d


def weights(s, lse):
    """exp(s - lse); lse = -inf becomes +inf, so every entry of a fully masked row is exp2(-inf) = 0."""
    lse = np.where(np.isneginf(lse), np.inf, lse)
    return np.exp2((s - lse[:, None]) * LOG2E)


def attention_backward(q, k, v, o, lse, do, causal=False, mask=None, scale=None):
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    allowed = tile_allowed(slice(0, q.shape[0]), slice(0, k.shape[0]), causal, mask)
    p = weights(np.where(allowed, scale * np.einsum("id,jd->ij", q, k), -np.inf), lse)
    ds = p * (np.einsum("ie,je->ij", do, v) - np.einsum("ie,ie->i", do, o)[:, None])
    return scale * np.einsum("ij,jd->id", ds, k), scale * np.einsum("ij,id->jd", ds, q), np.einsum("ij,ie->je", p, do)


def tiled_attention_backward(q, k, v, o, lse, do, block_q, block_k, causal=False, mask=None, scale=None):
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    d_rows = np.einsum("ie,ie->i", do, o)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    by_key = sorted(tile_schedule(n_q, n_k, block_q, block_k, causal, mask), key=lambda t: (t[1], t[0]))
    for j, tiles in itertools.groupby(by_key, key=lambda t: t[1]):
        cols = block_slice(j, block_k, n_k)
        k_j, v_j = k[cols], v[cols]
        dk_j, dv_j = np.zeros_like(k_j), np.zeros_like(v_j)
        for i, _, needs_mask in tiles:
            rows = block_slice(i, block_q, n_q)
            s = scale * np.einsum("id,jd->ij", q[rows], k_j)
            if needs_mask:
                s = np.where(tile_allowed(rows, cols, causal, mask), s, -np.inf)
            p = weights(s, lse[rows])
            ds = p * (np.einsum("ie,je->ij", do[rows], v_j) - d_rows[rows, None])
            dv_j += np.einsum("ij,ie->je", p, do[rows])
            dq[rows] += scale * np.einsum("ij,jd->id", ds, k_j)
            dk_j += scale * np.einsum("ij,id->jd", ds, q[rows])
        dk[cols], dv[cols] = dk_j, dv_j
    return dq, dk, dv
