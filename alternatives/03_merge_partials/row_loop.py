"""Alternative: attention_partial one query row at a time; the merge by explicit weights of each side."""
import numpy as np


def attention_partial(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                      scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`; `mask (n_q, n_k)` bool or None.

    Returns `o (n_q, d_v)`, normalised, and `lse (n_q,)`. With n_k = 0: o = 0, lse = -inf.
    """
    scale = 1 / np.sqrt(q.shape[1]) if scale is None else scale
    o = np.zeros((q.shape[0], v.shape[1]), dtype=q.dtype)
    lse = np.full(q.shape[0], -np.inf, dtype=q.dtype)
    for i in range(q.shape[0]):
        s = scale * (k @ q[i])
        if mask is not None:
            s = np.where(mask[i], s, -np.inf)
        if s.size == 0 or s.max() == -np.inf:
            continue  # no live key: the row keeps o = 0, lse = -inf
        m = s.max()
        f = np.exp(s - m)
        l = f.sum()
        o[i] = (f @ v) / l
        lse[i] = m + np.log(l)
    return o, lse


def merge_partials(o_a: np.ndarray, lse_a: np.ndarray, o_b: np.ndarray,
                   lse_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge attention over two disjoint key sets: `o_a, o_b (n_q, d_v)`, `lse_a, lse_b (n_q,)`.

    Returns `(o, lse)` over the union of the key sets, shapes of `o_a` and `lse_a`.
    """
    lse = np.logaddexp(lse_a, lse_b)
    o = np.zeros_like(o_a)
    for side_o, side_lse in ((o_a, lse_a), (o_b, lse_b)):
        live = ~np.isneginf(side_lse)  # an empty side is skipped: its o may be anything, NaN too
        o[live] += np.exp(side_lse[live] - lse[live])[:, None] * side_o[live]
    return o, lse


def split_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, num_splits: int,
                       mask: np.ndarray | None = None,
                       scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`, the keys cut in `num_splits` chunks.

    The chunks are contiguous, in the sizes np.array_split gives (empty ones when num_splits > n_k);
    each is attended with attention_partial and merged with merge_partials.
    Returns `o (n_q, d_v)` and `lse (n_q,)`, equal to attention over all keys at once.
    """
    result = None
    for keys in np.array_split(np.arange(k.shape[0]), num_splits):
        if keys.size == 0:
            continue  # an empty chunk is the merge's identity
        part = attention_partial(q, k[keys], v[keys], None if mask is None else mask[:, keys], scale)
        result = part if result is None else merge_partials(*result, *part)
    if result is None:  # no keys at all: the merge's identity, (0, -inf)
        return np.zeros((q.shape[0], v.shape[1]), dtype=q.dtype), np.full(q.shape[0], -np.inf, dtype=q.dtype)
    return result
