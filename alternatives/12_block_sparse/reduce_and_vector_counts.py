"""Alternative: and_masks and or_masks fold with functools.reduce; block_mask walks itertools.product
and names each tile by how many of its pairs may attend; block_sparse_io sums block lengths as arrays.
"""
import functools
import itertools

import numpy as np


def and_masks(*mods):
    """A pair may attend iff every mod allows it (no mods: every pair may)."""
    def mod(q_idx, kv_idx):
        start = np.ones(np.broadcast(q_idx, kv_idx).shape, bool)
        return functools.reduce(lambda a, m: np.logical_and(a, m(q_idx, kv_idx)), mods, start)
    return mod


def or_masks(*mods):
    """A pair may attend iff some mod allows it (no mods: no pair may)."""
    def mod(q_idx, kv_idx):
        start = np.zeros(np.broadcast(q_idx, kv_idx).shape, bool)
        return functools.reduce(lambda a, m: np.logical_or(a, m(q_idx, kv_idx)), mods, start)
    return mod


def block_mask(mask_mod, n_q: int, n_k: int, block_q: int, block_k: int):
    """Classify every tile as empty, partial or full, asking mask_mod about one tile at a time;
    return the lists in FlexAttention's layout, forward and transposed."""
    t_r, t_c = num_blocks(n_q, block_q), num_blocks(n_k, block_k)
    allowed_pairs = np.zeros((t_r, t_c), int)
    pairs = np.zeros((t_r, t_c), int)
    for i, j in itertools.product(range(t_r), range(t_c)):
        tile = tile_mask(mask_mod, block_slice(i, block_q, n_q), block_slice(j, block_k, n_k))
        allowed_pairs[i, j], pairs[i, j] = np.count_nonzero(tile), tile.size
    full = allowed_pairs == pairs
    partial = (allowed_pairs > 0) & ~full
    return BlockMask(n_q, n_k, block_q, block_k, *block_lists(partial), *block_lists(full),
                     *block_lists(partial.T), *block_lists(full.T))


def block_sparse_io(n: int, d: int, block_q: int, block_k: int, block_mask) -> tuple[int, int]:
    """(reads, writes) in elements of block_sparse_flash on Q, K, V (n, d): Python ints."""
    keys = 0
    for i in range(num_blocks(n, block_q)):
        listed = np.array([j for j, _ in kv_blocks(block_mask, i)], np.int64)
        keys += int(np.minimum(block_k, n - listed * block_k).sum())
    return n * d + 2 * d * keys, n * d + n
