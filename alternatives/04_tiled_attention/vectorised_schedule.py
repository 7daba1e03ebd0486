"""Alternative: tile_schedule from each query block's strip of allowed pairs, reshaped to (block_q, T_c, block_k).

Inputs pass through np.ascontiguousarray; the running state is one (n_q, 2 + d_v) array per row.
"""
import math
import numpy as np


def tile_allowed(rows: slice, cols: slice, causal: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
    """Which pairs of one tile may attend: bool (rows, cols), True where query i may attend key j.

    `rows` and `cols` are slices of the query and key indices, already cut to the bounds.
    """
    i, j = np.ogrid[rows, cols]
    allowed = np.full((i.size, j.size), True) if mask is None else np.array(mask[rows, cols], bool)
    if causal:
        allowed &= j <= i  # top-left aligned, whatever n_q and n_k
    return allowed


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, causal: bool = False,
                  mask: np.ndarray | None = None) -> list[tuple[int, int, bool]]:
    """The tiles worth computing, as (i, j, needs_mask): query block i ascending, then key block j.

    A tile is listed iff at least one pair in it may attend; needs_mask is True iff at least one
    pair in it may not. i, j are Python ints and needs_mask a Python bool.
    """
    t_c = num_blocks(n_k, block_k)
    schedule = []
    for i in range(num_blocks(n_q, block_q)):
        allowed = tile_allowed(block_slice(i, block_q, n_q), slice(0, n_k), causal, mask)  # block_q x n_k, not n x n
        pad = ((0, block_q - allowed.shape[0]), (0, t_c * block_k - n_k))
        # Cells past the bounds are in no tile: False for "any pair may attend", True for "all may".
        any_live = np.pad(allowed, pad, constant_values=False).reshape(block_q, t_c, block_k).any(axis=(0, 2))
        all_live = np.pad(allowed, pad, constant_values=True).reshape(block_q, t_c, block_k).all(axis=(0, 2))
        schedule += [(i, int(j), not bool(all_live[j])) for j in np.flatnonzero(any_live)]
    return schedule


def tiled_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_q: int, block_k: int,
                    causal: bool = False, mask: np.ndarray | None = None,
                    scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scale · q kᵀ) v, one scheduled tile at a time.

    q (n_q, d), k (n_k, d), v (n_k, d_v), mask (n_q, n_k) bool or None; scale defaults to 1/sqrt(d).
    Returns o (n_q, d_v) and lse (n_q,), in the dtype of q. Tiles not scheduled are never read.
    """
    q, k, v = np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v)
    n_q, n_k = q.shape[0], k.shape[0]
    scale = 1 / math.sqrt(q.shape[1]) if scale is None else scale
    # Per query row: column 0 the running max m, column 1 the running sum l, the rest acc.
    state = np.zeros((n_q, 2 + v.shape[1]), dtype=q.dtype)
    state[:, 0] = -np.inf
    for i, j, needs_mask in tile_schedule(n_q, n_k, block_q, block_k, causal, mask):
        rows, cols = block_slice(i, block_q, n_q), block_slice(j, block_k, n_k)
        s = scale * q[rows] @ k[cols].T
        if needs_mask:
            s = np.where(tile_allowed(rows, cols, causal, mask), s, -np.inf)
        m_old = state[rows, 0]
        m_new = np.maximum(m_old, s.max(axis=1))
        shift = np.where(np.isneginf(m_new), 0, m_new)  # still all -inf: shift by 0, exp(-inf) = 0
        p = np.exp(s - shift[:, None])
        alpha = np.exp(m_old - shift)[:, None]  # l and acc were summed against the old max
        state[rows, 1:] = alpha * state[rows, 1:] + np.hstack([p.sum(axis=1, keepdims=True), p @ v[cols]])
        state[rows, 0] = m_new
    m, l, acc = state[:, 0], state[:, 1], state[:, 2:]
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(l[:, None] > 0, acc / l[:, None], 0)
        lse = m + np.log(l)
    return o.astype(q.dtype, copy=False), lse
