"""Exercise 14 — attention dropout, regenerated in the backward.

The idea
    Training a transformer drops attention weights at random: each entry of the normalised P is
    kept with probability 1 − p and then weighs 1/(1 − p) (so that its expected value is P's), or
    dropped to 0. Standard attention runs dropout as a kernel of its own, which reads P from HBM,
    writes the dropped P and the mask, and keeps the mask for the backward: the mask has n² entries,
    as P has, and the backward reads it back. FlashAttention keeps neither P nor the mask. The
    forward draws each tile's mask where it computes P, on chip; the backward, which rebuilds P
    from lse, draws the same mask again from the same seed. Nothing of size n × n is ever written
    or read.

Counter-based: the same mask again, in any program
    A counter-based generator is a hash: u = Philox(seed, counter), a uniform number in [0, 1)
    that depends on the seed and the counter alone, with no state carried from one draw to the
    next (Salmon et al., 2011, "Parallel random numbers: as easy as 1, 2, 3"). Triton's
    tl.rand(seed, offsets) computes it for a whole tile of counters at once. Give each (query, key)
    pair of each (batch, head) a counter of its own, its place in the (B, H, n_q, n_k) mask,
        counter = ((b·H + h)·n_q + i)·n_k + j        pair (i, j) kept iff tl.rand(seed, counter) >= p
    and any program can draw any entry: the forward's program of query block i, the backward's
    program of key block j (which sees the tile transposed), dropout_mask's programs, whatever
    their tile sizes or their grid. The counter passes 2**31 once B·H·n_q·n_k does (one head at a
    64k context has 2**32 pairs): compute it in int64 (Triton's Philox takes its low and high 32
    bits as two counter words). keep_mask takes broadcast index arrays, as 12's mask_mod does:
    rows[:, None] and keys[None, :] for a tile with queries on its rows, rows[None, :] and
    keys[:, None] for one with keys on its rows.

The formulas (06 and 09, with Z = keep / (1 − p): 1/(1 − p) where kept, 0 where dropped)
    forward:  m and l from every score, kept or dropped (they normalise softmax(S), which
              dropout does not change);  acc += (P̃ ∘ keep) V;  o = acc / (l · (1 − p))
    backward: P = exp2(S·c − lse·log2 e) as in 09, then
              dV += (P ∘ Z)ᵀ dO        dP = (dO Vᵀ) ∘ Z        dS = P ∘ (dP − D)
              with D = rowsum(dO ∘ O) as in 09: o is the dropped output, and
              rowsum(P ∘ dP) = rowsum(dO ∘ (P ∘ Z) V) = rowsum(dO ∘ O).
    dQ and dK follow from dS as in 09. A row whose every attended key is dropped has o = 0 and
    a finite lse: dividing by l (undropped, never 0) keeps it so; its dS is 0.
    p = 0 is 09 exactly: the kernels take DROPOUT = p > 0 as a constexpr, and without it they
    draw no random numbers (Triton compiles the branch away). The seed, a new one each training
    step, is passed with do_not_specialize: else Triton compiles the kernels again for a seed of 1
    or a multiple of 16.

In the paper
    FlashAttention (Dao et al., 2022, arXiv 2205.14135), Appendix B. Algorithm 2 (the forward with
    masking and dropout): line 1 sets the generator's state R and saves it to HBM, line 14 drops
    P̃_ij, line 15 adds P̃_ij^dropped V_j into O_i, and l and m (line 13) come from the undropped
    P̃_ij; line 19 returns R beside O, l, m. Algorithm 4 (the backward): line 1 restores R; line 13
    rebuilds P_ij; line 14 regenerates Z_ij (1/(1 − p) with probability 1 − p, else 0); line 15
    P_ij^dropped = P_ij ∘ Z_ij; line 16 dV_j += (P_ij^dropped)ᵀ dO_i; line 18 dP_ij = dP_ij^dropped
    ∘ Z_ij; line 19 D_i = rowsum(dO_i ∘ O_i); line 20 dS_ij = P_ij ∘ (dP_ij − D_i). Here R is
    the seed, and the order of the loops is 09's (FlashAttention-2's), not Algorithm 4's.

Where the kata simplifies
    - The seed is the caller's (flash-attn takes a seed and an offset from torch's generator and
      keeps them for the backward); a model passes a new seed each step.
    - tl.rand runs the full Philox (ten rounds) for each entry and keeps 32 of its 128 bits;
      flash-attn compares 8 random bits per entry with the keep probability rounded down to a
      multiple of 1/255, so that one Philox call serves 16 entries.

Conventions
    - As 09: q (B, H, n_q, D), k and v (B, H, n_k, D), float16, bfloat16 or float32, D <= 256, any
      n_q, n_k >= 1, causal top-left aligned; o in q's dtype; gradients in their input's dtype.
    - dropout_p in [0, 1), else ValueError; seed an integer in [0, 2**63), else ValueError.
    - dropout_mask(seed, dropout_p, B, H, n_q, n_k) is the kernels' mask, True where kept: the
      tests compare the kernels with dense float64 attention under it.
    - Without a CUDA GPU the tests run the kernels in Triton's interpreter (they set
      TRITON_INTERPRET=1 themselves) on the CPU in float32 and float16; the
      tests compile them for Ampere and Hopper in float16, bfloat16 and float32.

Given (kata/given/)
    dropout_launch.py  the autograd wrapper: input, dropout_p and seed checks, tile sizes, grid
    tiles.py           row_ptrs, load_rows, as in 09 (the wrapper pads the head dim)
    launch.py          autotuned: the kernels tuned beside the fixed tiles of small problems
    precision.py       dot_precision(dtype): tl.dot's input_precision (PRECISION), as in 09
"""
import torch
import triton
import triton.language as tl

from kata.given import dropout_launch, tiles
from kata.given.dropout_launch import Kernels
from kata.given.launch import TUNING_DKDV, TUNING_DQ, autotuned
from kata.given.solved import solved

load_rows, row_ptrs = tiles.load_rows, tiles.row_ptrs  # for your kernels


# ---------------------------------------------------------------- the mask (yours) ------------------

@triton.jit
def keep_mask(seed, dropout_p, bh, q_idx, kv_idx, n_q, n_k):
    """True where dropout keeps pair (q_idx, kv_idx) of batch·head bh: tl.rand(seed, counter) >= dropout_p,
    counter = (bh·n_q + q_idx)·n_k + kv_idx in int64. q_idx and kv_idx are broadcast index arrays
    (rows[:, None] and keys[None, :], or transposed); the result has their broadcast shape."""
    # TODO: the counter of each pair, in int64 (it passes 2**31 at long context); keep where
    #       tl.rand(seed, counter) >= dropout_p.
    raise NotImplementedError("keep_mask: replace this line with your code")


# ---------------------------------------------------------------- the forward (yours) ---------------

@triton.jit
def _fwd_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_q, n_k, qk_scale,
               seed, dropout_p, bh, MASKED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
               BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state of one query block, as 06's attn_tiles,
    with P̃'s dropped entries left out of acc (not out of l). Returns acc, l, m."""
    # TODO: 06's loop; after l is updated from every weight, under DROPOUT set the dropped weights
    #       to 0 (keep_mask of rows[:, None], keys[None, :]) before acc += p @ v. Every tl.dot takes
    #       input_precision=PRECISION.
    raise NotImplementedError("_fwd_tiles: replace this line with your code")


@triton.jit(do_not_specialize=["seed"])
def _attn_fwd(Q, K, V, O, LSE, seed, dropout_p, qk_scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: one query block of one (batch, head), as 06's _attn_fwd (without kv_lens).

    LSE (B, H, n_q) contiguous float32, from the undropped scores; qk_scale = scale · log2(e).
    """
    # TODO: 06's program, passing seed, dropout_p and the batch·head to _fwd_tiles; under DROPOUT
    #       o = acc / (l · (1 − dropout_p)); lse = (m + log2 l) · ln 2 as in 06.
    raise NotImplementedError("_attn_fwd: replace this line with your code")


# ---------------------------------------------------------------- the backward (yours) --------------

@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, lo, hi, n_q, n_k,
                qk_scale, seed, dropout_p, bh, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    """Add query tiles [lo, hi) into dk, dv of one key block, as 09's _dkdv_tiles, with the
    forward's mask regenerated on the transposed tile. Returns dk, dv, not yet times scale."""
    # TODO: 09's loop; under DROPOUT, Zᵀ = keep_mask of rows[None, :], keys[:, None] (keys on the
    #       tile's rows) as 1/(1 − dropout_p) or 0; dv += (Pᵀ ∘ Zᵀ) @ dO, dPᵀ ∘= Zᵀ, then dSᵀ as in 09.
    raise NotImplementedError("_dkdv_tiles: replace this line with your code")


@triton.jit(do_not_specialize=["seed"])
def _bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, seed, dropout_p, qk_scale, scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dK and dV of one key block of one (batch, head), as 09's _bwd_dkdv."""
    # TODO: 09's program, passing seed, dropout_p and the batch·head to _dkdv_tiles.
    raise NotImplementedError("_bwd_dkdv: replace this line with your code")


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, n_q, n_k, qk_scale,
              seed, dropout_p, bh, MASKED: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
              BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Add key tiles [lo, hi) into dq of one query block, as 09's _dq_tiles, with dP times the
    forward's Z. Returns dq, not yet times scale."""
    # TODO: 09's loop; under DROPOUT, dP ∘= Z (keep_mask of rows[:, None], keys[None, :] as
    #       1/(1 − dropout_p) or 0) before dS = P ∘ (dP − D).
    raise NotImplementedError("_dq_tiles: replace this line with your code")


@triton.jit(do_not_specialize=["seed"])
def _bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, seed, dropout_p, qk_scale, scale,
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
            stride_dqb, stride_dqh, stride_dqn,
            H, n_q, n_k,
            HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dQ of one query block of one (batch, head), as 09's _bwd_dq."""
    # TODO: 09's program, passing seed, dropout_p and the batch·head to _dq_tiles.
    raise NotImplementedError("_bwd_dq: replace this line with your code")


_attn_fwd_tuned = autotuned(_attn_fwd, solved("06").TUNING)
_bwd_dkdv_tuned = autotuned(_bwd_dkdv, TUNING_DKDV)
_bwd_dq_tuned = autotuned(_bwd_dq, TUNING_DQ)


# ---------------------------------------------------------------- the glue (given) -----------------

@triton.jit(do_not_specialize=["seed"])
def _mask_kernel(MASK, seed, dropout_p, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: keep_mask of one (BLOCK_M, BLOCK_N) tile of one batch·head, stored as int8 into the
    contiguous (B, H, n_q, n_k) MASK, where an entry's index is its counter."""
    row_blocks = tl.cdiv(n_q, BLOCK_M)
    col_blocks = tl.cdiv(n_k, BLOCK_N)
    bh = tl.program_id(0) // (row_blocks * col_blocks)
    tile = tl.program_id(0) % (row_blocks * col_blocks)
    rows = tile // col_blocks * BLOCK_M + tl.arange(0, BLOCK_M)
    keys = tile % col_blocks * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = keep_mask(seed, dropout_p, bh, rows[:, None], keys[None, :], n_q, n_k)
    where = (bh.to(tl.int64) * n_q + rows[:, None]) * n_k + keys[None, :]
    tl.store(MASK + where, keep.to(tl.int8), mask=(rows < n_q)[:, None] & (keys < n_k)[None, :])


def dropout_mask(seed: int, dropout_p: float, B: int, H: int, n_q: int, n_k: int, device=None) -> torch.Tensor:
    """The keep mask flash_attention(..., dropout_p, seed) draws, (B, H, n_q, n_k) bool, True where kept.

    device: the kernels' device when None (CUDA, or the CPU where the kernels run interpreted).
    """
    return dropout_launch.dropout_mask(_mask_kernel, seed, dropout_p, B, H, n_q, n_k, device)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, dropout_p: float = 0.0, seed: int = 0) -> torch.Tensor:
    """dropout(softmax(scale · q kᵀ)) v, fused and differentiable; q (B, H, n_q, D), k and v (B, H, n_k, D).

    Each weight is dropped with probability dropout_p, by the mask dropout_mask(seed, dropout_p, B, H,
    n_q, n_k); kept weights are multiplied by 1/(1 − dropout_p). Returns o (B, H, n_q, D) in q's dtype.
    Checks, pads and launches your kernels in kata/given/dropout_launch.py.
    """
    kernels = Kernels(_attn_fwd, _attn_fwd_tuned, _bwd_dkdv, _bwd_dkdv_tuned, _bwd_dq, _bwd_dq_tuned)
    return dropout_launch.flash_attention(kernels, q, k, v, causal, scale, dropout_p, seed)
