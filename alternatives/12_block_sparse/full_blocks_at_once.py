"""Alternative: a query block attends all its full blocks in one unmasked call, then each partial tile.

The mask mods are written with np.equal and a two-sided comparison of the distance back.
"""
import numpy as np


def sliding_window(window: int):
    """Query i sees the `window` most recent keys: i - window < j <= i."""
    def mod(q_idx, kv_idx):
        back = q_idx - kv_idx
        return (0 <= back) & (back < window)
    return mod


def document_mask(doc_ids: np.ndarray):
    """Packed sequences: `doc_ids (n,)` names each position's document; a query sees the keys of
    its own document, causally."""
    ids = np.array(doc_ids)
    return lambda q_idx, kv_idx: np.equal(ids[q_idx], ids[kv_idx]) & np.greater_equal(q_idx, kv_idx)


def block_sparse_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_mask,
                           mask_mod, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of q (n_q, d) over k (n_k, d), v (n_k, d_v) under mask_mod, computing only the
    tiles block_mask lists. Returns o (n_q, d_v) and lse (n_q,), in the dtype of q."""
    o = np.zeros((q.shape[0], v.shape[1]), q.dtype)
    lse = np.full(q.shape[0], -np.inf, q.dtype)
    for i in range(len(block_mask.kv_num_blocks)):
        rows = block_slice(i, block_mask.block_q, block_mask.n_q)
        tiles = kv_blocks(block_mask, i)
        # Every pair of a full block may attend: their keys together are one unmasked attention.
        keys = [np.arange(block_mask.n_k)[block_slice(j, block_mask.block_k, block_mask.n_k)]
                for j, masked in tiles if not masked]
        keys = np.concatenate(keys) if keys else np.zeros(0, int)
        o[rows], lse[rows] = attention_partial(q[rows], k[keys], v[keys], None, scale)
        for j, masked in tiles:
            if masked:
                cols = block_slice(j, block_mask.block_k, block_mask.n_k)
                tile = attention_partial(q[rows], k[cols], v[cols], tile_mask(mask_mod, rows, cols), scale)
                o[rows], lse[rows] = merge_partials(o[rows], lse[rows], *tile)
    return o, lse
