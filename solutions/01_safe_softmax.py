"""Exercise 01 — softmax without overflow.

The idea
    softmax(x)_j = exp(x_j) / sum_k exp(x_k). In floating point exp(1000) is inf and
    inf / inf is NaN, although the true answer is a perfectly ordinary number. Softmax does not
    change when the same constant is subtracted from every score of a row, so subtract the row's
    max m first: every exponent is then <= 0, every exp is in (0, 1], and the largest is exactly 1.

The formula (one row x of length n)
    m   = max_j x_j
    l   = sum_j exp(x_j - m)            (l >= 1 whenever the row has a finite value)
    p_j = exp(x_j - m) / l
    lse = log sum_j exp(x_j) = m + log(l)

In the paper
    FlashAttention (Dao et al., 2022), section 3.1, "Tiling": m(x), f(x) = exp(x - m(x)),
    l(x) = sum f(x), softmax(x) = f(x) / l(x). Every later exercise keeps these same m and l.

Conventions
    - Softmax runs over the last axis; any leading axes are independent rows.
    - A score of -inf is a key that may not be attended: its weight is exactly 0.
    - A fully masked row (all -inf) has m = -inf, and x - m would be -inf - (-inf) = NaN.
      Its weights are all 0 and its lse is -inf. Never NaN.
    - float32 in gives float32 out, float64 in gives float64 out; the input is never modified.

Worked example
    x = [1000, 1001]  ->  m = 1001, exp(x - m) = [e^-1, 1], l = 1.3679
    p = [0.2689, 0.7311], lse = 1001 + log(1.3679) = 1001.3133
"""
import numpy as np


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)); same shape and dtype as `x`."""
    # TODO: subtract each row's max before exp, then divide by the row's sum.
    #       A fully masked row must give zeros, not NaN.
    # BEGIN SOLUTION
    m = x.max(axis=-1, keepdims=True)
    # A fully masked row has m = -inf; shifting by 0 instead keeps exp(-inf) = 0 and avoids NaN.
    m = np.where(np.isneginf(m), 0, m)
    f = np.exp(x - m)
    l = f.sum(axis=-1, keepdims=True)
    # l is 0 only for a fully masked row, where every f is 0 too: 0 / 1 = 0.
    return f / np.where(l == 0, 1, l)
    # END SOLUTION


def logsumexp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) over the last axis of `x` (shape (..., n)); shape x.shape[:-1]."""
    # TODO: lse = m + log(l), with the same max trick. A fully masked row gives -inf.
    # BEGIN SOLUTION
    m = x.max(axis=-1)
    m_safe = np.where(np.isneginf(m), 0, m)
    l = np.exp(x - m_safe[..., None]).sum(axis=-1)
    with np.errstate(divide="ignore"):  # log(0) = -inf is the right answer for a masked row
        return m_safe + np.log(l)
    # END SOLUTION
