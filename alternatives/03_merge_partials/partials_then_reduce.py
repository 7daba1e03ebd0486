"""Alternative: split_kv_attention attends every chunk first, then reduces the list with functools.reduce.

The merge weights come from exp2 of log2-scaled differences; attention_partial masks with np.putmask.
"""
from functools import reduce
import numpy as np


LOG2_E = 1.4426950408889634


def attention_partial(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                      scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`; `mask (n_q, n_k)` bool or None.

    Returns `o (n_q, d_v)`, normalised, and `lse (n_q,)`. With n_k = 0: o = 0, lse = -inf.
    """
    d = q.shape[-1]
    s = np.matmul(q, k.T) * (d ** -0.5 if scale is None else scale)
    if mask is not None:
        np.putmask(s, ~np.asarray(mask, bool), -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    np.putmask(m, np.isneginf(m), 0)  # a row with no live key: exp(-inf - 0) = 0, not NaN
    f = np.exp(s - m)
    l = f.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(l))[:, 0]
    return f @ v / np.maximum(l, np.finfo(l.dtype).tiny), lse


def merge_partials(o_a: np.ndarray, lse_a: np.ndarray, o_b: np.ndarray,
                   lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge attention over two disjoint key sets: `o_a, o_b (n_q, d_v)`, `lse_a, lse_b (n_q,)`.

    Returns `(o, lse)` over the union of the key sets, shapes of `o_a` and `lse_a`.
    """
    lse = np.logaddexp(lse_a, lse_b)
    empty = np.isneginf(lse)
    ref = np.where(empty, 0, lse)
    o = np.zeros_like(o_a)
    for side_o, side_lse in ((o_a, lse_a), (o_b, lse_b)):
        w = np.exp2((side_lse - ref) * LOG2_E)[:, None]
        o += np.where(w > 0, w * side_o, 0)  # weight 0 times a NaN o must add nothing
    return o, lse


def split_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, num_splits: int,
                       mask: np.ndarray | None = None,
                       scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`, the keys cut in `num_splits` chunks.

    The chunks are contiguous, in the sizes np.array_split gives (empty ones when num_splits > n_k);
    each is attended with attention_partial and merged with merge_partials.
    Returns `o (n_q, d_v)` and `lse (n_q,)`, equal to attention over all keys at once.
    """
    chunks = np.array_split(np.arange(k.shape[0]), num_splits)
    partials = [attention_partial(q, k[c], v[c], None if mask is None else mask[:, c], scale) for c in chunks]
    identity = (np.zeros((q.shape[0], v.shape[1]), q.dtype), np.full(q.shape[0], -np.inf, q.dtype))
    return reduce(lambda acc, part: merge_partials(*acc, *part), partials, identity)
