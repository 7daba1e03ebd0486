"""Exercise 13 — the kernel that visits only the listed tiles.

The idea
    Exercise 12 walked a block mask in NumPy; here the same walk runs in Triton, forward and
    backward, so that a model trains at a cost in proportion to the tiles its mask keeps. Only
    which tiles a program visits, and where the mask applies, change from 06 and 09.

The walk (kata/given/block_mask.py's lists; T_r query blocks, T_c key blocks)
    The forward, one program per BLOCK_M rows of query block i, folds as 06 does
        the full blocks      full_kv_indices[i, :full_kv_num_blocks[i]]   unmasked
        the partial blocks   kv_indices[i, :kv_num_blocks[i]]             masked
    (full first here, so that the masked tiles end the walk; the other order gives the same
    answer, up to rounding). Entries past a count are garbage, and past a list's last row lies the
    end of its tensor: never read them. A listed block is walked as block / BLOCK tiles in a row
    (BLOCK_M divides block_q, BLOCK_N block_k). A full block that the walked axis's end cuts is
    masked too (keys past n_k weigh 0); lists ascend, so only a list's last full block can be
    (masks.ends_ragged). A program's own rows past n_q need only the stores' mask.

The backward: the transposed lists
    dQ, one program per BLOCK_M rows of query block i, walks the forward's lists. It runs first and
    also makes D = rowsum(dO ∘ O), in float32, from the O and dO rows it holds; dK, dV read it.
    dK, dV, one program per BLOCK_N keys of key block j, walk the transposed lists full_q_indices[j]
    and q_indices[j]; there the end that may cut a block is n_q's.

How the mask reaches the kernel (kata/given/masks.py)
    A Mask holds a @triton.jit mod(q_idx, kv_idx, window, doc_ids) -> bool, 12's mask_mod for a
    kernel, and its window and doc_ids. The kernels take the mod as a constexpr, MOD (Triton
    compiles it into them), and on a masked tile call masks.tile_allowed(MOD, rows, keys, n_q, n_k,
    window, doc_ids, RAGGED). RAGGED (masks.ragged: does an end cut a block?) decides whether it
    checks the bounds, rows < n_q and keys < n_k, never which tiles are masked: pass it on as it is.

Fully masked rows
    A row may see no key at all (a window past the keys' end, n_q > n_k): its running max stays
    -inf, and exp2(s - m) would be exp2(-inf + inf) = NaN. Subtract 0 instead while m is -inf, but
    keep m itself -inf (set to 0, it would underflow at a later tile of very negative scores): the
    row ends with l = 0, o = 0, lse = -inf. In the backward its P = exp2(S - lse) is inf where the
    mask has already chosen 0: zero P with tl.where, never a product with the mask.

In the paper
    FlashAttention (Dao et al., 2022), section 3.3: block-sparse FlashAttention is Algorithm 1
    skipping the zero blocks of a block mask; appendix D.1 writes it out as Algorithm 5, which is
    Algorithm 2 (Algorithm 1 with scale, mask and dropout) skipping zero blocks. Proposition 4:
    IO Θ(Nd + N²d²M⁻¹s). FlexAttention (Dong et al., 2024) keeps partial and full blocks apart,
    so that only the partial ones pay the mask.

Conventions
    q, k, v (B, H, n_q | n_k, D) float16, bfloat16 or float32 on one device, D <= 256; one block
    mask for every (batch, head). o in q's dtype; gradients in their inputs' dtypes; lse, D and the
    backward's sums in float32. As in 06, every tl.dot takes input_precision=PRECISION. A kernel
    loads a tile through a tensor descriptor, load_tile(desc, b, h, start, ROWS, HEAD_DIM),
    rows past the end reading as zeros; it stores through row_ptrs, masked. lse and D lie in
    one (B, H, 2, n) tensor: dK, dV read both with load_stats. Inside a kernel write log2 e as
    1.4426950408889634 (compiled Triton refuses a module global). Without a GPU the kernels run in
    Triton's interpreter (float32, float16, tiles of 16), and are compiled for Ampere and Hopper.

Given (kata/given/)
    sparse_launch.py  block_sparse_attention's autograd wrapper: input checks, tile sizes, grid
    masks.py    Mask, tile_allowed, block_mask (12's, solved, on the device), ragged, ends_ragged
    tiles.py    load_tile, load_stats, row_ptrs (the wrapper makes the descriptors, pads the head dim)
"""
import torch
import triton
import triton.language as tl

from kata.given import masks, sparse_launch, tiles
from kata.given.masks import Mask
from kata.given.sparse_launch import Kernels

block_mask = masks.block_mask  # exercise 12's, solved, on the device: block_mask(mask, n_q, n_k, block_q, block_k)
load_tile, load_stats, row_ptrs = tiles.load_tile, tiles.load_stats, tiles.row_ptrs  # for your kernels


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
    # TODO: as above: the block whose lists a program walks is the block its rows (or keys) lie in
    #       (any order of the blocks gives the same answer; ORDER's is the fast one: hint 5).
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
    # TODO: for every tile t of the walk, per_block = BLOCK_K // BLOCK_N of them per block, starting
    #       at key _tile_start(..., t, ...): load the K tile (load_tile); s = q kᵀ; from tile
    #       unmasked · per_block on (and only there), -inf where tile_allowed(..., RAGGED) says no;
    #       update m, l, acc as in 06 (a row whose m is still -inf subtracts 0); load the V tile;
    #       acc += p v. Every tl.dot takes input_precision=PRECISION.
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
    # TODO: find this program's rows (_program_tile, ORDER being kv_order); load Q
    #       (load_tile from q_desc); fold its full blocks and its partial ones, all but a
    #       last full block the keys' end cuts unmasked; write o = acc / l (l = 0 gives o = 0) and
    #       lse = (m + log2 l) · ln 2, in float32.
    raise NotImplementedError("_sparse_fwd: replace this line with your code")


# ---------------------------------------------------------------- the backward (yours) -------------

@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_desc, do_desc, stats_desc, b, h, full, n_full, partial, n_partial, unmasked,
                n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_Q: tl.constexpr,
                BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the query blocks full[:n_full], then partial[:n_partial], BLOCK_M rows at a time, into the
    float32 sums dk, dv of one key tile; the first `unmasked` full blocks without the mask. As 09's
    _dkdv_tiles (transposed tiles, keys on rows), the rows from the lists."""
    # TODO: for every tile of the walk, BLOCK_Q // BLOCK_M per block, as in _fwd_tiles: load Q, dO,
    #       then lse and D (load_stats); Sᵀ = k qᵀ; Pᵀ = exp2(Sᵀ · qk_scale − lse · log2 e),
    #       from tile unmasked · per_block on (and only there) set to 0 with tl.where where
    #       tl.trans(tile_allowed(..., RAGGED)) says no (its tile is rows x keys, Pᵀ keys x rows);
    #       dv += Pᵀ dO; dPᵀ = v dOᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D); dk += dSᵀ q, the sums in float32.
    #       Every tl.dot takes input_precision=PRECISION.
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
    #       V (load_tile); walk key block j's full query blocks and its partial ones, all but
    #       a last full block the queries' end cuts unmasked; store dk·scale and dv.
    raise NotImplementedError("_sparse_dkdv: replace this line with your code")


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_desc, v_desc, b, h, full, n_full, partial, n_partial, unmasked,
              n_q, n_k, qk_scale, window, doc_ids, MOD: tl.constexpr, RAGGED: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr):
    """Add the key blocks full[:n_full], then partial[:n_partial], BLOCK_N keys at a time, into the
    float32 sum dq of one query tile; the first `unmasked` full blocks without the mask. As 09's
    _dq_tiles, the keys from the lists."""
    # TODO: for every tile of the walk, BLOCK_K // BLOCK_N per block, as in _fwd_tiles: load K, V;
    #       S = q kᵀ; P = exp2(S · qk_scale − lse2), from tile unmasked · per_block on (and only
    #       there) set to 0 with tl.where where tile_allowed(..., RAGGED) says no; dP = dO vᵀ;
    #       dS = P ∘ (dP − D); dq += dS k. Every tl.dot takes input_precision=PRECISION.
    raise NotImplementedError("_dq_tiles: replace this line with your code")


@triton.jit
def _sparse_dq(ORDER, q_desc, k_desc, v_desc, do_desc, o_desc, DQ, LSE, DELTA, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX,
               window, doc_ids, qk_scale, scale, stride_dqb, stride_dqh, stride_dqn, stride_lse, H, n_q, n_k, t_c,
               MOD: tl.constexpr, RAGGED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """One program: dQ and D of BLOCK_M query rows (a slice of query block i, from _program_tile) of
    one (batch, head), over the forward's lists. LSE and DELTA as _sparse_fwd's LSE."""
    # TODO: find this program's rows as _sparse_fwd does; load Q, dO, and lse·log2 e;
    #       D = rowsum(dO ∘ O) from an O tile, in float32, stored (rows < n_q) for dK, dV; walk as
    #       the forward does with _dq_tiles; store dq·scale.
    raise NotImplementedError("_sparse_dq: replace this line with your code")


# ---------------------------------------------------------------- the launch (given) ---------------

def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, mask: Mask,
                           scale: float | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ) v under `mask`, computing only the tiles `block_mask` lists; differentiable.

    q (B, H, n_q, D), k and v (B, H, n_k, D); block_mask = block_mask(mask, n_q, n_k, ...), the same
    for every (batch, head). Returns o (B, H, n_q, D) in q's dtype. The given wrapper launches your
    three kernels (kata/given/sparse_launch.py).
    """
    return sparse_launch.block_sparse_attention(Kernels(fwd=_sparse_fwd, dq=_sparse_dq, dkdv=_sparse_dkdv),
                                                q, k, v, block_mask, mask, scale)
