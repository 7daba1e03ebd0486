"""Alternative: each block's own (m, l) first, merged into the running pair by the paper's two-part rule.

The normalising pass builds the blocks of p and joins them with np.concatenate.
"""
import numpy as np


def _block_stats(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max, sum of exp(block - max)) of each row of one block; a row of -inf gives (-inf, 0)."""
    m = block.max(axis=-1)
    shift = np.where(np.isneginf(m), 0, m)
    return m, np.exp(block - shift[..., None]).sum(axis=-1)


def online_softmax_stats(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row max `m` and row sum `l = sum(exp(x - m))` of `x` (shape (..., n)) in one pass of blocks.

    Work on x directly, block by block: no operation may look at more than block_size columns of
    a row, and no block may be read before the one to its left (no x.max over the whole row first).
    Returns `(m, l)`, each of shape x.shape[:-1] and the dtype of `x`.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
    l = np.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], block_size):
        m_b, l_b = _block_stats(x[..., start:start + block_size])
        # l(x) = exp(m(x1) - m(x)) l(x1) + exp(m(x2) - m(x)) l(x2); a side with max -inf weighs 0.
        m_new = np.maximum(m, m_b)
        shift = np.where(np.isneginf(m_new), 0, m_new)
        l = np.exp(m - shift) * l + np.exp(m_b - shift) * l_b
        m = m_new
    return m, l


def online_softmax(x: np.ndarray, block_size: int) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)): the stats pass, then a normalising pass.

    Returns `p`, same shape and dtype as `x`.
    """
    m, l = online_softmax_stats(x, block_size)
    masked = (l == 0)[..., None]
    shift = np.where(masked, 0, m[..., None])
    l = np.where(masked, 1, l[..., None])
    blocks = [np.exp(x[..., start:start + block_size] - shift) / l
              for start in range(0, x.shape[-1], block_size)]
    return np.concatenate(blocks, axis=-1)
