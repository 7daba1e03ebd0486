"""Exercise 02 — one pass: running max and running sum.

The idea
    Safe softmax (exercise 01) reads each row twice before it can normalise: once for the max m,
    once for the sum l. FlashAttention cannot afford that: a row of scores never exists whole, it
    arrives one block of keys at a time. So keep a running max m and a running sum l, and fold in
    one block at a time. When a block raises the max from m to m_new, every term already in l was
    computed against the old max and is too large by exp(m_new - m): multiply l by exp(m - m_new).

The update (one row, one block b of columns)
    m_new = max(m, max_j b_j)
    l     = l * exp(m - m_new) + sum_j exp(b_j - m_new)
    m     = m_new
    start from m = -inf, l = 0; at the end l = sum_j exp(x_j - m) over the whole row.
    Then p_j = exp(x_j - m) / l, one more pass over the blocks with the final m and l.

In the paper
    FlashAttention (Dao et al., 2022), section 3.1, for x = [x1 x2]:
    m(x) = max(m(x1), m(x2)),  l(x) = exp(m(x1) - m(x)) l(x1) + exp(m(x2) - m(x)) l(x2).
    Algorithm 1, lines 10-11, apply exactly this to each block of keys. The one-pass softmax
    itself is older: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018,
    arXiv 1805.02867). Reading FlashAttention-2 (arXiv 2307.08691) alongside: its l update
    (Algorithm 1, line 9) is this one, but line 10 and its online-softmax derivation print the
    output's factor as diag(e^(m_old - m_new))^-1, an inverse too many (a typo, also in
    FlashAttention-3's Algorithm 1): the factor multiplies, as it does l here.

Conventions
    - The pass runs over the last axis in chunks of block_size columns; the last chunk may be
      shorter. The normalising pass too fills p block by block: no operation looks at more than
      block_size columns of a row, since in FlashAttention a whole row never exists at once.
      Leading axes are independent rows. block_size < 1 is a ValueError whose message names
      block_size.
    - A fully masked row (all -inf) has m = -inf, l = 0 and weights of all 0. Never NaN.
      A row whose first blocks are all -inf must still come out exact: while m is -inf there is
      no max to shift by yet, and -inf - (-inf) is NaN.
    - float32 in gives float32 out, float64 in gives float64 out; the input is never modified.

Worked example (block_size = 2)
    x = [1, 3, 5]
    block [1, 3]: m = 3, l = exp(-2) + exp(0)              = 1.1353
    block [5]:    m = 5, l = 1.1353 * exp(3 - 5) + exp(0)  = 1.1537
    p = exp(x - 5) / 1.1537 = [0.0159, 0.1173, 0.8668]
"""
import numpy as np


def online_softmax_stats(x: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row max `m` and row sum `l = sum(exp(x - m))` of `x` (shape (..., n)) in one pass of blocks.

    Work on x directly, block by block: no operation may look at more than block_size columns of
    a row, and no block may be read before the one to its left (no x.max over the whole row first).
    Returns `(m, l)`, each of shape x.shape[:-1] and the dtype of `x`.
    """
    # TODO: check block_size, then walk the columns block by block, keeping m and l up to date.
    #       Rescale l whenever m grows; a fully masked row ends with m = -inf, l = 0.
    raise NotImplementedError("online_softmax_stats: replace this line with your code")


def online_softmax(x: np.ndarray, block_size: int) -> np.ndarray:
    """Softmax over the last axis of `x` (shape (..., n)): the stats pass, then a normalising pass.

    Returns `p`, same shape and dtype as `x`.
    """
    # TODO: get (m, l) from online_softmax_stats, then fill p block by block with exp(x - m) / l.
    raise NotImplementedError("online_softmax: replace this line with your code")
