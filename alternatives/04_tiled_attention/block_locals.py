"""Alternative: per query block, m, l and acc are local variables over that block's tiles (itertools.groupby).

Inputs pass through np.asanyarray; the causal part of tile_allowed comes from np.tri with an offset.
"""
import itertools
import math
import numpy as np


def tile_allowed(rows: slice, cols: slice, causal: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
    """Which pairs of one tile may attend: bool (rows, cols), True where query i may attend key j.

    `rows` and `cols` are slices of the query and key indices, already cut to the bounds.
    """
    shape = (rows.stop - rows.start, cols.stop - cols.start)
    # Pair (a, b) of the tile is query rows.start + a, key cols.start + b: j <= i iff b <= a + offset.
    causal_part = np.tri(*shape, k=rows.start - cols.start, dtype=bool) if causal else np.ones(shape, bool)
    return causal_part if mask is None else causal_part & mask[rows, cols]


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, causal: bool = False,
                  mask: np.ndarray | None = None) -> list[tuple[int, int, bool]]:
    """The tiles worth computing, as (i, j, needs_mask): query block i ascending, then key block j.

    A tile is listed iff at least one pair in it may attend; needs_mask is True iff at least one
    pair in it may not. i, j are Python ints and needs_mask a Python bool.
    """
    schedule = []
    for i, j in itertools.product(range(num_blocks(n_q, block_q)), range(num_blocks(n_k, block_k))):
        allowed = tile_allowed(block_slice(i, block_q, n_q), block_slice(j, block_k, n_k), causal, mask)
        live = int(allowed.sum())
        if live:
            schedule.append((i, j, live < allowed.size))
    return schedule


def tiled_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_q: int, block_k: int,
                    causal: bool = False, mask: np.ndarray | None = None,
                    scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scale · q kᵀ) v, one scheduled tile at a time.

    q (n_q, d), k (n_k, d), v (n_k, d_v), mask (n_q, n_k) bool or None; scale defaults to 1/sqrt(d).
    Returns o (n_q, d_v) and lse (n_q,), in the dtype of q. Tiles not scheduled are never read.
    """
    q, k, v = np.asanyarray(q), np.asanyarray(k), np.asanyarray(v)
    n_q, n_k = len(q), len(k)
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else scale
    # A query block with no scheduled tile is fully masked: it keeps o = 0 and lse = -inf.
    o = np.zeros((n_q, v.shape[1]), dtype=q.dtype)
    lse = np.full(n_q, -np.inf, dtype=q.dtype)
    schedule = tile_schedule(n_q, n_k, block_q, block_k, causal, mask)
    for i, tiles in itertools.groupby(schedule, key=lambda tile: tile[0]):
        rows = block_slice(i, block_q, n_q)
        q_i = q[rows]
        m = np.full(len(q_i), -np.inf, dtype=q.dtype)
        l = np.zeros(len(q_i), dtype=q.dtype)
        acc = np.zeros((len(q_i), v.shape[1]), dtype=q.dtype)
        for _, j, needs_mask in tiles:
            cols = block_slice(j, block_k, n_k)
            s = scale * (q_i @ k[cols].T)
            if needs_mask:
                s = np.where(tile_allowed(rows, cols, causal, mask), s, -np.inf)
            m_new = np.maximum(m, s.max(axis=1))
            shift = np.where(np.isneginf(m_new), 0, m_new)[:, None]
            p = np.exp(s - shift)
            alpha = np.exp(m[:, None] - shift)  # what l and acc summed was measured against the old max
            l = alpha[:, 0] * l + p.sum(axis=1)
            acc = alpha * acc + p @ v[cols]
            m = m_new
        o[rows] = acc / np.where(l > 0, l, 1)[:, None]
        with np.errstate(divide="ignore"):  # log(0) = -inf: a row of the block that saw no live key
            lse[rows] = m + np.log(l)
    return o, lse
