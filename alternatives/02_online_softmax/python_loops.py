"""Alternative: one row at a time in plain Python floats (math.exp), each block read with tolist()."""
import math
import numpy as np


def online_softmax_stats(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row max `m` and row sum `l = sum(exp(x - m))` of `x` (shape (..., n)) in one pass of blocks.

    Work on x directly, block by block: no operation may look at more than block_size columns of
    a row, and no block may be read before the one to its left (no x.max over the whole row first).
    Returns `(m, l)`, each of shape x.shape[:-1] and the dtype of `x`.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be a positive number of columns, got block_size={block_size}")
    m_out = np.empty(x.shape[:-1], dtype=x.dtype)
    l_out = np.empty(x.shape[:-1], dtype=x.dtype)
    for row in np.ndindex(x.shape[:-1]):
        m, l = -math.inf, 0.0
        for start in range(0, x.shape[-1], block_size):
            block = x[row][start:start + block_size].tolist()
            m_new = max([m, *block])
            if m_new == -math.inf:
                continue  # nothing live yet: l stays 0 and m stays -inf
            # The terms already in l were taken against m; exp(m - m_new) moves them to m_new.
            l = l * math.exp(m - m_new) + sum(math.exp(s - m_new) for s in block)
            m = m_new
        m_out[row], l_out[row] = m, l
    return m_out, l_out


def online_softmax(x: np.ndarray, block_size: int) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)): the stats pass, then a normalising pass.

    Returns `p`, same shape and dtype as `x`.
    """
    m, l = online_softmax_stats(x, block_size)
    p = np.zeros_like(x)
    for row in np.ndindex(x.shape[:-1]):
        if l[row] == 0:
            continue  # a fully masked row keeps its weights of 0
        m_row, l_row = float(m[row]), float(l[row])
        for start in range(0, x.shape[-1], block_size):
            block = x[row][start:start + block_size].tolist()
            p[row][start:start + block_size] = [math.exp(s - m_row) / l_row for s in block]
    return p
