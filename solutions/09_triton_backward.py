"""Exercise 09 — train with your kernel: the backward pass in Triton.

The idea
    Exercise 07 computed the gradients tile by tile in NumPy; here the same recomputation runs on
    the GPU, behind torch.autograd, so that a model trains with your kernel. The forward (06's,
    given below) saves q, k, v, o and lse; the backward runs three kernels:
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
    registers, written once, in a fixed order (Triton's fused-attention tutorial chooses the same).
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
    - Without a GPU, TRITON_INTERPRET=1 runs the same kernels on the CPU in float32.
"""
import math
import os

import torch
import triton
import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e)
TUNE_ABOVE = 2**25  # B*H*n_q*n_k scores: smaller problems run a fixed config, tuning costs more than it saves
TUNING = [  # the forward's, from 06
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2),
]
TUNING_DKDV = [  # BLOCK_N keys stay on chip, BLOCK_M-row query tiles stream past (pipelined by num_stages)
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 128}, num_warps=4, num_stages=5),  # Triton's tutorial on Hopper
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=8, num_stages=2),  # D = 256 fits it
]
TUNING_DQ = [  # BLOCK_M query rows stay on chip, BLOCK_N-key tiles stream past
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=4, num_stages=5),  # Triton's tutorial on Hopper
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 16}, num_warps=8, num_stages=2),  # D = 256 fits it
]


def _fitting(configs, named_args, **kwargs):
    """Keep the configs whose tiles hold at most 128 x 128 elements at this head dimension."""
    return [c for c in configs if max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) * kwargs["HEAD_DIM"] <= 128 * 128]


# ---------------------------------------------------------------- the forward (06, given) ----------

@triton.jit
def _load_rows(ptrs, rows, n_rows, MASKED: tl.constexpr):
    """Load a (rows, HEAD_DIM) tile; when MASKED, rows at or past n_rows read as 0 and touch no memory."""
    if MASKED:
        tile = tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _tile_ptrs(base, b, h, stride_b, stride_h, stride_n, rows, HEAD_DIM: tl.constexpr):
    """Pointers to rows `rows` (all HEAD_DIM columns) of the (b, h) matrix of a (B, H, n, HEAD_DIM) tensor."""
    start = base + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h  # B*H*n*D may pass 2**31
    return start + rows[:, None] * stride_n + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def _attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, lo, hi, n_k, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold key tiles [lo, hi) into the running state (acc, l, m; m in base 2) of one query block."""
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        k = _load_rows(k_ptrs + start * stride_kn, keys, n_k, MASKED)
        s = tl.dot(q, tl.trans(k))
        if MASKED:
            keep = (keys < n_k)[None, :]
            if CAUSAL:
                keep = keep & (keys[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1) * qk_scale)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)  # the old terms were summed relative to the old max
        l = l * alpha + tl.sum(p, 1)
        v = _load_rows(v_ptrs + start * stride_vn, keys, n_k, MASKED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m = m_new
    return acc, l, m


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, qk_scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: one query block of one (batch, head); writes its o rows and lse (natural log)."""
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    block = n_blocks - 1 - tl.program_id(0) % n_blocks  # causal: the heaviest blocks first
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(_tile_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    k_ptrs = _tile_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = _tile_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)
    hi = n_k
    full = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, (block + 1) * BLOCK_M)
        full = tl.minimum(n_k, block * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l, m = _attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, 0, full, n_k,
                            qk_scale, False, CAUSAL, BLOCK_N)
    acc, l, m = _attn_tiles(acc, l, m, q, k_ptrs, v_ptrs, stride_kn, stride_vn, rows, full, hi, n_k,
                            qk_scale, True, CAUSAL, BLOCK_N)
    o = acc / l[:, None]  # every row attends key 0, so l >= 1
    lse = (m + tl.math.log2(l)) * 0.6931471805599453  # ln(2): base 2 back to natural log
    o_ptrs = _tile_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(rows < n_q)[:, None])
    tl.store(LSE + bh.to(tl.int64) * n_q + rows, lse, mask=rows < n_q)


_attn_fwd_tuned = triton.autotune(TUNING, key=["n_q", "n_k", "HEAD_DIM", "CAUSAL"],
                                  prune_configs_by={"early_config_prune": _fitting})(_attn_fwd)


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
    # BEGIN SOLUTION
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    b = bh // H
    h = bh % H
    rows = tl.program_id(0) % n_blocks * BLOCK_M + tl.arange(0, BLOCK_M)
    o = _load_rows(_tile_ptrs(O, b, h, stride_ob, stride_oh, stride_on, rows, HEAD_DIM), rows, n_q, True)
    do = _load_rows(_tile_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, rows, HEAD_DIM), rows, n_q, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * n_q + rows, delta, mask=rows < n_q)
    # END SOLUTION


@triton.jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA, lo, hi, n_q,
                qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """Add query tiles [lo, hi) into the float32 sums dk, dv (BLOCK_N, HEAD_DIM) of one key block.

    k, v (BLOCK_N, HEAD_DIM) on chip; keys: their indices. q_ptrs, do_ptrs point at query rows
    0..BLOCK_M-1 of this (batch, head); LSE, DELTA at its first row. MASKED: rows at or past n_q
    load as 0, and (CAUSAL) Pᵀ is 0 where key > query. Returns dk, dv, not yet times scale.
    """
    # TODO: for each tile start in range(lo, hi, BLOCK_M): load Q, dO, lse and D of its rows;
    #       Sᵀ = k @ qᵀ, Pᵀ = exp2(Sᵀ·qk_scale − lse·log2 e) (masked when MASKED and CAUSAL);
    #       dv += Pᵀ @ dO; dPᵀ = v @ dOᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D); dk += dSᵀ @ q.
    # BEGIN SOLUTION
    offs_m = tl.arange(0, BLOCK_M)
    for start in tl.range(lo, hi, BLOCK_M):
        rows = start + offs_m
        q = _load_rows(q_ptrs + start * stride_qn, rows, n_q, MASKED)
        do = _load_rows(do_ptrs + start * stride_don, rows, n_q, MASKED)
        if MASKED:
            lse = tl.load(LSE + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(DELTA + rows, mask=rows < n_q, other=0.0)
        else:
            lse = tl.load(LSE + rows)
            delta = tl.load(DELTA + rows)
        lse2 = lse * 1.4426950408889634  # to base 2 on the BLOCK_M vector, before it is broadcast
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        if MASKED:
            if CAUSAL:
                p_t = tl.where(keys[:, None] <= rows[None, :], p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv
    # END SOLUTION


@triton.jit
def _bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, qk_scale, scale,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
              H, n_q, n_k,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dK and dV of one key block (BLOCK_N keys) of one (batch, head).

    Program p owns batch·head p // cdiv(n_k, BLOCK_N) and key block p % cdiv(n_k, BLOCK_N). LSE and
    DELTA (B, H, n_q) contiguous float32. qk_scale = scale · log2(e).
    """
    # TODO: load K_j and V_j once (keys past n_k masked); choose the query tiles that attend this
    #       key block (causal: from the tile holding query start_n on; the tiles that reach keys
    #       past the query are MASKED, so is the ragged last tile); run _dkdv_tiles over each
    #       range; store dk·scale and dv for keys < n_k.
    # BEGIN SOLUTION
    n_blocks = tl.cdiv(n_k, BLOCK_N)
    bh = tl.program_id(0) // n_blocks
    block = tl.program_id(0) % n_blocks  # causal: key block 0 has the most query tiles, so runs first
    b = bh // H
    h = bh % H
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
    k = _load_rows(_tile_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, keys, HEAD_DIM), keys, n_k, True)
    v = _load_rows(_tile_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, keys, HEAD_DIM), keys, n_k, True)
    q_ptrs = _tile_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, tl.arange(0, BLOCK_M), HEAD_DIM)
    do_ptrs = _tile_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, tl.arange(0, BLOCK_M), HEAD_DIM)
    LSE += bh.to(tl.int64) * n_q
    DELTA += bh.to(tl.int64) * n_q

    # Three stages: [lo, diagonal) masked, [mid, full) unmasked, [tail, n_q) masked (the ragged end).
    full = n_q // BLOCK_M * BLOCK_M
    lo = 0
    diagonal = 0
    mid = 0
    tail = full
    if CAUSAL:  # queries before the block's first key attend none of it; from its last key on, all of it
        lo = block * BLOCK_N // BLOCK_M * BLOCK_M
        mid = tl.cdiv((block + 1) * BLOCK_N, BLOCK_M) * BLOCK_M
        diagonal = tl.minimum(mid, n_q)
        tail = tl.maximum(mid, full)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA,
                         lo, diagonal, n_q, qk_scale, True, CAUSAL, BLOCK_M)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA,
                         mid, full, n_q, qk_scale, False, CAUSAL, BLOCK_M)
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptrs, do_ptrs, stride_qn, stride_don, LSE, DELTA,
                         tail, n_q, n_q, qk_scale, True, CAUSAL, BLOCK_M)

    dk_ptrs = _tile_ptrs(DK, b, h, stride_dkb, stride_dkh, stride_dkn, keys, HEAD_DIM)
    dv_ptrs = _tile_ptrs(DV, b, h, stride_dvb, stride_dvh, stride_dvn, keys, HEAD_DIM)
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=(keys < n_k)[:, None])
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=(keys < n_k)[:, None])
    # END SOLUTION


@triton.jit
def _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, n_k, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Add key tiles [lo, hi) into the float32 sum dq (BLOCK_M, HEAD_DIM) of one query block.

    q, do (BLOCK_M, HEAD_DIM), lse2 = lse · log2(e) and delta (BLOCK_M,) on chip; rows: their
    indices. k_ptrs, v_ptrs point at keys 0..BLOCK_N-1. MASKED: keys at or past n_k load as 0,
    and (CAUSAL) P is 0 where key > query. Returns dq, not yet times scale.
    """
    # TODO: for each tile start in range(lo, hi, BLOCK_N): load K and V; S = q @ kᵀ,
    #       P = exp2(S·qk_scale − lse2) (masked when MASKED and CAUSAL); dP = do @ vᵀ;
    #       dS = P ∘ (dP − delta); dq += dS @ k.
    # BEGIN SOLUTION
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        k = _load_rows(k_ptrs + start * stride_kn, keys, n_k, MASKED)
        v = _load_rows(v_ptrs + start * stride_vn, keys, n_k, MASKED)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            if CAUSAL:
                p = tl.where(keys[None, :] <= rows[:, None], p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq
    # END SOLUTION


@triton.jit
def _bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, qk_scale, scale,
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
            stride_dqb, stride_dqh, stride_dqn,
            H, n_q, n_k,
            HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program: dQ of one query block (BLOCK_M rows) of one (batch, head).

    Program p owns batch·head p // cdiv(n_q, BLOCK_M) and query block p % cdiv(n_q, BLOCK_M)
    (or, as the forward, counted from the last). LSE, DELTA as in _bwd_dkdv.
    """
    # TODO: load this block's Q, dO, lse and D once (rows past n_q masked); walk the key tiles as
    #       06's forward does (stage 1 unmasked up to `full`, stage 2 MASKED up to `hi`) with
    #       _dq_tiles; store dq·scale for rows < n_q.
    # BEGIN SOLUTION
    n_blocks = tl.cdiv(n_q, BLOCK_M)
    bh = tl.program_id(0) // n_blocks
    block = n_blocks - 1 - tl.program_id(0) % n_blocks  # causal: the heaviest blocks first
    b = bh // H
    h = bh % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(_tile_ptrs(Q, b, h, stride_qb, stride_qh, stride_qn, rows, HEAD_DIM), rows, n_q, True)
    do = _load_rows(_tile_ptrs(DO, b, h, stride_dob, stride_doh, stride_don, rows, HEAD_DIM), rows, n_q, True)
    lse2 = tl.load(LSE + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + rows, mask=rows < n_q, other=0.0)
    k_ptrs = _tile_ptrs(K, b, h, stride_kb, stride_kh, stride_kn, tl.arange(0, BLOCK_N), HEAD_DIM)
    v_ptrs = _tile_ptrs(V, b, h, stride_vb, stride_vh, stride_vn, tl.arange(0, BLOCK_N), HEAD_DIM)

    hi = n_k
    full = n_k
    if CAUSAL:  # keys below the block's first row are visible to all its rows
        hi = tl.minimum(n_k, (block + 1) * BLOCK_M)
        full = tl.minimum(n_k, block * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, 0, full, n_k,
                   qk_scale, False, CAUSAL, BLOCK_N)
    dq = _dq_tiles(dq, q, do, lse2, delta, rows, k_ptrs, v_ptrs, stride_kn, stride_vn, full, hi, n_k,
                   qk_scale, True, CAUSAL, BLOCK_N)
    dq_ptrs = _tile_ptrs(DQ, b, h, stride_dqb, stride_dqh, stride_dqn, rows, HEAD_DIM)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=(rows < n_q)[:, None])
    # END SOLUTION


_bwd_dkdv_tuned = triton.autotune(TUNING_DKDV, key=["n_q", "n_k", "HEAD_DIM", "CAUSAL"],
                                  prune_configs_by={"early_config_prune": _fitting})(_bwd_dkdv)
_bwd_dq_tuned = triton.autotune(TUNING_DQ, key=["n_q", "n_k", "HEAD_DIM", "CAUSAL"],
                                prune_configs_by={"early_config_prune": _fitting})(_bwd_dq)


# ---------------------------------------------------------------- the plumbing (given) -------------

def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_inputs(q, k, v, scale) -> None:
    """Raise ValueError naming the first problem with the inputs; launch nothing."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(f"{name} must be a 4-D torch tensor (B, H, n, D), got {getattr(t, 'shape', type(t))}")
        if t.dtype not in DTYPES or t.dtype != q.dtype:
            raise ValueError(f"{name} is {t.dtype}: q, k and v must share one dtype of float16, bfloat16, float32")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: q, k and v must share one device")
    if q.device.type != "cuda" and not _interpreted():
        raise ValueError(f"tensors are on {q.device}: compiled Triton needs CUDA (or set TRITON_INTERPRET=1)")
    if _interpreted() and q.dtype == torch.bfloat16:
        raise ValueError("dtype bfloat16 under TRITON_INTERPRET=1: Triton's interpreter multiplies the raw bits "
                         "of bfloat16 in tl.dot and returns garbage; use float32 (or float16) on the CPU")
    (B, H, n_q, D), n_k = q.shape, k.shape[2]
    if k.shape != v.shape or k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         f"need q (B, H, n_q, D) and k, v both (B, H, n_k, D)")
    if min(B, H, n_q, n_k) < 1:
        raise ValueError(f"empty input: B, H, n_q, n_k must be >= 1, got {B}, {H}, {n_q}, {n_k}")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dimension D = {D} is over the {MAX_HEAD_DIM} this kernel supports")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale}")


def _pad_head_dim(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero columns change no dot product and give zero output columns; keep the last axis contiguous."""
    if t.shape[-1] != width:
        t = torch.nn.functional.pad(t, (0, width - t.shape[-1]))
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(kernel, tuned, n_rows: int, fixed: dict, args: tuple, tune: bool, **meta) -> None:
    """One program per (block of n_rows, batch·head) on one grid axis (CUDA's others stop at 65535)."""
    B, H, n_q, n_k = meta.pop("B"), meta.pop("H"), meta.pop("n_q"), meta.pop("n_k")
    if tune:
        tuned[lambda m: (triton.cdiv(n_rows, m[fixed["rows"]]) * B * H,)](*args, H, n_q, n_k, **meta)
    else:
        blocks = {key: value for key, value in fixed.items() if key != "rows"}
        grid = (triton.cdiv(n_rows, blocks[fixed["rows"]]) * B * H,)
        kernel[grid](*args, H, n_q, n_k, **meta, **blocks, num_warps=4, num_stages=2)


def _fixed(width: int) -> dict:
    """Untuned tiles for small problems: {kernel: its blocks, and which of them its grid counts}.
    The interpreter's 16 and 32 make even tiny tests span several tiles of both kernels' loops."""
    if _interpreted():
        return {"fwd": dict(BLOCK_M=32, BLOCK_N=16, rows="BLOCK_M"),
                "dkdv": dict(BLOCK_M=16, BLOCK_N=32, rows="BLOCK_N"),
                "dq": dict(BLOCK_M=32, BLOCK_N=16, rows="BLOCK_M")}
    small = width <= 128
    return {"fwd": dict(BLOCK_M=64, BLOCK_N=64 if small else 32, rows="BLOCK_M"),
            "dkdv": dict(BLOCK_M=32 if small else 16, BLOCK_N=64 if small else 32, rows="BLOCK_N"),
            "dq": dict(BLOCK_M=64 if small else 32, BLOCK_N=32 if small else 16, rows="BLOCK_M")}


def _forward(q, k, v, causal: bool, scale: float):
    """o (padded width, q's dtype) and lse (B, H, n_q) float32 of the padded q, k, v."""
    (B, H, n_q, width), n_k = q.shape, k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    args = (q, k, v, o, lse, scale * LOG2E, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3])
    tune = not _interpreted() and B * H * n_q * n_k >= TUNE_ABOVE
    _launch(_attn_fwd, _attn_fwd_tuned, n_q, _fixed(width)["fwd"], args, tune,
            B=B, H=H, n_q=n_q, n_k=n_k, HEAD_DIM=width, CAUSAL=causal)
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool, scale: float):
    """dq, dk, dv (padded width, the dtypes of q, k, v): the three kernels in order."""
    (B, H, n_q, width), n_k = q.shape, k.shape[2]
    delta = torch.empty_like(lse)
    block = _fixed(width)["dq"]["BLOCK_M"]
    _bwd_delta[(triton.cdiv(n_q, block) * B * H,)](o, do, delta, *o.stride()[:3], *do.stride()[:3], H, n_q,
                                                   HEAD_DIM=width, BLOCK_M=block)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = (q, k, v, do)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    tune = not _interpreted() and B * H * n_q * n_k >= TUNE_ABOVE
    meta = dict(B=B, H=H, n_q=n_q, n_k=n_k, HEAD_DIM=width, CAUSAL=causal)
    _launch(_bwd_dkdv, _bwd_dkdv_tuned, n_k, _fixed(width)["dkdv"],
            (*common, dk, dv, lse, delta, scale * LOG2E, scale, *strides, *dk.stride()[:3], *dv.stride()[:3]),
            tune, **meta)
    _launch(_bwd_dq, _bwd_dq_tuned, n_q, _fixed(width)["dq"],
            (*common, dq, lse, delta, scale * LOG2E, scale, *strides, *dq.stride()[:3]), tune, **meta)
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """o = softmax(scale · q kᵀ) v; the forward saves q, k, v, o and lse, the backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float):
        head_dim = q.shape[-1]
        width = max(16, triton.next_power_of_2(head_dim))  # tl.dot and tl.arange want powers of two, >= 16
        q, k, v = (_pad_head_dim(t, width) for t in (q, k, v))
        o, lse = _forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.head_dim = causal, scale, head_dim
        return o[..., :head_dim]

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        do = _pad_head_dim(do, q.shape[-1])
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal, ctx.scale)
        d = ctx.head_dim
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(scale · q kᵀ) v, fused and differentiable. q (B, H, n_q, D), k and v (B, H, n_k, D).

    Returns o (B, H, n_q, D) in q's dtype; o.backward(...) gives q.grad, k.grad, v.grad.
    """
    _check_inputs(q, k, v, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, bool(causal), scale)
