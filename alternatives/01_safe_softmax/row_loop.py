"""Alternative: one row at a time, a Python loop over the leading axes (np.ndindex)."""
import numpy as np


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)); same shape and dtype as `x`."""
    p = np.zeros_like(x)
    for row in np.ndindex(x.shape[:-1]):
        m = x[row].max()
        if m == -np.inf:
            continue  # a fully masked row keeps its weights of 0
        f = np.exp(x[row] - m)
        p[row] = f / f.sum()
    return p


def logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis of `x` (shape (..., n)); shape x.shape[:-1]."""
    lse = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
    for row in np.ndindex(x.shape[:-1]):
        m = x[row].max()
        if m != -np.inf:  # a fully masked row keeps lse = -inf
            lse[row] = m + np.log(np.exp(x[row] - m).sum())
    return lse
