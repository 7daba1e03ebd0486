"""Masks for the Triton block-sparse kernel (exercise 13), and the block mask built from one.

A mask is 12's mask_mod written for Triton: a @triton.jit function

    mod(q_idx, kv_idx, window, doc_ids) -> bool

called inside a kernel on a (BLOCK_M, 1) column of query indices and a (1, BLOCK_N) row of key
indices, True where the query may attend the key. Every mod takes the same four arguments (one
that needs no window or no documents ignores them), so one kernel runs them all: it takes the mod
as a constexpr, and the Mask's window and doc_ids as ordinary arguments.

    mask = Mask(sliding_window_mod, window=1024)
    bm = block_mask(mask, n_q, n_k, 128, 128)    # exercise 12's block_mask, on the device

Indices handed to a mod always lie inside the arrays (tile_allowed clamps them where a tile may
reach past an end), so a mod may load doc_ids[q_idx] with no bounds check of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kata.given.block_mask import BlockMask
from kata.given.launch import interpreted


@dataclass(frozen=True)
class Mask:
    """A @triton.jit mod and its arguments, as the kernels take them: `window` (an int) and
    `doc_ids` (an int32 tensor (n,) on the device, or None, which a kernel takes as a constexpr)."""
    mod: object
    window: int = 0
    doc_ids: torch.Tensor | None = None


@triton.jit
def tile_allowed(MOD: tl.constexpr, rows, keys, n_q, n_k, window, doc_ids, RAGGED: tl.constexpr):
    """(len(rows), len(keys)) bool: MOD at every pair inside the arrays, False past their ends.

    RAGGED False promises that every row and key lies inside the arrays (n_q and n_k multiples of
    the blocks, so that no tile reaches past an end): the bounds are then left out. Per pair they cost
    about as much as a window's own test (selects and compares; the clamps once a row and a key)."""
    if RAGGED:
        q_idx = tl.minimum(rows, n_q - 1)[:, None]  # the mod's loads stay in bounds
        kv_idx = tl.minimum(keys, n_k - 1)[None, :]
        inside = (rows < n_q)[:, None] & (keys < n_k)[None, :]
        allowed = inside & MOD(q_idx, kv_idx, window, doc_ids)
    else:
        allowed = MOD(rows[:, None], keys[None, :], window, doc_ids)
    return allowed


def ragged(block_mask: BlockMask) -> bool:
    """Whether an array's end cuts a block of `block_mask` (n_q or n_k not a multiple of its block):
    the kernels' RAGGED, under which tile_allowed checks the bounds."""
    return block_mask.n_q % block_mask.block_q != 0 or block_mask.n_k % block_mask.block_k != 0


@triton.jit
def ends_ragged(indices, count, n, BLOCK: tl.constexpr):
    """1 when the last of the `count` blocks listed at `indices` is cut by the array's end (n rows
    in blocks of BLOCK), else 0: lists ascend, so only their last block can be."""
    last = tl.load(indices + tl.maximum(count - 1, 0), mask=count > 0, other=-1)  # an empty list: no entry is read
    return ((n % BLOCK != 0) & (last == (n - 1) // BLOCK)).to(tl.int32)


@triton.jit
def _classify(KIND, MOD: tl.constexpr, window, doc_ids, n_q, n_k, t_c,
              BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, TILES: tl.constexpr):
    """One program: query block i against TILES key blocks from j0 = program_id(1) · TILES on.
    KIND (T_r, T_c) int8 gets 0 for an empty tile, 1 for a partial one, 2 for a full one."""
    i = tl.program_id(0)
    j0 = tl.program_id(1) * TILES
    rows = i * BLOCK_Q + tl.arange(0, BLOCK_Q)
    keys = j0 * BLOCK_K + tl.arange(0, TILES * BLOCK_K)
    allowed = tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids, True).to(tl.int32)  # TILES may pass t_c
    some = tl.sum(tl.sum(tl.reshape(allowed, (BLOCK_Q, TILES, BLOCK_K)), 2), 0)  # allowed pairs per tile
    cols = j0 + tl.arange(0, TILES)
    # the pairs inside the arrays, per tile: its rows below n_q times its keys below n_k
    pairs = tl.minimum(n_q - i * BLOCK_Q, BLOCK_Q) * tl.minimum(tl.maximum(n_k - cols * BLOCK_K, 0), BLOCK_K)
    kind = tl.where(some == 0, 0, tl.where(some == pairs, 2, 1))
    tl.store(KIND + i * t_c + cols, kind.to(tl.int8), mask=cols < t_c)


def _lists(listed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `listed (rows, cols)` bool: how many columns are listed, and which, ascending,
    at the start of the row (a stable sort puts them first); what follows is never read."""
    counts = listed.sum(1, dtype=torch.int32)
    indices = torch.argsort((~listed).to(torch.int8), dim=1, stable=True).to(torch.int32)
    return counts.contiguous(), indices.contiguous()


def _longest_first(counts: torch.Tensor) -> torch.Tensor:
    """The blocks by count, largest first, ties in block order: the order in which a kernel's programs
    should start, so that the last to start, running when the GPU has little else left, are the shortest."""
    return torch.argsort(counts, descending=True, stable=True).to(torch.int32).contiguous()


def block_mask(mask: Mask, n_q: int, n_k: int, block_q: int, block_k: int, device=None) -> BlockMask:
    """Exercise 12's block_mask, solved, for a Triton mask: every tile classified on the device,
    one tile (on a GPU) at a time, never an n_q x n_k array; the lists in FlexAttention's layout,
    int32 tensors on `device` (doc_ids' device, else CUDA, else the CPU under the interpreter), and
    kv_order, q_order: the blocks longest list first, the order in which 13's programs start them.
    block_q and block_k are powers of two, at least 16."""
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if block < 16 or block & (block - 1):
            raise ValueError(f"{name} = {block}: block sizes must be powers of two, at least 16 (tl.arange's rule)")
    if min(n_q, n_k) < 1:
        raise ValueError(f"n_q = {n_q}, n_k = {n_k}: a block mask needs at least one query and one key")
    if mask.doc_ids is not None and mask.doc_ids.numel() < max(n_q, n_k):
        raise ValueError(f"doc_ids has {mask.doc_ids.numel()} entries: it needs one per position, "
                         f"{max(n_q, n_k)} here")
    if device is None:
        device = mask.doc_ids.device if mask.doc_ids is not None else "cpu" if interpreted() else "cuda"
    t_r, t_c = triton.cdiv(n_q, block_q), triton.cdiv(n_k, block_k)
    # The interpreter runs each program as Python: one program per query block, all its tiles at once.
    tiles = triton.next_power_of_2(t_c) if interpreted() else max(1, 128 // block_k)
    kind = torch.empty((t_r, t_c), dtype=torch.int8, device=device)
    _classify[(t_r, triton.cdiv(t_c, tiles))](kind, mask.mod, mask.window, mask.doc_ids, n_q, n_k, t_c,
                                              BLOCK_Q=block_q, BLOCK_K=block_k, TILES=tiles)
    partial, full = kind == 1, kind == 2
    kv, full_kv, q, full_q = _lists(partial), _lists(full), _lists(partial.T), _lists(full.T)  # (counts, indices)
    return BlockMask(n_q, n_k, block_q, block_k, *kv, *full_kv, *q, *full_q,
                     kv_order=_longest_first(kv[0] + full_kv[0]), q_order=_longest_first(q[0] + full_q[0]))


def check_block_mask(block_mask: BlockMask, q: torch.Tensor, k: torch.Tensor) -> None:
    """Raise ValueError when `block_mask` was built for other sizes, or lives on another device, than q, k,
    or lacks the programs' order (a BlockMask made by hand)."""
    n_q, n_k = q.shape[2], k.shape[2]
    if (block_mask.n_q, block_mask.n_k) != (n_q, n_k):
        raise ValueError(f"the block mask was built for n_q = {block_mask.n_q}, n_k = {block_mask.n_k}; "
                         f"q and k have n_q = {n_q}, n_k = {n_k}: build it for these sizes")
    if block_mask.kv_order is None or block_mask.q_order is None:
        raise ValueError("the block mask has no program order (kv_order, q_order): build it with "
                         "block_mask(mask, n_q, n_k, block_q, block_k)")
    if block_mask.kv_indices.device != q.device:
        raise ValueError(f"the block mask is on {block_mask.kv_indices.device}, q on {q.device}")
    if interpreted():  # a count or index out of range makes the interpreter read the process's own memory
        check_lists(block_mask)


def check_lists(block_mask: BlockMask) -> None:
    """Raise ValueError naming the first count outside [0, T], listed block outside [0, T) or order
    entry outside its blocks, T the blocks of the axis a list walks: a kernel would read past its
    tensors with it (a crash, or a loop over garbage). Costs a copy to the host: run under the interpreter."""
    t_r, t_c = triton.cdiv(block_mask.n_q, block_mask.block_q), triton.cdiv(block_mask.n_k, block_mask.block_k)
    lists = [("kv_num_blocks", "kv_indices", t_r, t_c), ("full_kv_num_blocks", "full_kv_indices", t_r, t_c),
             ("q_num_blocks", "q_indices", t_c, t_r), ("full_q_num_blocks", "full_q_indices", t_c, t_r)]
    for counts_name, indices_name, rows, blocks in lists:
        counts, indices = getattr(block_mask, counts_name).cpu(), getattr(block_mask, indices_name).cpu()
        if tuple(counts.shape) != (rows,) or tuple(indices.shape) != (rows, blocks):
            raise ValueError(f"block mask: {counts_name} {tuple(counts.shape)} and {indices_name} "
                             f"{tuple(indices.shape)}, expected ({rows},) and ({rows}, {blocks})")
        for row, count in enumerate(counts.tolist()):
            if not 0 <= count <= blocks:
                raise ValueError(f"block mask: {counts_name}[{row}] = {count}, outside [0, {blocks}]: a count "
                                 f"lies between 0 and the {blocks} blocks a list may name")
            listed = indices[row, :count].tolist()
            if any(not 0 <= block < blocks for block in listed):
                raise ValueError(f"block mask: {indices_name}[{row}, :{count}] = {listed} names a block "
                                 f"outside [0, {blocks})")
    for order_name, blocks in (("kv_order", t_r), ("q_order", t_c)):
        order = getattr(block_mask, order_name).cpu()
        if tuple(order.shape) != (blocks,) or order.min() < 0 or order.max() >= blocks:
            raise ValueError(f"block mask: {order_name} {order.tolist()} must hold {blocks} blocks of [0, {blocks})")
