"""Alternative: split_kv_attention attends each chunk in its own lines (scores, shifted exp, the
chunk's o and lse) instead of calling attention_partial, and merges with merge_partials.

The tests see the chunks through attention_partial: here they report that rule not checked.
"""
import numpy as np


def split_kv_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, num_splits: int,
                       mask: np.ndarray | None = None,
                       scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of `q (n_q, d)` over `k (n_k, d)`, `v (n_k, d_v)`, the keys cut in `num_splits` chunks."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o = np.zeros((q.shape[0], v.shape[-1]), dtype=q.dtype)
    lse = np.full(q.shape[0], -np.inf, dtype=q.dtype)
    for keys in np.array_split(np.arange(k.shape[0]), num_splits):
        s = scale * (q @ k[keys].T)
        if mask is not None:
            s = np.where(mask[:, keys], s, -np.inf)
        m = s.max(axis=-1, initial=-np.inf)
        shift = np.where(np.isneginf(m), 0, m)
        f = np.exp(s - shift[:, None])
        l = f.sum(axis=-1)
        with np.errstate(divide="ignore"):
            lse_chunk = shift + np.log(l)
        o, lse = merge_partials(o, lse, (f @ v[keys]) / np.where(l == 0, 1, l)[:, None], lse_chunk)
    return o, lse
