"""Exercise 13 — the kernel that visits only the listed tiles.

The idea
    Exercise 12 walked a block mask in NumPy; here the same walk runs in Triton, forward and
    backward, so a model trains with a sliding window or packed documents at a cost in proportion
    to the tiles it keeps. The only change from 06 and 09 is which tiles a program visits and where
    the mask applies: a program reads its block's lists (kata/given/block_mask.py's layout) and
    folds each listed block's tiles as 06 and 09 do, the full blocks with no mask and the partial
    blocks with it (here the full ones first, so that the masked tiles end the walk; the other
    order gives the same answer, up to rounding). Empty blocks are never named, so never read.

The mask (kata/given/masks.py)
    A Mask holds a @triton.jit mod(q_idx, kv_idx, window, doc_ids) -> bool, 12's mask_mod for a
    kernel, and its window and doc_ids. The kernels take the mod as a constexpr (Triton compiles it
    into them) and evaluate it with masks.tile_allowed(MOD, rows, keys, n_q, n_k, window, doc_ids,
    RAGGED), which, under RAGGED, is also False past the arrays' ends. block_mask(mask, n_q, n_k,
    block_q, block_k) is 12's, solved, on the device: int32 lists.

The walk (per program; T_c key blocks, T_r query blocks)
    forward, one program per BLOCK_M rows of query block i, one loop over
        the full blocks full_kv_indices[i, :full_kv_num_blocks[i]]  unmasked
        then the partial blocks kv_indices[i, :kv_num_blocks[i]]    masked
    dK, dV, one program per BLOCK_N keys of key block j: the same over full_q_indices[j] and
    q_indices[j] (the transposed lists). dQ, one program per BLOCK_M rows: the forward's lists.
    The dQ kernel runs first: it also makes D = rowsum(dO ∘ O) from the O and dO rows it holds
    (09 gave D a kernel of its own), which the dK, dV kernel then reads.
    The masked tiles end the walk: the partial blocks, and before them a full block that the
    end of the walked axis cuts (n_k in the forward and dQ, n_q in dK, dV), whose keys or rows past
    the end must weigh 0; lists ascend, so only a list's last full block can be cut
    (masks.ends_ragged). A program's own rows or keys past the end need only the stores' mask.
    A program's tiles may be smaller than the mask's blocks: BLOCK_M divides block_q and BLOCK_N
    divides block_k, and a listed block is then walked as block / BLOCK tiles in a row.

Bounds only where an end cuts a block
    Where n_q and n_k are multiples of the blocks no tile reaches past an end, so the wrapper
    (given) passes the kernels RAGGED = False and tile_allowed leaves out the bounds, rows < n_q
    and keys < n_k, which cost about as many selects and compares per pair as a window's own test
    (FlexAttention leaves them out too, unless it must check a block boundary). Pass RAGGED on to
    tile_allowed as it is: it decides the bounds, never whether a tile is masked. Compiled for an
    H200, the forward's masked tile of a window falls from 518 to 352 instructions a thread, and
    the forward, window 1k at n = 16k, from 1.43 to 1.39 ms.

Tiles through descriptors (kata/given/tiles.py)
    The wrapper hands the kernels Q, K, V, dO and O as tensor descriptors, and a kernel loads a
    tile by its first row: tiles.load_tile(desc, b, h, start, ROWS, HEAD_DIM). Rows past the end
    read as zeros, so no tile load needs a bounds mask; the stores do. (An H200 copies such a tile
    by TMA, with no pointer per element in registers: the forward, causal at n = 16k, 8.6 ms
    against 9.1 with pointers.) lse and D lie side by side in one (B, H, 2, n) float32 tensor: the
    forward and dQ store them with pointers, rows (b·H + h)·stride_lse apart, and dK, dV reads both
    for its rows with one copy, lse, d = tiles.load_stats(desc, b, h, start, ROWS).

Advice, for speed (the tests cannot see it: each way gives the same answer, up to rounding)
    - One loop a program, over the full list and then the partial one, the mask turned on by a
      runtime `if` from the first masked tile: the compiler overlaps the loads of a loop's coming
      trips only within that loop, and each loop fills and drains its own pipeline, which costs
      most where lists are short.
    - Read the next tile's start at the end of each trip, not at its top: K and V tiles are fetched
      ahead only when their address is known a trip early (an H200's forward, causal at n = 16k:
      10.3 ms with the start read in the same trip, 9.1 ms with it read a trip ahead).
    - Programs longest list first: a program takes its block from the block mask's order (kv_order
      for the forward and dQ, q_order for dK, dV: the blocks by list length), not from its number.
      The GPU starts the next program as one ends, so the short lists, started last, leave no long
      one running alone at the end (documents at n = 64k, the three kernels: 12.9 to 12.4 ms).
      Under a causal mask it is the order 06 and 09 chose by hand.
    - In the backward, the products that are not running sums first, S = q kᵀ and dP = dO vᵀ, and
      the sums (dV += Pᵀ dO, dK += dSᵀ q, dQ += dS k) last. Compiled for Hopper, Triton waits for a
      product that is not a running sum as soon as it is issued, and that wait takes every product
      in flight, but it leaves a running sum running into the next trip (an H200, causal at
      n = 16k: the dK, dV and dQ kernels 27.7 ms in 09's order, 24.8 ms this way).

Fully masked rows
    Under a partial tile a row may see no key at all (a window past the keys' end, n_q > n_k): its
    running max stays -inf, and exp2(s - m) would be exp2(-inf + inf) = NaN. Subtract 0 instead
    while m is -inf, but keep m itself -inf (a row set to 0 would underflow at a later tile of
    very negative scores); such a row keeps l = 0 and comes out o = 0, lse = -inf. In the backward
    its lse is -inf and P = exp2(S - lse) = inf where the mask has already chosen 0: use tl.where,
    never a product with the mask.

In the paper
    FlashAttention (Dao et al., 2022), section 3.3: block-sparse FlashAttention is Algorithm 1
    skipping the zero blocks of a block mask; appendix D.1 writes it out as Algorithm 5, which is
    Algorithm 2 (Algorithm 1 with scale, mask and dropout) skipping zero blocks. Proposition 4:
    IO Θ(Nd + N²d²M⁻¹s). FlexAttention
    (Dong et al., 2024) keeps partial and full blocks apart, so that only the partial ones pay the mask.

Conventions
    q, k, v (B, H, n_q | n_k, D) float16, bfloat16 or float32 on one device, D <= 256; one block
    mask for every (batch, head), built for these n_q and n_k. o in q's dtype; gradients in their
    inputs' dtypes; the backward's sums and D = rowsum(dO ∘ O) in float32. As in 06, every tl.dot
    takes input_precision=PRECISION: float32 in full unless torch was asked for TF32.
    Without a GPU, TRITON_INTERPRET=1 runs the kernels on the CPU (float32, float16) with blocks of
    16 and 32; the tests also compile them for Ampere and Hopper. The GPU stage adds bfloat16
    (it runs all three dtypes), 128-wide blocks, thousands of tokens and a training run. Inside a
    kernel write log2 e as the number 1.4426950408889634: LOG2E is a module global, which compiled
    Triton refuses (the wrapper passes qk_scale = scale · LOG2E).

Given (kata/given/)
    masks.py    Mask, tile_allowed, block_mask (its lists and their order), ragged (does an end cut a
                block: the kernels' RAGGED), ends_ragged (is a list's last block the ragged one?)
    tiles.py    load_tile, load_stats (and tma_aligned, descriptor, row_stats, stats_descriptor, which
                the wrapper calls); row_ptrs for stores; the head-dim padding, as in 06 and 09
    inputs.py   check_inputs: 06's ValueErrors
    precision.py  dot_precision(dtype): tl.dot's input_precision, as in 06 (the wrapper passes PRECISION)
"""
import math

import torch
import triton
import triton.language as tl

from kata.given import masks, tiles
from kata.given.inputs import check_inputs
from kata.given.launch import LOG2E, MAX_TILE, interpreted
from kata.given.masks import Mask, check_block_mask
from kata.given.precision import dot_precision

block_mask = masks.block_mask  # exercise 12's, solved, on the device: block_mask(mask, n_q, n_k, block_q, block_k)


# ---------------------------------------------------------------- masks -----------------------------

@triton.jit
def causal_mod(q_idx, kv_idx, window, doc_ids):
    """Query i may attend key j iff j <= i (top-left aligned)."""
    return kv_idx <= q_idx


causal = Mask(causal_mod)


@triton.jit
def sliding_window_mod(q_idx, kv_idx, window, doc_ids):
    """Causal, and at most window - 1 keys back: i - window < j <= i."""
    # TODO: as 12's sliding_window, on the index tiles.
    raise NotImplementedError("sliding_window_mod: replace this line with your code")


def sliding_window(window: int) -> Mask:
    """The mask of sliding_window_mod with this window (at least 1)."""
    # TODO: a ValueError naming the window when it is below 1; else a Mask of sliding_window_mod
    #       carrying the window.
    raise NotImplementedError("sliding_window: replace this line with your code")


@triton.jit
def document_mod(q_idx, kv_idx, window, doc_ids):
    """Same document (doc_ids[i] == doc_ids[j]) and causal."""
    # TODO: load both indices' documents from doc_ids; same document AND causal.
    raise NotImplementedError("document_mod: replace this line with your code")


def document_mask(doc_ids: torch.Tensor) -> Mask:
    """The mask of document_mod for packed sequences: doc_ids (n,) an int tensor on the device."""
    # TODO: a Mask of document_mod carrying doc_ids as int32, contiguous (the kernel indexes it).
    raise NotImplementedError("document_mask: replace this line with your code")


# ---------------------------------------------------------------- the forward (yours) --------------

@triton.jit
def _tile_start(full, n_full, partial, n_partial, t, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """The first index of tile t of a program's walk: the blocks full[:n_full], then partial[:n_partial],
    BLOCK wide, TILE at a time (BLOCK // TILE tiles a block); 0 past the walk's end, reading nothing there."""
    # TODO: tile t is slice t % (BLOCK // TILE) of entry e = t // (BLOCK // TILE) of the walk: full[e]
    #       while e < n_full, then partial[e - n_full]; mask the load to the walk (the entries past
    #       each count are garbage, or past the array's end).
    raise NotImplementedError("_tile_start: replace this line with your code")


@triton.jit
def _program_tile(ORDER, n, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """(batch·head, block, tile) of this program, for n rows in blocks of BLOCK, TILE rows a program.

    A (batch, head) has cdiv(n, BLOCK) · per_block programs, per_block = BLOCK // TILE (the last
    block's slices past n included: they store nothing). Program p is batch·head p // that, and its
    rank r = p % that takes block ORDER[r // per_block] (ORDER: the blocks, longest list first) and
    its slice r % per_block, which is tile block · per_block + r % per_block of TILE rows.
    """
    # TODO: as above; read ORDER once.
    raise NotImplementedError("_program_tile: replace this line with your code")


@triton.jit
def _fwd_tiles(acc, l, m, q, k_desc, v_desc, b, h, rows, full, n_full, partial, n_partial, unmasked, n_q, n_k,
               qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Fold the key blocks full[:n_full], then partial[:n_partial], into the running state of one query
    tile, BLOCK_N keys at a time; the first `unmasked` full blocks without the mask.

    As 06's attn_tiles, with the keys taken from the lists. A masked tile lets tile_allowed decide
    which scores stay (the mask and, where RAGGED, the arrays' ends). Returns acc, l, m (m in base-2
    units).
    """
    # TODO: one loop over every tile of the walk, per_block = BLOCK_K // BLOCK_N of them per block,
    #       tile t starting at key _tile_start(...) read a trip ahead (see the lesson's advice).
    #       Load the K tile (tiles.load_tile); s = q kᵀ; from tile unmasked · per_block on, -inf where
    #       tile_allowed(..., RAGGED) says no; update m, l, acc as in 06 (a row whose m is still -inf
    #       subtracts 0); load the V tile; acc += p v. Every tl.dot takes input_precision=PRECISION.
    raise NotImplementedError("_fwd_tiles: replace this line with your code")


@triton.jit
def _sparse_fwd(ORDER, q_desc, k_desc, v_desc, O, LSE, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, window, doc_ids,
                qk_scale, stride_ob, stride_oh, stride_on, stride_lse, H, n_q, n_k, t_c,
                MOD: tl.constexpr, RAGGED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One program: BLOCK_M query rows (a slice of query block i, from _program_tile) of one
    (batch, head). The lists (T_r,) and (T_r, T_c) int32, row i at KV_IDX + i·t_c. LSE: lse of
    (b, h) at LSE + (b·H + h)·stride_lse.
    """
    # TODO: find this program's rows (_program_tile, ORDER being kv_order); load Q once
    #       (tiles.load_tile from q_desc); fold its full blocks, then its partial ones, all but a
    #       last full block the keys' end cuts unmasked; write o = acc / l (l = 0 gives o = 0) and
    #       lse = (m + log2 l) · ln 2.
    raise NotImplementedError("_sparse_fwd: replace this line with your code")


# ---------------------------------------------------------------- the backward (yours) -------------

@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_desc, do_desc, stats_desc, b, h, full, n_full, partial, n_partial, unmasked,
                n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the query blocks full[:n_full], then partial[:n_partial], BLOCK_M rows at a time, into the
    float32 sums dk, dv of one key tile; the first `unmasked` full blocks without the mask. As 09's
    _dkdv_tiles (transposed tiles, keys on rows), the rows from the lists."""
    # TODO: one loop over every tile of the walk, BLOCK_Q // BLOCK_M per block, their starts read a
    #       trip ahead (as in _fwd_tiles); load Q, dO, then lse and D (tiles.load_stats); Sᵀ = k qᵀ
    #       and dPᵀ = v dOᵀ first (the sums last: see the lesson); Pᵀ = exp2(Sᵀ · qk_scale − lse ·
    #       log2 e), from tile unmasked · per_block on 0 where tl.trans(tile_allowed(..., RAGGED))
    #       says no (its tile is rows x keys, Pᵀ keys x rows);
    #       dv += Pᵀ dO; dSᵀ = Pᵀ ∘ (dPᵀ − D); dk += dSᵀ q. Every tl.dot takes input_precision=PRECISION.
    raise NotImplementedError("_dkdv_tiles: replace this line with your code")


@triton.jit
def _sparse_dkdv(ORDER, q_desc, k_desc, v_desc, do_desc, stats_desc, DK, DV, Q_NUM, Q_IDX, FULL_NUM, FULL_IDX, window,
                 doc_ids, qk_scale, scale, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                 H, n_q, n_k, t_r,
                 MOD: tl.constexpr, RAGGED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One program: dK, dV of BLOCK_N keys (a slice of key block j, from _program_tile) of one
    (batch, head), over the transposed lists, row j at Q_IDX + j·t_r. stats_desc: lse and D."""
    # TODO: find this program's keys (_program_tile with q_order, key blocks of BLOCK_K); load K and
    #       V once (tiles.load_tile); walk key block j's full query blocks, then its partial ones,
    #       all but a last full block the queries' end cuts unmasked; store dk·scale and dv.
    raise NotImplementedError("_sparse_dkdv: replace this line with your code")


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_desc, v_desc, b, h, full, n_full, partial, n_partial, unmasked,
              n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the key blocks full[:n_full], then partial[:n_partial], BLOCK_N keys at a time, into the
    float32 sum dq of one query tile; the first `unmasked` full blocks without the mask. As 09's
    _dq_tiles, the keys from the lists."""
    # TODO: one loop over every tile of the walk, BLOCK_K // BLOCK_N per block, their starts read a
    #       trip ahead; load K, V; S = q kᵀ and dP = dO vᵀ first (the sum dq last);
    #       P = exp2(S · qk_scale − lse2), from tile unmasked · per_block on 0 where
    #       tile_allowed(..., RAGGED) says no; dS = P ∘ (dP − D); dq += dS k. Every tl.dot takes
    #       input_precision=PRECISION.
    raise NotImplementedError("_dq_tiles: replace this line with your code")


@triton.jit
def _sparse_dq(ORDER, q_desc, k_desc, v_desc, do_desc, o_desc, DQ, LSE, DELTA, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX,
               window, doc_ids, qk_scale, scale, stride_dqb, stride_dqh, stride_dqn, stride_lse, H, n_q, n_k, t_c,
               MOD: tl.constexpr, RAGGED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One program: dQ and D of BLOCK_M query rows (a slice of query block i, from _program_tile) of
    one (batch, head), over the forward's lists. LSE and DELTA as _sparse_fwd's LSE."""
    # TODO: find this program's rows as _sparse_fwd does; load Q, dO, and lse·log2 e once;
    #       D = rowsum(dO ∘ O) from an O tile, in float32, stored (rows < n_q) for dK, dV; walk as
    #       the forward does with _dq_tiles; store dq·scale.
    raise NotImplementedError("_sparse_dq: replace this line with your code")


# ---------------------------------------------------------------- the plumbing (given) -------------

def kernel_tiles(block_mask, width: int, itemsize: int) -> dict:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of each kernel for this mask, head width and
    element size. On an H200 in bfloat16 at D = 128 with blocks of 128 (ms at n = 16k, causal,
    measured with pointer loads, before the descriptors, 09's D kernel and the programs' order;
    docs/benchmark.md, steps 2 and 8),
    whole blocks win the forward (128 x 128 at 3 stages: 9.1, against 9.4 for 128 x 64 at 4), dK, dV
    walks query tiles of 64 at 3 stages (with 4 warps they take twice as long), and dQ walks key
    tiles of 64 at 3 stages (the whole backward 28.2, against 29.7 for whole blocks at 2 stages;
    window 1k, documents and window 4k at 64k: 4.91, 10.81, 15.04 against 5.18, 11.50, 15.37).
    A wider head or float32 takes tiles as many bytes as those, slices of a block, and 2 stages.
    The interpreter's tiles are all 16, so that its blocks of 32 run the slicing of both a
    program's own rows (as float32 does on a GPU) and the tiles it walks."""
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
    """Programs a (batch, head) for n rows in blocks of `block`, `tile` rows a program, as
    _program_tile counts them."""
    return triton.cdiv(n, block) * (block // tile)


def kernel_constants(block_mask, mask: Mask, width: int, dtype: torch.dtype) -> dict:
    """The constexprs all three kernels take: the mask's mod, RAGGED, the tiles' width, the blocks,
    tl.dot's input precision for inputs of `dtype`."""
    return dict(MOD=mask.mod, RAGGED=masks.ragged(block_mask), HEAD_DIM=width, BLOCK_Q=block_mask.block_q,
                BLOCK_K=block_mask.block_k, PRECISION=dot_precision(dtype))


class BlockSparseAttention(torch.autograd.Function):
    """o = softmax(scale · q kᵀ under the mask) v over the listed tiles; the backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, bm, mask, scale):
        head_dim = q.shape[-1]
        width = tiles.padded_width(head_dim)
        q, k, v = (tiles.tma_aligned(tiles.pad_head_dim(t, width)) for t in (q, k, v))  # kept for the backward
        (B, H, n_q, _), n_k = q.shape, k.shape[2]
        o = torch.empty_like(q)
        stats = tiles.row_stats(B, H, n_q, q.device)  # lse, and D in the backward
        lse = stats[:, :, 0]
        block_m, block_n, warps, stages = kernel_tiles(bm, width, q.element_size())["fwd"]
        _sparse_fwd[(programs(n_q, bm.block_q, block_m) * B * H,)](
            bm.kv_order, tiles.descriptor(q, block_m), tiles.descriptor(k, block_n), tiles.descriptor(v, block_n), o,
            lse, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, mask.window, mask.doc_ids,
            scale * LOG2E, *o.stride()[:3], lse.stride(1), H, n_q, n_k, bm.kv_indices.shape[1], BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps, num_stages=stages, **kernel_constants(bm, mask, width, q.dtype))
        ctx.save_for_backward(q, k, v, o, stats)
        ctx.bm, ctx.mask, ctx.scale, ctx.head_dim = bm, mask, scale, head_dim
        return o[..., :head_dim]

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, stats = ctx.saved_tensors
        bm, mask, scale = ctx.bm, ctx.mask, ctx.scale
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
        _sparse_dq[(programs(n_q, bm.block_q, block_m) * B * H,)](
            bm.kv_order, *inputs(block_m, block_n), tiles.descriptor(o, block_m), dq, lse, delta, bm.kv_num_blocks,
            bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, mask.window, mask.doc_ids, scale * LOG2E,
            scale, *dq.stride()[:3], lse.stride(1), H, n_q, n_k, bm.kv_indices.shape[1], BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps, num_stages=stages, **common)
        block_m, block_n, warps, stages = sizes["dkdv"]
        _sparse_dkdv[(programs(n_k, bm.block_k, block_n) * B * H,)](
            bm.q_order, *inputs(block_m, block_n), tiles.stats_descriptor(stats, block_m), dk, dv, bm.q_num_blocks,
            bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices, mask.window, mask.doc_ids, scale * LOG2E,
            scale, *dk.stride()[:3], *dv.stride()[:3], H, n_q, n_k, bm.q_indices.shape[1], BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps, num_stages=stages, **common)
        d = ctx.head_dim
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None, None


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, mask: Mask,
                           scale: float | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ) v under `mask`, computing only the tiles `block_mask` lists; differentiable.

    q (B, H, n_q, D), k and v (B, H, n_k, D); block_mask = block_mask(mask, n_q, n_k, ...), the same
    for every (batch, head). Returns o (B, H, n_q, D) in q's dtype.
    """
    check_inputs(q, k, v, scale)
    check_block_mask(block_mask, q, k)
    if not isinstance(mask, Mask):
        raise ValueError(f"mask must be a Mask (causal, sliding_window(w), document_mask(ids)), "
                         f"got {type(mask).__name__}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return BlockSparseAttention.apply(q, k, v, block_mask, mask, scale)
