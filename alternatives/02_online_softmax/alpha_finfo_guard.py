"""Alternative: alpha and the block's terms as named steps; masked rows shift by the dtype's lowest finite value.

The normalising pass multiplies by 1/l, set to 0 on a fully masked row.
"""
import numpy as np


def online_softmax_stats(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row max `m` and row sum `l = sum(exp(x - m))` of `x` (shape (..., n)) in one pass of blocks.

    Work on x directly, block by block: no operation may look at more than block_size columns of
    a row, and no block may be read before the one to its left (no x.max over the whole row first).
    Returns `(m, l)`, each of shape x.shape[:-1] and the dtype of `x`.
    """
    if not block_size >= 1:
        raise ValueError(f"block_size = {block_size}: a block needs at least one column")
    lowest = np.finfo(x.dtype).min
    m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
    l = np.zeros(x.shape[:-1], dtype=x.dtype)
    start = 0
    while start < x.shape[-1]:
        block = x[..., start:start + block_size]
        m_new = np.maximum(m, np.max(block, axis=-1))
        # While m_new is -inf, shift by a finite value: -inf - lowest is -inf, and exp of it is 0.
        shift = np.maximum(m_new, lowest)
        alpha = np.exp(m - shift)
        terms = np.exp(block - shift[..., None])
        l = alpha * l + terms.sum(axis=-1)
        m = m_new
        start += block_size
    return m, l


def online_softmax(x: np.ndarray, block_size: int) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)): the stats pass, then a normalising pass.

    Returns `p`, same shape and dtype as `x`.
    """
    m, l = online_softmax_stats(x, block_size)
    shift = np.maximum(m, np.finfo(x.dtype).min)[..., None]
    inv_l = np.divide(1, l, out=np.zeros_like(l), where=l != 0)[..., None]  # 0 on a fully masked row
    p = np.empty_like(x)
    start = 0
    while start < x.shape[-1]:
        stop = start + block_size
        p[..., start:stop] = np.exp(x[..., start:stop] - shift) * inv_l
        start = stop
    return p
