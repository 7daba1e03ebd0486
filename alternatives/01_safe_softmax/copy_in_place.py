"""Alternative: works on a copy of x, shifted, exponentiated and divided in place."""
import numpy as np


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)); same shape and dtype as `x`."""
    x = x.copy()  # the caller's x is never modified: everything below happens to the copy
    m = x.max(axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0  # a fully masked row: exp(-inf - 0) = 0 instead of exp(NaN)
    x -= m
    np.exp(x, out=x)
    l = x.sum(axis=-1, keepdims=True)
    l[l == 0] = 1  # only a fully masked row sums to 0, and all its terms are 0
    x /= l
    return x


def logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis of `x` (shape (..., n)); shape x.shape[:-1]."""
    x = x.copy()
    m = x.max(axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0
    x -= m
    np.exp(x, out=x)
    with np.errstate(divide="ignore"):  # log(0) = -inf for a fully masked row
        return m[..., 0] + np.log(x.sum(axis=-1))
