"""How exercise 13 runs its kernels: the autograd wrapper, the tiles each kernel takes, the grid.

    block_sparse_attention(Kernels(fwd, dq, dkdv), q, k, v, block_mask, mask, scale)

checks the inputs, pads and aligns q, k, v (and dO) for their tensor descriptors, and launches the
exercise's three kernels, which it is handed at every call (so the kernels launched are always the
ones the exercise file holds now): the forward, then in the backward the dQ kernel (which also makes
D) and after it the dK, dV kernel. Each kernel gets one program per TILE rows of a (batch, head),
on one grid axis, and a block's programs start in the block mask's order (kv_order, q_order).
The tile sizes were measured on an H200 (docs/benchmark.md, "How the kernels were tuned").
"""
import math
from typing import NamedTuple

import torch
import triton

from kata.given import masks, tiles
from kata.given.inputs import check_inputs
from kata.given.launch import LOG2E, MAX_TILE, interpreted
from kata.given.masks import Mask, check_block_mask
from kata.given.precision import dot_precision


class Kernels(NamedTuple):
    """Exercise 13's @triton.jit kernels: the forward, dQ (and D), dK and dV."""
    fwd: object
    dq: object
    dkdv: object


def kernel_tiles(block_mask, width: int, itemsize: int) -> dict:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of each kernel for this mask, head width and
    element size. Compiled, at D = 128 in bfloat16 with blocks of 128: whole blocks in the forward,
    dK, dV walking query tiles of 64 and dQ key tiles of 64, 8 warps and 3 stages (steps 2 and 8 of
    docs/benchmark.md's tuning); a wider head or float32 takes tiles of as many bytes, slices of a
    block, and 2 stages. The interpreter's tiles are all 16, so that its blocks of 32 run the
    slicing of both a program's own rows (as float32 does on a GPU) and the tiles it walks."""
    bq, bk = block_mask.block_q, block_mask.block_k
    if interpreted():
        return dict(fwd=(16, 16, 4, 2), dkdv=(16, 16, 4, 2), dq=(16, 16, 4, 2))
    fits = MAX_TILE * 2 // (width * itemsize)  # rows of a tile as large as a 128 x 128 tile of bfloat16
    rows, keys = min(bq, fits), min(bk, fits)
    warps = 8 if width >= 64 else 4
    stages = 3 if width * itemsize <= 256 else 2  # a third buffer of K and V tiles fits beside 128-wide bfloat16
    return dict(fwd=(rows, keys, warps, stages), dkdv=(min(rows, 64), keys, warps, stages),
                dq=(rows, max(16, keys // 2), warps, stages))


def programs(n: int, block: int, tile: int) -> int:
    """Programs a (batch, head) for n rows in blocks of `block`, `tile` rows a program, as the
    exercise's _program_tile counts them."""
    return triton.cdiv(n, block) * (block // tile)


def kernel_constants(block_mask, mask: Mask, width: int, dtype: torch.dtype) -> dict:
    """The constexprs all three kernels take: the mask's mod, RAGGED, the tiles' width, the blocks,
    tl.dot's input precision for inputs of `dtype`."""
    return dict(MOD=mask.mod, RAGGED=masks.ragged(block_mask), HEAD_DIM=width, BLOCK_Q=block_mask.block_q,
                BLOCK_K=block_mask.block_k, PRECISION=dot_precision(dtype))


class BlockSparseAttention(torch.autograd.Function):
    """o = softmax(scale · q kᵀ under the mask) v over the listed tiles; the backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, bm, mask, scale, kernels):
        head_dim = q.shape[-1]
        width = tiles.padded_width(head_dim)
        q, k, v = (tiles.tma_aligned(tiles.pad_head_dim(t, width)) for t in (q, k, v))  # kept for the backward
        (B, H, n_q, _), n_k = q.shape, k.shape[2]
        o = torch.empty_like(q)
        stats = tiles.row_stats(B, H, n_q, q.device)  # lse, and D in the backward
        lse = stats[:, :, 0]
        block_m, block_n, warps, stages = kernel_tiles(bm, width, q.element_size())["fwd"]
        kernels.fwd[(programs(n_q, bm.block_q, block_m) * B * H,)](
            bm.kv_order, tiles.descriptor(q, block_m), tiles.descriptor(k, block_n), tiles.descriptor(v, block_n), o,
            lse, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, mask.window, mask.doc_ids,
            scale * LOG2E, *o.stride()[:3], lse.stride(1), H, n_q, n_k, bm.kv_indices.shape[1], BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps, num_stages=stages, **kernel_constants(bm, mask, width, q.dtype))
        ctx.save_for_backward(q, k, v, o, stats)
        ctx.bm, ctx.mask, ctx.scale, ctx.head_dim, ctx.kernels = bm, mask, scale, head_dim, kernels
        return o[..., :head_dim]

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, stats = ctx.saved_tensors
        bm, mask, scale, kernels = ctx.bm, ctx.mask, ctx.scale, ctx.kernels
        do = tiles.tma_aligned(tiles.pad_head_dim(do, q.shape[-1]))
        (B, H, n_q, width), n_k = q.shape, k.shape[2]
        lse, delta = stats[:, :, 0], stats[:, :, 1]  # D: made by the dQ kernel, read by dK, dV's
        sizes = kernel_tiles(bm, width, q.element_size())
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        common = kernel_constants(bm, mask, width, q.dtype)

        def inputs(block_m, block_n):  # Q and dO walked or held BLOCK_M rows at a time, K and V BLOCK_N
            return (tiles.descriptor(q, block_m), tiles.descriptor(k, block_n), tiles.descriptor(v, block_n),
                    tiles.descriptor(do, block_m))

        block_m, block_n, warps, stages = sizes["dq"]
        kernels.dq[(programs(n_q, bm.block_q, block_m) * B * H,)](
            bm.kv_order, *inputs(block_m, block_n), tiles.descriptor(o, block_m), dq, lse, delta, bm.kv_num_blocks,
            bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, mask.window, mask.doc_ids, scale * LOG2E,
            scale, *dq.stride()[:3], lse.stride(1), H, n_q, n_k, bm.kv_indices.shape[1], BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps, num_stages=stages, **common)
        block_m, block_n, warps, stages = sizes["dkdv"]
        kernels.dkdv[(programs(n_k, bm.block_k, block_n) * B * H,)](
            bm.q_order, *inputs(block_m, block_n), tiles.stats_descriptor(stats, block_m), dk, dv, bm.q_num_blocks,
            bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices, mask.window, mask.doc_ids, scale * LOG2E,
            scale, *dk.stride()[:3], *dv.stride()[:3], H, n_q, n_k, bm.q_indices.shape[1], BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps, num_stages=stages, **common)
        d = ctx.head_dim
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None, None, None


def block_sparse_attention(kernels: Kernels, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask,
                           mask: Mask, scale: float | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ) v under `mask` by `kernels`, computing only the tiles `block_mask` lists;
    differentiable. q (B, H, n_q, D), k and v (B, H, n_k, D); block_mask built for these n_q, n_k.
    ValueError, before any launch, for inputs the kernels cannot take."""
    check_inputs(q, k, v, scale)
    check_block_mask(block_mask, q, k)
    if not isinstance(mask, Mask):
        raise ValueError(f"mask must be a Mask (causal, sliding_window(w), document_mask(ids)), "
                         f"got {type(mask).__name__}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return BlockSparseAttention.apply(q, k, v, block_mask, mask, scale, kernels)
