"""Alternative: inputs converted with np.asarray first; m, l, acc as full-length arrays updated in place."""
import numpy as np


def tile_allowed(rows: slice, cols: slice, causal: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
    """Which pairs of one tile may attend: bool (rows, cols), True where query i may attend key j.

    `rows` and `cols` are slices of the query and key indices, already cut to the bounds.
    """
    i = np.arange(rows.start, rows.stop)[:, None]
    j = np.arange(cols.start, cols.stop)[None, :]
    allowed = np.broadcast_to(True, (i.size, j.size)) if mask is None else np.asarray(mask)[rows, cols]
    return allowed & (j <= i) if causal else allowed.copy()


def tile_schedule(n_q: int, n_k: int, block_q: int, block_k: int, causal: bool = False,
                  mask: np.ndarray | None = None) -> list[tuple[int, int, bool]]:
    """The tiles worth computing, as (i, j, needs_mask): query block i ascending, then key block j.

    A tile is listed iff at least one pair in it may attend; needs_mask is True iff at least one
    pair in it may not. i, j are Python ints and needs_mask a Python bool.
    """
    tiles = ((i, j, tile_allowed(block_slice(i, block_q, n_q), block_slice(j, block_k, n_k), causal, mask))
             for i in range(num_blocks(n_q, block_q)) for j in range(num_blocks(n_k, block_k)))
    return [(i, j, bool(not allowed.all())) for i, j, allowed in tiles if allowed.any()]


def tiled_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_q: int, block_k: int,
                    causal: bool = False, mask: np.ndarray | None = None,
                    scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scale · q kᵀ) v, one scheduled tile at a time.

    q (n_q, d), k (n_k, d), v (n_k, d_v), mask (n_q, n_k) bool or None; scale defaults to 1/sqrt(d).
    Returns o (n_q, d_v) and lse (n_q,), in the dtype of q. Tiles not scheduled are never read.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    (n_q, d), n_k = q.shape, k.shape[0]
    if scale is None:
        scale = d ** -0.5
    m = np.full(n_q, -np.inf, dtype=q.dtype)
    l = np.zeros(n_q, dtype=q.dtype)
    acc = np.zeros((n_q, v.shape[1]), dtype=q.dtype)
    for i, j, needs_mask in tile_schedule(n_q, n_k, block_q, block_k, causal, mask):
        rows, cols = block_slice(i, block_q, n_q), block_slice(j, block_k, n_k)
        k_j, v_j = k[cols], v[cols]
        s = (q[rows] @ k_j.T) * scale
        if needs_mask:
            s[~tile_allowed(rows, cols, causal, mask)] = -np.inf
        m_old = m[rows]
        m_new = np.fmax(m_old, s.max(axis=1))
        safe = np.where(m_new == -np.inf, 0, m_new)  # only -inf seen so far: exp(-inf - 0) = 0
        p = np.exp(s - safe[:, None])
        alpha = np.exp(m_old - safe)
        l[rows] *= alpha
        l[rows] += p.sum(axis=1)
        acc[rows] *= alpha[:, None]
        acc[rows] += p @ v_j
        m[rows] = m_new
    live = l > 0
    o = np.zeros_like(acc)
    o[live] = acc[live] / l[live, None]
    lse = np.full_like(m, -np.inf)
    lse[live] = m[live] + np.log(l[live])
    return o, lse
