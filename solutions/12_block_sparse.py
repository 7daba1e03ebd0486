"""Exercise 12 — skip the tiles a mask empties.

The idea
    Exercise 04 skipped the tiles above the causal diagonal. Any mask can be cut the same way.
    Write it as a mask_mod(q_idx, kv_idx) -> bool, called on broadcast NumPy index arrays, True
    where the query may attend the key. That is FlexAttention's idea (Dong et al., 2024, arXiv
    2412.05496) simplified: its mask_mod(b, h, q_idx, kv_idx) takes the batch and head too, and is
    written for scalar index tensors, which create_block_mask vmaps over every (b, h, q, kv).
    Ask it about one tile at a time and each tile is one of three kinds: empty (no pair may
    attend: skip it, never read its K and V), full (every pair may: compute it with no mask) or
    partial (some pairs masked: the only tiles that pay for the mask). Causal, sliding-window and
    document masks (packed sequences, causal within each document) leave most tiles empty or full.

In the paper
    FlashAttention (Dao et al., 2022), section 3.3: given a block mask, compute only its nonzero
    blocks. Proposition 4: the HBM accesses fall to Θ(Nd + N²d²M⁻¹s), s the fraction of nonzero
    blocks. Here: Q is read once and O, L written once (the Nd), and each listed tile costs its K
    and V rows; with blocks of Θ(M/d) rows that is s·T_r·2Nd = Θ(s·N²d²/M). As an approximation
    of dense attention, section 3.3 takes s = N^(-1/2) or N^(-1)·log N, and the IO becomes Θ(N√N)
    or Θ(N log N). In the table printed once 12 passes (N = 64k, where N^(-1/2) = 0.004), a
    sliding window of w = 1k keys has s = 0.017, about w/N: at a fixed w, s falls as 1/N and the
    traffic grows only linearly in N.

The layout (FlexAttention's BlockMask, kata/given/block_mask.py)
    For query block i: kv_num_blocks[i] partial key blocks in kv_indices[i, :kv_num_blocks[i]],
    full_kv_num_blocks[i] full ones in full_kv_indices[i, :...], both ascending; entries past a
    count are leftovers, never read. The backward walks the same grid by key block, so the mask
    also keeps it transposed: q_num_blocks, q_indices, full_q_num_blocks, full_q_indices.
    density s = (partial + full tiles) / (T_r·T_c).

Conventions
    As in 03 and 04: scale defaults to 1/sqrt(d); a fully masked row gives o = 0, lse = -inf,
    never NaN; float32 in gives float32 out. Blocks are cut at the array's end.

Worked example
    causal, n_q = n_k = 4, block_q = block_k = 2: tile (0, 0) partial, (0, 1) empty, (1, 0)
    full, (1, 1) partial. kv_num_blocks = [1, 1], kv_indices[:, 0] = [0, 1]; full_kv_num_blocks
    = [0, 1], full_kv_indices[1, 0] = 0. Transposed: q_num_blocks = [1, 1], q_indices[:, 0] =
    [0, 1], full_q_num_blocks = [1, 0], full_q_indices[0, 0] = 1. density = 3/4. Its IO at d = 2:
    query block 0 lists 2 key rows, block 1 lists 4, so reads = Q's 8 + K and V's 2·2·(2 + 4) =
    8 + 24 = 32 and writes = O's 8 + L's 4 = 12 (dense would read 8 + 2·2·(4 + 4) = 40).
"""
from typing import Callable

import numpy as np

from kata.given.block_mask import BlockMask
from kata.given.hbm import HBM
from kata.given.solved import solved

MaskMod = Callable[[np.ndarray, np.ndarray], np.ndarray]

# Exercise 03's, solved: attention over one set of keys as (o, lse), and the exact merge of two.
attention_partial, merge_partials = solved("03").attention_partial, solved("03").merge_partials
# Exercise 04's, solved: how many blocks cover n rows, and the rows of one (the last one cut at n).
num_blocks, block_slice = solved("04").num_blocks, solved("04").block_slice


def causal(q_idx: np.ndarray, kv_idx: np.ndarray) -> np.ndarray:
    """Query i may attend key j iff j <= i (top-left aligned)."""
    return kv_idx <= q_idx


def tile_mask(mask_mod: MaskMod, rows: slice, cols: slice) -> np.ndarray:
    """mask_mod asked about one tile: bool (len(rows), len(cols)), from a column and a row of indices."""
    q_idx, kv_idx = np.arange(rows.start, rows.stop)[:, None], np.arange(cols.start, cols.stop)[None, :]
    return np.broadcast_to(mask_mod(q_idx, kv_idx), (q_idx.size, kv_idx.size))


def sliding_window(window: int) -> MaskMod:
    """Query i sees the `window` most recent keys: i - window < j <= i."""
    # TODO: return a mask_mod (a function of q_idx, kv_idx) that is causal and at most window - 1 back.
    # BEGIN SOLUTION
    def mod(q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)
    return mod
    # END SOLUTION


def document_mask(doc_ids: np.ndarray) -> MaskMod:
    """Packed sequences: `doc_ids (n,)` names each position's document; a query sees the keys of
    its own document, causally."""
    # TODO: look both indices up in doc_ids; same document AND causal.
    # BEGIN SOLUTION
    doc_ids = np.asarray(doc_ids)

    def mod(q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (kv_idx <= q_idx)
    return mod
    # END SOLUTION


def and_masks(*mods: MaskMod) -> MaskMod:
    """A pair may attend iff every mod allows it (no mods: every pair may)."""
    # TODO: start from all True at the broadcast shape of the indices, AND in each mod.
    # BEGIN SOLUTION
    def mod(q_idx, kv_idx):
        allowed = np.ones(np.broadcast_shapes(np.shape(q_idx), np.shape(kv_idx)), bool)
        for m in mods:
            allowed = allowed & m(q_idx, kv_idx)
        return allowed
    return mod
    # END SOLUTION


def or_masks(*mods: MaskMod) -> MaskMod:
    """A pair may attend iff some mod allows it (no mods: no pair may)."""
    # TODO: start from all False at the broadcast shape of the indices, OR in each mod.
    # BEGIN SOLUTION
    def mod(q_idx, kv_idx):
        allowed = np.zeros(np.broadcast_shapes(np.shape(q_idx), np.shape(kv_idx)), bool)
        for m in mods:
            allowed = allowed | m(q_idx, kv_idx)
        return allowed
    return mod
    # END SOLUTION


def block_lists(listed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`listed (rows, cols)` bool -> (counts (rows,), indices (rows, cols)), both int arrays: per
    row, how many columns are listed, and which, ascending, at the start of its row of indices. The
    grader's 64k table calls it too."""
    # TODO: count each row; write its listed columns, in order, at the start of its row.
    # BEGIN SOLUTION
    counts = listed.sum(axis=1).astype(np.int32)
    indices = np.zeros(listed.shape, np.int32)  # what lies past a count is never read
    for row, cols in enumerate(listed):
        indices[row, :counts[row]] = np.flatnonzero(cols)
    return counts, indices
    # END SOLUTION


def block_mask(mask_mod: MaskMod, n_q: int, n_k: int, block_q: int, block_k: int) -> BlockMask:
    """Classify every tile as empty, partial or full, asking mask_mod about one tile at a time;
    return the lists in FlexAttention's layout, forward and transposed."""
    # TODO: a (T_r, T_c) bool grid each for partial and full tiles (num_blocks), filled tile by
    #       tile with tile_mask over block_slice rows and columns (never an n_q x n_k array); then
    #       BlockMask(n_q, n_k, block_q, block_k, ...) with block_lists of the partial grid, the
    #       full grid, and their transposes, in that order.
    # BEGIN SOLUTION
    t_r, t_c = num_blocks(n_q, block_q), num_blocks(n_k, block_k)
    partial, full = np.zeros((t_r, t_c), bool), np.zeros((t_r, t_c), bool)
    for i in range(t_r):
        for j in range(t_c):
            allowed = tile_mask(mask_mod, block_slice(i, block_q, n_q), block_slice(j, block_k, n_k))
            full[i, j] = allowed.all()
            partial[i, j] = allowed.any() and not full[i, j]
    return BlockMask(n_q, n_k, block_q, block_k, *block_lists(partial), *block_lists(full),
                     *block_lists(partial.T), *block_lists(full.T))
    # END SOLUTION


def kv_blocks(block_mask: BlockMask, i: int) -> list[tuple[int, bool]]:
    """Query block i's key blocks as (j, masked): its full blocks (masked False), then its partial
    blocks (masked True), each ascending, the order of 13's kernels; j a Python int. The other order
    (FlexAttention's) is as right: the running softmax gives the same answer, up to rounding."""
    # TODO: read each list only up to its count.
    # BEGIN SOLUTION
    full = block_mask.full_kv_indices[i, :block_mask.full_kv_num_blocks[i]]
    partial = block_mask.kv_indices[i, :block_mask.kv_num_blocks[i]]
    return [(int(j), False) for j in full] + [(int(j), True) for j in partial]
    # END SOLUTION


def block_sparse_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, block_mask: BlockMask,
                           mask_mod: MaskMod, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of q (n_q, d) over k (n_k, d), v (n_k, d_v) under mask_mod, computing only the
    tiles block_mask lists. Returns o (n_q, d_v) and lse (n_q,), in the dtype of q."""
    # TODO: per query block start from (0, -inf); per listed tile attend its keys (mask_mod's
    #       tile only on partial ones) and merge the result in.
    # BEGIN SOLUTION
    o = np.zeros((q.shape[0], v.shape[1]), q.dtype)
    lse = np.full(q.shape[0], -np.inf, q.dtype)  # the merge's identity: a row that sees no key yet
    for i in range(len(block_mask.kv_num_blocks)):
        rows = block_slice(i, block_mask.block_q, block_mask.n_q)
        for j, masked in kv_blocks(block_mask, i):
            cols = block_slice(j, block_mask.block_k, block_mask.n_k)
            mask = tile_mask(mask_mod, rows, cols) if masked else None
            o_tile, lse_tile = attention_partial(q[rows], k[cols], v[cols], mask, scale)
            o[rows], lse[rows] = merge_partials(o[rows], lse[rows], o_tile, lse_tile)
    return o, lse
    # END SOLUTION


def block_sparse_flash(hbm: HBM, block_mask: BlockMask, mask_mod: MaskMod, scale: float | None = None) -> None:
    """05's flash_attention on hbm's Q, K, V (n, d), walking only the listed tiles: per query block
    read Q once, the K and V rows of each listed tile, then write its rows of O (n, d) and L (n,)."""
    # TODO: as block_sparse_attention, with every value read through hbm.read inside on-chip
    #       blocks (one query block, one key tile at a time), O and L written once per query block.
    #       Every query block reads its Q, even one that lists no tile (o = 0, L = -inf there).
    # BEGIN SOLUTION
    n, _ = hbm.shape("Q")
    for i in range(num_blocks(n, block_mask.block_q)):
        rows = block_slice(i, block_mask.block_q, n)
        with hbm.on_chip():
            q = hbm.read("Q", rows)
            o, lse = np.zeros_like(q), np.full(q.shape[0], -np.inf)
            for j, masked in kv_blocks(block_mask, i):
                keys = block_slice(j, block_mask.block_k, n)
                with hbm.on_chip():
                    mask = tile_mask(mask_mod, rows, keys) if masked else None
                    tile = attention_partial(q, hbm.read("K", keys), hbm.read("V", keys), mask, scale)
                    o, lse = merge_partials(o, lse, *tile)
            hbm.write("O", rows, value=o)
            hbm.write("L", rows, value=lse)
    # END SOLUTION


def block_sparse_io(n: int, d: int, block_q: int, block_k: int, block_mask: BlockMask) -> tuple[int, int]:
    """(reads, writes) in elements of block_sparse_flash on Q, K, V (n, d): Python ints. block_q and
    block_k are block_mask's."""
    # TODO: Q once; the K and V rows of every listed tile (the last key block may be short);
    #       O and L once.
    # BEGIN SOLUTION
    keys = 0
    for i in range(num_blocks(n, block_q)):
        keys += sum(min(block_k, n - j * block_k) for j, _ in kv_blocks(block_mask, i))
    return n * d + 2 * d * keys, n * d + n
    # END SOLUTION


def density(block_mask: BlockMask) -> float:
    """s: the fraction of the T_r x T_c tiles that are computed (partial or full)."""
    # TODO: count the listed tiles of every query block.
    # BEGIN SOLUTION
    tiles = len(block_mask.kv_num_blocks) * len(block_mask.q_num_blocks)
    return float(block_mask.kv_num_blocks.sum() + block_mask.full_kv_num_blocks.sum()) / tiles
    # END SOLUTION
