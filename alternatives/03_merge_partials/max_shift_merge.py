"""Alternative: the merge by a max shift (m = max(lse_a, lse_b)) instead of logaddexp; o divided once.

attention_partial takes the lse first and weights by exp(s - lse); split_kv_attention slices k and v.
"""
import numpy as np


def attention_partial(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                      scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`; `mask (n_q, n_k)` bool or None.

    Returns `o (n_q, d_v)`, normalised, and `lse (n_q,)`. With n_k = 0: o = 0, lse = -inf.
    """
    if scale is None:
        scale = 1 / np.sqrt(q.shape[1])
    s = (q @ k.T) * q.dtype.type(scale)
    if mask is not None:
        s[~mask] = -np.inf
    m = np.max(s, axis=1, initial=-np.inf)
    live = ~np.isneginf(m)
    shift = np.where(live, m, 0)
    with np.errstate(divide="ignore"):  # log(0) = -inf: a row with no live key
        lse = shift + np.log(np.exp(s - shift[:, None]).sum(axis=1))
    # exp(s - lse) is each weight, already normalised; a row with no key shifts by 0 and weighs 0.
    p = np.exp(s - np.where(live, lse, 0)[:, None])
    return p @ v, lse


def merge_partials(o_a: np.ndarray, lse_a: np.ndarray, o_b: np.ndarray,
                   lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge attention over two disjoint key sets: `o_a, o_b (n_q, d_v)`, `lse_a, lse_b (n_q,)`.

    Returns `(o, lse)` over the union of the key sets, shapes of `o_a` and `lse_a`.
    """
    m = np.maximum(lse_a, lse_b)
    m = np.where(np.isneginf(m), 0, m)  # both sides empty: shift by 0, not by -inf
    w_a, w_b = np.exp(lse_a - m), np.exp(lse_b - m)  # each at most 1: no overflow
    total = w_a + w_b
    with np.errstate(divide="ignore"):
        lse = m + np.log(total)
    # A side of weight 0 adds nothing, even if its o is NaN.
    o = np.where(w_a[:, None] > 0, w_a[:, None] * o_a, 0) + np.where(w_b[:, None] > 0, w_b[:, None] * o_b, 0)
    return o / np.where(total == 0, 1, total)[:, None], lse


def split_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, num_splits: int,
                       mask: np.ndarray | None = None,
                       scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`, the keys cut in `num_splits` chunks.

    The chunks are contiguous, in the sizes np.array_split gives (empty ones when num_splits > n_k);
    each is attended with attention_partial and merged with merge_partials.
    Returns `o (n_q, d_v)` and `lse (n_q,)`, equal to attention over all keys at once.
    """
    n_k = k.shape[0]
    base, extra = divmod(n_k, num_splits)  # np.array_split: the first `extra` chunks hold one key more
    o = np.zeros((q.shape[0], v.shape[1]), dtype=q.dtype)
    lse = np.full(q.shape[0], -np.inf, dtype=q.dtype)
    start = 0
    for split in range(num_splits):
        stop = start + base + (split < extra)
        part = attention_partial(q, k[start:stop], v[start:stop],
                                 None if mask is None else mask[:, start:stop], scale)
        o, lse = merge_partials(o, lse, *part)
        start = stop
    return o, lse
