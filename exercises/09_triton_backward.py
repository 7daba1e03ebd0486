"""Exercise 09 — train with your kernel: the backward pass in Triton.

The idea
    Exercise 07 computed the gradients tile by tile in NumPy; here the same recomputation runs on
    the GPU, behind torch.autograd, so that a model trains with your kernel. The forward (06's,
    solved) saves q, k, v, o and lse; the backward runs three kernels:
      1. D = rowsum(dO ∘ O), one float per query row (07: D_i = Σ_j P_ij dP_ij, no P needed).
      2. dK, dV: one program per key block j. K_j and V_j are loaded once and stay on chip with
         the float32 sums dK_j, dV_j while the program walks the query blocks that attend j.
      3. dQ: one program per query block i. Q_i, dO_i, lse_i, D_i and the float32 sum dQ_i stay on
         chip while it walks the key blocks i attends.
    Each gradient is summed where it lives and written once: no atomics, no n × n array.

The formulas (per tile; base 2 as in 06, c = scale · log2(e))
    P  = exp2(c · Q Kᵀ − lse · log2(e))       the forward's weights, rebuilt from lse alone
    dV_j += Pᵀ dO_i       dP = dO_i V_jᵀ      dS = P ∘ (dP − D_i)
    dK_j += dSᵀ Q_i       dQ_i += dS K_j      times scale once, after the loop
    Kernel 2 computes the tiles transposed (keys on rows: Sᵀ = K_j Q_iᵀ, Pᵀ, dPᵀ = V_j dO_iᵀ), so
    Pᵀ dO_i and dSᵀ Q_i are plain products with no transpose of a computed tile.

Why two kernels rather than atomics
    With key blocks outside (07's order), dQ_i gathers a term from every key block, each in another
    program: the paper adds them into dQ in HBM, which on a GPU means float32 atomic adds from
    many programs at once, a zeroed float32 buffer, a final cast, and sums whose order (and so
    whose rounding) changes from run to run. The dQ kernel instead recomputes S and dP for its own
    query block: two more matmuls per tile (7 instead of 5), in exchange for dQ_i summed in
    registers, written once, in a fixed order. Triton's fused-attention tutorial also recomputes
    rather than add atomically, but in one launch after D's: each of its programs sums one key
    block's dK, dV, then one query block's dQ.
    The extra matmuls run on tensor cores, which have FLOPs to spare; atomics contend in memory.

FLOPs (n_q = n_k = n, head dimension d, one head; a matmul of (a, b) by (b, c) is 2abc)
    forward: S = QKᵀ and PV, 4n²d. Backward: S again, dV = PᵀdO, dP = dOVᵀ, dQ = dSK, dK = dSᵀQ,
    five matmuls, 10n²d: 2.5 times the forward (the count benchmarks use, causal halving both).
    These kernels run seven (S and dP twice), 14n²d, to avoid the atomics.

In the paper
    FlashAttention-2 (Dao, 2023, arXiv 2307.08691), Algorithm 2: line 4 is kernel 1 (D before the
    loops); lines 5-18 are kernel 2 (line 6 loads K_j, V_j, line 7 zeroes dK_j, dV_j, lines 10-14
    rebuild S, P and compute dV_j, dP, dS, line 16 adds into dK_j, line 18 writes dK_j, dV_j);
    its line 15 (dQ_i read, added to, written back in HBM, atomics in its CUDA code) becomes
    kernel 3. FlashAttention (Dao et al., 2022, arXiv 2205.14135), Appendix B, Algorithm 4, has
    the same outer loop over key blocks but rebuilds P from m and ℓ kept apart, computes D_i inside
    the inner loop for every tile (line 19) and writes dQ_i to HBM after every tile (line 21).

Where masks are paid (as in 06: masked tiles apart from unmasked ones)
    causal=True is top-left aligned: query i attends key j iff j <= i. Tiles wholly above the
    diagonal are never visited: key block j starts at query block ⌊start_j / BLOCK_M⌋, query
    block i stops at key min(n_k, end_i). Only tiles cut by the diagonal, or by the ragged end of
    the array they walk, run MASKED (loads bounds-checked; P set to 0 above the diagonal). Rows and
    keys past the ends load as 0 and add 0 to every sum, so no other mask is needed. A key block
    that no query attends (causal, n_q < n_k) visits no tile and writes dK = dV = 0.
    Example, n_q = n_k = 6, BLOCK_M = BLOCK_N = 4, causal: key block 0 (keys 0-3) walks query
    block 0 masked, then query block 1 (rows 4-5, ragged) masked; key block 1 walks query block 1
    masked. Query block 0 walks key block 0 masked; query block 1 walks key block 0 unmasked, then
    key block 1 masked.

Conventions
    - q (B, H, n_q, D), k and v (B, H, n_k, D): float16, bfloat16 or float32, one device, D <= 256;
      any n_q, n_k >= 1. flash_attention returns o only; its gradients have their input's dtype.
    - Sums (dK_j, dV_j, dQ_i, D) are float32; P and dS are cast to the input dtype for tl.dot.
    - As in 06, every tl.dot takes input_precision=PRECISION: float32 in full unless torch was asked
      for TF32 (kata/given/precision.py).
    - Without a CUDA GPU the tests run the same kernels in Triton's interpreter (they set
      TRITON_INTERPRET=1 themselves) on the CPU in float32 and float16,
      with small tiles (16 and 32); the tests also compile them for Ampere and Hopper in float16,
      bfloat16 and float32, as a GPU would. Only the GPU stage runs bfloat16, the tuned tiles, thousands of
      tokens and the training run.

Given (kata/given/)
    solved.py   solved("06").flash_attention: exercise 06's forward, solved, which returns o and lse
    tiles.py    tiles.row_ptrs and tiles.load_rows for your kernels, as in 06; the head-dim padding
    inputs.py   check_inputs: 06's ValueErrors (there is no kv_lens here)
    launch.py   the grid, fixed tiles for small problems, autotuning; the backward's tile sizes
    precision.py  dot_precision(dtype): tl.dot's input_precision, as in 06
"""
import math

import torch
import triton
import triton.language as tl

from kata.given import tiles
from kata.given.inputs import check_inputs
from kata.given.launch import LOG2E, TUNING_DKDV, TUNING_DQ, autotuned, backward_tiles, launch
from kata.given.precision import dot_precision
from kata.given.solved import solved

flash_forward = solved("06").flash_attention  # (o, lse): exercise 06's kernel, autotuned as there


# ---------------------------------------------------------------- the backward (yours) -------------

@triton.jit
def _bwd_delta(O, DO, DELTA, stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
               H, n_q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """One program: D = rowsum(dO ∘ O) in float32 for one block of BLOCK_M query rows of one (batch, head).

    O, DO (B, H, n_q, HEAD_DIM), last axis contiguous; DELTA (B, H, n_q) contiguous float32.
    Program p owns batch·head p // cdiv(n_q, BLOCK_M) and query block p % cdiv(n_q, BLOCK_M).
    """
    # TODO: load this block's O and dO rows (rows past n_q masked), multiply them in float32, sum
    #       each row, store the sums at DELTA + (batch·head)·n_q + rows.
    raise NotImplementedError("_bwd_delta: replace this line with your code")


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, lo, hi, n_q,
                qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                PRECISION: tl.constexpr):
    """Add query tiles [lo, hi) into the float32 sums dk, dv (BLOCK_N, HEAD_DIM) of one key block.

    k, v (BLOCK_N, HEAD_DIM) on chip; keys: their indices. q_ptrs, do_ptrs point at query rows
    0..BLOCK_M-1 of this (batch, head); LSE, DELTA at its first row. MASKED: rows at or past n_q
    load as 0, and (CAUSAL) Pᵀ is 0 where key > query. PRECISION: tl.dot's input_precision, as in
    06. Returns dk, dv, not yet times scale.
    """
    # TODO: for each tile start in range(lo, hi, BLOCK_M): load Q, dO, lse and D of its rows;
    #       Sᵀ = k @ qᵀ, Pᵀ = exp2(Sᵀ·qk_scale − lse·log2 e) (masked when MASKED and CAUSAL);
    #       dv += Pᵀ @ dO; dPᵀ = v @ dOᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D); dk += dSᵀ @ q. Every tl.dot takes
    #       input_precision=PRECISION (float32 in full unless torch was asked for TF32).
    raise NotImplementedError("_dkdv_tiles: replace this line with your code")


@triton.jit
def _bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, qk_scale, scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """One program: dK and dV of one key block (BLOCK_N keys) of one (batch, head).

    Program p owns batch·head p // cdiv(n_k, BLOCK_N) and key block p % cdiv(n_k, BLOCK_N). LSE and
    DELTA (B, H, n_q) contiguous float32. qk_scale = scale · log2(e).
    """
    # TODO: load K_j and V_j once (keys past n_k masked); choose the query tiles that attend this
    #       key block (causal: from the tile holding query start_n on; the tiles that reach keys
    #       past the query are MASKED, so is the ragged last tile); run _dkdv_tiles over each
    #       range (passing PRECISION on); store dk·scale and dv for keys < n_k.
    raise NotImplementedError("_bwd_dkdv: replace this line with your code")


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, n_k, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Add key tiles [lo, hi) into the float32 sum dq (BLOCK_M, HEAD_DIM) of one query block.

    q, do (BLOCK_M, HEAD_DIM), lse2 = lse · log2(e) and delta (BLOCK_M,) on chip; rows: their
    indices. k_ptrs, v_ptrs point at keys 0..BLOCK_N-1. MASKED: keys at or past n_k load as 0,
    and (CAUSAL) P is 0 where key > query. PRECISION as in _dkdv_tiles. Returns dq, not yet times scale.
    """
    # TODO: for each tile start in range(lo, hi, BLOCK_N): load K and V; S = q @ kᵀ,
    #       P = exp2(S·qk_scale − lse2) (masked when MASKED and CAUSAL); dP = do @ vᵀ;
    #       dS = P ∘ (dP − delta); dq += dS @ k. Every tl.dot takes input_precision=PRECISION.
    raise NotImplementedError("_dq_tiles: replace this line with your code")


@triton.jit
def _bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, qk_scale, scale,
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
            stride_dqb, stride_dqh, stride_dqn,
            H, n_q, n_k,
            HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            PRECISION: tl.constexpr):
    """One program: dQ of one query block (BLOCK_M rows) of one (batch, head).

    Program p owns batch·head p // cdiv(n_q, BLOCK_M) and query block p % cdiv(n_q, BLOCK_M)
    (or, as the forward, counted from the last). LSE, DELTA as in _bwd_dkdv.
    """
    # TODO: load this block's Q, dO, lse and D once (rows past n_q masked); walk the key tiles as
    #       06's forward does (stage 1 unmasked up to `full`, stage 2 MASKED up to `hi`) with
    #       _dq_tiles (passing PRECISION on); store dq·scale for rows < n_q.
    raise NotImplementedError("_bwd_dq: replace this line with your code")


_bwd_dkdv_tuned = autotuned(_bwd_dkdv, TUNING_DKDV)
_bwd_dq_tuned = autotuned(_bwd_dq, TUNING_DQ)


# ---------------------------------------------------------------- the plumbing (given) -------------

class FlashAttention(torch.autograd.Function):
    """o = softmax(scale · q kᵀ) v; the forward saves q, k, v, o and lse, the backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float):
        head_dim = q.shape[-1]
        # Padded once, here: the forward, the saved tensors and the backward share one width.
        q, k, v = (tiles.pad_head_dim(t, tiles.padded_width(head_dim)) for t in (q, k, v))
        o, lse = flash_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.head_dim = causal, scale, head_dim
        return o[..., :head_dim]

    @staticmethod
    def backward(ctx, do):
        """dq, dk, dv in the dtypes of q, k, v: the three kernels in order."""
        q, k, v, o, lse = ctx.saved_tensors
        do = tiles.pad_head_dim(do, q.shape[-1])
        (B, H, n_q, width), n_k = q.shape, k.shape[2]
        fixed, scale = backward_tiles(width), ctx.scale
        delta = torch.empty_like(lse)
        block = fixed["dq"]["BLOCK_M"]
        _bwd_delta[(triton.cdiv(n_q, block) * B * H,)](o, do, delta, *o.stride()[:3], *do.stride()[:3], H, n_q,
                                                       HEAD_DIM=width, BLOCK_M=block)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
        sizes = dict(batch_heads=B * H, scores=B * H * n_q * n_k, HEAD_DIM=width, CAUSAL=ctx.causal,
                     PRECISION=dot_precision(q.dtype))
        launch(_bwd_dkdv, _bwd_dkdv_tuned, (q, k, v, do, dk, dv, lse, delta, scale * LOG2E, scale, *strides,
                                            *dk.stride()[:3], *dv.stride()[:3], H, n_q, n_k),
               rows=n_k, block="BLOCK_N", fixed=fixed["dkdv"], **sizes)
        launch(_bwd_dq, _bwd_dq_tuned, (q, k, v, do, dq, lse, delta, scale * LOG2E, scale, *strides,
                                        *dq.stride()[:3], H, n_q, n_k),
               rows=n_q, block="BLOCK_M", fixed=fixed["dq"], **sizes)
        d = ctx.head_dim
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ) v, fused and differentiable. q (B, H, n_q, D), k and v (B, H, n_k, D).

    Returns o (B, H, n_q, D) in q's dtype; o.backward(...) gives q.grad, k.grad, v.grad.
    """
    check_inputs(q, k, v, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, bool(causal), scale)
