"""Alternative: the log-sum-exp first; softmax is then exp(x - lse), with no division."""
import numpy as np


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)); same shape and dtype as `x`."""
    lse = np.expand_dims(logsumexp(x), -1)
    # A fully masked row has lse = -inf: shifting by 0 keeps exp(-inf) = 0 instead of NaN.
    return np.exp(x - np.where(np.isneginf(lse), 0, lse))


def logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis of `x` (shape (..., n)); shape x.shape[:-1]."""
    m = np.max(x, axis=-1)
    finite = ~np.isneginf(m)
    shift = np.where(finite, m, 0)
    l = np.sum(np.exp(x - np.expand_dims(shift, -1)), axis=-1)
    with np.errstate(divide="ignore"):
        return np.where(finite, shift + np.log(l), -np.inf).astype(x.dtype)
